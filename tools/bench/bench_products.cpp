// sat bench decoder --products: the matrix products of one decoder training step alone, with the shapes, layouts,
// product calls (seq/matmul.hpp, in the step's precision; for the per-row ones Eigen's, or in bf16 those of
// seq/grid_bf16.hpp over the grid in bf16) and threading the decoder uses, and nothing else (no activations, softmax,
// dropout or Adam). Its time is a floor for the whole step: what the step would take if all elementwise work were free.
#include "tools/bench/bench_products.hpp"

#include <algorithm>
#include <chrono>
#include <omp.h>

#include "seq/grid_bf16.hpp"
#include "seq/tensor.hpp"

namespace sat {

namespace {

Mat filled(int64_t rows, int64_t cols, float v) {
  return Mat::Constant(rows, cols, v);
}

double now_seconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

}  // namespace

// The count of the products time_decoder_products runs (below): keep the two lists alike.
double decoder_row_step_macs(const DecoderConfig& c) {
  if (c.score != "additive" || c.luong() || c.updown() || c.attention == "none") return 0;
  const double L = c.locations(), E = c.embed_dim, n = c.hidden_dim, A = c.attn_dim, V = c.vocab_size,
               Z = c.feature_dim;
  return E * 4 * n      // the words' part of the gates
         + Z * 4 * n    // the contexts' part
         + n * 4 * n    // the recurrent part
         + n * A        // the query projection
         + L * A        // the scores e = tanh(.) v
         + L * Z        // the contexts z = alpha F
         + (n + Z) * E  // the deep output layer
         + E * V;       // the words' logits
}

double decoder_step_flops(const DecoderConfig& c, int B, int T, int grids) {
  if (c.score != "additive" || c.luong() || c.updown() || c.attention == "none") return 0;
  const double TB = (double)B * T, L = c.locations(), D = c.feature_dim, E = c.embed_dim, n = c.hidden_dim,
               A = c.attn_dim, V = c.vocab_size, G = grids, Z = D;
  const double forward = TB * decoder_row_step_macs(c)  // every row's step (the words' part of the gates at once)
                         + G * L * D * A                // the grid's attention projection, once
                         + 2 * G * D * n;               // the initial h and c
  const double backward = 2 * TB * E * V                // the output layer's weight and input gradients
                          + 2 * TB * (n + Z) * E        // the deep output's
                          + TB * 4 * n * (n + Z)        // the gates' gradient into h and the context, step by step
                          + TB * Z * L                  // into the attention weights (dz F^T)
                          + TB * L * A                  // the score vector v's gradient
                          + 2 * TB * n * A              // the query projection's weight and input gradients
                          + TB * 4 * n * (E + Z + n)    // the LSTM's weight gradients, all steps at once
                          + TB * 4 * n * E              // into the words' embeddings
                          + G * L * D * A               // the grid projection's weight gradient
                          + 2 * G * D * n;              // the initial state's weights
  return 2 * (forward + backward);
}

ProductTimes time_decoder_products(const DecoderConfig& c, int B, int T, int G, int iters, ProductPrecision precision) {
  Products P(precision);
  const int64_t TB = (int64_t)B * T, L = c.locations(), D = c.feature_dim, E = c.embed_dim, n = c.hidden_dim,
                A = c.attn_dim, V = c.vocab_size, Z = D;
  // Weights and activations with the decoder's shapes (row-major Mats; constant values: speed does not depend on them).
  Mat Wemb = filled(E, 4 * n, 1e-3f), Wctx = filled(Z, 4 * n, 1e-3f), Whh = filled(n, 4 * n, 1e-3f),
      Wq = filled(n, A, 1e-3f), U = filled(D, A, 1e-3f), Woh = filled(n, E, 1e-3f), Woc = filled(Z, E, 1e-3f),
      Wout = filled(E, V, 1e-3f), Winit = filled(D, n, 1e-3f);
  Mat gWemb = Wemb, gWctx = Wctx, gWhh = Whh, gWq = Wq, gU = U, gWoh = Woh, gWoc = Woc, gWout = Wout, gWinit = Winit;
  Mat F = filled(G * L, D, 0.5f), emb = filled(TB, E, 0.1f), hd = filled(TB, n, 0.1f), zall = filled(TB, Z, 0.1f),
      od = filled(TB, E, 0.1f), hall = filled(TB, n, 0.1f), mean = filled(G, D, 0.1f);
  Mat gates_emb(TB, 4 * n), UA(G * L, A), pre(TB, E), probs(TB, V), init(G, n),
      dlogits = filled(TB, V, 1e-4f), dpre(TB, E), dout(TB, n), dz_out(TB, Z), dgates_all = filled(TB, 4 * n, 1e-3f),
      demb(TB, E), dUA = UA;
  Mat h = filled(B, n, 0.1f), x = filled(B, Z, 0.1f), g(B, 4 * n), q(B, A), e(B, L), alpha = filled(B, L, 1.f / L),
      z(B, Z), dh(B, n), dz(B, Z), dalpha(B, L), dq = filled(B, A, 1e-3f), dv(B, A), Tact = filled(B * L, A, 0.5f);
  Eigen::VectorXf v = Eigen::VectorXf::Constant(A, 1e-3f);
  // bf16 products: the decoder's per-row passes read the grid and its projection as bf16 (seq/grid_bf16.hpp)
  const bool bf16_rows = precision == ProductPrecision::bf16;
  Bf16Rows F16, Tact16;
  if (bf16_rows) round_rows_bf16(F, F16), round_rows_bf16(Tact, Tact16);
  ProductTimes best{1e30, 1e30};
  for (int it = 0; it <= iters; ++it) {
    double t0 = now_seconds();
    P.invalidate();  // the weights' bf16 copies are made once per step, as the decoder's
    // Once per step, over all T*B rows (forward, then backward).
    P.times(emb, Wemb, gates_emb, false);
    P.times(F, U, UA, false);
    P.times(mean, Winit, init, false);
    P.times(mean, Winit, init, false);
    P.times(hd, Woh, pre, false);
    P.times(zall, Woc, pre, true);
    P.times(od, Wout, probs, false);
    P.add_xt_y(od, dlogits, gWout);
    P.times_t(dlogits, Wout, dpre, false);
    P.add_xt_y(hd, dpre, gWoh);
    P.add_xt_y(zall, dpre, gWoc);
    P.times_t(dpre, Woh, dout, false);
    P.times_t(dpre, Woc, dz_out, false);
    P.add_xt_y(emb, dgates_all, gWemb);
    P.add_xt_y(zall, dgates_all, gWctx);
    P.add_xt_y(hall, dgates_all, gWhh);
    P.times_t(dgates_all, Wemb, demb, true);
    P.add_xt_y(F, dUA, gU);
    P.add_xt_y(mean, init, gWinit);
    P.add_xt_y(mean, init, gWinit);
    double t1 = now_seconds();
    // Inside the time loop, T times over B rows: forward, then backward.
    for (int t = 0; t < T; ++t) {
      P.times(h, Wq, q, false);
#pragma omp parallel for schedule(static)
      for (int b = 0; b < B; ++b) {
        if (bf16_rows) {
          rows_dot_bf16(Tact16.row((int64_t)b * L), (int)L, (int)A, v.data(), &e(b, 0));
          weighted_sum_of_rows_bf16(&alpha(b, 0), F16.row((int64_t)(b % G) * L), (int)L, (int)D, &z(b, 0));
          continue;
        }
        e.row(b).noalias() = (Tact.middleRows((int64_t)b * L, L) * v).transpose();
        z.row(b).noalias() = alpha.row(b) * F.middleRows((int64_t)(b % G) * L, L);
      }
      P.times(x, Wctx, g, false);
      P.times(h, Whh, g, true);
    }
    for (int t = 0; t < T; ++t) {
      auto dgates = dgates_all.middleRows((int64_t)t * B, B);
      P.times_t(dgates, Whh, dh, false);
      P.times_t(dgates, Wctx, dz, false);
#pragma omp parallel for schedule(static)
      for (int b = 0; b < B; ++b) {
        if (bf16_rows) {
          rows_dot_bf16(F16.row((int64_t)(b % G) * L), (int)L, (int)D, &dz(b, 0), &dalpha(b, 0));
          weighted_sum_of_rows_bf16(&e(b, 0), Tact16.row((int64_t)b * L), (int)L, (int)A, &dv(b, 0));
          continue;
        }
        dalpha.row(b).noalias() = dz.row(b) * F.middleRows((int64_t)(b % G) * L, L).transpose();
        dv.row(b).noalias() = e.row(b) * Tact.middleRows((int64_t)b * L, L);
      }
      P.add_xt_y(h, dq, gWq);
      P.times_t(dq, Wq, dh, true);
    }
    double t2 = now_seconds();
    if (it > 0) best.whole = std::min(best.whole, t1 - t0), best.recurrent = std::min(best.recurrent, t2 - t1);
  }
  return best;
}

}  // namespace sat
