#include "datasets/shipped.hpp"

#include <climits>
#include <cstdlib>
#include <dlfcn.h>
#include <link.h>
#include <sys/stat.h>

namespace sat {

namespace {

std::string real_path(const char* path) {
  char buf[PATH_MAX];
  return realpath(path, buf) ? std::string(buf) : std::string();
}

// The file this code was loaded from: libsat.so when it is linked into the shared library, else the executable
// (whose link map has no name).
std::string loaded_from(bool* executable) {
  Dl_info info{};
  link_map* map = nullptr;
  if (dladdr1(reinterpret_cast<void*>(&loaded_from), &info, reinterpret_cast<void**>(&map), RTLD_DL_LINKMAP) && map &&
      map->l_name && map->l_name[0]) {
    *executable = false;
    return real_path(map->l_name);
  }
  *executable = true;
  return real_path("/proc/self/exe");
}

// <prefix>/share/sat/models when this binary is an installed one (SAT_BIN_TO_MODELS and SAT_LIB_TO_MODELS are the
// install layout's relative paths from the binary's folder); "" in the build tree.
std::string installed_models_dir() {
  bool executable = true;
  const std::string binary = loaded_from(&executable);
  const size_t slash = binary.rfind('/');
  if (slash == std::string::npos) return "";
  const std::string dir = binary.substr(0, slash) + "/" + (executable ? SAT_BIN_TO_MODELS : SAT_LIB_TO_MODELS);
  struct stat st {};
  if (stat(dir.c_str(), &st) != 0 || !S_ISDIR(st.st_mode)) return "";
  return real_path(dir.c_str());
}

const std::string& installed() {
  static const std::string dir = installed_models_dir();
  return dir;
}

}  // namespace

std::string shipped_models_dir() {
  return installed().empty() ? SAT_SOURCE_MODELS_DIR : installed();
}

std::string shipped_weights_dir() {
  return installed().empty() ? SAT_SOURCE_WEIGHTS_DIR : installed();
}

}  // namespace sat
