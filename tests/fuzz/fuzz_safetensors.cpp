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
    // Mapped, as models and encoder weights are loaded: float16 tensors read in place from the file.
    const std::string path = fuzz::write_input("fuzz.safetensors", data, size);
    sat::TensorFile mapped = sat::decode_mapped_safetensors(std::make_shared<const sat::MappedFile>(path));
    for (auto& [name, h] : mapped.mapped_half)
      for (float v : h.to_floats()) sum += v;
    mapped.convert_mapped_half();
    (void)sum;
  });
  return 0;
}
