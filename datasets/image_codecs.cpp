#include "datasets/image_codecs.hpp"

#include <dlfcn.h>

#include <mutex>

#include "datasets/io.hpp"

#ifndef SAT_IMGCODECS_LIBRARY
#define SAT_IMGCODECS_LIBRARY "libopencv_imgcodecs.so.406"
#endif

namespace sat {

// The Itanium C++ ABI name of cv::imdecode(InputArray, int) (OpenCV 4).
const char* const kImdecodeSymbol = "_ZN2cv8imdecodeERKNS_11_InputArrayEi";

const char* image_codecs_library() {
  return SAT_IMGCODECS_LIBRARY;
}

namespace {

using Imdecode = cv::Mat (*)(const cv::_InputArray&, int);

struct Codecs {
  std::once_flag loaded;
  Imdecode imdecode = nullptr;
};

Codecs& codecs() {
  static Codecs c;
  return c;
}

// The codecs, loaded on the first call (by whichever thread comes first; the others wait for it).
const Codecs& loaded_codecs() {
  Codecs& c = codecs();
  std::call_once(c.loaded, [&c] {
    const char* name = image_codecs_library();
    // Kept open for the life of the process (OpenCV's codecs hold global state of their own).
    void* lib = ::dlopen(name, RTLD_NOW | RTLD_LOCAL);
    if (!lib) {
      const char* why = ::dlerror();
      throw Error(std::string("cannot load OpenCV's image codecs (") + name + "): " + (why ? why : "dlopen failed"));
    }
    auto dec = reinterpret_cast<Imdecode>(::dlsym(lib, kImdecodeSymbol));
    if (!dec)
      throw Error(std::string("OpenCV's image codecs (") + name + ") lack cv::imdecode: another OpenCV than sat " +
                  "was built with?");
    c.imdecode = dec;
  });  // a throw leaves the flag unset: the next call tries again and reports the same reason
  return c;
}

}  // namespace

void load_image_codecs() {
  loaded_codecs();
}

cv::Mat decode_image(const cv::Mat& bytes, int flags) {
  return loaded_codecs().imdecode(bytes, flags);
}

}  // namespace sat
