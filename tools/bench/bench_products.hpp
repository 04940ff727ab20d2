// The matrix products of one decoder training step alone (tools/bench/bench_products.cpp): sat bench decoder
// --products.
#pragma once
#include "seq/decoder.hpp"

namespace sat {

struct ProductTimes {
  double whole = 0;      // the products over all T*B rows (output layer, deep output, the words' gates, weight sums)
  double recurrent = 0;  // the T products of B rows each inside the time loop, forward and backward
};

// The matrix products of one training step (forward and backward, the features frozen), 2*M*N*K each, for an
// attending decoder with the additive score in Bahdanau order (the benchmark's default); 0 for other kinds.
// Elementwise work (activations, softmax, the attention's tanh, dropout, Adam) is not counted: this is what a
// perfect matrix-product library would have to do, so FLOPs / time against the sgemm peak is a fair share.
double decoder_step_flops(const DecoderConfig& c, int B, int T, int grids);
// The multiply-adds of one decoder step for one row (caption) with the same count and kinds: the LSTM gates, the
// attention query, scores and context, the deep output and the words' logits. A training step's forward holds T*B
// of them; a search's step, one per beam row.
double decoder_row_step_macs(const DecoderConfig& c);

// Best of `iters` timed runs (after one warm-up) of the products a training step of the additive, Bahdanau-order
// decoder `c` makes for B captions of T steps reading G grids, with the decoder's shapes, product calls (in
// `precision`) and threads.
ProductTimes time_decoder_products(const DecoderConfig& c, int B, int T, int G, int iters, ProductPrecision precision);

}  // namespace sat
