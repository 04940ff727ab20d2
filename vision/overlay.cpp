#include "vision/overlay.hpp"

#include <algorithm>
#include <cctype>
#include <opencv2/imgproc.hpp>

#include "datasets/stb_codecs.hpp"
#include "datasets/io.hpp"

namespace sat {

static cv::Mat labelled(const cv::Mat& panel, const std::string& text) {
  const int strip = 30;
  cv::Mat out(panel.rows + strip, panel.cols, CV_8UC3, cv::Scalar(255, 255, 255));
  panel.copyTo(out(cv::Rect(0, 0, panel.cols, panel.rows)));
  int base = 0;
  double scale = 0.65;
  cv::Size sz = cv::getTextSize(text, cv::FONT_HERSHEY_SIMPLEX, scale, 2, &base);
  while (sz.width > panel.cols - 8 && scale > 0.3) {
    scale -= 0.05;
    sz = cv::getTextSize(text, cv::FONT_HERSHEY_SIMPLEX, scale, 2, &base);
  }
  cv::putText(out, text, cv::Point((panel.cols - sz.width) / 2, panel.rows + (strip + sz.height) / 2),
              cv::FONT_HERSHEY_SIMPLEX, scale, cv::Scalar(20, 20, 20), 2, cv::LINE_AA);
  return out;
}

cv::Mat attention_overlay(const cv::Mat& bgr, const std::vector<std::vector<float>>& alphas,
                          const std::vector<std::string>& words, int gh, int gw, const OverlayOptions& opt,
                          const std::vector<int>& locations) {
  if (alphas.size() < words.size()) throw Error("overlay: fewer attention maps than words");
  const int P = opt.panel;
  cv::Mat base;
  cv::resize(bgr, base, cv::Size(P, P), 0, 0, cv::INTER_AREA);
  cv::Mat input = base.clone();  // the marks on the input panel only
  for (const OverlayOptions::Mark& m : opt.marks) {
    const cv::Point c((int)std::lround(m.x * P), (int)std::lround(m.y * P));
    cv::drawMarker(input, c, cv::Scalar(0, 0, 0), cv::MARKER_CROSS, 14, 4, cv::LINE_AA);
    cv::drawMarker(input, c, cv::Scalar(0, 255, 255), cv::MARKER_CROSS, 12, 2, cv::LINE_AA);
    const cv::Point at(std::min(c.x + 8, P - 8), std::max(c.y - 6, 12));
    cv::putText(input, m.label, at, cv::FONT_HERSHEY_SIMPLEX, 0.4, cv::Scalar(0, 0, 0), 3, cv::LINE_AA);
    cv::putText(input, m.label, at, cv::FONT_HERSHEY_SIMPLEX, 0.4, cv::Scalar(0, 255, 255), 1, cv::LINE_AA);
  }
  std::vector<cv::Mat> panels{labelled(input, "input")};
  for (size_t k = 0; k < words.size(); ++k) {
    if ((int)alphas[k].size() != gh * gw) throw Error("overlay: attention map has the wrong size");
    cv::Mat a(gh, gw, CV_32F, const_cast<float*>(alphas[k].data()));
    cv::Mat up;
    cv::resize(a, up, cv::Size(P, P), 0, 0, cv::INTER_CUBIC);
    double sigma = 0.35 * P / std::max(gh, gw);
    cv::GaussianBlur(up, up, cv::Size(0, 0), sigma);
    double lo, hi;
    cv::minMaxLoc(up, &lo, &hi);
    up = (up - lo) / std::max(hi - lo, 1e-12);
    cv::Mat u8, heat, blended;
    up.convertTo(u8, CV_8U, 255.0);
    cv::applyColorMap(u8, heat, cv::COLORMAP_JET);
    if (hi <= 0)
      blended = base.clone();  // no attention: nothing to draw
    else
      cv::addWeighted(base, 1.0 - opt.blend, heat, opt.blend, 0.0, blended);
    if (k < locations.size() && locations[k] >= 0) {  // hard attention: where the glimpse was taken
      const double cw = (double)P / gw, ch = (double)P / gh;
      cv::Point c((int)((locations[k] % gw + 0.5) * cw), (int)((locations[k] / gw + 0.5) * ch));
      int r = std::max(4, (int)(0.45 * std::min(cw, ch)));
      cv::circle(blended, c, r + 2, cv::Scalar(0, 0, 0), 3, cv::LINE_AA);
      cv::circle(blended, c, r, cv::Scalar(255, 255, 255), 2, cv::LINE_AA);
      cv::drawMarker(blended, c, cv::Scalar(255, 255, 255), cv::MARKER_CROSS, r, 1, cv::LINE_AA);
    }
    panels.push_back(labelled(blended, words[k]));
  }
  const int cols = std::max(1, std::min(opt.columns, (int)panels.size()));
  const int rows = ((int)panels.size() + cols - 1) / cols;
  const int ph = panels[0].rows, gap = 6;
  cv::Mat grid(rows * ph + (rows + 1) * gap, cols * P + (cols + 1) * gap, CV_8UC3, cv::Scalar(255, 255, 255));
  for (size_t k = 0; k < panels.size(); ++k) {
    int r = (int)k / cols, c = (int)k % cols;
    panels[k].copyTo(grid(cv::Rect(gap + c * (P + gap), gap + r * (ph + gap), P, ph)));
  }
  return grid;
}

void write_image(const std::string& path, const cv::Mat& img) {
  const auto dot = path.rfind('.');
  std::string ext = dot == std::string::npos ? "" : path.substr(dot);
  for (char& c : ext) c = (char)std::tolower((unsigned char)c);
  std::string bytes;
  try {
    if (ext == ".png")
      bytes = encode_png(img);
    else if (ext == ".jpg" || ext == ".jpeg")
      bytes = encode_jpeg(img, 95);  // OpenCV's default quality, which sat wrote with before stb
    else
      fail(path, "cannot encode an image with extension '" + ext + "' (use .png or .jpg)");
  } catch (const Error& e) {
    if (std::string(e.what()).rfind(path + ": ", 0) == 0) throw;
    fail(path, e.what());
  }
  write_file_atomic(path, bytes);
}

}  // namespace sat
