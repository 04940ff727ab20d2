#include "vision/onednn.hpp"

#include <algorithm>
#include <chrono>
#include <vector>

#include "datasets/cpu.hpp"
#include "datasets/io.hpp"

namespace sat {

using namespace dnnl;
using tag = memory::format_tag;
using dt = memory::data_type;

dnnl::engine& cpu_engine() {
  static dnnl::engine eng(dnnl::engine::kind::cpu, 0);
  return eng;
}

dnnl::stream& cpu_stream() {
  static dnnl::stream s(cpu_engine());
  return s;
}

// A ResNet-like 3x3 convolution with every layout left to oneDNN: what it picks for the destination is what its
// fast kernels on this CPU work in.
// For u8 activations the weights are s8.
static tag probe_activation_tag(dt type) {
  const memory::dims src{1, 64, 28, 28}, w{64, 64, 3, 3}, dst{1, 64, 28, 28};
  convolution_forward::desc d(prop_kind::forward_inference, algorithm::convolution_direct,
                              memory::desc(src, type, tag::any),
                              memory::desc(w, type == dt::u8 ? dt::s8 : type, tag::any),
                              memory::desc(dst, type, tag::any), {1, 1}, {1, 1}, {1, 1});
  convolution_forward::primitive_desc pd(d, cpu_engine());
  for (tag t : {tag::nChw16c, tag::nChw8c, tag::nhwc})
    if (pd.dst_desc() == memory::desc(dst, type, t)) return t;
  return tag::nChw8c;
}

memory::format_tag activation_tag() {
  return activation_tag(Precision::f32);
}
int activation_block() {
  return activation_block(Precision::f32);
}

memory::format_tag activation_tag(Precision p) {
  static const tag f32 = probe_activation_tag(dt::f32);
  if (p == Precision::f32) return f32;
  if (p == Precision::int8) {
    static const tag int8 = probe_activation_tag(dt::u8);
    return int8;
  }
  static const tag bf16 = [] {
    try {
      return probe_activation_tag(dt::bf16);
    } catch (const dnnl::error&) {  // oneDNN 2.6 has bf16 convolutions on AVX-512 CPUs only
      throw Error(
          "this CPU has no bfloat16 convolutions (oneDNN needs AVX-512 for them); use --encoder-precision "
          "f32 or auto");
    }
  }();
  return bf16;
}

int activation_block(Precision p) {
  const tag t = activation_tag(p);
  return t == tag::nChw16c ? 16 : t == tag::nChw8c ? 8 : 1;
}

bool cpu_has_amx() {
  return get_effective_cpu_isa() >= cpu_isa::avx512_core_amx;
}
bool cpu_has_vnni() {
  return get_effective_cpu_isa() >= cpu_isa::avx512_core_vnni;
}
bool cpu_has_native_bf16() {
  return get_effective_cpu_isa() >= cpu_isa::avx512_core_bf16;
}
bool cpu_prefers_bf16() {
  static const bool faster = bf16_beats_f32(cpu_has_amx(), cpu_has_native_bf16(), cpu_vendor());
  return faster;
}

Precision resolve(PrecisionChoice c) {
  if (c == PrecisionChoice::auto_) return cpu_prefers_bf16() ? Precision::bf16 : Precision::f32;
  return c == PrecisionChoice::bf16 ? Precision::bf16 : c == PrecisionChoice::int8 ? Precision::int8 : Precision::f32;
}

PrecisionChoice parse_precision(const std::string& s) {
  if (s == "f32") return PrecisionChoice::f32;
  if (s == "bf16") return PrecisionChoice::bf16;
  if (s == "int8") return PrecisionChoice::int8;
  if (s == "auto") return PrecisionChoice::auto_;
  throw Error("unknown encoder precision '" + s + "' (f32, bf16, int8 or auto)");
}

static std::optional<PrecisionChoice> g_precision;
void set_encoder_precision(PrecisionChoice c) {
  g_precision = c;
}
std::optional<PrecisionChoice> encoder_precision_setting() {
  return g_precision;
}

const char* precision_name(Precision p) {
  return p == Precision::bf16 ? "bf16" : p == Precision::int8 ? "int8" : "f32";
}
const char* precision_name(PrecisionChoice p) {
  return p == PrecisionChoice::auto_  ? "auto"
         : p == PrecisionChoice::bf16 ? "bf16"
         : p == PrecisionChoice::int8 ? "int8"
                                      : "f32";
}

const char* activation_layout_name(Precision p) {
  const tag t = activation_tag(p);
  return t == tag::nChw16c ? "nChw16c" : t == tag::nChw8c ? "nChw8c" : "nhwc";
}

const char* const kPeakMethod = "best of 8 oneDNN sgemm calls, 3072 x 3072 x 3072";

double measure_peak_gflops() {
  const dnnl_dim_t n = 3072;
  std::vector<float> a((size_t)n * n, 0.5f), b((size_t)n * n, 0.25f), c((size_t)n * n);
  double best = 1e30;
  for (int rep = 0; rep < 9; ++rep) {  // the first call warms up (page faults, thread pool)
    auto t0 = std::chrono::steady_clock::now();
    dnnl_sgemm('N', 'N', n, n, n, 1.f, a.data(), n, b.data(), n, 0.f, c.data(), n);
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (rep > 0) best = std::min(best, s);
  }
  return 2.0 * n * n * n / best / 1e9;
}

const char* const kBf16PeakMethod = "best of 8 oneDNN bf16 matmuls (float32 accumulation), 3072 x 3072 x 3072";

// An n x n x n matmul of these types (B in the layout oneDNN chooses), A and B filled with `one` (the time does
// not depend on the values): its best rate over 8 calls after one that warms up, in GOP/s (a multiply-add is 2).
template <typename T>
static double best_matmul_gops(dt a_type, dt b_type, dt c_type, T one) {
  const memory::dim n = 3072;
  auto& eng = cpu_engine();
  const memory::desc a({n, n}, a_type, tag::ab), b_any({n, n}, b_type, tag::any), c({n, n}, c_type, tag::ab);
  matmul::primitive_desc pd(matmul::desc(a, b_any, c), eng);
  memory A(a, eng), B(pd.weights_desc(), eng), C(c, eng);
  std::fill_n(static_cast<T*>(A.get_data_handle()), a.get_size() / sizeof(T), one);
  std::fill_n(static_cast<T*>(B.get_data_handle()), B.get_desc().get_size() / sizeof(T), one);
  matmul mm(pd);
  double best = 1e30;
  for (int rep = 0; rep < 9; ++rep) {
    auto t0 = std::chrono::steady_clock::now();
    mm.execute(cpu_stream(), {{DNNL_ARG_SRC, A}, {DNNL_ARG_WEIGHTS, B}, {DNNL_ARG_DST, C}});
    cpu_stream().wait();
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (rep > 0) best = std::min(best, s);
  }
  return 2.0 * n * n * n / best / 1e9;
}

double measure_bf16_peak_gflops() {
  return best_matmul_gops<uint16_t>(dt::bf16, dt::bf16, dt::f32, 0x3f80);  // bf16 1.0 is 0x3f80
}

const char* const kInt8PeakMethod = "best of 8 oneDNN u8 x s8 matmuls (int32 sums), 3072 x 3072 x 3072";

double measure_int8_peak_gops() {
  return best_matmul_gops<uint8_t>(dt::u8, dt::s8, dt::s32, 1);
}

}  // namespace sat
