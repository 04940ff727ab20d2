// Matrix products with few rows: out (B x N) = X (B x K) * W (K x N), all row-major, for the B of a caption search's
// step (a beam's rows: 3 to 30). Eigen's general product packs W into its blocked layout on every call, which at so
// few rows costs as much as the multiply (a beam-10 step of the default model: 44% of its time packing); this
// product reads W once per panel of up to 12 rows, straight from its row-major storage, with each panel's sums held
// in registers, and splits W's columns between the threads. Above kFewRows rows Eigen's product is faster and the
// callers use it.
#pragma once
#include "seq/matmul.hpp"
#include "seq/tensor.hpp"

namespace sat {

constexpr int kFewRows = 24;

// out = X W (accumulate: out += X W). X, W and out are row-major with leading dimensions ldx, ldw (>= N) and ldo.
void few_rows_product(const float* X, int64_t ldx, int B, int K, const float* W, int64_t ldw, int N, float* out,
                      int64_t ldo, bool accumulate);

// out = X W or out += X W for Mats (any rows): the few-rows product at up to kFewRows rows, Eigen's above.
template <class XType, class WType>
void times(const XType& X, const WType& W, Mat& out, bool accumulate) {
  if (!accumulate) out.resize(X.rows(), W.cols());
  if (X.rows() <= kFewRows && X.cols() > 0) {
    few_rows_product(X.data(), X.outerStride(), (int)X.rows(), (int)X.cols(), W.data(), W.outerStride(), (int)W.cols(),
                     out.data(), out.outerStride(), accumulate);
  } else if (accumulate) {
    out.noalias() += X * W;
  } else {
    out.noalias() = X * W;
  }
}

// The same for a decoder's products: the few-rows product for a float32 search's few rows (faster there than any
// library call), else the decoder's oneDNN products (seq/matmul.hpp) in their precision.
template <class XType, class WType>
void times(Products& products, const XType& X, const WType& W, Mat& out, bool accumulate) {
  if (products.precision() == ProductPrecision::f32 && X.rows() <= kFewRows)
    times(X, W, out, accumulate);
  else
    products.times(X, W, out, accumulate);
}

}  // namespace sat
