// Model and checkpoint files in the safetensors layout: 8-byte little-endian header length, a JSON
// header (tensor index plus "__metadata__" of string values), then raw little-endian data: float32 tensors,
// and uint8 tensors with a per-tensor affine dequantization (value = q * scale + min, kept in the metadata key
// "quantization" as {"name": [min, scale]}), which is how imported pretrained weights are stored losslessly.
#pragma once
#include <map>
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

  const Param& get(const std::string& name, const std::string& file) const;
  std::string meta(const std::string& key, const std::string& file) const;
};

// Serialize to bytes (tensor order: by name) and write atomically.
std::string encode_safetensors(const TensorFile& tf);
void save_safetensors(const std::string& path, const TensorFile& tf);
// Validates everything (header size, JSON, dtypes, offsets, lengths); errors name the file.
TensorFile load_safetensors(const std::string& path);
TensorFile decode_safetensors(const std::string& bytes, const std::string& path_for_errors);

}  // namespace sat
