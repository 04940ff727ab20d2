// sat attend's picture: the photo keeps its shape, shows untouched where the word's attention is zero, carries the
// heat where it peaks, outlines a hard-attention glimpse, and refuses absurd sizes.
#include <doctest/doctest.h>

#include <opencv2/core.hpp>

#include "datasets/sat/error.hpp"
#include "vision/overlay.hpp"

using namespace sat;

namespace {

const cv::Vec3b kGrey(128, 128, 128);

// The top row of the first panel: the first row, from the top, whose pixel in the middle of column `x` is the grey
// photo (above it: the white title strip).
int first_photo_row(const cv::Mat& out, int x) {
  for (int y = 0; y < out.rows; ++y)
    if (out.at<cv::Vec3b>(y, x) == kGrey) return y;
  return -1;
}

}  // namespace

TEST_CASE("attention overlay: shape kept, photo untouched where the word did not look, heat where it did") {
  const cv::Mat photo(150, 300, CV_8UC3, cv::Scalar(128, 128, 128));  // twice as wide as high
  // One word on a 2x2 grid, all its weight in the top-left cell; one word with no attention at all.
  const std::vector<std::vector<float>> alphas{{1, 0, 0, 0}, {0, 0, 0, 0}};
  OverlayOptions o;
  o.panel = 200;
  o.columns = 3;
  const cv::Mat out = attention_overlay(photo, alphas, {"dog", "runs"}, 2, 2, o);
  const int gap = 6, pw = 200, ph = 100;
  REQUIRE(out.type() == CV_8UC3);
  CHECK(out.cols == 3 * pw + 4 * gap);  // three panels of the photo's shape in one row
  const int top = first_photo_row(out, gap + pw / 2);
  REQUIRE(top > 0);  // the title is above
  CHECK(out.at<cv::Vec3b>(top + ph - 1, gap + pw / 2) == kGrey);
  CHECK(out.at<cv::Vec3b>(top + ph + 2, gap + pw / 2) != kGrey);  // the panel is 100 high: its label strip under it
  bool title_ink = false;
  for (int y = 0; y < top; ++y)
    for (int x = 0; x < out.cols; ++x) title_ink |= out.at<cv::Vec3b>(y, x)[0] < 100;
  CHECK(title_ink);

  const int word_x = gap + pw + gap;  // the first word's panel
  // The far corner got no weight: the photo as it is, no tint.
  CHECK(out.at<cv::Vec3b>(top + ph - 1, word_x + pw - 1) == kGrey);
  // The top-left corner is where the weight peaks: inferno's brightest at opacity 0.65 over the grey.
  const cv::Vec3b peak = inferno_bgr(1.0), at = out.at<cv::Vec3b>(top, word_x);
  for (int c = 0; c < 3; ++c) CHECK(std::abs(at[c] - (0.35 * 128 + 0.65 * peak[c])) <= 2);
  // A word with no attention shows the photo.
  const int none_x = gap + 2 * (pw + gap);
  CHECK(out.at<cv::Vec3b>(top, none_x) == kGrey);
  CHECK(out.at<cv::Vec3b>(top + ph / 2, none_x + pw / 2) == kGrey);

  // Negative control: the same weight spread evenly tints every pixel alike, so the far corner is no longer grey.
  const cv::Mat even = attention_overlay(photo, {{0.25f, 0.25f, 0.25f, 0.25f}}, {"dog"}, 2, 2, o);
  CHECK(even.at<cv::Vec3b>(top + ph - 1, word_x + pw - 1) != kGrey);
}

TEST_CASE("attention overlay: a tall photo and a hard-attention glimpse outlined") {
  const cv::Mat photo(300, 150, CV_8UC3, cv::Scalar(128, 128, 128));
  OverlayOptions o;
  o.panel = 200;
  o.columns = 2;
  const std::vector<std::vector<float>> none{{0, 0, 0, 0}};
  const cv::Mat out = attention_overlay(photo, none, {"a"}, 2, 2, o, {3});  // the glimpse: bottom-right cell
  const int gap = 6, pw = 100, ph = 200;
  CHECK(out.cols == 2 * pw + 3 * gap);
  const int top = first_photo_row(out, gap + pw / 2), word_x = gap + pw + gap;
  REQUIRE(top > 0);
  // The cell's outline: black and white at the cell's edge, the photo inside it and in the other cells.
  const cv::Vec3b edge = out.at<cv::Vec3b>(top + ph * 3 / 4, word_x + pw / 2);
  CHECK((edge == cv::Vec3b(0, 0, 0) || edge == cv::Vec3b(255, 255, 255)));
  CHECK(out.at<cv::Vec3b>(top + ph * 3 / 4, word_x + pw * 3 / 4) == kGrey);
  CHECK(out.at<cv::Vec3b>(top + ph / 4, word_x + pw / 4) == kGrey);
}

TEST_CASE("attention overlay: bad sizes are errors") {
  const cv::Mat photo(64, 64, CV_8UC3, cv::Scalar(128, 128, 128));
  const std::vector<std::vector<float>> one{{1, 0, 0, 0}};
  OverlayOptions o;
  o.panel = 0;
  CHECK_THROWS_AS(attention_overlay(photo, one, {"a"}, 2, 2, o), Error);
  o.panel = 20000;
  CHECK_THROWS_AS(attention_overlay(photo, one, {"a"}, 2, 2, o), Error);
  o.panel = 224;
  o.columns = 0;
  CHECK_THROWS_AS(attention_overlay(photo, one, {"a"}, 2, 2, o), Error);
  o.columns = 5;
  CHECK_THROWS_AS(attention_overlay(photo, one, {"a"}, 3, 3, o), Error);  // a map of the wrong size
  CHECK_THROWS_AS(attention_overlay(photo, {}, {"a"}, 2, 2, o), Error);   // no map for the word
  CHECK_THROWS_AS(attention_overlay(cv::Mat(), one, {"a"}, 2, 2, o), Error);
  // 64 panels of 2048 pixels in a row, 40 rows: far more than any picture needs.
  o.panel = 2048;
  o.columns = 64;
  const std::vector<std::vector<float>> many(2600, std::vector<float>{1, 0, 0, 0});
  const std::vector<std::string> words(2600, "a");
  CHECK_THROWS_WITH_AS(attention_overlay(photo, many, words, 2, 2, o), doctest::Contains("too large"), Error);
}
