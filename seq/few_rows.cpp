#include "seq/few_rows.hpp"

#include <algorithm>

namespace sat {

namespace {
constexpr int kPanelCols = 32;  // two AVX-512 vectors (four AVX2) of each row's sums
constexpr int kPrefetchRows = 16;

// Rows r0 .. r0 + RB - 1 of the product, columns c0 .. c0 + kPanelCols - 1: RB x 32 sums in registers, W's rows
// read once.
template <int RB>
void panel(const float* X, int64_t ldx, int K, const float* W, int64_t ldw, float* out, int64_t ldo, bool accumulate) {
  float sums[RB][kPanelCols];
  for (int r = 0; r < RB; ++r)
    for (int j = 0; j < kPanelCols; ++j) sums[r][j] = accumulate ? out[r * ldo + j] : 0.f;
  for (int k = 0; k < K; ++k) {
    const float* w = W + (int64_t)k * ldw;
    // W's rows are ldw apart (kilobytes): no hardware prefetcher follows that stride, so ask for a later row's panel.
    __builtin_prefetch(w + kPrefetchRows * ldw);
    __builtin_prefetch(w + kPrefetchRows * ldw + 16);
#pragma GCC unroll 16
    for (int r = 0; r < RB; ++r) {
      const float x = X[r * ldx + k];
#pragma omp simd
      for (int j = 0; j < kPanelCols; ++j) sums[r][j] += x * w[j];
    }
  }
  for (int r = 0; r < RB; ++r)
    for (int j = 0; j < kPanelCols; ++j) out[r * ldo + j] = sums[r][j];
}

using Panel = void (*)(const float*, int64_t, int, const float*, int64_t, float*, int64_t, bool);
constexpr int kPanelRows = 12;
constexpr Panel kPanels[kPanelRows + 1] = {nullptr,  panel<1>, panel<2>, panel<3>,  panel<4>,  panel<5>, panel<6>,
                                           panel<7>, panel<8>, panel<9>, panel<10>, panel<11>, panel<12>};

// The last N % 32 columns, plainly.
void edge(const float* X, int64_t ldx, int B, int K, const float* W, int64_t ldw, int c0, int N, float* out,
          int64_t ldo, bool accumulate) {
  for (int r = 0; r < B; ++r)
    for (int c = c0; c < N; ++c) {
      float s = accumulate ? out[r * ldo + c] : 0.f;
      for (int k = 0; k < K; ++k) s += X[r * ldx + k] * W[(int64_t)k * ldw + c];
      out[r * ldo + c] = s;
    }
}
}  // namespace

void few_rows_product(const float* X, int64_t ldx, int B, int K, const float* W, int64_t ldw, int N, float* out,
                      int64_t ldo, bool accumulate) {
  if (B <= 0 || N <= 0) return;
  if (K <= 0) {
    if (!accumulate)
      for (int r = 0; r < B; ++r) std::fill(out + r * ldo, out + r * ldo + N, 0.f);
    return;
  }
  const int blocks = N / kPanelCols;
  // Row panels of nearly equal size (B = 14: 7 + 7, not 12 + 2), each over every column block.
  const int panels = (B + kPanelRows - 1) / kPanelRows;
#pragma omp parallel for schedule(static) if (blocks >= 8)
  for (int cb = 0; cb < blocks; ++cb)
    for (int p = 0, r0 = 0; p < panels; ++p) {
      const int rows = (B - r0) / (panels - p);
      kPanels[rows](X + r0 * ldx, ldx, K, W + (int64_t)cb * kPanelCols, ldw, out + r0 * ldo + (int64_t)cb * kPanelCols,
                    ldo, accumulate);
      r0 += rows;
    }
  if (blocks * kPanelCols < N) edge(X, ldx, B, K, W, ldw, blocks * kPanelCols, N, out, ldo, accumulate);
}

}  // namespace sat
