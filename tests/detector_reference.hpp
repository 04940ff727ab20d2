// A plain-loop interpretation of a DetectorNet (vision/detector_net.hpp), one image, NCHW float32 (double sums): what
// the oneDNN detector is checked against, layer by layer.
#pragma once
#include <algorithm>
#include <cmath>
#include <vector>

#include "vision/detector_net.hpp"

namespace sat::test {

inline float apply_post(const sat::PostOp& p, float x) {
  switch (p.kind) {
    case sat::PostOpKind::linear:
      return p.scale * (p.alpha * x + p.beta);
    case sat::PostOpKind::relu:
      return p.scale * std::max(x, 0.f);
    case sat::PostOpKind::relu6:
      return p.scale * std::min(std::max(x, 0.f), 6.f);
    case sat::PostOpKind::hard_swish:
      return p.scale * x * std::min(std::max(x + 3.f, 0.f), 6.f) / 6.f;
    case sat::PostOpKind::logistic:
      return p.scale / (1.f + std::exp(-x));
    case sat::PostOpKind::sum:
      return x;  // applied by the caller
  }
  return x;
}

// image: 3 x S x S (RGB 0..255). Returns every layer's output, C x H x W.
inline std::vector<std::vector<float>> reference_forward(const sat::DetectorNet& net, const float* image, int size) {
  using sat::LayerKind;
  const auto shapes = net.shapes(size);
  std::vector<std::vector<float>> out(net.layers.size());
  out[0].assign(image, image + 3 * size * size);
  for (size_t i = 1; i < net.layers.size(); ++i) {
    const sat::DetectorLayer& l = net.layers[i];
    const sat::NodeShape& s = shapes[i];
    std::vector<float>& o = out[i];
    o.assign((size_t)s.c * s.h * s.w, 0.f);
    const sat::NodeShape& a = shapes[l.inputs[0]];
    const std::vector<float>& x = out[l.inputs[0]];
    switch (l.kind) {
      case LayerKind::input:
        break;
      case LayerKind::conv: {
        const int ci = l.depthwise ? 1 : a.c;
        for (int oc = 0; oc < s.c; ++oc)
          for (int y = 0; y < s.h; ++y)
            for (int xx = 0; xx < s.w; ++xx) {
              double acc = l.bias[oc];
              for (int ic = 0; ic < ci; ++ic)
                for (int ky = 0; ky < l.kh; ++ky)
                  for (int kx = 0; kx < l.kw; ++kx) {
                    const int iy = y * l.stride - s.pad_t + ky, ix = xx * l.stride - s.pad_l + kx;
                    if (iy < 0 || iy >= a.h || ix < 0 || ix >= a.w) continue;
                    const int channel = l.depthwise ? oc : ic;
                    acc += (double)l.weight[(((size_t)oc * ci + ic) * l.kh + ky) * l.kw + kx] *
                           x[((size_t)channel * a.h + iy) * a.w + ix];
                  }
              float v = (float)acc;
              const size_t at = ((size_t)oc * s.h + y) * s.w + xx;
              for (const sat::PostOp& p : l.post)
                v = p.kind == sat::PostOpKind::sum ? v + out[p.sum_from][at] : apply_post(p, v);
              o[at] = v;
            }
        break;
      }
      case LayerKind::eltwise:
        for (size_t k = 0; k < o.size(); ++k) {
          float v = x[k];
          for (const sat::PostOp& p : l.post) v = apply_post(p, v);
          o[k] = v;
        }
        break;
      case LayerKind::mean:
        for (int c = 0; c < a.c; ++c) {
          double acc = 0;
          for (int k = 0; k < a.h * a.w; ++k) acc += x[(size_t)c * a.h * a.w + k];
          o[c] = (float)(acc / (a.h * a.w));
        }
        break;
      case LayerKind::add:
      case LayerKind::mul: {
        const sat::NodeShape& b = shapes[l.inputs[1]];
        const std::vector<float>& z = out[l.inputs[1]];
        for (int c = 0; c < s.c; ++c)
          for (int k = 0; k < s.h * s.w; ++k) {
            const float u = a.h == 1 && s.h > 1 ? x[c] : x[(size_t)c * s.h * s.w + k];
            const float v = b.h == 1 && s.h > 1 ? z[c] : z[(size_t)c * s.h * s.w + k];
            o[(size_t)c * s.h * s.w + k] = l.kind == LayerKind::mul ? u * v : u + v;
          }
        break;
      }
      case LayerKind::concat: {
        size_t at = 0;
        for (int k : l.inputs) {
          std::copy(out[k].begin(), out[k].end(), o.begin() + at);
          at += out[k].size();
        }
        break;
      }
      case LayerKind::resize: {
        const float sy = (float)a.h / s.h, sx = (float)a.w / s.w;
        for (int c = 0; c < s.c; ++c)
          for (int y = 0; y < s.h; ++y)
            for (int xx = 0; xx < s.w; ++xx) {
              const float fy = y * sy, fx = xx * sx;
              const int y0 = (int)std::floor(fy), x0 = (int)std::floor(fx);
              const int y1 = std::min(y0 + 1, a.h - 1), x1 = std::min(x0 + 1, a.w - 1);
              const float dy = fy - y0, dx = fx - x0;
              auto at = [&](int yy, int xxx) { return x[((size_t)c * a.h + yy) * a.w + xxx]; };
              const float top = at(y0, x0) + (at(y0, x1) - at(y0, x0)) * dx;
              const float bottom = at(y1, x0) + (at(y1, x1) - at(y1, x0)) * dx;
              o[((size_t)c * s.h + y) * s.w + xx] = top + (bottom - top) * dy;
            }
        break;
      }
    }
  }
  return out;
}

}  // namespace sat::test
