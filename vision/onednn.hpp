// The one oneDNN CPU engine and stream the vision code shares, and the activation layout its convolutions prefer.
#pragma once
#include <optional>
#include <string>

#include <oneapi/dnnl/dnnl.hpp>

namespace sat {
dnnl::engine& cpu_engine();
dnnl::stream& cpu_stream();
// The channel-blocked layout oneDNN's convolutions choose on this machine (nChw16c with AVX-512, nChw8c with AVX2),
// asked of oneDNN once. Every activation inside a network uses it, so no reorder runs between layers.
dnnl::memory::format_tag activation_tag();
int activation_block();  // its channel block: 16 or 8 (1 for a plain layout)

// The arithmetic a pretrained (frozen) encoder runs in. f32: float32 throughout. bf16: activations and weights in
// bfloat16 (8-bit mantissa), accumulated in float32 by the convolutions, bias and grid in float32; on a CPU with
// AMX (Intel Sapphire Rapids and later) oneDNN runs it on the tile units, several times the float32 rate.
// auto: bf16 where it is the faster arithmetic (cpu_prefers_bf16: AMX, or AVX512-BF16 on AMD), else f32 (on Intel
// without AMX bf16 runs natively but slower than f32; without AVX512-BF16 oneDNN would emulate it, slowly).
// int8: the convolutions read unsigned 8-bit activations and signed 8-bit weights (one scale per output channel)
// and sum in 32-bit integers; the activations' ranges come from calibration on photos (PretrainedEncoder,
// Int8Ranges), the residual stream and the grid stay float32 (vision/pretrained.hpp). With AVX512-VNNI (or
// AMX-INT8) that is about twice the bf16 rate.
enum class Precision { f32, bf16, int8 };
enum class PrecisionChoice { f32, bf16, int8, auto_ };
Precision resolve(PrecisionChoice c);
PrecisionChoice parse_precision(const std::string& s);  // "f32", "bf16", "int8", "auto"; else an Error
const char* precision_name(Precision p);
const char* precision_name(PrecisionChoice p);
bool cpu_has_native_bf16();  // AMX-BF16 or AVX512-BF16, as oneDNN sees the CPU: bf16 runs, not emulated
bool cpu_prefers_bf16();     // and runs faster than f32 (datasets/cpu.hpp: bf16_beats_f32): what auto takes
bool cpu_has_amx();
bool cpu_has_vnni();  // AVX512-VNNI or later (oneDNN's int8 convolutions at full rate)
// The process's choice, set by the CLI's --encoder-precision (or LoadOptions): when set, it overrides the
// precision a model file stores.
void set_encoder_precision(PrecisionChoice c);
std::optional<PrecisionChoice> encoder_precision_setting();  // empty until set
// The layout convolutions of that precision prefer (as activation_tag for f32) and its channel block.
dnnl::memory::format_tag activation_tag(Precision p);
int activation_block(Precision p);
}  // namespace sat

namespace sat {
const char* activation_layout_name(Precision p = Precision::f32);  // "nhwc", "nChw16c", "nChw8c"
// The machine's practical FP32 peak: the best of several oneDNN sgemm calls (3072 x 3072 x 3072, every thread oneDNN
// uses), in GFLOP/s. Takes a few seconds.
double measure_peak_gflops();
extern const char* const kPeakMethod;
// The same with bfloat16 inputs and float32 accumulation (a oneDNN matmul, AMX where the CPU has it): the
// practical bf16 peak, in GFLOP/s.
double measure_bf16_peak_gflops();
extern const char* const kBf16PeakMethod;
// The same with unsigned 8-bit by signed 8-bit inputs and 32-bit integer sums (AVX512-VNNI where the CPU has it):
// the practical int8 peak, in GOP/s (a multiply-add counted as 2).
double measure_int8_peak_gops();
extern const char* const kInt8PeakMethod;
}  // namespace sat
