// OpenCV's image codecs (imdecode, imencode), loaded when first needed instead of when the program starts.
//
// Debian builds libopencv_imgcodecs with GDAL, so linking it loads about 130 more shared libraries and runs their
// initializers before main: 70-80 ms of the 90 ms `sat` took to start (Zen 4), paid even by commands that never
// read an image (`sat model info`, `sat eval --features`, `sat bench`, `--help`). sat links OpenCV's core and
// imgproc only and opens the codecs library by name (dlopen) the first time an image is read or written. The
// codecs are still OpenCV's, called through their C++ entry points.
//
// Loading it on a thread beside the model's loading was tried and dropped: while dlopen holds the dynamic
// loader's lock (the whole 70 ms), every thread the load creates waits for it (glibc allocates a new thread's TLS
// under that lock), so a photo's caption was no faster.
#pragma once
#include <opencv2/core.hpp>

#include <string>
#include <vector>

namespace sat {

// Loads the codecs library now (a no-op once loaded): a server does this at start, so its first request does not
// wait for it. Throws Error when it cannot be loaded, naming it and the loader's reason.
void load_image_codecs();

// cv::imdecode(bytes, flags): an empty Mat when the bytes are not an image OpenCV reads. Throws Error when the codecs
// library cannot be loaded (naming it and the loader's reason).
cv::Mat decode_image(const cv::Mat& bytes, int flags);

// cv::imencode(ext, image, out, params): false when OpenCV cannot write that format. Throws Error as decode_image.
bool encode_image(const std::string& ext, const cv::Mat& image, std::vector<unsigned char>& out,
                  const std::vector<int>& params = {});

// The library's file name and the two symbols looked up in it (the tests check them against the linked functions).
const char* image_codecs_library();
extern const char* const kImdecodeSymbol;
extern const char* const kImencodeSymbol;

}  // namespace sat
