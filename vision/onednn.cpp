#include "vision/onednn.hpp"

#include <algorithm>
#include <chrono>
#include <vector>

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
static tag probe_activation_tag() {
  const memory::dims src{1, 64, 28, 28}, w{64, 64, 3, 3}, dst{1, 64, 28, 28};
  convolution_forward::desc d(prop_kind::forward_inference, algorithm::convolution_direct,
                              memory::desc(src, dt::f32, tag::any), memory::desc(w, dt::f32, tag::any),
                              memory::desc(dst, dt::f32, tag::any), {1, 1}, {1, 1}, {1, 1});
  convolution_forward::primitive_desc pd(d, cpu_engine());
  for (tag t : {tag::nChw16c, tag::nChw8c, tag::nhwc})
    if (pd.dst_desc() == memory::desc(dst, dt::f32, t)) return t;
  return tag::nChw8c;
}

memory::format_tag activation_tag() {
  static const tag t = probe_activation_tag();
  return t;
}

int activation_block() {
  const tag t = activation_tag();
  return t == tag::nChw16c ? 16 : t == tag::nChw8c ? 8 : 1;
}

const char* activation_layout_name() {
  const tag t = activation_tag();
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

}  // namespace sat
