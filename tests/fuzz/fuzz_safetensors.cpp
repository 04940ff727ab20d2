// The safetensors reader under every model, checkpoint and weights file: header JSON, dtypes, shapes, offsets.
#include "datasets/safetensors.hpp"
#include "tests/fuzz/fuzz_common.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  fuzz::expect_clean([&] {
    sat::TensorFile tf = sat::decode_safetensors((const char*)data, size, "fuzz.safetensors");
    // touch every tensor's values, as a loader does
    double sum = 0;
    for (auto& [name, t] : tf.tensors)
      for (float v : t.value) sum += v;
    for (auto& [name, q] : tf.quantized) sum += q.dequantize().size();
    (void)sum;
  });
  return 0;
}
