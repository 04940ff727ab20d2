// Attention maps drawn over the image, one panel per generated word, all panels in one picture with the caption as
// its title and a colour key.
#pragma once
#include <string>
#include <vector>

#include <opencv2/core.hpp>

namespace sat {

struct OverlayOptions {
  int panel = 224;  // the longer side of each panel in pixels (the photo keeps its aspect ratio); 32..2048
  int columns = 5;  // panels per row; 1..64
  // Opacity of the heat where the word's attention peaks; elsewhere it falls with the weight, so places the model
  // did not look at show the photo untouched.
  double heat_opacity = 0.65;
  // Labelled points drawn on the input panel (the objects found: "dog 0.37" where its heat peaks), at fractions of
  // the image's width and height.
  struct Mark {
    std::string label;
    float x = 0, y = 0;
  };
  std::vector<Mark> marks;
};

// The sizes OverlayOptions accepts (sat attend checks its flags against them; attention_overlay throws outside).
constexpr int kMinOverlayPanel = 32, kMaxOverlayPanel = 2048, kMaxOverlayColumns = 64;

// alphas[k] holds grid_h*grid_w weights for words[k] (row-major; the grid covers the whole image). The first panel
// is the image itself; word k's panel shows its weights, upsampled bilinearly and divided by their largest, in the
// 'inferno' colour map blended over the photo with opacity heat_opacity * weight / largest; under it the word and
// its largest weight as a percentage. locations (hard attention), when given, holds the grid cell each word's
// glimpse was taken at: its square is outlined. Without attention (all-zero maps) the panels show the image with
// the word. The title is the caption (the words joined); the key under the panels maps colour to weight.
cv::Mat attention_overlay(const cv::Mat& bgr, const std::vector<std::vector<float>>& alphas,
                          const std::vector<std::string>& words, int grid_h, int grid_w, const OverlayOptions& opt = {},
                          const std::vector<int>& locations = {});

// The 'inferno' colour (BGR) for v in [0, 1]: the colour map of the overlay, the HTML report and the web page.
cv::Vec3b inferno_bgr(double v);

// Writes 8-bit BGR or grey pixels atomically, through stb; the format follows the extension (.png, .jpg or .jpeg,
// quality 95).
void write_image(const std::string& path, const cv::Mat& img);

}  // namespace sat
