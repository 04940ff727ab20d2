#include "datasets/cpu.hpp"

#include <cstring>

#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#endif

namespace sat {

CpuVendor cpu_vendor() {
#if defined(__x86_64__) || defined(__i386__)
  unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
  if (!__get_cpuid(0, &eax, &ebx, &ecx, &edx)) return CpuVendor::other;
  char id[13];
  std::memcpy(id, &ebx, 4);
  std::memcpy(id + 4, &edx, 4);
  std::memcpy(id + 8, &ecx, 4);
  id[12] = 0;
  if (std::strcmp(id, "AuthenticAMD") == 0) return CpuVendor::amd;
  if (std::strcmp(id, "GenuineIntel") == 0) return CpuVendor::intel;
#endif
  return CpuVendor::other;
}

const char* cpu_vendor_name(CpuVendor v) {
  return v == CpuVendor::amd ? "AMD" : v == CpuVendor::intel ? "Intel" : "other";
}

bool bf16_beats_f32(bool has_amx, bool has_avx512_bf16, CpuVendor vendor) {
  if (has_amx) return true;
  return has_avx512_bf16 && vendor == CpuVendor::amd;
}

}  // namespace sat
