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
