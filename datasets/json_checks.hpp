// JSON read from files: a check before any value is converted.
#pragma once
#include <cstdint>
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

// For readers of JSON-like string literals written here (tfjs's minified JavaScript, a caption memory's captions):
// the value of the 4 hex digits of a \u escape at p (4 characters readable), or -1 when they are not hex digits;
int32_t json_hex4(const char* p);
// and code point `cp` (at most U+10FFFF) appended as UTF-8.
void append_utf8(std::string& out, uint32_t cp);

}  // namespace sat
