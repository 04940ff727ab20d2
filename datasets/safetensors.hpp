// Model and checkpoint files in the safetensors layout: 8-byte little-endian header length, a JSON
// header (tensor index plus "__metadata__" of string values), then raw little-endian data: float32 tensors,
// and uint8 tensors with a per-tensor affine dequantization (value = q * scale + min, kept in the metadata key
// "quantization" as {"name": [min, scale]}), which is how imported pretrained weights are stored losslessly,
// and float16 tensors (IEEE half, read back as float32, or left in a mapped file: decode_mapped_safetensors), which
// `sat model compact` uses for decoder weights and imported ResNet weights use for their kernels.
#pragma once
#include <map>
#include <memory>
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

// A float16 tensor left where it lies in a memory-mapped file (decode_mapped_safetensors). Large imported weights
// (ResNet-101's 42 M) are converted a piece at a time where they are used, the encoder's weight reorders, instead of
// all at once into float32 memory: 110 MB less to fault in and write at every load. `file` keeps the mapping alive.
struct MappedHalfTensor {
  std::vector<int64_t> shape;
  const char* data = nullptr;  // shape's product of float16 values, at any byte alignment
  std::shared_ptr<const MappedFile> file;
  int64_t size() const;
  void to_floats(float* out) const;  // all size() values
  FloatBuffer to_floats() const;
};

struct TensorFile {
  std::map<std::string, std::string> metadata;
  std::map<std::string, Param> tensors;  // grads are left empty
  std::map<std::string, QuantizedTensor> quantized;
  std::set<std::string> half;  // names in `tensors` stored as float16 (on load: those that were)
  std::map<std::string, MappedHalfTensor> mapped_half;  // decode_mapped_safetensors' float16 tensors (not in `tensors`)

  const Param& get(const std::string& name, const std::string& file) const;
  std::string meta(const std::string& key, const std::string& file) const;
  // Any kind of tensor: its shape, or nullptr when the file has no tensor of that name.
  const std::vector<int64_t>* shape_of(const std::string& name) const;
  // The float16 tensors left mapped become float32 tensors like any other (named in `half`).
  void convert_mapped_half();
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
// The same, with its float16 tensors left in the mapped file (TensorFile::mapped_half) instead of converted.
TensorFile decode_mapped_safetensors(const std::shared_ptr<const MappedFile>& file);

}  // namespace sat
