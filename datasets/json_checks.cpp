#include "datasets/json_checks.hpp"

#include <cmath>
#include <utility>
#include <vector>

#include "datasets/io.hpp"

namespace sat {

void require_json_numbers_in_range(const nlohmann::json& j, const std::string& path) {
  // iterative: a document nested a million deep must not overflow the stack here
  std::vector<std::pair<const nlohmann::json*, std::string>> todo{{&j, ""}};
  while (!todo.empty()) {
    auto [v, key] = todo.back();
    todo.pop_back();
    if (v->is_number_float()) {
      if (!(std::fabs(v->get<double>()) < 2147483648.0))
        fail(path, "number out of range in JSON" + (key.empty() ? std::string() : " (at \"" + key + "\")"));
    } else if (v->is_array()) {
      for (auto& e : *v) todo.emplace_back(&e, key);
    } else if (v->is_object()) {
      for (auto it = v->begin(); it != v->end(); ++it) todo.emplace_back(&it.value(), it.key());
    }
  }
}

nlohmann::json parse_json_checked(const std::string& text, const std::string& path, const std::string& what) {
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(text);
  } catch (const nlohmann::json::exception& e) {
    fail(path, what + " (" + e.what() + ")");
  }
  require_json_numbers_in_range(j, path);
  return j;
}

int32_t json_hex4(const char* p) {
  int32_t v = 0;
  for (int i = 0; i < 4; ++i) {
    const char h = p[i];
    const int d = h >= '0' && h <= '9'   ? h - '0'
                  : h >= 'a' && h <= 'f' ? h - 'a' + 10
                  : h >= 'A' && h <= 'F' ? h - 'A' + 10
                                         : -1;
    if (d < 0) return -1;
    v = v * 16 + d;
  }
  return v;
}

void append_utf8(std::string& out, uint32_t cp) {
  if (cp < 0x80) {
    out += (char)cp;
  } else if (cp < 0x800) {
    out += (char)(0xC0 | (cp >> 6)), out += (char)(0x80 | (cp & 0x3F));
  } else if (cp < 0x10000) {
    out += (char)(0xE0 | (cp >> 12)), out += (char)(0x80 | ((cp >> 6) & 0x3F)), out += (char)(0x80 | (cp & 0x3F));
  } else {
    out += (char)(0xF0 | (cp >> 18)), out += (char)(0x80 | ((cp >> 12) & 0x3F));
    out += (char)(0x80 | ((cp >> 6) & 0x3F)), out += (char)(0x80 | (cp & 0x3F));
  }
}

}  // namespace sat
