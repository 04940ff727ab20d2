// A model or checkpoint file as `sat caption --model` and `sat train --resume` read it: safetensors, then the
// configuration JSON, the vocabulary and every weight's shape checked against the configuration, then the model
// built (encoder and decoder).
#include "tests/fuzz/fuzz_common.hpp"
#include "train/model.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  fuzz::expect_clean([&] {
    sat::TensorFile tf = sat::decode_safetensors((const char*)data, size, "fuzz.sat");
    auto model = sat::CaptionModel::from_tensor_file(tf, "fuzz.sat");
    // The way `sat caption` loads it: the file mapped, its float16 tensors converted straight into the model.
    auto mapped = sat::CaptionModel::load(fuzz::write_input("fuzz.sat", data, size));
  });
  return 0;
}
