// Test helpers for files and errors: a scratch folder removed at the end of its scope, and the message of the
// sat::Error a call throws.
#pragma once
#include <cstdlib>
#include <functional>
#include <string>
#include <unistd.h>

#include "datasets/io.hpp"

namespace sat::test {

struct TempDir {
  std::string path;
  TempDir() {
    char tmpl[] = "/tmp/sat_test_XXXXXX";
    path = mkdtemp(tmpl);
  }
  ~TempDir() { std::system(("rm -rf '" + path + "'").c_str()); }
  std::string file(const std::string& name) const { return path + "/" + name; }
  // Writes text to the file `name` in the folder; its path.
  std::string write(const std::string& name, const std::string& text) const {
    write_file_atomic(file(name), text);
    return file(name);
  }
};

// What f throws as a sat::Error ("" when it throws nothing).
inline std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

}  // namespace sat::test
