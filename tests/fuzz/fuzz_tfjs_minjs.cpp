// TensorFlow.js models in the UMD-wrapped minified form nsfwjs ships: model.min.js exporting the model JSON as a
// JavaScript object literal, and group1-shard1of1.min.js exporting the shard as one base64 string. The input is
// model.min.js, then the marker line, then the shard file.
#include "tests/fuzz/fuzz_common.hpp"
#include "vision/tfjs.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  auto [model, shard] = fuzz::split_input(data, size, "\n@@shard@@\n");
  fuzz::write_input("model.min.js", model);
  fuzz::write_input("group1-shard1of1.min.js", shard);
  fuzz::expect_clean([&] { sat::import_tfjs(fuzz::scratch_dir() + "/model.min.js"); });
  return 0;
}
