// The pixels the reference figures were computed from: photos decoded by libjpeg (OpenCV's imdecode), as the PyTorch
// reference (tools/resnet-reference.py) and the detector's shared README did. sat reads JPEG with stb, whose inverse
// DCT and chroma upsampling round differently (values up to 3 levels apart on 2-6% of them): enough to move a deep
// network's outputs far past the tolerances of checks that the network computes the reference's function. Those
// checks feed it these pixels; the decoders' agreement is checked on its own (test_images.cpp).
#pragma once
#include <string>

#include <opencv2/core.hpp>
#include <opencv2/imgcodecs.hpp>

#include "datasets/io.hpp"

namespace sat::test {

inline cv::Mat load_reference_pixels(const std::string& path) {
  const std::string bytes = read_file(path);
  cv::Mat img = cv::imdecode(cv::Mat(1, (int)bytes.size(), CV_8UC1, (void*)bytes.data()), cv::IMREAD_COLOR);
  if (img.empty()) throw Error(path + ": OpenCV cannot decode it");
  return img;
}

}  // namespace sat::test
