// OpenCV's image decoder (imdecode), loaded when first needed instead of when the program starts, for the image files
// stb cannot read: WebP, TIFF, PNM bitmaps (P1, P4), ASCII or 16-bit PNM, and JPEG codings other than 8-bit baseline
// and progressive Huffman. Everything else, and all writing, goes through stb (datasets/stb_codecs.hpp).
//
// Debian builds libopencv_imgcodecs with GDAL, so linking it loads about 130 more shared libraries and runs their
// initializers before main: 70-100 ms of a one-photo `sat caption`, paid even by commands that never read an image
// (`sat model info`, `sat eval --features`, `sat bench`, `--help`). sat links OpenCV's core and imgproc only and
// opens the codecs library by name (dlopen) the first time one of those files is read, so a JPEG or PNG never
// loads GDAL. The codecs are still OpenCV's, called through their C++ entry point.
//
// Loading it on a thread beside the model's loading was tried and dropped: while dlopen holds the dynamic
// loader's lock (the whole 70 ms), every thread the load creates waits for it (glibc allocates a new thread's TLS
// under that lock), so a photo's caption was no faster.
#pragma once
#include <opencv2/core.hpp>

namespace sat {

// Loads the codecs library now (a no-op once loaded): a server does this at start, so its first WebP or TIFF request
// does not wait for it. Throws Error when it cannot be loaded, naming it and the loader's reason.
void load_image_codecs();

// cv::imdecode(bytes, flags): an empty Mat when the bytes are not an image OpenCV reads. Throws Error when the codecs
// library cannot be loaded (naming it and the loader's reason).
cv::Mat decode_image(const cv::Mat& bytes, int flags);

// The library's file name and the symbol looked up in it (the tests check it against the linked function).
const char* image_codecs_library();
extern const char* const kImdecodeSymbol;

}  // namespace sat
