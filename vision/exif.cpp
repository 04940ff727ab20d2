#include "vision/exif.hpp"

#include <cstdint>
#include <cstring>

namespace sat {

namespace {

// The orientation in a TIFF structure (EXIF's container): tag 0x0112 of the first directory, a SHORT.
int tiff_orientation(std::string_view t) {
  if (t.size() < 8) return 1;
  const bool little = t[0] == 'I' && t[1] == 'I';
  if (!little && !(t[0] == 'M' && t[1] == 'M')) return 1;
  auto u16 = [&](size_t at) -> uint32_t {
    const uint32_t a = (uint8_t)t[at], b = (uint8_t)t[at + 1];
    return little ? b << 8 | a : a << 8 | b;
  };
  auto u32 = [&](size_t at) -> uint64_t { return little ? u16(at + 2) << 16 | u16(at) : u16(at) << 16 | u16(at + 2); };
  if (u16(2) != 42) return 1;
  const uint64_t dir = u32(4);
  if (dir + 2 > t.size()) return 1;
  const uint64_t entries = u16(dir);
  for (uint64_t i = 0; i < entries; ++i) {
    const uint64_t e = dir + 2 + 12 * i;
    if (e + 12 > t.size()) return 1;
    if (u16(e) != 0x0112) continue;
    const uint32_t value = u16(e + 2) == 3 ? u16(e + 8) : 0;  // SHORT; any other type is not a valid tag
    return value >= 1 && value <= 8 ? (int)value : 1;
  }
  return 1;
}

std::string_view without_exif_prefix(std::string_view s) {
  return s.size() >= 6 && std::memcmp(s.data(), "Exif\0\0", 6) == 0 ? s.substr(6) : s;
}

// The first APP1 segment holding EXIF, among the segments before the image data.
int jpeg_orientation(std::string_view b) {
  size_t at = 2;
  while (at + 4 <= b.size() && (uint8_t)b[at] == 0xFF) {
    const uint8_t marker = (uint8_t)b[at + 1];
    if (marker == 0xFF) {  // fill byte
      ++at;
      continue;
    }
    if (marker == 0xDA || marker == 0xD9) return 1;              // image data: no EXIF before it
    if (marker == 0x01 || (marker >= 0xD0 && marker <= 0xD8)) {  // markers without a segment
      at += 2;
      continue;
    }
    const size_t length = (uint8_t)b[at + 2] << 8 | (uint8_t)b[at + 3];
    if (length < 2 || at + 2 + length > b.size()) return 1;
    const std::string_view payload = b.substr(at + 4, length - 2);
    if (marker == 0xE1 && payload.size() >= 6 && std::memcmp(payload.data(), "Exif\0\0", 6) == 0)
      return tiff_orientation(payload.substr(6));
    at += 2 + length;
  }
  return 1;
}

// A PNG's eXIf chunk (PNG 1.5's extension), anywhere before the end.
int png_orientation(std::string_view b) {
  size_t at = 8;
  while (at + 12 <= b.size()) {
    const uint64_t length =
        (uint64_t)(uint8_t)b[at] << 24 | (uint8_t)b[at + 1] << 16 | (uint8_t)b[at + 2] << 8 | (uint8_t)b[at + 3];
    const std::string_view type = b.substr(at + 4, 4);
    if (at + 12 + length > b.size() || type == "IEND") return 1;
    if (type == "eXIf") return tiff_orientation(without_exif_prefix(b.substr(at + 8, length)));
    at += 12 + length;
  }
  return 1;
}

}  // namespace

int exif_orientation(std::string_view bytes, const char* format) {
  if (std::strcmp(format, "JPEG") == 0) return jpeg_orientation(bytes);
  if (std::strcmp(format, "PNG") == 0) return png_orientation(bytes);
  return 1;
}

void apply_exif_orientation(cv::Mat& image, int orientation) {
  // EXIF's eight: 2 mirrored, 3 upside down, 4 mirrored upside down, 5-8 the same after a transpose (6: turn 90
  // degrees clockwise, 8: counter-clockwise), as OpenCV's ApplyExifOrientation does them.
  switch (orientation) {
    case 2:
      cv::flip(image, image, 1);
      break;
    case 3:
      cv::flip(image, image, -1);
      break;
    case 4:
      cv::flip(image, image, 0);
      break;
    case 5:
      cv::transpose(image, image);
      break;
    case 6:
      cv::transpose(image, image), cv::flip(image, image, 1);
      break;
    case 7:
      cv::transpose(image, image), cv::flip(image, image, -1);
      break;
    case 8:
      cv::transpose(image, image), cv::flip(image, image, 0);
      break;
    default:
      break;
  }
}

}  // namespace sat
