#include "vision/overlay.hpp"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdio>
#include <opencv2/imgproc.hpp>

#include "datasets/stb_codecs.hpp"
#include "datasets/io.hpp"

namespace sat {

namespace {

constexpr int kFont = cv::FONT_HERSHEY_SIMPLEX;
const cv::Scalar kPaper(255, 255, 255), kInk(25, 25, 25), kMuted(105, 105, 105);
// Nothing sat draws needs more: a larger picture means flags asking for absurd sizes.
constexpr double kMaxOverlayPixels = 100e6;

const cv::Mat& inferno_table() {  // 256 BGR colours
  static const cv::Mat table = [] {
    cv::Mat ramp(1, 256, CV_8U), colours;
    for (int i = 0; i < 256; ++i) ramp.at<uint8_t>(0, i) = (uint8_t)i;
    cv::applyColorMap(ramp, colours, cv::COLORMAP_INFERNO);
    return colours;
  }();
  return table;
}

// Text scaled with the panel: at the default 224 pixels, OpenCV's simplex font at 0.55.
struct Lettering {
  double scale;
  int thickness, line;
  explicit Lettering(int panel)
      : scale(0.55 * std::clamp(panel / 224.0, 0.6, 3.0)),
        thickness(panel >= 400 ? 2 : 1),
        line((int)std::lround(26 * std::clamp(panel / 224.0, 0.6, 3.0))) {}
  int width(const std::string& text) const {
    int base = 0;
    return cv::getTextSize(text, kFont, scale, thickness, &base).width;
  }
  void put(cv::Mat& img, const std::string& text, cv::Point at, const cv::Scalar& colour, double factor = 1) const {
    cv::putText(img, text, at, kFont, scale * factor, colour, thickness, cv::LINE_AA);
  }
};

// The caption broken into lines no wider than `width`.
std::vector<std::string> wrapped(const std::vector<std::string>& words, const Lettering& l, int width) {
  std::vector<std::string> lines;
  std::string line;
  for (const std::string& w : words) {
    const std::string longer = line.empty() ? w : line + " " + w;
    if (!line.empty() && l.width(longer) > width) {
      lines.push_back(line);
      line = w;
    } else {
      line = longer;
    }
  }
  if (!line.empty()) lines.push_back(line);
  return lines;
}

std::string percent(double weight) {
  char text[32];
  std::snprintf(text, sizeof text, weight < 0.1 ? "%.1f%%" : "%.0f%%", 100 * weight);
  return text;
}

// The photo with the map over it: colour and opacity both follow weight / largest weight.
cv::Mat heat_over(const cv::Mat& photo, const cv::Mat& map, double opacity) {
  double peak = 0;
  cv::minMaxLoc(map, nullptr, &peak);
  if (!(peak > 0)) return photo.clone();  // no attention: nothing to draw
  cv::Mat up;
  cv::resize(map, up, photo.size(), 0, 0, cv::INTER_LINEAR);
  const cv::Vec3b* colours = inferno_table().ptr<cv::Vec3b>(0);
  cv::Mat out(photo.size(), CV_8UC3);
  for (int y = 0; y < photo.rows; ++y) {
    const float* w = up.ptr<float>(y);
    const cv::Vec3b* in = photo.ptr<cv::Vec3b>(y);
    cv::Vec3b* o = out.ptr<cv::Vec3b>(y);
    for (int x = 0; x < photo.cols; ++x) {
      const double v = std::clamp(w[x] / peak, 0.0, 1.0), a = opacity * v;
      const cv::Vec3b& c = colours[(int)std::lround(255 * v)];
      for (int ch = 0; ch < 3; ++ch) o[x][ch] = cv::saturate_cast<uint8_t>((1 - a) * in[x][ch] + a * c[ch]);
    }
  }
  return out;
}

// A panel with its label strip under it: the word, and (for a map) its largest weight in the muted colour.
cv::Mat labelled(const cv::Mat& panel, const std::string& word, const std::string& note, const Lettering& l) {
  cv::Mat out(panel.rows + l.line, panel.cols, CV_8UC3, kPaper);
  panel.copyTo(out(cv::Rect(0, 0, panel.cols, panel.rows)));
  const std::string gap = note.empty() ? "" : "  ";
  const int word_width = l.width(word + gap), note_width = note.empty() ? 0 : l.width(note);
  const int x = std::max(2, (panel.cols - word_width - note_width) / 2);
  const int y = panel.rows + (int)std::lround(0.72 * l.line);
  l.put(out, word, cv::Point(x, y), kInk);
  if (!note.empty()) l.put(out, note, cv::Point(x + word_width, y), kMuted);
  return out;
}

// The key: the colour bar from no attention to the word's largest weight.
cv::Mat colour_key(int width, const Lettering& l) {
  cv::Mat out(2 * l.line, width, CV_8UC3, kPaper);
  const std::string left = "attention: 0", right = "the word's largest weight (under each panel)";
  const int bar_x = 8 + l.width(left) + 8, bar_w = std::max(40, std::min(width / 3, 4 * l.line * 3));
  const int bar_h = std::max(6, l.line / 2), bar_y = (out.rows - bar_h) / 2;
  const int text_y = bar_y + bar_h - 1;
  l.put(out, left, cv::Point(8, text_y), kMuted);
  const cv::Vec3b* colours = inferno_table().ptr<cv::Vec3b>(0);
  for (int x = 0; x < bar_w && bar_x + x < width; ++x)
    cv::line(out, cv::Point(bar_x + x, bar_y), cv::Point(bar_x + x, bar_y + bar_h - 1),
             cv::Scalar(colours[x * 255 / std::max(1, bar_w - 1)]));
  if (bar_x + bar_w + 8 < width) l.put(out, right, cv::Point(bar_x + bar_w + 8, text_y), kMuted);
  return out;
}

void draw_marks(cv::Mat& panel, const std::vector<OverlayOptions::Mark>& marks, const Lettering& l) {
  for (const OverlayOptions::Mark& m : marks) {
    const cv::Point c((int)std::lround(m.x * panel.cols), (int)std::lround(m.y * panel.rows));
    cv::drawMarker(panel, c, cv::Scalar(0, 0, 0), cv::MARKER_CROSS, 14, 4, cv::LINE_AA);
    cv::drawMarker(panel, c, cv::Scalar(0, 255, 255), cv::MARKER_CROSS, 12, 2, cv::LINE_AA);
    const cv::Point at(std::min(c.x + 8, panel.cols - 8), std::max(c.y - 6, 12));
    cv::putText(panel, m.label, at, kFont, 0.75 * l.scale, cv::Scalar(0, 0, 0), 3, cv::LINE_AA);
    cv::putText(panel, m.label, at, kFont, 0.75 * l.scale, cv::Scalar(0, 255, 255), 1, cv::LINE_AA);
  }
}

// Hard attention: the grid cell the glimpse was read from, outlined.
void outline_cell(cv::Mat& panel, int location, int gh, int gw) {
  const int row = location / gw, col = location % gw;
  const cv::Point a((int)std::lround((double)col * panel.cols / gw), (int)std::lround((double)row * panel.rows / gh));
  const cv::Point b((int)std::lround((double)(col + 1) * panel.cols / gw) - 1,
                    (int)std::lround((double)(row + 1) * panel.rows / gh) - 1);
  cv::rectangle(panel, a, b, cv::Scalar(0, 0, 0), 3, cv::LINE_8);
  cv::rectangle(panel, a, b, cv::Scalar(255, 255, 255), 1, cv::LINE_8);
}

}  // namespace

cv::Vec3b inferno_bgr(double v) {
  return inferno_table().at<cv::Vec3b>(0, (int)std::lround(255 * std::clamp(v, 0.0, 1.0)));
}

cv::Mat attention_overlay(const cv::Mat& bgr, const std::vector<std::vector<float>>& alphas,
                          const std::vector<std::string>& words, int gh, int gw, const OverlayOptions& opt,
                          const std::vector<int>& locations) {
  if (alphas.size() < words.size()) throw Error("overlay: fewer attention maps than words");
  if (opt.panel < kMinOverlayPanel || opt.panel > kMaxOverlayPanel)
    throw Error("overlay: panel side " + std::to_string(opt.panel) + " is outside " +
                std::to_string(kMinOverlayPanel) + ".." + std::to_string(kMaxOverlayPanel) + " pixels");
  if (opt.columns < 1 || opt.columns > kMaxOverlayColumns)
    throw Error("overlay: " + std::to_string(opt.columns) + " columns is outside 1.." +
                std::to_string(kMaxOverlayColumns));
  if (bgr.empty() || bgr.type() != CV_8UC3) throw Error("overlay: the image must be 8-bit BGR");
  if (gh <= 0 || gw <= 0) throw Error("overlay: the attention grid has no cells");
  // The photo's aspect kept: its longer side becomes the panel side.
  const int P = opt.panel;
  const double aspect = (double)bgr.cols / bgr.rows;
  const int pw = aspect >= 1 ? P : std::max(8, (int)std::lround(P * aspect));
  const int ph = aspect >= 1 ? std::max(8, (int)std::lround(P / aspect)) : P;
  const Lettering lettering(P);
  const int count = (int)words.size() + 1, cols = std::min(opt.columns, count), rows = (count + cols - 1) / cols;
  const int gap = 6, width = cols * pw + (cols + 1) * gap;
  const std::vector<std::string> title = wrapped(words.empty() ? std::vector<std::string>{"(no words)"} : words,
                                                 lettering, width - 2 * gap);
  const int title_h = (int)title.size() * lettering.line + gap, key_h = 2 * lettering.line;
  const double height = title_h + rows * (ph + lettering.line) + (rows + 1) * gap + key_h;
  if ((double)width * height > kMaxOverlayPixels)
    throw Error("overlay: " + std::to_string(width) + "x" + std::to_string((long long)height) +
                " pixels is too large (at most 100 million); use a smaller panel or fewer columns");

  cv::Mat photo;
  cv::resize(bgr, photo, cv::Size(pw, ph), 0, 0,
             pw < bgr.cols ? cv::INTER_AREA : cv::INTER_LINEAR);
  cv::Mat input = photo.clone();
  draw_marks(input, opt.marks, lettering);
  std::vector<cv::Mat> panels{labelled(input, "photo", "", lettering)};
  for (size_t k = 0; k < words.size(); ++k) {
    if ((int)alphas[k].size() != gh * gw) throw Error("overlay: attention map has the wrong size");
    const cv::Mat map(gh, gw, CV_32F, const_cast<float*>(alphas[k].data()));
    double peak = 0;
    cv::minMaxLoc(map, nullptr, &peak);
    cv::Mat panel = heat_over(photo, map, opt.heat_opacity);
    if (k < locations.size() && locations[k] >= 0 && locations[k] < gh * gw) outline_cell(panel, locations[k], gh, gw);
    panels.push_back(labelled(panel, words[k], peak > 0 ? percent(peak) : "", lettering));
  }

  cv::Mat out((int)height, width, CV_8UC3, kPaper);
  for (size_t i = 0; i < title.size(); ++i)
    lettering.put(out, title[i], cv::Point(gap, (int)((i + 0.75) * lettering.line) + gap / 2), kInk, 1.15);
  for (size_t k = 0; k < panels.size(); ++k) {
    const int r = (int)k / cols, c = (int)k % cols;
    panels[k].copyTo(out(cv::Rect(gap + c * (pw + gap), title_h + gap + r * (panels[k].rows + gap), pw,
                                  panels[k].rows)));
  }
  colour_key(width, lettering).copyTo(out(cv::Rect(0, out.rows - key_h, width, key_h)));
  return out;
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
