// SHA-256 (FIPS 180-4), for naming the exact weights file a model was trained on. Uses the CPU's SHA extensions
// when it has them (x86 SHA-NI: ~1 GB/s and more), else portable code.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>

namespace sat {

class Sha256 {
 public:
  Sha256();
  void update(const void* data, size_t bytes);
  std::string hex_digest();  // 64 lower-case hex digits; the object is spent afterwards

 private:
  void blocks(const uint8_t* data, size_t count);
  uint32_t state_[8];
  uint8_t buffer_[64];
  size_t buffered_ = 0;
  uint64_t total_ = 0;
};

std::string sha256_hex(const void* data, size_t bytes);
std::string sha256_hex(const std::string& bytes);
// For tests: the portable and the accelerated paths over the same data (the latter is the portable one again when
// the CPU has no SHA extensions).
std::string sha256_hex_portable(const void* data, size_t bytes);
bool sha256_accelerated();

}  // namespace sat
