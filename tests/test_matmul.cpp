// The decoder's products on oneDNN (seq/matmul.hpp): float32 equal to Eigen's for every form the decoder calls,
// bfloat16 equal to exact sums of bf16-rounded inputs, the weights' copies following their changes, and a bf16
// training step and search step close to float32's.
#include <doctest/doctest.h>

#include <cmath>
#include <tuple>

#include "datasets/cpu.hpp"
#include "seq/decoder.hpp"
#include "seq/grid_bf16.hpp"
#include "seq/matmul.hpp"
#include "tests/decoder_fixtures.hpp"
#include "train/optimizer.hpp"
#include "vision/onednn.hpp"

using namespace sat;

namespace {

Mat random_mat(int64_t r, int64_t c, Rng& rng) {
  Mat m(r, c);
  for (int64_t i = 0; i < m.size(); ++i) m.data()[i] = (float)rng.normal();
  return m;
}

double max_abs_diff(const Mat& a, const Mat& b) {
  REQUIRE(a.rows() == b.rows());
  REQUIRE(a.cols() == b.cols());
  return (a - b).cwiseAbs().maxCoeff();
}

float round_to_bf16(float x) {
  uint16_t h;
  to_bf16(Operand{&x, 1, 1, 1, false}, &h);
  return bf16_to_float(h);
}

// op(X) op(W) in double from bf16-rounded inputs: what a bf16 product with float32 sums should give, up to the
// float32 sums' own rounding.
Mat bf16_reference(const Mat& X, bool tx, const Mat& W, bool tw) {
  Mat x = tx ? Mat(X.transpose()) : X, w = tw ? Mat(W.transpose()) : W;
  x = x.unaryExpr(&round_to_bf16), w = w.unaryExpr(&round_to_bf16);
  return (x.cast<double>() * w.cast<double>()).cast<float>();
}

// A decoder at a size where the products have some depth, its weights randomized a little around init.
struct StepFixture {
  DecoderConfig cfg;
  Mat F;
  CaptionBatch batch;
  StepFixture() {
    cfg = test::small_config(0.f);
    cfg.vocab_size = 60, cfg.embed_dim = 32, cfg.hidden_dim = 48, cfg.attn_dim = 24, cfg.feature_dim = 20;
    cfg.grid_h = cfg.grid_w = 3;
    Rng rng(3);
    F = test::random_features(6, cfg, rng);
    std::vector<std::vector<int>> caps;
    for (int b = 0; b < 6; ++b) {
      std::vector<int> c;
      for (int t = 0; t < 5 + b; ++t) c.push_back(4 + (int)rng.integer(0, cfg.vocab_size - 5));
      caps.push_back(c);
    }
    batch = CaptionBatch::from_ids(caps, 12);
  }
  void init(Decoder& d) const {
    Rng rng(9);
    d.init(rng);
  }
};

// Loss and gradients of one forward and backward in `precision`.
struct StepResult {
  double loss = 0;
  std::vector<FloatBuffer> grads;
};
StepResult step(const StepFixture& fx, Decoder& d, ProductPrecision precision) {
  d.set_precision(precision);
  DecoderCache cache;
  for (Param* p : d.params()) p->zero_grad();
  StepResult r;
  r.loss = d.forward(fx.F, fx.batch, 1.f, false, nullptr, cache).total();
  d.backward(cache, nullptr);
  for (Param* p : d.params())
    if (p->trainable) r.grads.push_back(p->grad);
  return r;
}

}  // namespace

TEST_CASE("products: oneDNN in float32 equals Eigen's product in every form the decoder calls") {
  Rng rng(1);
  Products P(ProductPrecision::f32);
  for (int M : {1, 3, 24, 25, 64}) {
    for (auto KN : {std::pair{1, 1}, {7, 33}, {64, 2048}, {129, 5}}) {
      const int K = KN.first, N = KN.second;
      CAPTURE(M);
      CAPTURE(K);
      CAPTURE(N);
      // operands inside larger matrices (leading dimensions past their widths), as the decoder's row blocks
      const Mat Xbig = random_mat(M + 2, K + 3, rng), W = random_mat(K, N, rng), Wt = random_mat(N, K + 1, rng);
      const auto X = Xbig.block(1, 0, M, K);
      const Mat Xt = random_mat(K, M, rng);
      const Mat base = random_mat(M, N, rng);
      const double tol = 1e-5 * std::sqrt((double)K) * 4;
      Mat out;
      P.times(X, W, out, false);  // X W
      CHECK(max_abs_diff(out, X * W) < tol);
      out = base;
      P.times(X, W, out, true);  // += X W
      CHECK(max_abs_diff(out, base + X * W) < tol);
      out = base;
      P.times_t(X, Wt.leftCols(K), out, true);  // += X W^T, W^T read through strides
      CHECK(max_abs_diff(out, base + X * Wt.leftCols(K).transpose()) < tol);
      // grad += X^T Y (M x N from K x M and K x N), the weight gradients' form
      Mat grad = random_mat(M, N, rng), grad0 = grad;
      const Mat Y = random_mat(K, N, rng);
      P.add_xt_y(Xt, Y, grad);
      CHECK(max_abs_diff(grad, grad0 + Xt.transpose() * Y) < tol);
      // negative control: the accumulated result is not the plain product
      if (M * N > 1) CHECK(max_abs_diff(grad, Xt.transpose() * Y) > 0.1);
    }
  }
  // a zero-width input (a decoder without attention has no context): the product is zero, or adds nothing
  Mat X0(4, 0), W0(0, 6), out = Mat::Constant(4, 6, 2.f);
  P.times(X0, W0, out, true);
  CHECK(out.isApprox(Mat::Constant(4, 6, 2.f)));
  P.times(X0, W0, out, false);
  CHECK(out.isZero());
  CHECK_THROWS_WITH_AS(P.times(Mat(2, 3), Mat(4, 5), out, false), "products: inner sizes differ (3 and 4)", Error);
}

TEST_CASE("products: a transposed operand's bf16 copy is each element rounded, in the transposed place") {
  // the transposed conversion works in 16 x 16 blocks (AVX-512) and one element at a time for what is left: sizes
  // around the blocks and the 32-wide tiles, a row stride wider than the rows, and values that round up, down, to
  // even, and NaN, infinity and a subnormal among them
  Rng rng(11);
  for (const auto& size : {std::pair<int, int>{16, 16}, {1, 20}, {20, 1}, {37, 53}, {64, 48}, {33, 100}, {129, 17}}) {
    const int rows = size.first, cols = size.second;  // named, not bound: CAPTURE's lambda cannot read a binding
    CAPTURE(rows);
    CAPTURE(cols);
    const int ld = cols + 3;
    std::vector<float> x((size_t)rows * ld, -7.f);
    for (int r = 0; r < rows; ++r)
      for (int c = 0; c < cols; ++c) x[(size_t)r * ld + c] = (float)rng.normal() * (1 + r % 5);
    x[0] = std::nanf("");
    if (x.size() > 2) x[1] = INFINITY, x[2] = 1.f + 1.f / 256;
    if (x.size() > 4) x[3] = 1.f + 3.f / 256, x[4] = 1e-40f;
    std::vector<uint16_t> out((size_t)rows * cols, 0xffff);
    to_bf16(Operand{x.data(), rows, cols, ld, true}, out.data());
    int wrong = 0;
    for (int c = 0; c < cols; ++c)  // out is the cols x rows transpose
      for (int r = 0; r < rows; ++r) {
        const float want = round_to_bf16(x[(size_t)r * ld + c]), got = bf16_to_float(out[(size_t)c * rows + r]);
        if (!(got == want || (std::isnan(got) && std::isnan(want)))) ++wrong;
      }
    CHECK(wrong == 0);
  }
  // negative control: the plain (not transposed) copy of a non-square operand puts elements elsewhere
  std::vector<float> y(6);
  for (int i = 0; i < 6; ++i) y[i] = (float)i;
  std::vector<uint16_t> plain(6), trans(6);
  to_bf16(Operand{y.data(), 2, 3, 3, false}, plain.data());
  to_bf16(Operand{y.data(), 2, 3, 3, true}, trans.data());
  CHECK(plain != trans);
  CHECK(bf16_to_float(trans[1]) == 3.f);  // out[0][1] = y[1][0]
}

TEST_CASE("auto takes bf16 only where it beats float32: AMX, or AVX512-BF16 on AMD") {
  CHECK(bf16_beats_f32(true, true, CpuVendor::intel));
  CHECK(bf16_beats_f32(true, true, CpuVendor::other));
  CHECK(bf16_beats_f32(false, true, CpuVendor::amd));
  CHECK_FALSE(bf16_beats_f32(false, true, CpuVendor::intel));  // one port for VDPBF16PS: half sgemm's rate here
  CHECK_FALSE(bf16_beats_f32(false, true, CpuVendor::other));
  CHECK_FALSE(bf16_beats_f32(false, false, CpuVendor::amd));  // emulated
  // this CPU: the encoder's auto and the products' auto follow the one rule; bf16 by name runs wherever it is native
  const bool faster = bf16_beats_f32(cpu_has_amx(), cpu_has_native_bf16(), cpu_vendor());
  CHECK(cpu_prefers_bf16() == faster);
  CHECK(cpu_prefers_bf16_products() == faster);
  CHECK((resolve(PrecisionChoice::auto_) == Precision::bf16) == faster);
  CHECK((parse_product_precision("auto", "t") == ProductPrecision::bf16) == faster);
  if (cpu_computes_bf16()) CHECK(parse_product_precision("bf16", "t") == ProductPrecision::bf16);
  MESSAGE("this CPU: " << std::string(cpu_vendor_name(cpu_vendor())) << ", AMX " << cpu_has_amx() << ", AVX512-BF16 "
                       << cpu_has_native_bf16() << ": auto is "
                       << std::string(precision_name(resolve(PrecisionChoice::auto_))));
}

TEST_CASE("products: bfloat16 rounds the inputs to nearest even and sums them in float32") {
  CHECK(round_to_bf16(1.f) == 1.f);
  CHECK(round_to_bf16(1.f + 1.f / 256) == 1.f);               // a tie: to even (1.0)
  CHECK(round_to_bf16(1.f + 3.f / 256) == 1.f + 4.f / 256);   // a tie: to even (1 + 2/128)
  CHECK(round_to_bf16(1.f + 1.5f / 256) == 1.f + 2.f / 256);  // above half: up
  CHECK(std::isnan(round_to_bf16(std::nanf(""))));
  if (!cpu_computes_bf16()) {
    MESSAGE("this CPU has no native bf16: the bf16 products are not run");
    return;
  }
  Rng rng(2);
  Products P(ProductPrecision::bf16);
  for (auto MKN : {std::tuple{3, 17, 40}, {64, 512, 256}, {30, 64, 3000}}) {
    const int M = std::get<0>(MKN), K = std::get<1>(MKN), N = std::get<2>(MKN);
    CAPTURE(M);
    CAPTURE(K);
    CAPTURE(N);
    const Mat X = random_mat(M, K, rng), W = random_mat(K, N, rng), Wt = random_mat(N, K, rng),
              Xt = random_mat(K, M, rng);
    const double tol = 2e-6 * K;  // float32 sums of K products of magnitude ~1
    Mat out;
    P.times(X, W, out, false);
    CHECK(max_abs_diff(out, bf16_reference(X, false, W, false)) < tol);
    // negative control: the inputs really were rounded (float32 inputs would be this far from the bf16 result)
    CHECK(max_abs_diff(out, X * W) > 10 * tol);
    P.times_t(X, Wt, out, false);
    CHECK(max_abs_diff(out, bf16_reference(X, false, Wt, true)) < tol);
    Mat grad = Mat::Constant(M, K, 0.5f);
    const Mat Y = random_mat(N, K, rng), Xn = random_mat(N, M, rng);
    P.add_xt_y(Xn, Y, grad);  // accumulated in float32 onto what was there
    CHECK(max_abs_diff(grad, (bf16_reference(Xn, true, Y, false).array() + 0.5f).matrix()) < 2e-6 * N);
  }
}

TEST_CASE("grid in bf16: a row's context and attention gradient are exact sums of the bf16-rounded grid") {
  // Runs on every CPU (plain loads and float32 multiply-adds, no bf16 arithmetic): odd sizes reach every tail.
  Rng rng(5);
  for (auto LD : {std::pair{196, 512}, {9, 20}, {7, 1104}, {3, 77}, {1, 1}}) {
    const int L = LD.first, D = LD.second;
    CAPTURE(L);
    CAPTURE(D);
    const Mat F = random_mat(L, D, rng), w = random_mat(1, L, rng), x = random_mat(1, D, rng);
    Bf16Rows F16;
    round_rows_bf16(F, F16);
    REQUIRE(F16.rows == L);
    REQUIRE(F16.cols == D);
    const Mat Fr = F.unaryExpr(&round_to_bf16);
    Mat z(1, D), e(1, L), back(L, D);
    weighted_sum_of_rows_bf16(w.data(), F16.row(0), L, D, z.data());
    rows_dot_bf16(F16.row(0), L, D, x.data(), e.data());
    bf16_to_floats(F16.row(0), (int64_t)L * D, back.data());
    CHECK(max_abs_diff(back, Fr) == 0);
    CHECK(max_abs_diff(z, (w.cast<double>() * Fr.cast<double>()).cast<float>()) < 2e-6 * L);
    CHECK(max_abs_diff(e, (x.cast<double>() * Fr.cast<double>().transpose()).cast<float>()) < 2e-6 * D);
    if (D >= 20) CHECK(max_abs_diff(z, w * F) > 1e-4);  // negative control: the grid really was rounded
  }
}

TEST_CASE("products: a weight's bf16 copy is made once, and again after invalidate()") {
  if (!cpu_computes_bf16()) return;
  Rng rng(4);
  Products P(ProductPrecision::bf16);
  const Mat X = random_mat(8, 16, rng);
  Mat W = random_mat(16, 32, rng), first, second;
  P.times(X, W, first, false);
  W *= 2.f;  // the optimizer changes the weight in place
  P.times(X, W, second, false);
  CHECK(max_abs_diff(second, first) == 0);  // the copy is kept until told: once per step, not per product
  P.invalidate();
  P.times(X, W, second, false);
  CHECK(max_abs_diff(second, 2.f * first) < 1e-5);
}

TEST_CASE("decoder: a bf16 training step is within 1% of the float32 step (loss and every gradient)") {
  if (!cpu_computes_bf16()) {
    MESSAGE("this CPU has no native bf16: the bf16 step is not run");
    return;
  }
  const StepFixture fx;
  Decoder d(fx.cfg);
  fx.init(d);
  const StepResult f32 = step(fx, d, ProductPrecision::f32), bf16 = step(fx, d, ProductPrecision::bf16);
  // Each bf16 input is off by up to 2^-9 relative; sums in float32 average those errors out, so the loss moves by
  // far less than 1%, and each gradient tensor by a few tenths of a percent of its norm.
  CHECK(std::abs(bf16.loss - f32.loss) < 1e-2 * f32.loss);
  CHECK(bf16.loss != f32.loss);  // negative control: the step really ran in bf16
  auto params = d.params();
  size_t k = 0;
  for (Param* p : params) {
    if (!p->trainable) continue;
    CAPTURE(p->name);
    const FloatBuffer &a = f32.grads[k], &b = bf16.grads[k];
    ++k;
    double diff = 0, norm = 0;
    for (size_t i = 0; i < a.size(); ++i) diff += (a[i] - b[i]) * (a[i] - b[i]), norm += a[i] * a[i];
    if (norm == 0) continue;
    CHECK(std::sqrt(diff / norm) < 2e-2);
  }
}

TEST_CASE("decoder: after an optimizer step, the bf16 forward uses the updated weights") {
  if (!cpu_computes_bf16()) return;
  const StepFixture fx;
  Decoder d(fx.cfg), fresh(fx.cfg);
  fx.init(d);
  step(fx, d, ProductPrecision::bf16);
  Adam adam;
  auto params = d.params();
  adam.attach(params);
  adam.update(params, 1e-2f);  // the weights change in place, as in training
  // the same weights in a decoder that never made bf16 copies of the old ones
  auto to = fresh.params();
  for (size_t i = 0; i < params.size(); ++i) to[i]->value = params[i]->value;
  const double after = step(fx, d, ProductPrecision::bf16).loss;
  CHECK(after == step(fx, fresh, ProductPrecision::bf16).loss);
}

TEST_CASE("decoder: a bf16 search step's log-probabilities are within 0.05 of the float32 step's") {
  if (!cpu_computes_bf16()) return;
  const StepFixture fx;
  Decoder d(fx.cfg);
  fx.init(d);
  Mat lp[2], alpha[2];
  for (int k = 0; k < 2; ++k) {
    d.set_precision(k ? ProductPrecision::bf16 : ProductPrecision::f32);
    Decoder::State st;
    d.begin(fx.F, 6, st, 5);  // 30 rows: past the few-rows product, as a beam of 5 over 6 photos
    std::vector<int> words(30, 1);
    for (int t = 0; t < 3; ++t) {
      d.step(words, st, lp[k], alpha[k]);
      for (int b = 0; b < 30; ++b) words[b] = 4 + (b + t) % 50;
    }
  }
  CHECK(max_abs_diff(lp[0], lp[1]) < 5e-2);
  CHECK(max_abs_diff(alpha[0], alpha[1]) < 1e-2);
  CHECK(max_abs_diff(lp[0], lp[1]) > 0);  // negative control: the two steps did run in different arithmetic
}
