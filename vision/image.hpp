// Pixels in: decode, resize, normalize (OpenCV). The encoder never sees anything but these planes.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include <opencv2/core.hpp>

#include "datasets/sat/error.hpp"

namespace sat {

// The most pixels a photo may declare (600 MB as BGR): a larger header is refused before any decoder allocates.
constexpr uint64_t kMaxImagePixels = 200'000'000;

// Decoded pixels in flight, process-wide: before a decoder allocates, a decode reserves the pixels the header
// declares (3x for GIF, whose decoder holds 9 bytes a pixel) from one budget, and waits while the budget cannot
// hold them; so photos decoded at once (a server's requests, a caption run's threads) hold at most the budget's
// pixels, whatever their files declare. A photo declaring more than the whole budget is an Error naming it.
// The reservation ends when the decode returns, or, handed to the caller as a PixelHold, when that is released
// (a server keeps it until the network has taken the pixels).
class PixelHold {
 public:
  PixelHold() = default;
  PixelHold(PixelHold&& other) noexcept : pixels_(other.pixels_) { other.pixels_ = 0; }
  PixelHold& operator=(PixelHold&& other) noexcept;
  ~PixelHold() { release(); }
  uint64_t pixels() const { return pixels_; }
  void release();

 private:
  friend PixelHold reserve_pixels(uint64_t, const std::string&, bool);
  uint64_t pixels_ = 0;
};
// The budget (kMaxImagePixels until set; at least 1) and what is reserved now.
void set_pixel_budget(uint64_t pixels);
uint64_t pixel_budget();
uint64_t pixels_in_flight();
// What a decode told not to wait throws while others hold too much of the budget (a server answers 503).
struct ImageBusy : Error {
  using Error::Error;
};
// Reserves `pixels` for `name`: waits for them (wait), or throws ImageBusy; an Error when over the whole budget.
PixelHold reserve_pixels(uint64_t pixels, const std::string& name, bool wait);

// What a decode lets through. A damaged JPEG or PNG (cut short, corrupt data, a failed checksum: vision/damage.hpp
// says what is detectable) is an Error unless allow_damaged; the decoder then fills what is missing with grey.
// wait_for_budget: wait for the pixel budget to hold the photo, or (false) throw ImageBusy at once.
struct DecodeOptions {
  bool allow_damaged = false;
  bool wait_for_budget = true;
};

// The Error a damaged photo throws (one DecodeOptions::allow_damaged would read), so that a front end can say how.
struct DamagedImage : Error {
  using Error::Error;
};

// Decodes an image file as 8-bit BGR; a missing, empty, damaged or undecodable file, one that is not a regular file,
// or one declaring more than kMaxImagePixels, is an Error naming it.
cv::Mat load_image_bgr(const std::string& path, const DecodeOptions& options = {});
// The same from an encoded image in memory (the file's bytes); `name` stands for the file in errors. With `hold`,
// the pixels stay reserved in it after the return.
cv::Mat decode_image_bgr(const char* data, size_t size, const std::string& name, const DecodeOptions& options = {},
                         PixelHold* hold = nullptr);

// Resizes to size x size and writes planar RGB floats ((x/255 - mean) / std) into out (3*size*size).
void image_to_planes(const cv::Mat& bgr, int size, const float mean[3], const float stdev[3], float* out);
// The same without normalization: planar RGB values 0..255 as they are (what the object detector takes).
void image_to_rgb255_planes(const cv::Mat& bgr, int size, float* out);

}  // namespace sat
