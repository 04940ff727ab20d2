// Image decoding: the bytes of a photo a user gives `sat caption`, through stb (compiled into sat, so instrumented and
// covered here) or OpenCV's codecs (WebP, TIFF, other PNM: not instrumented), then resized into the encoder's planes
// as captioning does.
#include <vector>

#include "tests/fuzz/fuzz_common.hpp"
#include "vision/image.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string path = fuzz::write_input("photo", data, size);
  fuzz::expect_clean([&] {
    cv::Mat img = sat::load_image_bgr(path);
    const float mean[3] = {0.5f, 0.5f, 0.5f}, stdev[3] = {0.25f, 0.25f, 0.25f};
    std::vector<float> planes(3 * 32 * 32);
    sat::image_to_planes(img, 32, mean, stdev, planes.data());
  });
  return 0;
}
