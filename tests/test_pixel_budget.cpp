// The decode budget (vision/image.hpp): what a header declares is reserved before the decoder allocates, a full budget
// makes a decode wait or refuse, a photo over the whole budget is refused, and a held reservation lasts until released.
#include <doctest/doctest.h>

#include <atomic>
#include <chrono>
#include <thread>

#include "datasets/stb_codecs.hpp"
#include "vision/image.hpp"

using namespace sat;

namespace {
// Restores the process-wide budget whatever a test does to it.
struct BudgetScope {
  uint64_t saved = pixel_budget();
  explicit BudgetScope(uint64_t pixels) { set_pixel_budget(pixels); }
  ~BudgetScope() { set_pixel_budget(saved); }
};
}  // namespace

TEST_CASE("pixel budget: a decode reserves its header's pixels; full means wait or ImageBusy; over it, refused") {
  const std::string png = encode_png(cv::Mat(30, 40, CV_8UC3, cv::Scalar(1, 2, 3)));  // 1200 pixels
  BudgetScope scope(2000);
  REQUIRE(pixels_in_flight() == 0);
  PixelHold held;
  cv::Mat img = decode_image_bgr(png.data(), png.size(), "a.png", {}, &held);
  CHECK(img.cols == 40);
  CHECK(held.pixels() == 1200);
  CHECK(pixels_in_flight() == 1200);
  // a second one does not fit beside it: refused at once when told not to wait
  CHECK_THROWS_AS(decode_image_bgr(png.data(), png.size(), "b.png", DecodeOptions{false, false}), ImageBusy);
  // ...and waits when told to, until the first is released
  std::atomic<bool> done{false};
  std::thread waiter([&] {
    decode_image_bgr(png.data(), png.size(), "c.png");
    done = true;
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  CHECK_FALSE(done.load());
  held.release();
  waiter.join();
  CHECK(done.load());
  CHECK(pixels_in_flight() == 0);  // without a hold, the reservation ends with the decode
  // negative control: with the budget free, the same call goes through
  CHECK_NOTHROW(decode_image_bgr(png.data(), png.size(), "d.png", DecodeOptions{false, false}));
  set_pixel_budget(1000);
  CHECK_THROWS_WITH_AS(decode_image_bgr(png.data(), png.size(), "e.png"),
                       "e.png: image of 1200 pixels to decode is over the decode budget of 1000 pixels", Error);
}
