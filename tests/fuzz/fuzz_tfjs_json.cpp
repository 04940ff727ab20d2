// TensorFlow.js Layers models in the standard form (`sat import-tfjs`): model.json (topology and weights manifest)
// and its binary shard. The input is model.json, then the marker line, then the shard's bytes.
#include "tests/fuzz/fuzz_common.hpp"
#include "vision/tfjs.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  auto [model, shard] = fuzz::split_input(data, size, "\n@@shard@@\n");
  fuzz::write_input("model.json", model);
  fuzz::write_input("group1-shard1of1.bin", shard);
  fuzz::expect_clean([&] { sat::import_tfjs(fuzz::scratch_dir() + "/model.json"); });
  return 0;
}
