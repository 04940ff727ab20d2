#include "vision/onednn.hpp"

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

}  // namespace sat
