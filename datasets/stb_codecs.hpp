// Image files through stb (stb_image, stb_image_write; Debian's libstb-dev): JPEG, PNG, BMP, GIF and binary PNM in,
// PNG and JPEG out. Only these, so that reading a photo or writing an overlay never opens OpenCV's codecs library
// (Debian links it with GDAL: about 130 more shared libraries, 70-100 ms: datasets/image_codecs.hpp).
//
// Debian ships stb's implementation both in libstb.so and in the headers (STB_IMAGE_IMPLEMENTATION). sat compiles it
// from the headers into this one file, static: the fuzzing and sanitizer builds then instrument the decoder that
// runs (an uninstrumented libstb.so would be invisible to libFuzzer's coverage and to AddressSanitizer), the
// formats sat never hands it (PSD, TGA, HDR, PIC) are compiled out, and no stb symbol is exported from libsat.so.
// Only the calls that read no global setting of stb's are used (no flip, no unpremultiply); its failure reason is
// thread-local (a C++11 build: STBI_THREAD_LOCAL), so threads decoding at once get their own messages.
#pragma once
#include <opencv2/core.hpp>

#include <string>
#include <string_view>

namespace sat {

// The width and height an image's header declares, as stb's decoder reads it (so the size checked before decoding
// is the size the decoder will allocate for). False when stb cannot read the header.
bool stb_declared_size(std::string_view bytes, int& width, int& height);

// The image as 8-bit BGR (grey replicated, alpha dropped, 16 bits per channel taken to 8 by their high byte, as
// OpenCV's IMREAD_COLOR). An empty Mat when stb cannot decode it; *why then holds stb's reason ("bad huffman code").
cv::Mat stb_decode_bgr(std::string_view bytes, std::string* why);

// 8-bit grey or BGR pixels as PNG or JPEG file bytes (quality 1-100). Throws Error for any other pixel type.
std::string encode_png(const cv::Mat& image);
std::string encode_jpeg(const cv::Mat& image, int quality);

}  // namespace sat
