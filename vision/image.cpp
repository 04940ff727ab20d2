#include "vision/image.hpp"

#include <cctype>
#include <climits>
#include <cstring>
#include <string_view>

#include <opencv2/imgcodecs.hpp>
#include <opencv2/imgproc.hpp>

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

cv::Mat load_image_bgr(const std::string& path) {
  const std::string bytes = read_file(path);  // names the file if it is missing or unreadable
  return decode_image_bgr(bytes.data(), bytes.size(), path);
}

cv::Mat decode_image_bgr(const char* data, size_t size, const std::string& name) {
  const std::string_view bytes(data, data ? size : 0);
  if (bytes.empty()) fail(name, "empty file, not an image");
  if (!photo_format(bytes))
    fail(name, "cannot decode image (not a JPEG, PNG, WebP, BMP, TIFF or PNM file: corrupt or another format)");
  // libjpeg decodes a truncated JPEG with a warning, the missing rows grey: a caption of half a photo. A whole JPEG
  // ends with the end-of-image marker (FF D9), give or take trailing padding.
  if (bytes.size() >= 3 && (unsigned char)bytes[0] == 0xFF && (unsigned char)bytes[1] == 0xD8 &&
      (unsigned char)bytes[2] == 0xFF) {
    size_t end = bytes.size();
    while (end > 2 && (bytes[end - 1] == '\0' || bytes[end - 1] == '\n' || bytes[end - 1] == '\r' || bytes[end - 1] == ' '))
      --end;
    if (!((unsigned char)bytes[end - 2] == 0xFF && (unsigned char)bytes[end - 1] == 0xD9))
      fail(name, "truncated JPEG (" + std::to_string(bytes.size()) + " bytes, no end-of-image marker)");
  }
  if (bytes.size() > (size_t)INT_MAX) fail(name, "image of " + std::to_string(bytes.size()) + " bytes is too large");
  const cv::Mat raw(1, (int)bytes.size(), CV_8UC1, const_cast<char*>(bytes.data()));  // imdecode only reads it
  cv::Mat img;
  try {
    img = cv::imdecode(raw, cv::IMREAD_COLOR);
  } catch (const cv::Exception&) {
    img.release();
  }
  if (img.empty() || img.rows < 1 || img.cols < 1) fail(name, "cannot decode image (corrupt or not an image)");
  return img;
}

void image_to_planes(const cv::Mat& bgr, int size, const float mean[3], const float stdev[3], float* out) {
  cv::Mat resized;
  if (bgr.rows == size && bgr.cols == size) {
    resized = bgr;
  } else {
    bool shrink = bgr.rows > size || bgr.cols > size;
    cv::resize(bgr, resized, cv::Size(size, size), 0, 0, shrink ? cv::INTER_AREA : cv::INTER_LINEAR);
  }
  const size_t plane = (size_t)size * size;
  for (int y = 0; y < size; ++y) {
    const cv::Vec3b* row = resized.ptr<cv::Vec3b>(y);
    for (int x = 0; x < size; ++x)
      for (int c = 0; c < 3; ++c)  // BGR -> RGB
        out[c * plane + (size_t)y * size + x] = (row[x][2 - c] / 255.f - mean[c]) / stdev[c];
  }
}

}  // namespace sat
