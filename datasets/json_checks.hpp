// JSON read from files: a check before any value is converted.
#pragma once
#include <string>

#include <nlohmann/json.hpp>

namespace sat {

// nlohmann's get<int>() and get<float>() convert a floating-point number with static_cast, which is undefined
// behaviour when the value does not fit (1e30 read as an int or a float; found by fuzzing the model reader). No file
// sat reads holds such a number, so every JSON document read from outside goes through this first: a floating-point
// number beyond +-2^31 anywhere in it is an Error naming `path` and the JSON path of the value.
void require_json_numbers_in_range(const nlohmann::json& j, const std::string& path);

// json::parse with that check; a syntax error is an Error naming `path` with `what` ("malformed JSON", ...).
nlohmann::json parse_json_checked(const std::string& text, const std::string& path, const std::string& what);

}  // namespace sat
