#include "datasets/safetensors.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <nlohmann/json.hpp>
#include <string_view>

#include "datasets/features.hpp"
#include "datasets/io.hpp"
#include "datasets/json_checks.hpp"

namespace sat {

using nlohmann::json;

const Param& TensorFile::get(const std::string& name, const std::string& file) const {
  auto it = tensors.find(name);
  if (it == tensors.end()) fail(file, "missing tensor '" + name + "'");
  return it->second;
}

const std::vector<int64_t>* TensorFile::shape_of(const std::string& name) const {
  if (auto t = tensors.find(name); t != tensors.end()) return &t->second.shape;
  if (auto q = quantized.find(name); q != quantized.end()) return &q->second.shape;
  if (auto h = mapped_half.find(name); h != mapped_half.end()) return &h->second.shape;
  return nullptr;
}

void TensorFile::convert_mapped_half() {
  for (auto& [name, h] : mapped_half) {
    Param p(name, h.shape, false);
    h.to_floats(p.value.data());
    tensors.erase(name);
    tensors.emplace(name, std::move(p));
    half.insert(name);
  }
  mapped_half.clear();
}

int64_t MappedHalfTensor::size() const {
  return shape_size(shape);
}

// count float16 values at `from`, at any byte offset: copied out a cache-sized piece at a time, then converted. One
// thread: this runs while a model loads, beside the threads that hash the weights and prepare the caption memory,
// where an OpenMP team waits at its barrier for a core those threads hold (measured: the load 45 ms slower).
static void unaligned_halves_to_floats(const char* from, uint64_t count, float* out) {
  constexpr uint64_t kPiece = 4096;
  for (uint64_t done = 0; done < count; done += kPiece) {
    uint16_t piece[kPiece];
    const uint64_t m = std::min(kPiece, count - done);
    std::memcpy(piece, from + done * 2, m * 2);
    half_to_floats(piece, out + done, m);
  }
}

void MappedHalfTensor::to_floats(float* out) const {
  unaligned_halves_to_floats(data, (uint64_t)size(), out);
}

FloatBuffer MappedHalfTensor::to_floats() const {
  FloatBuffer out((size_t)size());
  to_floats(out.data());
  return out;
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

uint16_t float_to_half(float f) {
  uint32_t x;
  std::memcpy(&x, &f, 4);
  const uint16_t sign = (uint16_t)((x >> 16) & 0x8000);
  const uint32_t abs = x & 0x7fffffff;
  if (abs >= 0x7f800000) return sign | 0x7c00 | (abs > 0x7f800000 ? 0x200 : 0);  // inf, NaN (quiet)
  if (abs >= 0x477ff000) return sign | 0x7c00;  // rounds past 65504: overflow to infinity
  if (abs < 0x38800000) {                       // below the smallest normal half (2^-14): subnormal or zero
    if (abs < 0x33000000) return sign;          // under half the smallest subnormal (2^-25): zero
    const uint32_t mant = (abs & 0x7fffff) | 0x800000;
    const int shift = 126 - (int)(abs >> 23);  // value / 2^-24 = mantissa * 2^(exponent - 126)
    const uint32_t q = mant >> shift, rest = mant & ((1u << shift) - 1), half = 1u << (shift - 1);
    return sign | (uint16_t)(q + (rest > half || (rest == half && (q & 1))));
  }
  // normal: rebias the exponent (127 -> 15) and round the 23-bit mantissa to 10 bits, to nearest even
  const uint32_t r = abs - 0x38000000;
  const uint32_t q = r >> 13, rest = r & 0x1fff;
  return sign | (uint16_t)(q + (rest > 0x1000 || (rest == 0x1000 && (q & 1))));
}

float half_to_float(uint16_t h) {
  const uint32_t sign = (uint32_t)(h & 0x8000) << 16;
  const uint32_t exp = (h >> 10) & 0x1f, mant = h & 0x3ff;
  uint32_t x;
  if (exp == 0x1f)
    x = sign | 0x7f800000 | (mant << 13);
  else if (exp != 0)
    x = sign | ((exp + 112) << 23) | (mant << 13);
  else if (mant == 0)
    x = sign;
  else {  // subnormal: value = mant * 2^-24
    float v = (float)mant * 5.9604644775390625e-8f;
    std::memcpy(&x, &v, 4);
    x |= sign;
  }
  float f;
  std::memcpy(&f, &x, 4);
  return f;
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
  for (auto& name : tf.half)
    if (!tf.tensors.count(name)) throw Error("float16 tensor '" + name + "' is not among the tensors");
  for (auto& [name, p] : tf.tensors) {
    const bool half = tf.half.count(name) > 0;
    uint64_t bytes = p.value.size() * (half ? 2 : sizeof(float));
    header[name] = {{"dtype", half ? "F16" : "F32"}, {"shape", p.shape}, {"data_offsets", {offset, offset + bytes}}};
    offset += bytes;
  }
  for (auto& [name, t] : tf.quantized) {
    if (tf.tensors.count(name)) throw Error("tensor '" + name + "' is stored twice");
    uint64_t bytes = t.data.size();
    header[name] = {{"dtype", "U8"}, {"shape", t.shape}, {"data_offsets", {offset, offset + bytes}}};
    offset += bytes;
  }
  for (auto& [name, t] : tf.mapped_half) {
    if (tf.tensors.count(name) || tf.quantized.count(name)) throw Error("tensor '" + name + "' is stored twice");
    uint64_t bytes = (uint64_t)t.size() * 2;
    header[name] = {{"dtype", "F16"}, {"shape", t.shape}, {"data_offsets", {offset, offset + bytes}}};
    offset += bytes;
  }
  std::string h = header.dump();
  while ((h.size() + 8) % 8) h += ' ';  // keep the data 8-byte aligned, as the reference writer does
  std::string out;
  out.reserve(8 + h.size() + offset);
  uint64_t n = h.size();
  for (int i = 0; i < 8; ++i) out += (char)((n >> (8 * i)) & 0xff);
  out += h;
  for (auto& [name, p] : tf.tensors) {
    if (!tf.half.count(name)) {
      out.append((const char*)p.value.data(), p.value.size() * sizeof(float));
      continue;
    }
    std::vector<uint16_t> h(p.value.size());
    for (size_t i = 0; i < h.size(); ++i) {
      h[i] = float_to_half(p.value[i]);
      if ((h[i] & 0x7c00) == 0x7c00 && std::isfinite(p.value[i]))
        throw Error("tensor '" + name + "' has a value (" + std::to_string(p.value[i]) +
                    ") outside the float16 range; keep it float32");
    }
    out.append((const char*)h.data(), h.size() * 2);
  }
  for (auto& [name, t] : tf.quantized) out.append((const char*)t.data.data(), t.data.size());
  for (auto& [name, t] : tf.mapped_half) out.append(t.data, (size_t)t.size() * 2);
  return out;
}

void save_safetensors(const std::string& path, const TensorFile& tf) {
  write_file_atomic(path, encode_safetensors(tf));
}

TensorFile load_safetensors(const std::string& path) {
  // Mapped, not read: the page cache's pages are the bytes (no copy into freshly faulted memory; model files are
  // tens of MB).
  MappedFile file(path);
  return decode_safetensors(file.data(), file.size(), path);
}

TensorFile decode_safetensors(const std::string& bytes, const std::string& path) {
  return decode_safetensors(bytes.data(), bytes.size(), path);
}

static TensorFile decode(const char* data, size_t size, const std::string& path,
                         const std::shared_ptr<const MappedFile>* keep_half_mapped);

TensorFile decode_safetensors(const char* data, size_t size, const std::string& path) {
  return decode(data, size, path, nullptr);
}

TensorFile decode_mapped_safetensors(const std::shared_ptr<const MappedFile>& file) {
  return decode(file->data(), file->size(), file->path(), &file);
}

static TensorFile decode(const char* data, size_t size, const std::string& path,
                         const std::shared_ptr<const MappedFile>* keep_half_mapped) {
  const std::string_view bytes(data, size);
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
  require_json_numbers_in_range(header, path);
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
    require_json_numbers_in_range(quantization, path);
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
      if (dtype != "F32" && dtype != "F16" && dtype != "U8")
        fail(path, "tensor '" + name + "' has dtype " + dtype + ", expected F32, F16 or U8");
      for (auto d : shape)
        if (d < 0 || d > (1ll << 32)) fail(path, "tensor '" + name + "' has a bad shape");
      if (offs.size() != 2 || offs[0] > offs[1] || offs[1] > data_size)
        fail(path, "tensor '" + name + "' lies outside the file (truncated?)");
      uint64_t count = (uint64_t)shape_size(shape);
      if (dtype == "U8") {
        if (offs[1] - offs[0] != count)
          fail(path, "tensor '" + name + "' size does not match its shape " + shape_str(shape));
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
      const uint64_t width = dtype == "F16" ? 2 : sizeof(float);
      if (offs[1] - offs[0] != count * width)
        fail(path, "tensor '" + name + "' size does not match its shape " + shape_str(shape));
      if (dtype == "F16" && keep_half_mapped) {
        MappedHalfTensor h;
        h.shape = shape;
        h.data = bytes.data() + data_start + offs[0];
        h.file = *keep_half_mapped;
        tf.mapped_half.emplace(name, std::move(h));
        continue;
      }
      Param p(name, shape, false);
      if (dtype == "F16") {
        unaligned_halves_to_floats(bytes.data() + data_start + offs[0], count, p.value.data());
        tf.half.insert(name);
      } else if (count) {
        std::memcpy(p.value.data(), bytes.data() + data_start + offs[0], count * sizeof(float));
      }
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
