// The feature cache (`sat extract` writes it, training and `sat eval --features` read it): magic, header JSON,
// grid sizes and dtype against the file's size, then every record read.
#include <vector>

#include "datasets/features.hpp"
#include "tests/fuzz/fuzz_common.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string path = fuzz::write_input("cache.feat", data, size);
  fuzz::expect_clean([&] {
    sat::FeatureCache cache(path);
    const auto& h = cache.header();
    std::vector<float> record((size_t)h.locations() * h.channels);
    for (int i = 0; i < cache.size() && i < 8; ++i) cache.read(i, record.data());
    cache.require(cache.header().encoder_id, {});
    (void)cache.index_of("a.jpg");
    (void)cache.was_skipped("a.jpg");
  });
  return 0;
}
