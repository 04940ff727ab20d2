// The matrix products of one decoder training step alone (tools/bench_products.cpp): sat bench decoder --products.
#pragma once
#include "seq/decoder.hpp"

namespace sat {

struct ProductTimes {
  double whole = 0;      // the products over all T*B rows (output layer, deep output, the words' gates, weight sums)
  double recurrent = 0;  // the T products of B rows each inside the time loop, forward and backward
};

// Best of `iters` timed runs (after one warm-up) of the products a training step of the additive, Bahdanau-order
// decoder `c` makes for B captions of T steps reading G grids, with the decoder's shapes, Eigen calls and threads.
ProductTimes time_decoder_products(const DecoderConfig& c, int B, int T, int G, int iters);

}  // namespace sat
