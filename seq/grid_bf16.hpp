// The attention's per-row passes over a bfloat16 copy of the grid, for decoders whose products run in bf16.
// Each step of training reads every row's grid (L x D) twice, forward for the context z = alpha F and backward for
// dalpha = F dz, and the additive score's projection of it (L x A) twice more: at the benchmark's shape that is 4 x
// 25.7 MB per step, 1.6 GB per training step, read at the memory's speed (these are matrix-vector products: one
// multiply-add per float read). Stored as bfloat16 they are half the bytes; the sums stay float32. Where the decoder's
// products run in float32 the grid stays float32 and these are not used.
#pragma once
#include <cstdint>
#include <vector>

#include "seq/tensor.hpp"

namespace sat {

// A row-major matrix of bfloat16 values (rounded to nearest even from float32).
struct Bf16Rows {
  std::vector<uint16_t> values;
  int64_t rows = 0, cols = 0;
  bool empty() const { return rows == 0; }
  const uint16_t* row(int64_t r) const { return values.data() + r * cols; }
  void clear() { values.clear(), rows = cols = 0; }
};

// out = m rounded to bf16 (made once per forward pass: one read of m, half its bytes written).
void round_rows_bf16(const Mat& m, Bf16Rows& out);

// out[d] = sum_l w[l] block[l][d]: block is L x D bf16, row-major (a row's context from its grid).
void weighted_sum_of_rows_bf16(const float* w, const uint16_t* block, int L, int D, float* out);

// out[l] = block[l] . x (block L x D bf16, x D floats): a row's attention gradient from its context gradient.
void rows_dot_bf16(const uint16_t* block, int L, int D, const float* x, float* out);

// out[i] = float(in[i]) for n values.
void bf16_to_floats(const uint16_t* in, int64_t n, float* out);

}  // namespace sat
