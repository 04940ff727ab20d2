// The one oneDNN CPU engine and stream the vision code shares, and the activation layout its convolutions prefer.
#pragma once
#include <oneapi/dnnl/dnnl.hpp>

namespace sat {
dnnl::engine& cpu_engine();
dnnl::stream& cpu_stream();
// The channel-blocked layout oneDNN's convolutions choose on this machine (nChw16c with AVX-512, nChw8c with AVX2),
// asked of oneDNN once. Every activation inside a network uses it, so no reorder runs between layers.
dnnl::memory::format_tag activation_tag();
int activation_block();  // its channel block: 16 or 8 (1 for a plain layout)
}  // namespace sat

namespace sat {
const char* activation_layout_name();  // "nhwc", "nChw16c", "nChw8c"
// The machine's practical FP32 peak: the best of several oneDNN sgemm calls (3072 x 3072 x 3072, every thread oneDNN
// uses), in GFLOP/s. Takes a few seconds.
double measure_peak_gflops();
extern const char* const kPeakMethod;
}  // namespace sat
