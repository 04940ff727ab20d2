// Which arithmetic is the faster one on this CPU: the rule `auto` follows for the encoder and the decoder's products.
#pragma once

namespace sat {

enum class CpuVendor { amd, intel, other };
CpuVendor cpu_vendor();  // from the CPU's own identification string (cpuid leaf 0)
const char* cpu_vendor_name(CpuVendor v);

// Whether bfloat16 products run faster than float32 on a CPU with these traits (both native ones: without either,
// oneDNN emulates bf16, slowly). AMX's tiles always do. AVX512-BF16's dot products do on AMD, where Zen 4 and 5 issue
// VDPBF16PS at twice float32's FMA rate (the encoder 2.06x, the decoder's step 1.3-1.7x: docs/precision.md). They do
// not on Intel without AMX: on a Xeon (family 6 model 207, AMX not exposed, 2026-12-03) a oneDNN bf16 matmul peaked
// at 167 GFLOPS against sgemm's 315 and the encoder ran 1.7x slower in bf16 (VDPBF16PS at a quarter of the float32
// FMA rate would explain it: an inference from the peak, not a measurement). Other vendors: bf16 only with AMX.
bool bf16_beats_f32(bool has_amx, bool has_avx512_bf16, CpuVendor vendor);

}  // namespace sat
