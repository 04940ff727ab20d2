// Attention maps drawn over the image, one panel per generated word, all panels in one grid image.
#pragma once
#include <string>
#include <vector>

#include <opencv2/core.hpp>

namespace sat {

struct OverlayOptions {
  int panel = 224;  // panel side in pixels
  int columns = 5;
  double blend = 0.55;  // weight of the heatmap over the image
  // Labelled points drawn on the input panel (the objects found: "dog 0.37" where its heat peaks), at fractions of
  // the image's width and height.
  struct Mark {
    std::string label;
    float x = 0, y = 0;
  };
  std::vector<Mark> marks;
};

// alphas[k] holds grid_h*grid_w weights for words[k]. The first panel is the image itself. locations (hard
// attention), when given, holds the grid cell each word's glimpse was taken at: a marker is drawn there on top of
// the alpha heatmap. Without attention (all-zero maps) the panels show the image with the word.
cv::Mat attention_overlay(const cv::Mat& bgr, const std::vector<std::vector<float>>& alphas,
                          const std::vector<std::string>& words, int grid_h, int grid_w, const OverlayOptions& opt = {},
                          const std::vector<int>& locations = {});

// Writes 8-bit BGR or grey pixels atomically, through stb; the format follows the extension (.png, .jpg or .jpeg,
// quality 95).
void write_image(const std::string& path, const cv::Mat& img);

}  // namespace sat
