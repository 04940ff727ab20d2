// What every libFuzzer target here shares (tests/fuzz/README.md says how to run them):
//  - the loaders read files, as users hand them over, so an input is written to a scratch file first (tmpfs when
//    there is one), and the loader is called on that path;
//  - a loader may turn an input down only with sat::Error (the one-line "sat: <file>: <problem>" the CLI prints).
//    Any other exception escapes LLVMFuzzerTestOneInput and libFuzzer reports it as a crash, like a sanitizer
//    report, a leak, a timeout or running out of memory.
#pragma once
#include <unistd.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string>

#include "datasets/io.hpp"

namespace fuzz {

// A directory of this process's own, removed at exit. (Never destroyed: the atexit handler, registered while the
// name is being made, runs after static objects constructed before it are gone.)
inline const std::string& scratch_dir() {
  static const std::string* dir = [] {
    std::string base = access("/dev/shm", W_OK) == 0 ? "/dev/shm" : "/tmp";
    auto* made = new std::string(base + "/sat-fuzz-XXXXXX");
    if (!mkdtemp(made->data())) abort();
    std::atexit([] {
      std::string cmd = "rm -rf '" + scratch_dir() + "'";
      (void)!std::system(cmd.c_str());
    });
    return made;
  }();
  return *dir;
}

// Writes bytes to scratch_dir()/name (plain write: the fuzzer is the only reader) and returns the path.
inline std::string write_input(const std::string& name, const uint8_t* data, size_t size) {
  std::string path = scratch_dir() + "/" + name;
  FILE* f = std::fopen(path.c_str(), "wb");
  if (!f) abort();
  if (size && std::fwrite(data, 1, size, f) != size) abort();
  std::fclose(f);
  return path;
}
inline std::string write_input(const std::string& name, const std::string& bytes) {
  return write_input(name, (const uint8_t*)bytes.data(), bytes.size());
}

// Splits an input at the first occurrence of `marker` (for targets that read two files: a model and its shard).
inline std::pair<std::string, std::string> split_input(const uint8_t* data, size_t size, const std::string& marker) {
  std::string all((const char*)data, size);
  size_t at = all.find(marker);
  if (at == std::string::npos) return {all, std::string()};
  return {all.substr(0, at), all.substr(at + marker.size())};
}

// Runs a load: sat::Error is a clean refusal; everything else propagates to libFuzzer.
template <class F>
void expect_clean(F&& load) {
  try {
    load();
  } catch (const sat::Error&) {
  }
}

}  // namespace fuzz
