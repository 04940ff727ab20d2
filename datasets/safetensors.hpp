// Model and checkpoint files in the safetensors layout: 8-byte little-endian header length, a JSON
// header (tensor index plus "__metadata__" of string values), then raw little-endian data: float32 tensors,
// and uint8 tensors with a per-tensor affine dequantization (value = q * scale + min, kept in the metadata key
// "quantization" as {"name": [min, scale]}), which is how imported pretrained weights are stored losslessly,
// and float16 tensors (IEEE half, read back as float32), which `sat model compact` uses for decoder weights.
#pragma once
#include <map>
#include <set>
#include <string>
#include <vector>

#include "datasets/io.hpp"

namespace sat {

struct QuantizedTensor {
  std::vector<int64_t> shape;
  std::vector<uint8_t> data;
  float min = 0, scale = 1;
  FloatBuffer dequantize() const;
};

struct TensorFile {
  std::map<std::string, std::string> metadata;
  std::map<std::string, Param> tensors;  // grads are left empty
  std::map<std::string, QuantizedTensor> quantized;
  std::set<std::string> half;  // names in `tensors` stored as float16 (on load: those that were)

  const Param& get(const std::string& name, const std::string& file) const;
  std::string meta(const std::string& key, const std::string& file) const;
};

// IEEE binary16 conversions: round to nearest even, subnormals kept; values beyond the half range become
// infinity (encode_safetensors refuses to write those).
uint16_t float_to_half(float f);
float half_to_float(uint16_t h);

// Serialize to bytes (tensor order: by name) and write atomically.
std::string encode_safetensors(const TensorFile& tf);
void save_safetensors(const std::string& path, const TensorFile& tf);
// Validates everything (header size, JSON, dtypes, offsets, lengths); errors name the file.
TensorFile load_safetensors(const std::string& path);
TensorFile decode_safetensors(const std::string& bytes, const std::string& path_for_errors);
TensorFile decode_safetensors(const char* data, size_t size, const std::string& path_for_errors);

}  // namespace sat
