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

// What a decode lets through. A damaged JPEG or PNG (cut short, corrupt data, a failed checksum: vision/damage.hpp
// says what is detectable) is an Error unless allow_damaged; the decoder then fills what is missing with grey.
struct DecodeOptions {
  bool allow_damaged = false;
};

// The Error a damaged photo throws (one DecodeOptions::allow_damaged would read), so that a front end can say how.
struct DamagedImage : Error {
  using Error::Error;
};

// Decodes an image file as 8-bit BGR; a missing, empty, damaged or undecodable file, one that is not a regular file,
// or one declaring more than kMaxImagePixels, is an Error naming it.
cv::Mat load_image_bgr(const std::string& path, const DecodeOptions& options = {});
// The same from an encoded image in memory (the file's bytes); `name` stands for the file in errors.
cv::Mat decode_image_bgr(const char* data, size_t size, const std::string& name, const DecodeOptions& options = {});

// Resizes to size x size and writes planar RGB floats ((x/255 - mean) / std) into out (3*size*size).
void image_to_planes(const cv::Mat& bgr, int size, const float mean[3], const float stdev[3], float* out);
// The same without normalization: planar RGB values 0..255 as they are (what the object detector takes).
void image_to_rgb255_planes(const cv::Mat& bgr, int size, float* out);

}  // namespace sat
