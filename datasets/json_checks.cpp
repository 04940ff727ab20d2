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

}  // namespace sat
