// The EXIF orientation of a JPEG or PNG photo, applied as OpenCV's IMREAD_COLOR applies it: a phone's portrait photo
// is stored landscape with a tag saying how to turn it, and a caption of it lying on its side is a worse caption.
#pragma once
#include <opencv2/core.hpp>

#include <string_view>

namespace sat {

// The orientation tag (1-8, EXIF's numbering) in a JPEG's APP1 "Exif" segment or a PNG's eXIf chunk; 1 (as stored)
// when there is none or it cannot be read. format: "JPEG" or "PNG" (any other: 1).
int exif_orientation(std::string_view bytes, const char* format);

// Turns or mirrors the pixels as the tag says (2-8); 1 and unknown values leave them as they are.
void apply_exif_orientation(cv::Mat& image, int orientation);

}  // namespace sat
