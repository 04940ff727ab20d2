#include "vision/image.hpp"

#include <cctype>
#include <climits>
#include <condition_variable>
#include <mutex>
#include <algorithm>
#include <cstdint>
#include <cstring>
#include <optional>
#include <string_view>

#include <opencv2/imgcodecs.hpp>  // its constants; the codecs: datasets/image_codecs.hpp
#include <opencv2/imgproc.hpp>

#include "datasets/image_codecs.hpp"
#include "datasets/stb_codecs.hpp"
#include "datasets/io.hpp"
#include "vision/damage.hpp"
#include "vision/exif.hpp"

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
  if (starts("GIF87a", 6) || starts("GIF89a", 6)) return "GIF";
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

// A JPEG's first start-of-frame marker (any of SOF0-15), read past the segments before it: which coding it declares
// (stb reads baseline and progressive Huffman coding, SOF0-2, at 8 bits), its sample precision and its size.
struct JpegFrame {
  uint8_t marker = 0, precision = 0;
  PixelSize size;
};
std::optional<JpegFrame> jpeg_frame(std::string_view b) {
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
      return JpegFrame{marker, (uint8_t)b[at + 2], PixelSize{be16(b, at + 5), be16(b, at + 3)}};
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

// Width, height and (but for P1 and P4) the largest value after "P1".."P6": decimal numbers separated by whitespace
// and # comments; a missing number is 0.
struct PnmHeader {
  uint64_t width = 0, height = 0, maxval = 0;
  size_t data = 0;  // where the samples start: one whitespace after the last number
};
std::optional<PnmHeader> pnm_header(std::string_view b) {
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
  const bool bitmap = b[1] == '1' || b[1] == '4';
  const auto maxval = bitmap ? std::optional<uint64_t>(1) : number();
  if (!maxval) return std::nullopt;
  return PnmHeader{*width, *height, *maxval, at + 1};
}

// The size a file for OpenCV's decoders declares in its header, before any of them allocates for it (stb's formats
// are read by stb's own header reader: stb_declared_size).
std::optional<PixelSize> opencv_declared_size(std::string_view b, const std::string& format) {
  if (format == "JPEG") {
    const auto frame = jpeg_frame(b);
    if (!frame) return std::nullopt;
    return frame->size;
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
  if (format == "TIFF") return tiff_size(b);
  if (format == "PNM") {
    const auto h = pnm_header(b);
    if (!h) return std::nullopt;
    return PixelSize{h->width, h->height};
  }
  return std::nullopt;
}

// stb reads JPEG, PNG, BMP, GIF and 8-bit binary greymaps and pixmaps (P5, P6 with values up to 255 at most);
// OpenCV's codecs, opened only for the rest (datasets/image_codecs.hpp), read WebP, TIFF, the JPEG codings stb lacks
// (arithmetic, lossless, hierarchical, 12-bit: libjpeg-turbo reads the first and the last) and the PNM files stb
// lacks or reads otherwise: bitmaps, ASCII, and 16-bit samples (stb 2.27 takes their low byte, OpenCV their high).
bool through_opencv(std::string_view b, const std::string& format) {
  if (format == "WebP" || format == "TIFF") return true;
  if (format == "JPEG") {
    const auto frame = jpeg_frame(b);
    return frame && (frame->marker > 0xC2 || frame->precision != 8);
  }
  if (format != "PNM") return false;
  const auto h = pnm_header(b);
  return !(b[1] == '5' || b[1] == '6') || !h || h->maxval > 255;
}

// max_pixels: kMaxImagePixels, or less for a decoder that needs more than the BGR result's 3 bytes a pixel.
void check_declared_size(const PixelSize& size, const std::string& name, uint64_t max_pixels = kMaxImagePixels) {
  if (size.width == 0 || size.height == 0)
    fail(name, "cannot decode image (its header declares " + std::to_string(size.width) + "x" +
                   std::to_string(size.height) + " pixels)");
  if (size.width > max_pixels / size.height)
    fail(name, "image of " + std::to_string(size.width) + "x" + std::to_string(size.height) +
                   " pixels is too large (at most " + std::to_string(max_pixels / 1000000) + " megapixels)");
}

// A whole JPEG ends with the end-of-image marker (FF D9), give or take trailing padding: the first sign of a cut file.
void check_jpeg_end(std::string_view bytes, const std::string& name) {
  size_t end = bytes.size();
  while (end > 2 &&
         (bytes[end - 1] == '\0' || bytes[end - 1] == '\n' || bytes[end - 1] == '\r' || bytes[end - 1] == ' '))
    --end;
  if (!((unsigned char)bytes[end - 2] == 0xFF && (unsigned char)bytes[end - 1] == 0xD9))
    throw DamagedImage(name + ": truncated JPEG (" + std::to_string(bytes.size()) + " bytes, no end-of-image marker)");
}

// stb decodes a cut or corrupt JPEG or PNG without an error, the missing rows grey or garbage: a caption of half a
// photo. Damage that can be seen (vision/damage.hpp) is refused unless the caller asked for the photo anyway.
void check_whole(std::string_view bytes, const char* format, const std::string& name, const DecodeOptions& options) {
  if (options.allow_damaged) return;
  const bool jpeg = std::strcmp(format, "JPEG") == 0;
  if (!jpeg && std::strcmp(format, "PNG") != 0) return;
  if (jpeg) check_jpeg_end(bytes, name);
  const std::string what = jpeg ? jpeg_damage(bytes) : png_damage(bytes);
  if (!what.empty()) throw DamagedImage(name + ": damaged " + format + ": " + what);
}

// stb 2.27 (Debian 12's) builds a Huffman table from a DHT segment's 16 code counts without checking that they sum
// to 256 at most, then writes the sizes and symbols past the table's arrays (found by tests/fuzz/fuzz_image: UBSan,
// index 257 into size[257]; kept in its corpus). Every DHT segment in the file, those between a progressive JPEG's
// scans included, is checked here before stb reads it.
bool jpeg_huffman_tables_fit(std::string_view b) {
  size_t at = 2;
  while (at + 4 <= b.size()) {
    const uint8_t marker = (uint8_t)b[at + 1];
    if ((uint8_t)b[at] != 0xFF || marker == 0xFF) {  // entropy-coded data after a scan header, or a fill byte
      ++at;
      continue;
    }
    if (marker == 0x00 || marker == 0x01 || (marker >= 0xD0 && marker <= 0xD8)) {  // a stuffed 0xFF, RSTn, SOI, TEM
      at += 2;
      continue;
    }
    if (marker == 0xD9) return true;
    const size_t length = be16(b, at + 2);
    if (marker == 0xC4) {
      // read as stb reads it: table after table while the segment's length lasts, each one's 16 counts read even
      // past the segment's end (and as 0 past the file's)
      auto byte = [&](size_t i) -> size_t { return i < b.size() ? (uint8_t)b[i] : 0; };
      int64_t left = (int64_t)length - 2;
      for (size_t t = at + 4; left > 0;) {
        size_t codes = 0;
        for (size_t i = 1; i <= 16; ++i) codes += byte(t + i);
        if (codes > 256) return false;
        t += 17 + codes;
        left -= 17 + (int64_t)codes;
      }
    }
    at += 2 + length;
  }
  return true;
}

// stb fills what a BMP or binary PNM file lacks of the pixels its header declares with zeros or leaves it
// unwritten: a cut file would be captioned (or, 64 bytes declaring 16x3997708 pixels, decoded and resized for 26 s
// under the sanitizers: found by fuzzing). The file must hold them all, as OpenCV's readers required.
void check_complete(std::string_view b, const char* format, const std::string& name) {
  uint64_t need = 0;
  if (std::strcmp(format, "PNM") == 0) {
    const auto h = pnm_header(b);
    if (!h) return;  // stb's header reader refused it already
    need = h->data + h->width * h->height * (b[1] == '6' ? 3 : 1);
  } else if (std::strcmp(format, "BMP") == 0 && b.size() >= 30) {
    const bool core = le32(b, 14) == 12;  // OS/2 core header: 16-bit sizes, no compression
    const uint64_t width = core ? le16(b, 18) : le32(b, 18);
    const int64_t h = core ? (int64_t)le16(b, 20) : (int64_t)(int32_t)le32(b, 22);
    const uint64_t bpp = core ? le16(b, 24) : le16(b, 28);
    const uint32_t compression = core || b.size() < 34 ? 0 : le32(b, 30);
    if (compression == 1 || compression == 2) return;  // RLE: stb refuses it (any other value it reads as raw rows)
    need = le32(b, 10) + (width * bpp + 31) / 32 * 4 * (uint64_t)(h < 0 ? -h : h);
  } else {
    return;
  }
  if (b.size() < need)
    fail(name, std::string("truncated ") + format + " (" + std::to_string(b.size()) + " bytes, its header declares " +
                   std::to_string(need) + ")");
}

cv::Mat decode_with_opencv(std::string_view bytes, const char* format, const std::string& name,
                           const DecodeOptions& options, PixelHold& hold) {
  const std::optional<PixelSize> size = opencv_declared_size(bytes, format);
  if (!size) fail(name, std::string("cannot decode image (corrupt ") + format + " header)");
  check_declared_size(*size, name);
  check_whole(bytes, format, name, options);
  // OpenCV chooses its decoder by its own signature checks, and its DICOM reader (GDCM) claims any file with "DICM"
  // at byte 128, whatever its first bytes say, then aborts the process on a malformed one (found by fuzzing: a WebP
  // header, then "DICM"). No photo format here puts those bytes there by design.
  if (bytes.size() >= 132 && bytes.substr(128, 4) == "DICM")
    fail(name, std::string("cannot decode image (a ") + format + " header, but a DICOM signature at byte 128)");
  if (bytes.size() > (size_t)INT_MAX) fail(name, "image of " + std::to_string(bytes.size()) + " bytes is too large");
  hold = reserve_pixels(size->width * size->height, name, options.wait_for_budget);
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

cv::Mat decode_with_stb(std::string_view bytes, const char* format, const std::string& name,
                        const DecodeOptions& options, PixelHold& hold) {
  const bool jpeg = std::strcmp(format, "JPEG") == 0;
  // before any of stb's readers: its header reader builds the Huffman tables it meets before the frame header
  if (jpeg && !jpeg_huffman_tables_fit(bytes))
    fail(name, "cannot decode image (JPEG: a Huffman table of more than 256 codes)");
  // A decoder allocates the pixels its header declares before it reads them: 15 bytes of PBM header made OpenCV ask
  // for 3 GB (found by fuzzing). The size stb's own header reader finds is held to kMaxImagePixels first. That
  // reader refuses a PNG of more than 2^30 bytes by itself: its IHDR is read here before, so that such a file is
  // named too large rather than corrupt.
  if (std::strcmp(format, "PNG") == 0 && bytes.size() >= 24 && bytes.substr(12, 4) == "IHDR")
    check_declared_size(PixelSize{be32(bytes, 16), be32(bytes, 20)}, name);
  // stb reads a PNM header's numbers into an int without a bound (UBSan: a maxval of 255555555... overflowed, found
  // by fuzzing): sat's reader, bounded, goes first, and routes only maxvals up to 255 here.
  if (std::strcmp(format, "PNM") == 0) {
    const auto h = pnm_header(bytes);
    if (!h) fail(name, "cannot decode image (corrupt PNM header)");
    check_declared_size(PixelSize{h->width, h->height}, name);
  }
  int width = 0, height = 0;
  if (!stb_declared_size(bytes, width, height))
    fail(name, std::string("cannot decode image (corrupt ") + format + " header)");
  // stb's GIF reader allocates and clears 9 bytes a pixel (the frame, the background, which pixels changed) before
  // it reads any pixel: 384 bytes of GIF declaring 164 megapixels took 1.5 GB and more than 10 s under the sanitizers
  // (found by fuzzing). Its limit holds it to the memory a 200-megapixel BGR photo takes.
  const bool gif = std::strcmp(format, "GIF") == 0;
  check_declared_size(PixelSize{(uint64_t)width, (uint64_t)height}, name, gif ? kMaxImagePixels / 3 : kMaxImagePixels);
  if (jpeg) {
    // Huffman coding spends at least one bit on every 8x8 block's DC value (a flat grey photo, progressive: 1/512 of
    // a byte a pixel). stb decodes a frame's every block however little data follows, so 948 bytes declaring
    // 65496x2828 pixels took 2.8 s and a gigabyte to refuse (found by fuzzing). Half that minimum is required.
    const uint64_t pixels = (uint64_t)width * (uint64_t)height;
    if (bytes.size() < pixels / 1024)
      fail(name, "truncated JPEG (" + std::to_string(bytes.size()) + " bytes cannot hold the " + std::to_string(width) +
                     "x" + std::to_string(height) + " pixels its header declares)");
  }
  check_complete(bytes, format, name);
  check_whole(bytes, format, name, options);
  hold = reserve_pixels((uint64_t)width * (uint64_t)height * (gif ? 3 : 1), name, options.wait_for_budget);
  std::string why;
  cv::Mat img = stb_decode_bgr(bytes, &why);
  if (img.empty()) fail(name, std::string("cannot decode image (") + format + ": " + why + ")");
  apply_exif_orientation(img, exif_orientation(bytes, format));
  return img;
}

}  // namespace

cv::Mat load_image_bgr(const std::string& path, const DecodeOptions& options) {
  const std::string bytes = read_file(path);  // names the file if it is missing, unreadable or not a regular file
  return decode_image_bgr(bytes.data(), bytes.size(), path, options);
}

cv::Mat decode_image_bgr(const char* data, size_t size, const std::string& name, const DecodeOptions& options,
                         PixelHold* hold) {
  const std::string_view bytes(data, data ? size : 0);
  if (bytes.empty()) fail(name, "empty file, not an image");
  const char* format = photo_format(bytes);
  if (!format)
    fail(name, "cannot decode image (not a JPEG, PNG, WebP, BMP, GIF, TIFF or PNM file: corrupt or another format)");
  PixelHold reserved;
  cv::Mat image = through_opencv(bytes, format) ? decode_with_opencv(bytes, format, name, options, reserved)
                                                : decode_with_stb(bytes, format, name, options, reserved);
  if (hold) *hold = std::move(reserved);
  return image;
}

namespace {
std::mutex budget_mu;
std::condition_variable budget_freed;
uint64_t budget = kMaxImagePixels, in_flight = 0;
}  // namespace

void set_pixel_budget(uint64_t pixels) {
  std::lock_guard<std::mutex> lock(budget_mu);
  budget = std::max<uint64_t>(pixels, 1);
  budget_freed.notify_all();
}
uint64_t pixel_budget() {
  std::lock_guard<std::mutex> lock(budget_mu);
  return budget;
}
uint64_t pixels_in_flight() {
  std::lock_guard<std::mutex> lock(budget_mu);
  return in_flight;
}

PixelHold reserve_pixels(uint64_t pixels, const std::string& name, bool wait) {
  std::unique_lock<std::mutex> lock(budget_mu);
  if (pixels > budget)
    fail(name, "image of " + std::to_string(pixels) + " pixels to decode is over the decode budget of " +
                   std::to_string(budget) + " pixels");
  if (!wait && in_flight + pixels > budget)
    throw ImageBusy(name + ": busy: images being decoded or captioned hold " + std::to_string(in_flight) + " of " +
                    std::to_string(budget) + " pixels; try again");
  budget_freed.wait(lock, [&] { return in_flight + pixels <= budget; });
  in_flight += pixels;
  PixelHold hold;
  hold.pixels_ = pixels;
  return hold;
}

PixelHold& PixelHold::operator=(PixelHold&& other) noexcept {
  if (this != &other) {
    release();
    pixels_ = other.pixels_;
    other.pixels_ = 0;
  }
  return *this;
}

void PixelHold::release() {
  if (pixels_ == 0) return;
  {
    std::lock_guard<std::mutex> lock(budget_mu);
    in_flight -= pixels_;
  }
  pixels_ = 0;
  budget_freed.notify_all();
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
