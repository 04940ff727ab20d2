// The decoder's matrix products on oneDNN matmul, in float32 or in bfloat16 with float32 sums.
// Eigen's general product packs both operands on every call and, at the decoder's shapes (64-row recurrent products,
// 16 steps in sequence), cannot get past about a third of the machine's sgemm peak; oneDNN's matmul can, and runs
// bfloat16 on the CPU's native units (AVX512-BF16 dot products, AMX tiles). One Products object per decoder keeps:
//   - the matmul primitives, made once per shape (M, K, N, layout, precision, accumulate) and reused;
//   - in bf16, a bfloat16 copy of each weight it has multiplied by (and of its transpose, for backward's dY W^T), in
//     the blocked layout the primitive chooses (so its kernel does not repack the weight on every call), made the
//     first time the weight is used after invalidate(): the decoder calls invalidate() once per training
//     step (its forward), so the copies follow the optimizer's updates at one conversion per weight and step, not
//     one per product. Activations are converted on the way in (transposed there when the product reads X^T).
// Float32 masters stay where they are: weights, gradients (accumulated in float32 by the matmul's sum post-op), Adam.
#pragma once
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <tuple>
#include <vector>

#include "seq/tensor.hpp"

namespace sat {

enum class ProductPrecision { f32, bf16 };
// AVX512-BF16 or AMX-BF16, as oneDNN sees this CPU: where bf16 products run natively, not emulated.
bool cpu_computes_bf16();
// And faster than float32 there (datasets/cpu.hpp: AMX, or AVX512-BF16 on AMD): what "auto" takes.
bool cpu_prefers_bf16_products();
const char* product_precision_name(ProductPrecision p);
// "f32", "bf16" or "auto" (bf16 where it is the faster arithmetic, else f32); anything else throws an Error naming
// `what` (the flag or file field). bf16 on a CPU without native bf16 is refused (oneDNN would emulate it slowly).
ProductPrecision parse_product_precision(const std::string& s, const std::string& what);

// A float matrix operand: rows x cols, row-major with leading dimension ld; trans: the product reads its transpose.
struct Operand {
  const float* data = nullptr;
  int64_t rows = 0, cols = 0, ld = 0;
  bool trans = false;
  int64_t op_rows() const { return trans ? cols : rows; }
  int64_t op_cols() const { return trans ? rows : cols; }
};
template <class M>
Operand operand(const M& m, bool trans = false) {
  return {m.data(), (int64_t)m.rows(), (int64_t)m.cols(), (int64_t)m.outerStride(), trans};
}
inline Operand transposed(Operand o) {
  o.trans = !o.trans;
  return o;
}

class Products {
 public:
  explicit Products(ProductPrecision p = ProductPrecision::f32);
  ~Products();
  Products(const Products&) = delete;
  Products& operator=(const Products&) = delete;
  ProductPrecision precision() const { return precision_; }
  void set_precision(ProductPrecision p);  // drops the bf16 copies
  // The weights' values may have changed: the next product with each makes its bf16 copy again.
  void invalidate() { ++generation_; }

  // out (M x N, row-major, leading dimension ldo) = op(X) op(W), or += with accumulate. W is a weight (its bf16 copy
  // is cached until invalidate()); X an activation, converted on each call.
  void weight(const Operand& X, const Operand& W, float* out, int64_t ldo, bool accumulate);
  // The same with both operands activations (the weight gradients X^T dY): both converted on each call.
  void activations(const Operand& X, const Operand& Y, float* out, int64_t ldo, bool accumulate);

  // Eigen conveniences: out = X W (resized) or out += X W.
  template <class XT, class WT>
  void times(const XT& X, const WT& W, Mat& out, bool accumulate) {
    if (!accumulate) out.resize(X.rows(), W.cols());
    weight(operand(X), operand(W), out.data(), out.outerStride(), accumulate);
  }
  // out (+)= X W^T, W a weight (dX = dY W^T).
  template <class XT, class WT, class OT>
  void times_t(const XT& X, const WT& W, OT&& out, bool accumulate) {
    weight(operand(X), operand(W, true), out.data(), out.outerStride(), accumulate);
  }
  // grad += X^T Y (the weight gradients, summed over rows).
  template <class XT, class YT, class GT>
  void add_xt_y(const XT& X, const YT& Y, GT&& grad) {
    activations(operand(X, true), operand(Y), grad.data(), grad.outerStride(), true);
  }

 private:
  struct Impl;
  void run(const Operand& X, const uint16_t* x_bf16, const Operand& W, const uint16_t* w_bf16, float* out, int64_t ldo,
           bool accumulate);
  ProductPrecision precision_;
  uint64_t generation_ = 1;
  std::unique_ptr<Impl> impl_;
};

// op(X) as bf16, row-major (op_rows x op_cols), rounded to nearest even.
void to_bf16(const Operand& X, uint16_t* out);
float bf16_to_float(uint16_t h);

}  // namespace sat
