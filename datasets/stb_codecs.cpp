#include "datasets/stb_codecs.hpp"

#include <climits>
#include <cstdlib>

#include <opencv2/imgproc.hpp>

#include "datasets/io.hpp"

// The implementation, compiled here (datasets/stb_codecs.hpp says why). Static: nothing of stb's leaves this file.
#define STB_IMAGE_IMPLEMENTATION
#define STB_IMAGE_STATIC
#define STBI_ONLY_JPEG
#define STBI_ONLY_PNG
#define STBI_ONLY_BMP
#define STBI_ONLY_GIF
#define STBI_ONLY_PNM
#define STBI_NO_STDIO
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"  // stb's context, which GCC cannot follow through its setup
#endif
#include <stb/stb_image.h>
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic pop
#endif

#define STB_IMAGE_WRITE_IMPLEMENTATION
#define STB_IMAGE_WRITE_STATIC
#define STBI_WRITE_NO_STDIO
// The JPEG writer's bit buffer is a signed int shifted left past its sign bit (defined in C++20, and what every
// compiler does): the sanitizer builds would abort on every JPEG written. Exempted from that one check, in the
// writer only; the reader keeps every check.
#ifdef __clang__
#pragma clang attribute push(__attribute__((no_sanitize("shift-base"))), apply_to = function)
#endif
#include <stb/stb_image_write.h>
#ifdef __clang__
#pragma clang attribute pop
#endif

namespace sat {

namespace {

std::string reason() {
  const char* r = stbi_failure_reason();
  return r ? r : "unknown reason";
}

bool fits_int(std::string_view bytes) {
  return bytes.size() <= (size_t)INT_MAX;
}

// RGB(A) or grey pixels the way stb wants them: rows packed, red first.
cv::Mat rgb_for_stb(const cv::Mat& image, const char* what) {
  if (image.empty()) throw Error(std::string(what) + ": no pixels to write");
  if (image.type() == CV_8UC1) return image.isContinuous() ? image : image.clone();
  if (image.type() != CV_8UC3)
    throw Error(std::string(what) + ": can write 8-bit grey or BGR pixels, not " + cv::typeToString(image.type()));
  cv::Mat rgb;
  cv::cvtColor(image, rgb, cv::COLOR_BGR2RGB);
  return rgb;
}

}  // namespace

bool stb_declared_size(std::string_view bytes, int& width, int& height) {
  int comp = 0;
  return fits_int(bytes) &&
         stbi_info_from_memory((const stbi_uc*)bytes.data(), (int)bytes.size(), &width, &height, &comp);
}

cv::Mat stb_decode_bgr(std::string_view bytes, std::string* why) {
  int w = 0, h = 0, comp = 0;
  stbi_uc* rgb = fits_int(bytes)
                     ? stbi_load_from_memory((const stbi_uc*)bytes.data(), (int)bytes.size(), &w, &h, &comp, 3)
                     : nullptr;
  if (!rgb) {
    if (why) *why = fits_int(bytes) ? reason() : "too many bytes";
    return cv::Mat();
  }
  cv::Mat bgr;
  try {
    cv::cvtColor(cv::Mat(h, w, CV_8UC3, rgb), bgr, cv::COLOR_RGB2BGR);
  } catch (...) {
    stbi_image_free(rgb);
    throw;
  }
  stbi_image_free(rgb);
  return bgr;
}

std::string encode_png(const cv::Mat& image) {
  const cv::Mat pixels = rgb_for_stb(image, "PNG");
  int len = 0;
  unsigned char* png =
      stbi_write_png_to_mem(pixels.data, (int)pixels.step, pixels.cols, pixels.rows, pixels.channels(), &len);
  if (!png)
    throw Error("PNG: stb_image_write could not encode " + std::to_string(pixels.cols) + "x" +
                std::to_string(pixels.rows) + " pixels (out of memory?)");
  std::string out((const char*)png, (size_t)len);
  STBIW_FREE(png);
  return out;
}

std::string encode_jpeg(const cv::Mat& image, int quality) {
  const cv::Mat pixels = rgb_for_stb(image, "JPEG");
  std::string out;
  auto append = [](void* to, void* data, int size) { static_cast<std::string*>(to)->append((const char*)data, size); };
  if (!stbi_write_jpg_to_func(append, &out, pixels.cols, pixels.rows, pixels.channels(), pixels.data, quality))
    throw Error("JPEG: stb_image_write could not encode " + std::to_string(pixels.cols) + "x" +
                std::to_string(pixels.rows) + " pixels");
  return out;
}

}  // namespace sat
