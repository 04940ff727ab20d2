#include "datasets/safetensors.hpp"

#include <cstring>
#include <nlohmann/json.hpp>

namespace sat {

using nlohmann::json;

const Param& TensorFile::get(const std::string& name, const std::string& file) const {
  auto it = tensors.find(name);
  if (it == tensors.end()) fail(file, "missing tensor '" + name + "'");
  return it->second;
}

std::string TensorFile::meta(const std::string& key, const std::string& file) const {
  auto it = metadata.find(key);
  if (it == metadata.end()) fail(file, "missing metadata '" + key + "'");
  return it->second;
}

FloatBuffer QuantizedTensor::dequantize() const {
  FloatBuffer out(data.size());
  for (size_t i = 0; i < data.size(); ++i) out[i] = (float)data[i] * scale + min;
  return out;
}

std::string encode_safetensors(const TensorFile& tf) {
  json header = json::object();
  json meta = json::object();
  for (auto& [k, v] : tf.metadata) meta[k] = v;
  if (!tf.quantized.empty()) {
    json q = json::object();
    for (auto& [name, t] : tf.quantized) q[name] = {t.min, t.scale};
    meta["quantization"] = q.dump();
  }
  header["__metadata__"] = meta;
  uint64_t offset = 0;
  for (auto& [name, p] : tf.tensors) {
    uint64_t bytes = p.value.size() * sizeof(float);
    header[name] = {{"dtype", "F32"}, {"shape", p.shape}, {"data_offsets", {offset, offset + bytes}}};
    offset += bytes;
  }
  for (auto& [name, t] : tf.quantized) {
    if (tf.tensors.count(name)) throw Error("tensor '" + name + "' is stored twice");
    uint64_t bytes = t.data.size();
    header[name] = {{"dtype", "U8"}, {"shape", t.shape}, {"data_offsets", {offset, offset + bytes}}};
    offset += bytes;
  }
  std::string h = header.dump();
  while ((h.size() + 8) % 8) h += ' ';  // keep the data 8-byte aligned, as the reference writer does
  std::string out;
  out.reserve(8 + h.size() + offset);
  uint64_t n = h.size();
  for (int i = 0; i < 8; ++i) out += (char)((n >> (8 * i)) & 0xff);
  out += h;
  for (auto& [name, p] : tf.tensors) out.append((const char*)p.value.data(), p.value.size() * sizeof(float));
  for (auto& [name, t] : tf.quantized) out.append((const char*)t.data.data(), t.data.size());
  return out;
}

void save_safetensors(const std::string& path, const TensorFile& tf) { write_file_atomic(path, encode_safetensors(tf)); }

TensorFile load_safetensors(const std::string& path) { return decode_safetensors(read_file(path), path); }

TensorFile decode_safetensors(const std::string& bytes, const std::string& path) {
  if (bytes.size() < 8) fail(path, "not a sat model file (too short: " + std::to_string(bytes.size()) + " bytes)");
  uint64_t n = 0;
  for (int i = 0; i < 8; ++i) n |= (uint64_t)(unsigned char)bytes[i] << (8 * i);
  if (n == 0 || n > bytes.size() - 8 || n > (100u << 20))
    fail(path, "not a sat model file (bad header length " + std::to_string(n) + ")");
  json header;
  try {
    header = json::parse(bytes.begin() + 8, bytes.begin() + 8 + (long)n);
  } catch (const std::exception&) {
    fail(path, "not a sat model file (header is not JSON)");
  }
  if (!header.is_object()) fail(path, "not a sat model file (header is not a JSON object)");
  TensorFile tf;
  json quantization = json::object();
  if (header.contains("__metadata__") && header["__metadata__"].is_object() &&
      header["__metadata__"].contains("quantization")) {
    try {
      quantization = json::parse(header["__metadata__"]["quantization"].get<std::string>());
    } catch (const std::exception&) {
      fail(path, "metadata 'quantization' is malformed");
    }
  }
  const uint64_t data_start = 8 + n, data_size = bytes.size() - data_start;
  for (auto& [name, entry] : header.items()) {
    if (name == "__metadata__") {
      if (!entry.is_object()) fail(path, "__metadata__ is not an object");
      for (auto& [k, v] : entry.items()) {
        if (k == "quantization") continue;  // read above; kept in TensorFile::quantized
        if (!v.is_string()) fail(path, "metadata '" + k + "' is not a string");
        tf.metadata[k] = v.get<std::string>();
      }
      continue;
    }
    try {
      std::string dtype = entry.at("dtype").get<std::string>();
      auto shape = entry.at("shape").get<std::vector<int64_t>>();
      auto offs = entry.at("data_offsets").get<std::vector<uint64_t>>();
      if (dtype != "F32" && dtype != "U8")
        fail(path, "tensor '" + name + "' has dtype " + dtype + ", expected F32 or U8");
      for (auto d : shape)
        if (d < 0 || d > (1ll << 32)) fail(path, "tensor '" + name + "' has a bad shape");
      if (offs.size() != 2 || offs[0] > offs[1] || offs[1] > data_size)
        fail(path, "tensor '" + name + "' lies outside the file (truncated?)");
      uint64_t count = (uint64_t)shape_size(shape);
      if (dtype == "U8") {
        if (offs[1] - offs[0] != count) fail(path, "tensor '" + name + "' size does not match its shape " + shape_str(shape));
        if (!quantization.contains(name) || !quantization[name].is_array() || quantization[name].size() != 2)
          fail(path, "uint8 tensor '" + name + "' has no quantization entry (min, scale)");
        QuantizedTensor t;
        t.shape = shape;
        t.min = quantization[name][0].get<float>();
        t.scale = quantization[name][1].get<float>();
        t.data.assign(bytes.begin() + (long)(data_start + offs[0]), bytes.begin() + (long)(data_start + offs[1]));
        tf.quantized.emplace(name, std::move(t));
        continue;
      }
      if (offs[1] - offs[0] != count * sizeof(float))
        fail(path, "tensor '" + name + "' size does not match its shape " + shape_str(shape));
      Param p(name, shape, false);
      if (count) std::memcpy(p.value.data(), bytes.data() + data_start + offs[0], count * sizeof(float));
      tf.tensors.emplace(name, std::move(p));
    } catch (const Error&) {
      throw;
    } catch (const std::exception& e) {
      fail(path, "tensor '" + name + "' has a malformed index entry");
    }
  }
  return tf;
}

}  // namespace sat
