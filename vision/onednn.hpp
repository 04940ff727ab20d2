// The one oneDNN CPU engine and stream the vision code shares.
#pragma once
#include <oneapi/dnnl/dnnl.hpp>

namespace sat {
dnnl::engine& cpu_engine();
dnnl::stream& cpu_stream();
}  // namespace sat
