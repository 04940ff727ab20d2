#include "train/optimizer.hpp"

#include <cmath>

namespace sat {

void Adam::attach(const std::vector<Param*>& params) {
  m.clear();
  v.clear();
  for (auto* p : params) {
    m.emplace_back(p->trainable ? p->value.size() : 0, 0.f);
    v.emplace_back(p->trainable ? p->value.size() : 0, 0.f);
  }
}

double Adam::clip_grad_norm(const std::vector<Param*>& params, double max_norm) {
  double sq = 0;
  for (auto* p : params) {
    p->ensure_grad();
    for (float g : p->grad) sq += (double)g * g;
  }
  double norm = std::sqrt(sq);
  if (max_norm > 0 && norm > max_norm) {
    float s = (float)(max_norm / (norm + 1e-12));
    for (auto* p : params)
      for (float& g : p->grad) g *= s;
  }
  return norm;
}

void Adam::update(const std::vector<Param*>& params, float lr, const std::vector<float>* lr_scale) {
  if (m.size() != params.size()) throw Error("optimizer state does not match the model's parameters");
  if (lr_scale && lr_scale->size() != params.size()) throw Error("Adam: one learning-rate scale per parameter needed");
  ++step;
  const float c1 = 1.f - std::pow(beta1, (float)step), c2 = 1.f - std::pow(beta2, (float)step);
  const float a = lr * std::sqrt(c2) / c1;
  for (size_t k = 0; k < params.size(); ++k) {
    Param& p = *params[k];
    if (!p.trainable) continue;
    const float ak = lr_scale ? a * (*lr_scale)[k] : a;
    p.ensure_grad();
    float* w = p.value.data();
    const float* g = p.grad.data();
    float* mk = m[k].data();
    float* vk = v[k].data();
    const int64_t n = p.size();
    // elementwise, so the same result whichever thread does a weight: split between the threads above 64k weights
#pragma omp parallel for simd schedule(static) if (n >= 65536)
    for (int64_t i = 0; i < n; ++i) {
      mk[i] = beta1 * mk[i] + (1 - beta1) * g[i];
      vk[i] = beta2 * vk[i] + (1 - beta2) * g[i] * g[i];
      w[i] -= ak * mk[i] / (std::sqrt(vk[i]) + eps);
    }
  }
}

}  // namespace sat
