// A caption memory's captions as a model file stores them (sat::parse_caption_lists): its fast path must read any
// text exactly as the full JSON parser does, and refuse what that parser refuses. Differential: both run on every
// input, and a difference (or any exception but the JSON parser's) is a crash.
#include <nlohmann/json.hpp>

#include "tests/fuzz/fuzz_common.hpp"
#include "train/consensus.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  std::vector<std::vector<std::string>> reference;
  bool reference_ok = true;
  try {
    reference = nlohmann::json::parse(text).get<std::vector<std::vector<std::string>>>();
  } catch (const nlohmann::json::exception&) {
    reference_ok = false;
  }
  bool ok = true;
  std::vector<std::vector<std::string>> got;
  try {
    got = sat::parse_caption_lists(text);
  } catch (const nlohmann::json::exception&) {
    ok = false;
  }
  if (ok != reference_ok || got != reference) abort();
  return 0;
}
