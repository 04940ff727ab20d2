#include "vision/image.hpp"

#include <cctype>
#include <climits>
#include <cstdint>
#include <cstring>
#include <optional>
#include <string_view>

#include <opencv2/imgcodecs.hpp>  // its constants; the codecs: datasets/image_codecs.hpp
#include <opencv2/imgproc.hpp>

#include "datasets/image_codecs.hpp"
#include "datasets/io.hpp"

namespace sat {

// The photo formats sat decodes, by their leading bytes. OpenCV would also hand other files to the decoders it was
// built with (Debian's: DICOM through GDCM, JPEG 2000, OpenEXR, Radiance HDR, Sun raster, GDAL's formats), and some
// of those abort the whole process on a malformed file (fuzzing found GDCM's assert on a corrupt DICOM preamble):
// a caption run over a folder would die on one bad file. Photos come as these.
static const char* photo_format(std::string_view b) {
  auto starts = [&](const char* magic, size_t n, size_t at = 0) {
    return b.size() >= at + n && std::memcmp(b.data() + at, magic, n) == 0;
  };
  if (starts("\xFF\xD8\xFF", 3)) return "JPEG";
  if (starts("\x89PNG\r\n\x1A\n", 8)) return "PNG";
  if (starts("RIFF", 4) && starts("WEBP", 4, 8)) return "WebP";
  if (starts("BM", 2)) return "BMP";
  if (starts("II*\0", 4) || starts("MM\0*", 4)) return "TIFF";
  if (b.size() >= 3 && b[0] == 'P' && b[1] >= '1' && b[1] <= '6' && std::isspace((unsigned char)b[2])) return "PNM";
  return nullptr;
}

namespace {

uint32_t be16(std::string_view b, size_t at) {
  return (uint32_t)(uint8_t)b[at] << 8 | (uint8_t)b[at + 1];
}
uint32_t le16(std::string_view b, size_t at) {
  return (uint32_t)(uint8_t)b[at + 1] << 8 | (uint8_t)b[at];
}
uint32_t be32(std::string_view b, size_t at) {
  return be16(b, at) << 16 | be16(b, at + 2);
}
uint32_t le32(std::string_view b, size_t at) {
  return le16(b, at + 2) << 16 | le16(b, at);
}
uint32_t le24(std::string_view b, size_t at) {
  return (uint32_t)(uint8_t)b[at + 2] << 16 | le16(b, at);
}

struct PixelSize {
  uint64_t width = 0, height = 0;
};

// The size a JPEG declares in its first start-of-frame marker (any of SOF0-15), read past the segments before it.
std::optional<PixelSize> jpeg_size(std::string_view b) {
  size_t at = 2;
  while (at + 4 <= b.size()) {
    if ((uint8_t)b[at] != 0xFF) return std::nullopt;
    while (at < b.size() && (uint8_t)b[at] == 0xFF) ++at;  // fill bytes
    if (at + 3 > b.size()) return std::nullopt;
    const uint8_t marker = (uint8_t)b[at++];
    if (marker == 0x01 || (marker >= 0xD0 && marker <= 0xD8)) continue;  // markers without a segment
    if (marker == 0xD9 || marker == 0xDA) return std::nullopt;           // image data before any frame header
    const uint32_t length = be16(b, at);
    if (length < 2) return std::nullopt;
    const bool frame = marker >= 0xC0 && marker <= 0xCF && marker != 0xC4 && marker != 0xC8 && marker != 0xCC;
    if (frame) {
      if (length < 7 || at + 7 > b.size()) return std::nullopt;
      return PixelSize{be16(b, at + 5), be16(b, at + 3)};
    }
    at += length;
  }
  return std::nullopt;
}

// The first image's size in a TIFF file's first directory (ImageWidth 256, ImageLength 257), as libtiff reads it.
std::optional<PixelSize> tiff_size(std::string_view b) {
  const bool little = b[0] == 'I';
  auto u16 = [&](size_t at) { return little ? le16(b, at) : be16(b, at); };
  auto u32 = [&](size_t at) { return little ? le32(b, at) : be32(b, at); };
  if (b.size() < 8) return std::nullopt;
  const size_t dir = u32(4);
  if (dir + 2 > b.size()) return std::nullopt;
  const size_t entries = u16(dir);
  std::optional<uint64_t> width, height;
  for (size_t i = 0; i < entries; ++i) {
    const size_t e = dir + 2 + 12 * i;
    if (e + 12 > b.size()) return std::nullopt;
    const uint32_t tag = u16(e), type = u16(e + 2);
    if (tag != 256 && tag != 257) continue;
    if (type != 3 && type != 4) return std::nullopt;  // SHORT or LONG
    const uint64_t value = type == 3 ? u16(e + 8) : u32(e + 8);
    (tag == 256 ? width : height) = value;
  }
  if (!width || !height) return std::nullopt;
  return PixelSize{*width, *height};
}

// Width and height after "P1".."P6": decimal numbers separated by whitespace and # comments.
std::optional<PixelSize> pnm_size(std::string_view b) {
  size_t at = 2;
  auto number = [&]() -> std::optional<uint64_t> {
    while (at < b.size() && (std::isspace((unsigned char)b[at]) || b[at] == '#')) {
      if (b[at] == '#')
        while (at < b.size() && b[at] != '\n' && b[at] != '\r') ++at;
      else
        ++at;
    }
    uint64_t v = 0;
    size_t digits = 0;
    for (; at < b.size() && std::isdigit((unsigned char)b[at]); ++at, ++digits) {
      if (digits == 12) return std::nullopt;
      v = v * 10 + (uint64_t)(b[at] - '0');
    }
    if (digits == 0) return std::nullopt;
    return v;
  };
  const auto width = number();
  if (!width) return std::nullopt;
  const auto height = number();
  if (!height) return std::nullopt;
  return PixelSize{*width, *height};
}

// The size an image file declares in its header, before any decoder allocates for it.
std::optional<PixelSize> declared_size(std::string_view b, const std::string& format) {
  if (format == "JPEG") return jpeg_size(b);
  if (format == "PNG") {
    if (b.size() < 24 || b.substr(12, 4) != "IHDR") return std::nullopt;
    return PixelSize{be32(b, 16), be32(b, 20)};
  }
  if (format == "WebP") {
    if (b.size() < 30) return std::nullopt;
    const std::string_view chunk = b.substr(12, 4);
    if (chunk == "VP8X") return PixelSize{le24(b, 24) + 1ull, le24(b, 27) + 1ull};
    if (chunk == "VP8L") {
      const uint32_t bits = le32(b, 21);  // after the 0x2F signature: 14 bits width - 1, 14 bits height - 1
      return PixelSize{(bits & 0x3FFF) + 1ull, ((bits >> 14) & 0x3FFF) + 1ull};
    }
    if (chunk == "VP8 ") return PixelSize{le16(b, 26) & 0x3FFFu, le16(b, 28) & 0x3FFFu};
    return std::nullopt;
  }
  if (format == "BMP") {
    if (b.size() < 26) return std::nullopt;
    if (le32(b, 14) == 12) return PixelSize{le16(b, 18), le16(b, 20)};  // OS/2 core header: 16-bit sizes
    const int32_t height = (int32_t)le32(b, 22);                        // negative: rows stored top-down
    return PixelSize{le32(b, 18), height < 0 ? 0ull - (uint64_t)(int64_t)height : (uint64_t)height};
  }
  if (format == "TIFF") return tiff_size(b);
  if (format == "PNM") return pnm_size(b);
  return std::nullopt;
}

}  // namespace

cv::Mat load_image_bgr(const std::string& path) {
  const std::string bytes = read_file(path);  // names the file if it is missing or unreadable
  return decode_image_bgr(bytes.data(), bytes.size(), path);
}

cv::Mat decode_image_bgr(const char* data, size_t size, const std::string& name) {
  const std::string_view bytes(data, data ? size : 0);
  if (bytes.empty()) fail(name, "empty file, not an image");
  const char* format = photo_format(bytes);
  if (!format)
    fail(name, "cannot decode image (not a JPEG, PNG, WebP, BMP, TIFF or PNM file: corrupt or another format)");
  // A decoder allocates the pixels its header declares before it reads them: 15 bytes of PBM header made OpenCV ask
  // for 3 GB (found by fuzzing). The size is read here first and held to kMaxImagePixels.
  const std::optional<PixelSize> size_declared = declared_size(bytes, format);
  if (!size_declared) fail(name, std::string("cannot decode image (corrupt ") + format + " header)");
  if (size_declared->width == 0 || size_declared->height == 0)
    fail(name, "cannot decode image (its header declares " + std::to_string(size_declared->width) + "x" +
                   std::to_string(size_declared->height) + " pixels)");
  if (size_declared->width > kMaxImagePixels / size_declared->height)
    fail(name, "image of " + std::to_string(size_declared->width) + "x" + std::to_string(size_declared->height) +
                   " pixels is too large (at most " + std::to_string(kMaxImagePixels / 1000000) + " megapixels)");
  // libjpeg decodes a truncated JPEG with a warning, the missing rows grey: a caption of half a photo. A whole JPEG
  // ends with the end-of-image marker (FF D9), give or take trailing padding.
  if (bytes.size() >= 3 && (unsigned char)bytes[0] == 0xFF && (unsigned char)bytes[1] == 0xD8 &&
      (unsigned char)bytes[2] == 0xFF) {
    size_t end = bytes.size();
    while (end > 2 &&
           (bytes[end - 1] == '\0' || bytes[end - 1] == '\n' || bytes[end - 1] == '\r' || bytes[end - 1] == ' '))
      --end;
    if (!((unsigned char)bytes[end - 2] == 0xFF && (unsigned char)bytes[end - 1] == 0xD9))
      fail(name, "truncated JPEG (" + std::to_string(bytes.size()) + " bytes, no end-of-image marker)");
  }
  // OpenCV chooses its decoder by its own signature checks, and its DICOM reader (GDCM) claims any file with "DICM"
  // at byte 128, whatever its first bytes say, then aborts the process on a malformed one (found by fuzzing: a WebP
  // header, then "DICM"). No photo format here puts those bytes there by design.
  if (bytes.size() >= 132 && bytes.substr(128, 4) == "DICM")
    fail(name, std::string("cannot decode image (a ") + format + " header, but a DICOM signature at byte 128)");
  if (bytes.size() > (size_t)INT_MAX) fail(name, "image of " + std::to_string(bytes.size()) + " bytes is too large");
  const cv::Mat raw(1, (int)bytes.size(), CV_8UC1, const_cast<char*>(bytes.data()));  // imdecode only reads it
  cv::Mat img;
  try {
    img = decode_image(raw, cv::IMREAD_COLOR);
  } catch (const cv::Exception&) {
    img.release();
  }
  if (img.empty() || img.rows < 1 || img.cols < 1) fail(name, "cannot decode image (corrupt or not an image)");
  return img;
}

// The photo at size x size: as it is when it has that size, else shrunk by pixel area or enlarged bilinearly.
static cv::Mat resized_to(const cv::Mat& bgr, int size) {
  if (bgr.rows == size && bgr.cols == size) return bgr;
  cv::Mat resized;
  const bool shrink = bgr.rows > size || bgr.cols > size;
  cv::resize(bgr, resized, cv::Size(size, size), 0, 0, shrink ? cv::INTER_AREA : cv::INTER_LINEAR);
  return resized;
}

void image_to_planes(const cv::Mat& bgr, int size, const float mean[3], const float stdev[3], float* out) {
  const cv::Mat resized = resized_to(bgr, size);
  const size_t plane = (size_t)size * size;
  for (int y = 0; y < size; ++y) {
    const cv::Vec3b* row = resized.ptr<cv::Vec3b>(y);
    for (int x = 0; x < size; ++x)
      for (int c = 0; c < 3; ++c)  // BGR -> RGB
        out[c * plane + (size_t)y * size + x] = (row[x][2 - c] / 255.f - mean[c]) / stdev[c];
  }
}

void image_to_rgb255_planes(const cv::Mat& bgr, int size, float* out) {
  const cv::Mat resized = resized_to(bgr, size);
  const size_t plane = (size_t)size * size;
  for (int y = 0; y < size; ++y) {
    const cv::Vec3b* row = resized.ptr<cv::Vec3b>(y);
    for (int x = 0; x < size; ++x)
      for (int c = 0; c < 3; ++c) out[c * plane + (size_t)y * size + x] = row[x][2 - c];
  }
}

}  // namespace sat
