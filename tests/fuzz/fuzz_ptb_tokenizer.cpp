// The PTB tokenizer every reference and candidate caption goes through before scoring (any bytes: captions come
// from users' files and from models).
#include "tests/fuzz/fuzz_common.hpp"
#include "train/ptb_tokenizer.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string text((const char*)data, size);
  fuzz::expect_clean([&] {
    auto tokens = sat::ptb_tokenize(text);
    for (auto& t : tokens)
      if (t.empty()) abort();  // a token is never empty
    (void)sat::ptb_tokenize_joined(text);
  });
  return 0;
}
