#include "datasets/image_codecs.hpp"

#include <dlfcn.h>

#include <mutex>

#include "datasets/io.hpp"

#ifndef SAT_IMGCODECS_LIBRARY
#define SAT_IMGCODECS_LIBRARY "libopencv_imgcodecs.so.406"
#endif

namespace sat {

// The Itanium C++ ABI names of cv::imdecode(InputArray, int) and cv::imencode(const String&, InputArray,
// std::vector<uchar>&, const std::vector<int>&) (OpenCV 4, the C++11 string ABI).
const char* const kImdecodeSymbol = "_ZN2cv8imdecodeERKNS_11_InputArrayEi";
const char* const kImencodeSymbol =
    "_ZN2cv8imencodeERKNSt7__cxx1112basic_stringIcSt11char_traitsIcESaIcEEERKNS_11_InputArrayERSt6vectorIhSaIhEERKSB_"
    "IiSaIiEE";

const char* image_codecs_library() {
  return SAT_IMGCODECS_LIBRARY;
}

namespace {

using Imdecode = cv::Mat (*)(const cv::_InputArray&, int);
using Imencode = bool (*)(const std::string&, const cv::_InputArray&, std::vector<unsigned char>&,
                          const std::vector<int>&);

struct Codecs {
  std::once_flag loaded;
  Imdecode imdecode = nullptr;
  Imencode imencode = nullptr;
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
    auto enc = reinterpret_cast<Imencode>(::dlsym(lib, kImencodeSymbol));
    if (!dec || !enc)
      throw Error(std::string("OpenCV's image codecs (") + name + ") lack cv::imdecode or cv::imencode: another " +
                  "OpenCV than sat was built with?");
    c.imdecode = dec, c.imencode = enc;
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

bool encode_image(const std::string& ext, const cv::Mat& image, std::vector<unsigned char>& out,
                  const std::vector<int>& params) {
  return loaded_codecs().imencode(ext, image, out, params);
}

}  // namespace sat
