#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <set>

#include "seq/decoder.hpp"
#include "seq/few_rows.hpp"
#include "seq/search.hpp"
#include "tests/decoder_fixtures.hpp"
#include "tests/gradcheck.hpp"
#include "tests/scratch.hpp"
#include "train/optimizer.hpp"

using namespace sat;
using sat::test::random_features;
using sat::test::small_config;
using test::error_of;

namespace {

CaptionBatch small_batch() {
  // Different lengths, so masking is exercised.
  return CaptionBatch::from_ids({{4, 5, 6, 7}, {8, 9}, {10, 4, 5}}, 10);
}

// Loss with dropout masks drawn from the same seed every call, so it is a fixed function of the weights.
double loss_of(Decoder& dec, const Mat& F, const CaptionBatch& cb, float penalty, DecoderCache& cache) {
  Rng r(77);
  return dec.forward(F, cb, penalty, true, &r, cache).total();
}

// The decoder's parameter called `name` (the test fails if there is none).
Param& param_named(Decoder& dec, const std::string& name) {
  for (auto* p : dec.params())
    if (p->name == name) return *p;
  FAIL("no parameter " << name);
  throw Error("unreachable");
}

// Backward's gradients of every trainable parameter (and with check_features, of the features) against finite
// differences of loss(F), which runs the forward into `cache` (dropout drawn alike at every call).
void check_gradients(Decoder& dec, const Mat& F, DecoderCache& cache, const std::function<double(const Mat&)>& loss,
                     bool check_features) {
  loss(F);
  for (auto* p : dec.params()) p->zero_grad();
  Mat dF;
  dec.backward(cache, check_features ? &dF : nullptr);
  for (auto* p : dec.params()) {
    if (!p->trainable) continue;  // buffers (the REINFORCE baseline) have no gradient
    CAPTURE(p->name);
    FloatBuffer analytic = p->grad;
    // The floor: the loss (about 5 here) is computed in float32, so each evaluation carries a rounding of ~3e-7,
    // ~3e-5 in a central difference over 2 x 5e-3; a coordinate whose gradient is near 1e-3 would show that as a 1%
    // error with the default floor (2e-3). A wrong gradient is off by far more than 4e-3 x 1%.
    auto r = test::check_gradient(
        p->value, analytic, [&] { return loss(F); }, 12, 5e-3, 4e-3);
    CHECK(r.worst < 1e-2);
    if (getenv("SAT_GRADCHECK_VERBOSE")) MESSAGE(p->name << " worst " << r.worst);
  }
  if (!check_features) return;
  std::vector<float> fvals(F.data(), F.data() + F.size()), fgrad(dF.data(), dF.data() + dF.size());
  auto r = test::check_gradient(
      fvals, fgrad,
      [&] {
        Mat G = Eigen::Map<Mat>(fvals.data(), F.rows(), F.cols());
        return loss(G);
      },
      30, 5e-3);
  CHECK(r.worst < 1e-2);
}

}  // namespace

TEST_CASE("Param: a trainable tensor's gradient is allocated, zeros, when first needed") {
  Param w("w", {2, 3}), buffer("b", {4}, false);
  CHECK(w.grad.empty());
  CHECK(buffer.grad.empty());
  w.ensure_grad();
  REQUIRE(w.grad.size() == 6);
  CHECK(w.grad[5] == 0.f);
  w.grad[5] = 2.f;
  w.ensure_grad();  // left as it is
  CHECK(w.grad[5] == 2.f);
  w.zero_grad();
  CHECK(w.grad[5] == 0.f);
  buffer.zero_grad(), buffer.ensure_grad();  // a buffer never has one
  CHECK(buffer.grad.empty());
  Param v("v", {3, 2});
  grad_of(v)(2, 1) += 1.f;  // the view allocates it
  REQUIRE(v.grad.size() == 6);
  CHECK(v.grad[5] == 1.f);
}

TEST_CASE("decoder: params() lists its tensors and its attention score's in the order and names of model files") {
  // Model files, optimizer state and gradient checks all follow this order: a change would break old model files.
  const std::vector<std::string> core = {"embed.weight",    "init_h.weight",  "init_h.bias", "init_c.weight",
                                         "init_c.bias",     "gate.weight",    "gate.bias",   "lstm.weight_emb",
                                         "lstm.weight_ctx", "lstm.weight_hh", "lstm.bias",   "out.hidden",
                                         "out.context",     "out.weight",     "out.bias"};
  const std::vector<std::string> additive = {"attention.feat_proj.weight", "attention.feat_proj.bias",
                                             "attention.query_proj.weight", "attention.v"};
  const std::vector<std::string> baseline = {"attention.reinforce_baseline"};
  const std::vector<std::string> combine = {"combine.weight_ctx", "combine.weight_h", "combine.bias"};
  const std::vector<std::string> updown = {"lstm.weight_mean", "lstm2.weight_ctx", "lstm2.weight_in",
                                           "lstm2.weight_hh",  "lstm2.bias",       "init_h2.weight",
                                           "init_h2.bias",     "init_c2.weight",   "init_c2.bias"};
  auto joined = [](std::initializer_list<std::vector<std::string>> parts) {
    std::vector<std::string> out;
    for (auto& part : parts) out.insert(out.end(), part.begin(), part.end());
    return out;
  };
  struct Kind {
    std::string attention, order;
    std::vector<std::string> names;
  };
  for (const Kind& k : {Kind{"soft", "bahdanau", joined({core, additive})}, Kind{"none", "bahdanau", core},
                        Kind{"hard", "bahdanau", joined({core, baseline, additive})},
                        Kind{"soft", "luong", joined({core, combine, additive})},
                        Kind{"hard", "luong", joined({core, baseline, combine, additive})},
                        Kind{"soft", "updown", joined({core, updown, additive})},
                        Kind{"hard", "updown", joined({core, baseline, updown, additive})}}) {
    CAPTURE(k.attention);
    CAPTURE(k.order);
    DecoderConfig cfg = small_config(0.f, false, "additive", k.attention);
    cfg.order = k.order;
    Decoder dec(cfg);
    std::vector<std::string> names;
    for (auto* p : dec.params()) names.push_back(p->name);
    CHECK(names == k.names);
  }
  // Each attention score's after the decoder's (the local window's after its inner score's).
  struct Score {
    std::string attention, score;
    bool coverage;
    std::vector<std::string> names;
  };
  for (const Score& s :
       {Score{"soft", "additive", true, joined({additive, {"attention.coverage"}})},
        Score{"soft", "dot", false, {"attention.key_proj.weight"}},  // the features (4) are narrower than h (7)
        Score{"soft", "general", false, {"attention.query_proj.weight"}},
        Score{"soft",
              "cosine",
              false,
              {"attention.feat_proj.weight", "attention.feat_proj.bias", "attention.query_proj.weight",
               "attention.strength.weight", "attention.strength.bias"}},
        Score{"soft", "location", false, {"attention.location.weight", "attention.location.bias"}},
        Score{"local",
              "dot",
              false,
              {"attention.key_proj.weight", "attention.centre.hidden", "attention.centre.weight",
               "attention.centre.bias"}}}) {
    CAPTURE(s.attention);
    CAPTURE(s.score);
    Decoder dec(small_config(0.f, s.coverage, s.score, s.attention));
    std::vector<std::string> names;
    for (auto* p : dec.params()) names.push_back(p->name);
    CHECK(names == joined({core, s.names}));
  }
}

TEST_CASE("decoder: every parameter and the features match finite differences") {
  struct Variant {
    std::string score, attention, order = "bahdanau";
  };
  // hard: with lambda_r = lambda_e = 0 the backward is the exact gradient of the loss given the sampled glimpses
  // (drawn from the same seed at every evaluation); the REINFORCE part is checked for bias separately.
  const std::vector<Variant> kinds = {{"dot", "soft"},
                                      {"general", "soft"},
                                      {"cosine", "soft"},
                                      {"location", "soft"},
                                      {"additive", "local"},
                                      {"general", "local"},
                                      {"additive", "none"},
                                      {"additive", "hard"},
                                      {"dot", "hard"},
                                      {"additive", "soft", "luong"},
                                      {"general", "soft", "luong"},
                                      {"additive", "local", "luong"},
                                      {"additive", "hard", "luong"},
                                      {"additive", "none", "luong"},
                                      {"additive", "soft", "updown"},
                                      {"general", "soft", "updown"},
                                      {"additive", "hard", "updown"},
                                      {"additive", "local", "updown"},
                                      {"additive", "none", "updown"}};
  for (int variant = 0; variant < 5 + (int)kinds.size(); ++variant) {
    {
      const Variant kind = variant < 5 ? Variant{"additive", "soft"} : kinds[variant - 5];
      const bool luong = kind.order == "luong" || kind.order == "updown";
      const float penalty = variant % 2 ? 3.f : 0.f;
      const float dropout = (variant >= 2 && variant < 5) || (luong && variant % 2 == 0) ? 0.3f : 0.f;
      // coverage: the additive Bahdanau variant 4 and the first (additive soft) Luong variant
      const bool coverage = variant == 4 || (luong && kind.score == "additive" && kind.attention == "soft");
      CAPTURE(penalty);
      CAPTURE(dropout);
      CAPTURE(coverage);
      CAPTURE(kind.score);
      CAPTURE(kind.attention);
      CAPTURE(kind.order);
      if (getenv("SAT_GRADCHECK_VERBOSE"))
        fprintf(stderr, "variant %d %s %s %s\n", variant, kind.score.c_str(), kind.attention.c_str(),
                kind.order.c_str());
      Rng rng(5);
      DecoderConfig cfg = small_config(dropout, coverage, kind.score, kind.attention);
      cfg.reinforce_weight = cfg.entropy_weight = 0;
      cfg.order = kind.order;
      if (variant % 2 == 0) cfg.hard_window = 3;
      Decoder dec(cfg);
      dec.init(rng);
      // Word vectors at the small scale (±0.1) where float32 central differences resolve the cosine score's
      // curvature; their unit-variance start is a training choice, not part of what is checked here.
      for (auto& v : param_named(dec, "embed.weight").value) v *= (float)(0.1 / std::sqrt(3.0));
      for (auto* p : dec.params())  // make biases non-zero so their paths are exercised
        for (auto& v : p->value) v += 0.05f * (float)rng.normal();
      Mat F = random_features(3, cfg, rng);
      CaptionBatch cb = small_batch();
      DecoderCache cache;
      check_gradients(
          dec, F, cache, [&](const Mat& G) { return loss_of(dec, G, cb, penalty, cache); }, true);
    }
  }
}

TEST_CASE("decoder: rows sharing a grid give what the grid copied for each row gives (loss, gradients, dF summed)") {
  struct Variant {
    std::string score, attention, order = "bahdanau";
    bool coverage = false;
  };
  const std::vector<Variant> kinds = {{"additive", "soft"},
                                      {"additive", "soft", "bahdanau", true},
                                      {"dot", "soft"},
                                      {"general", "soft"},
                                      {"cosine", "soft"},
                                      {"location", "soft"},
                                      {"additive", "local"},
                                      {"additive", "hard"},
                                      {"additive", "none"},
                                      {"general", "soft", "luong"},
                                      {"additive", "soft", "luong", true},
                                      {"additive", "soft", "updown", true},
                                      {"dot", "hard", "updown"}};
  for (const auto& kind : kinds) {
    CAPTURE(kind.score);
    CAPTURE(kind.attention);
    CAPTURE(kind.order);
    CAPTURE(kind.coverage);
    Rng rng(21);
    DecoderConfig cfg = small_config(0.3f, kind.coverage, kind.score, kind.attention);
    cfg.order = kind.order;
    Decoder dec(cfg);
    dec.init(rng);
    const int L = cfg.locations();
    Mat grids = random_features(2, cfg, rng);
    const std::vector<int> grid_of_row = {1, 0, 1};  // rows 0 and 2 read grid 1, out of order
    Mat copied(3 * L, cfg.feature_dim);
    for (int b = 0; b < 3; ++b) copied.middleRows(b * L, L) = grids.middleRows(grid_of_row[b] * L, L);

    std::vector<FloatBuffer> start;  // hard attention's training forward moves its baseline (a buffer): reset it
    for (auto* p : dec.params()) start.push_back(p->value);
    auto run = [&](const Mat& F, const CaptionBatch& cb, Mat& dF) {
      DecoderCache cache;
      auto params = dec.params();
      for (size_t k = 0; k < params.size(); ++k) params[k]->value = start[k], params[k]->zero_grad();
      const double loss = loss_of(dec, F, cb, 2.f, cache);
      dec.backward(cache, &dF);
      std::vector<FloatBuffer> grads;
      for (auto* p : dec.params()) grads.push_back(p->grad);
      return std::make_pair(loss, grads);
    };
    CaptionBatch each = small_batch(), shared = small_batch();
    shared.grid = grid_of_row;
    Mat dF_each, dF_shared;
    auto [loss_each, grads_each] = run(copied, each, dF_each);
    auto [loss_shared, grads_shared] = run(grids, shared, dF_shared);
    CHECK(loss_shared == doctest::Approx(loss_each).epsilon(1e-6));
    auto params = dec.params();
    for (size_t k = 0; k < params.size(); ++k) {
      CAPTURE(params[k]->name);
      float largest = 0, worst = 0;  // summation order differs: compare against the gradient's own scale
      for (size_t i = 0; i < grads_each[k].size(); ++i) {
        largest = std::max(largest, std::abs(grads_each[k][i]));
        worst = std::max(worst, std::abs(grads_shared[k][i] - grads_each[k][i]));
      }
      CHECK(worst <= 1e-5f * std::max(largest, 1e-3f));
    }
    REQUIRE(dF_shared.rows() == 2 * L);
    Mat summed = Mat::Zero(2 * L, cfg.feature_dim);
    for (int b = 0; b < 3; ++b) summed.middleRows(grid_of_row[b] * L, L) += dF_each.middleRows(b * L, L);
    CHECK((dF_shared - summed).cwiseAbs().maxCoeff() < 1e-5f * std::max(1.f, summed.cwiseAbs().maxCoeff()));
  }
  SUBCASE("a row reading a grid that is not there is refused") {
    DecoderConfig cfg = small_config(0.f);
    Decoder dec(cfg);
    Rng rng(1);
    dec.init(rng);
    CaptionBatch cb = small_batch();
    cb.grid = {0, 2, 1};
    DecoderCache cache;
    CHECK_THROWS_WITH_AS(dec.forward(random_features(2, cfg, rng), cb, 0.f, false, nullptr, cache),
                         "decoder: row 1 reads grid 2 of 2", Error);
  }
}

TEST_CASE("decoder: row weights (self-critical advantages, negative too) scale each caption's gradient exactly") {
  for (const char* attention : {"soft", "none", "local"}) {
    CAPTURE(attention);
    Rng rng(9);
    DecoderConfig cfg = small_config(0.f, false, "additive", attention);
    Decoder dec(cfg);
    dec.init(rng);
    Mat F = random_features(3, cfg, rng);
    CaptionBatch cb = small_batch();
    cb.row_weight = {0.7f, -1.3f, 2.0f};
    DecoderCache cache;
    DecoderLoss loss = dec.forward(F, cb, 0.f, false, nullptr, cache);
    CHECK(loss.weighted);
    CHECK(loss.total() == doctest::Approx(loss.trained_cross_entropy));
    CHECK(std::abs(loss.trained_cross_entropy - loss.cross_entropy) > 1e-3);  // the weights change the objective
    check_gradients(
        dec, F, cache, [&](const Mat& G) { return dec.forward(G, cb, 0.f, false, nullptr, cache).total(); }, false);
  }
}

TEST_CASE("decoder: label smoothing's gradient matches finite differences of its objective; 0 is the plain loss") {
  for (const char* attention : {"soft", "none"}) {
    CAPTURE(attention);
    Rng rng(13);
    DecoderConfig cfg = small_config(0.f, false, "additive", attention);
    Decoder dec(cfg);
    dec.init(rng);
    Mat F = random_features(3, cfg, rng);
    CaptionBatch cb = small_batch();
    DecoderCache cache;
    const DecoderLoss plain = dec.forward(F, cb, 0.f, false, nullptr, cache);
    CHECK(!plain.smoothed);
    CHECK(plain.total() == plain.cross_entropy);
    cb.label_smoothing = 0.1f;
    const DecoderLoss loss = dec.forward(F, cb, 0.f, false, nullptr, cache);
    CHECK(loss.smoothed);
    CHECK(loss.cross_entropy == plain.cross_entropy);  // the reported loss stays the plain one
    // (1 - eps) -log p(word) + eps * mean over the vocabulary of -log p, averaged over the real tokens
    double expected = 0;
    int tokens = 0;
    for (int t = 0; t < cb.T; ++t)
      for (int b = 0; b < cb.B; ++b) {
        if (cb.mask[(size_t)b * cb.T + t] == 0) continue;
        const auto row = cache.probs.row((int64_t)t * cb.B + b).array().cast<double>();
        expected += 0.9 * -std::log(row(cb.target[(size_t)b * cb.T + t])) + 0.1 * -row.log().mean();
        ++tokens;
      }
    CHECK(loss.trained_cross_entropy == doctest::Approx(expected / tokens).epsilon(1e-5));
    CHECK(loss.total() == doctest::Approx(loss.trained_cross_entropy));
    CHECK(std::abs(loss.trained_cross_entropy - plain.cross_entropy) > 1e-3);
    cb.row_weight = {0.7f, -1.3f, 2.0f};  // with row weights too, both apply
    check_gradients(
        dec, F, cache, [&](const Mat& G) { return dec.forward(G, cb, 0.f, false, nullptr, cache).total(); }, true);
    cb.label_smoothing = 1.f;
    CHECK_THROWS_AS(dec.forward(F, cb, 0.f, false, nullptr, cache), Error);
  }
}

TEST_CASE("decoder: word weights scale each token's cross-entropy by its target word's weight, gradient included") {
  for (const char* attention : {"soft", "none"}) {
    CAPTURE(attention);
    Rng rng(17);
    DecoderConfig cfg = small_config(0.f, false, "additive", attention);
    Decoder dec(cfg);
    dec.init(rng);
    Mat F = random_features(3, cfg, rng);
    CaptionBatch cb = small_batch();
    DecoderCache cache;
    const DecoderLoss plain = dec.forward(F, cb, 0.f, false, nullptr, cache);
    cb.word_weight.assign(cfg.vocab_size, 1.f);
    const DecoderLoss ones = dec.forward(F, cb, 0.f, false, nullptr, cache);
    CHECK(ones.trained_cross_entropy == doctest::Approx(plain.cross_entropy));  // all 1: the plain objective
    for (int w = 0; w < cfg.vocab_size; ++w) cb.word_weight[w] = 0.5f + 0.25f * (float)(w % 5);
    const DecoderLoss loss = dec.forward(F, cb, 0.f, false, nullptr, cache);
    CHECK(loss.weighted);
    CHECK(loss.cross_entropy == plain.cross_entropy);  // the reported loss stays the plain one
    double expected = 0;
    int tokens = 0;
    for (int t = 0; t < cb.T; ++t)
      for (int b = 0; b < cb.B; ++b) {
        if (cb.mask[(size_t)b * cb.T + t] == 0) continue;
        const int y = cb.target[(size_t)b * cb.T + t];
        expected += cb.word_weight[y] * -std::log((double)cache.probs((int64_t)t * cb.B + b, y));
        ++tokens;
      }
    CHECK(loss.trained_cross_entropy == doctest::Approx(expected / tokens).epsilon(1e-5));
    cb.label_smoothing = 0.1f;  // with label smoothing and row weights too, all apply
    cb.row_weight = {0.7f, -1.3f, 2.0f};
    check_gradients(
        dec, F, cache, [&](const Mat& G) { return dec.forward(G, cb, 0.f, false, nullptr, cache).total(); }, true);
    cb.word_weight.resize(3);
    CHECK_THROWS_WITH_AS(dec.forward(F, cb, 0.f, false, nullptr, cache),
                         ("decoder: 3 word weights for a vocabulary of " + std::to_string(cfg.vocab_size)).c_str(),
                         Error);
  }
}

TEST_CASE("decoder: the attention penalty is lambda * mean (1 - sum_t alpha)^2 and vanishes with lambda 0") {
  Rng rng(3);
  DecoderConfig cfg = small_config(0);
  Decoder dec(cfg);
  dec.init(rng);
  Mat F = random_features(3, cfg, rng);
  CaptionBatch cb = small_batch();
  DecoderCache cache;
  DecoderLoss l0 = dec.forward(F, cb, 0.f, false, nullptr, cache);
  CHECK(l0.penalty == 0.0);
  DecoderLoss l2 = dec.forward(F, cb, 2.f, false, nullptr, cache);
  double expect = 0;
  for (int b = 0; b < 3; ++b)
    for (int i = 0; i < cfg.locations(); ++i) {
      double s = 0;
      for (int t = 0; t < cb.T; ++t) s += cb.mask[b * cb.T + t] * cache.alpha[t](b, i);
      expect += (1 - s) * (1 - s);
    }
  expect = 2.0 * expect / (3 * cfg.locations());
  CHECK(l2.penalty == doctest::Approx(expect).epsilon(1e-5));
  CHECK(l2.cross_entropy == doctest::Approx(l0.cross_entropy).epsilon(1e-6));
}

TEST_CASE("decoder: a tiny batch overfits to near-zero loss") {
  Rng rng(11);
  DecoderConfig cfg = small_config(0);
  cfg.hidden_dim = 32;
  cfg.embed_dim = 16;
  Decoder dec(cfg);
  dec.init(rng);
  Mat F = random_features(3, cfg, rng);
  CaptionBatch cb = small_batch();
  auto params = dec.params();
  Adam adam;
  adam.attach(params);
  DecoderCache cache;
  Mat dF;
  double first = 0, last = 0;
  for (int it = 0; it < 300; ++it) {
    for (auto* p : params) p->zero_grad();
    DecoderLoss l = dec.forward(F, cb, 0.f, true, &rng, cache);
    if (it == 0) first = l.cross_entropy;
    last = l.cross_entropy;
    dec.backward(cache, &dF);
    adam.update(params, 1e-2f);
  }
  CHECK(first > 1.5);
  CHECK(last < 0.02);
  // ...and greedy decoding reproduces the memorized captions.
  auto hyps = greedy_search(dec, F, 3, 10);
  CHECK(hyps[0].tokens == std::vector<int>{4, 5, 6, 7});
  CHECK(hyps[1].tokens == std::vector<int>{8, 9});
  CHECK(hyps[2].tokens == std::vector<int>{10, 4, 5});
}

TEST_CASE("decoder: every attention kind and ordering learns a grounded toy task and beats its untrained self") {
  // Each image: one object at a random cell of the 2 x 3 grid with one of 3 colours and one of 3 shapes (feature
  // dimensions 0-2 and 3-5), the other cells noise. Caption: <colour word> <shape word>. Held-out images score it.
  const int D = 6, L = 6;
  auto make = [&](int B, Rng& rng, CaptionBatch& cb) {
    Mat F((int64_t)B * L, D);
    std::vector<std::vector<int>> caps;
    for (int b = 0; b < B; ++b) {
      int cell = (int)(rng.uniform() * L) % L, colour = (int)(rng.uniform() * 3) % 3,
          shape = (int)(rng.uniform() * 3) % 3;
      for (int i = 0; i < L; ++i)
        for (int d = 0; d < D; ++d) F(b * L + i, d) = 0.3f * (float)rng.normal();
      F(b * L + cell, colour) += 3.f;
      F(b * L + cell, 3 + shape) += 3.f;
      caps.push_back({3 + colour, 6 + shape});
    }
    cb = CaptionBatch::from_ids(caps, 4);
    return F;
  };
  struct Kind {
    std::string attention, score, order;
  };
  for (const Kind& k :
       {Kind{"soft", "additive", "bahdanau"}, Kind{"soft", "dot", "bahdanau"}, Kind{"soft", "general", "bahdanau"},
        Kind{"soft", "cosine", "bahdanau"}, Kind{"soft", "location", "bahdanau"}, Kind{"local", "additive", "bahdanau"},
        Kind{"hard", "additive", "bahdanau"}, Kind{"none", "additive", "bahdanau"}, Kind{"soft", "additive", "luong"},
        Kind{"hard", "general", "luong"}, Kind{"soft", "additive", "updown"}, Kind{"hard", "additive", "updown"}}) {
    CAPTURE(k.attention);
    CAPTURE(k.score);
    CAPTURE(k.order);
    Rng rng(8);
    DecoderConfig cfg = small_config(0.f, false, k.score, k.attention);
    cfg.order = k.order;
    cfg.feature_dim = D;
    cfg.vocab_size = 12;
    cfg.hidden_dim = 24;
    cfg.embed_dim = 12;
    cfg.attn_dim = 12;
    Decoder dec(cfg);
    dec.init(rng);
    CaptionBatch held_cb;
    Mat held = make(64, rng, held_cb);
    DecoderCache cache;
    const double untrained = dec.forward(held, held_cb, 0.f, false, nullptr, cache).cross_entropy;
    auto params = dec.params();
    Adam adam;
    adam.attach(params);
    for (int it = 0; it < 150; ++it) {
      CaptionBatch cb;
      Mat F = make(16, rng, cb);
      for (auto* p : params) p->zero_grad();
      dec.forward(F, cb, 0.f, true, &rng, cache);
      dec.backward(cache, nullptr);
      adam.update(params, 1e-2f);
    }
    const double trained = dec.forward(held, held_cb, 0.f, false, nullptr, cache).cross_entropy;
    MESSAGE(k.attention << " " << k.score << " " << k.order << ": held-out cross-entropy " << untrained << " -> "
                        << trained);
    CHECK(trained < 0.25 * untrained);
  }
}

TEST_CASE("decoder: step-by-step inference reproduces the teacher-forced forward for every ordering and kind") {
  struct Kind {
    std::string attention, order, score;
  };
  for (const Kind& k :
       {Kind{"soft", "bahdanau", "additive"}, Kind{"soft", "luong", "general"}, Kind{"local", "luong", "additive"},
        Kind{"hard", "bahdanau", "dot"}, Kind{"hard", "luong", "additive"}, Kind{"none", "luong", "additive"},
        Kind{"soft", "updown", "additive"}, Kind{"hard", "updown", "general"}, Kind{"none", "updown", "additive"}}) {
    CAPTURE(k.attention);
    CAPTURE(k.order);
    Rng rng(21);
    DecoderConfig cfg = small_config(0.3f, false, k.score, k.attention);
    cfg.order = k.order;
    Decoder dec(cfg);
    dec.init(rng);
    Mat F = random_features(3, cfg, rng);
    CaptionBatch cb = small_batch();
    DecoderCache cache;
    dec.forward(F, cb, 0.f, false, nullptr, cache);  // evaluation: no dropout, argmax glimpses
    Decoder::State st;
    dec.begin(F, 3, st);
    double worst = 0;
    for (int t = 0; t < cb.T; ++t) {
      std::vector<int> tokens(3);
      for (int b = 0; b < 3; ++b) tokens[b] = cb.input[(size_t)b * cb.T + t];
      Mat logprobs, alpha;
      dec.step(tokens, st, logprobs, alpha);
      for (int b = 0; b < 3; ++b)
        for (int v = 0; v < cfg.vocab_size; ++v)
          worst =
              std::max(worst, (double)std::abs(logprobs(b, v) - std::log(cache.probs((int64_t)t * cache.B + b, v))));
      if (cfg.attends()) worst = std::max(worst, (double)(alpha - cache.alpha[t]).cwiseAbs().maxCoeff());
    }
    CHECK(worst < 1e-5);
    // the words' part of the gates was computed once per distinct word the rows took
    std::set<int> words(cb.input.begin(), cb.input.end());
    CHECK(st.word_gates_filled == (int)words.size());
    CHECK((int)words.size() < 3 * cb.T);
  }
}

TEST_CASE("search: a beam's captions score what the teacher-forced forward gives them, for every ordering") {
  // The beam reorders its rows every step (select_rows): a state left behind would change the scores.
  for (const std::string order : {"bahdanau", "luong", "updown"}) {
    CAPTURE(order);
    Rng rng(17);
    DecoderConfig cfg = small_config(0.3f, true);
    cfg.order = order;
    Decoder dec(cfg);
    dec.init(rng);
    for (auto* p : dec.params())  // a sharper model than the initial one, so the beam's rows diverge
      for (auto& v : p->value) v *= 3.f;
    const int n = 4;
    Mat F = random_features(n, cfg, rng);
    const auto beams = beam_search(dec, F, n, 4, 12, 0.0);
    int checked = 0;
    for (int i = 0; i < n; ++i) {
      if (beams[i].alphas.size() != beams[i].tokens.size() + 1) continue;  // cut at the length limit: no <end>
      CaptionBatch cb = CaptionBatch::from_ids({beams[i].tokens}, 20);
      DecoderCache cache;
      Mat Fi = F.middleRows((int64_t)i * cfg.locations(), cfg.locations());
      const double ce = dec.forward(Fi, cb, 0.f, false, nullptr, cache).cross_entropy;
      CHECK(-ce * (double)cb.real_tokens() == doctest::Approx(beams[i].logprob).epsilon(1e-4));
      ++checked;
    }
    CHECK(checked > 0);
  }
}

TEST_CASE("search: beam 1 equals greedy, captions are never empty, alphas are distributions") {
  for (uint64_t seed : {1, 2, 3, 4}) {
    Rng rng(seed);
    DecoderConfig cfg = small_config(0, seed % 2 == 0);  // with and without coverage
    Decoder dec(cfg);
    dec.init(rng);
    Mat F = random_features(5, cfg, rng);
    auto g = greedy_search(dec, F, 5, 8);
    auto b1 = beam_search(dec, F, 5, 1, 8);
    auto b4 = beam_search(dec, F, 5, 4, 8);
    for (int i = 0; i < 5; ++i) {
      CHECK(g[i].tokens == b1[i].tokens);
      CHECK(g[i].logprob == doctest::Approx(b1[i].logprob).epsilon(1e-5));
      CHECK(!g[i].tokens.empty());
      CHECK(!b4[i].tokens.empty());
      CHECK(b4[i].score >= b1[i].score - 1e-6);  // a wider beam never finds a worse normalized score here
      CHECK(b4[i].alphas.size() >= b4[i].tokens.size());
      for (auto& a : b4[i].alphas) {
        double s = 0;
        for (float v : a) s += v;
        CHECK(s == doctest::Approx(1.0).epsilon(1e-4));
      }
    }
  }
}

TEST_CASE("search: length normalization picks among the same finished captions") {
  // The beam grows by plain log-probability whatever length_norm is, so both runs finish the same captions and
  // differ only in which one wins: length_norm 0 takes the most probable, 1 the best per-word mean.
  Rng rng(11);
  DecoderConfig cfg = small_config(0, false);
  Decoder dec(cfg);
  dec.init(rng);
  const int n = 16;
  Mat F = random_features(n, cfg, rng);
  auto plain = beam_search(dec, F, n, 4, 10, 0.0), mean = beam_search(dec, F, n, 4, 10, 1.0);
  int differ = 0;
  for (int i = 0; i < n; ++i) {
    auto words = [](const Hypothesis& h) { return (double)h.tokens.size() + (h.alphas.size() > h.tokens.size()); };
    CHECK(plain[i].score == doctest::Approx(plain[i].logprob));
    CHECK(mean[i].score == doctest::Approx(mean[i].logprob / words(mean[i])));
    CHECK(plain[i].logprob >= mean[i].logprob - 1e-9);
    CHECK(mean[i].score >= plain[i].logprob / words(plain[i]) - 1e-9);
    differ += plain[i].tokens != mean[i].tokens;
  }
  CHECK(differ > 0);  // the setting matters for some of these images
  CHECK_THROWS(beam_search(dec, F, n, 4, 10, -0.5));
}

TEST_CASE("search: no_repeat_ngram keeps every n-word phrase unique in greedy and beam captions") {
  // An untrained decoder loops ("w w w ..."), so without blocking repeats occur; with it none may.
  auto repeats = [](const std::vector<int>& t, int n) {
    std::set<std::vector<int>> seen;
    for (size_t i = 0; i + n <= t.size(); ++i)
      if (!seen.insert(std::vector<int>(t.begin() + i, t.begin() + i + n)).second) return true;
    return false;
  };
  Rng rng(21);
  DecoderConfig cfg = small_config(0, false);
  Decoder dec(cfg);
  dec.init(rng);
  const int n = 12, max_len = 12;
  Mat F = random_features(n, cfg, rng);
  for (int ngram : {1, 2, 3}) {
    int repeated_without = 0;
    for (int beam : {1, 3}) {
      auto free = beam == 1 ? greedy_search(dec, F, n, max_len) : beam_search(dec, F, n, beam, max_len);
      auto blocked =
          beam == 1 ? greedy_search(dec, F, n, max_len, ngram) : beam_search(dec, F, n, beam, max_len, 1.0, ngram);
      for (int i = 0; i < n; ++i) {
        repeated_without += repeats(free[i].tokens, ngram);
        CHECK_FALSE(repeats(blocked[i].tokens, ngram));
        CHECK(!blocked[i].tokens.empty());
        // captions that had no repeat are found unchanged
        if (!repeats(free[i].tokens, ngram) && beam == 1) CHECK(blocked[i].tokens == free[i].tokens);
      }
    }
    CHECK(repeated_without > 0);  // the check above could fail
  }
  CHECK_THROWS(greedy_search(dec, F, n, max_len, -1));
  CHECK_THROWS(beam_search(dec, F, n, 3, max_len, 1.0, kMaxNoRepeat + 1));
}

TEST_CASE("search: diverse beam groups") {
  Rng rng(17);
  DecoderConfig cfg = small_config(0, false);
  Decoder dec(cfg);
  dec.init(rng);
  const int n = 6, max_len = 10;
  Mat F = random_features(n, cfg, rng);
  auto same = [](const std::vector<std::vector<Hypothesis>>& a, const std::vector<std::vector<Hypothesis>>& b) {
    if (a.size() != b.size()) return false;
    for (size_t i = 0; i < a.size(); ++i) {
      if (a[i].size() != b[i].size()) return false;
      for (size_t k = 0; k < a[i].size(); ++k)
        if (a[i][k].tokens != b[i][k].tokens || std::abs(a[i][k].logprob - b[i][k].logprob) > 1e-9) return false;
    }
    return true;
  };
  // One group is plain beam search, whatever the penalty.
  const auto plain = beam_search_nbest(dec, F, n, 4, max_len, 0.5, 2);
  CHECK(same(beam_search_nbest(dec, F, n, 4, max_len, 0.5, 2, {1, 5.0}), plain));
  // Without a penalty each of G groups is the same beam search of beam / G rows: its captions, G times over.
  const auto narrow = beam_search_nbest(dec, F, n, 2, max_len, 0.5, 2);
  const auto twice = beam_search_nbest(dec, F, n, 4, max_len, 0.5, 2, {2, 0.0});
  for (int i = 0; i < n; ++i) {
    std::multiset<std::vector<int>> want, got;
    for (auto& h : narrow[i]) want.insert(h.tokens), want.insert(h.tokens);
    for (auto& h : twice[i]) got.insert(h.tokens);
    CHECK(got == want);
  }
  // With one row per group and a prohibitive penalty, no two groups start with the same word, and a caption's
  // log p is its own (what teacher forcing gives it), not the penalized rank it was chosen by.
  const int beam = 6;
  const auto diverse = beam_search_nbest(dec, F, n, beam, max_len, 1.0, 0, {beam, kMaxDiversityPenalty});
  int distinct_total = 0, plain_distinct_total = 0;
  const auto plain6 = beam_search_nbest(dec, F, n, beam, max_len, 1.0, 0);
  for (int i = 0; i < n; ++i) {
    CAPTURE(i);
    REQUIRE(diverse[i].size() == (size_t)beam);  // one finished caption per group
    std::set<int> first;
    std::vector<std::vector<int>> captions;
    for (auto& h : diverse[i]) {
      first.insert(h.tokens.front());
      if ((int)h.tokens.size() < max_len) captions.push_back(h.tokens);
    }
    CHECK(first.size() == (size_t)beam);
    std::set<int> plain_first;
    for (auto& h : plain6[i]) plain_first.insert(h.tokens.front());
    distinct_total += (int)first.size(), plain_distinct_total += (int)plain_first.size();
    for (size_t k = 1; k < diverse[i].size(); ++k) CHECK(diverse[i][k - 1].score >= diverse[i][k].score);
    const auto scored = score_captions(dec, F.middleRows(i * cfg.locations(), cfg.locations()), captions, max_len, 1.0);
    size_t c = 0;
    for (auto& h : diverse[i])
      if ((int)h.tokens.size() < max_len) CHECK(scored[c++].logprob == doctest::Approx(h.logprob).epsilon(1e-5));
  }
  CHECK(distinct_total > plain_distinct_total);  // plain beam search shares first words here: the check can fail
  // The beam search's best caption is the list's first, as without groups.
  const auto best = beam_search(dec, F, n, beam, max_len, 1.0, 0, {3, 2.0});
  const auto lists = beam_search_nbest(dec, F, n, beam, max_len, 1.0, 0, {3, 2.0});
  for (int i = 0; i < n; ++i) CHECK(best[i].tokens == lists[i].front().tokens);
  CHECK(error_of([&] {
          beam_search(dec, F, n, 4, max_len, 1.0, 0, {3, 1.0});
        }).find("divide the beam size (4); got 3") != std::string::npos);
  CHECK(error_of([&] { beam_search(dec, F, n, 4, max_len, 1.0, 0, {0, 1.0}); }).find("divide") != std::string::npos);
  CHECK(error_of([&] {
          beam_search(dec, F, n, 4, max_len, 1.0, 0, {2, -1.0});
        }).find("penalty must be in [0, 100]") != std::string::npos);
  CHECK_THROWS(beam_search(dec, F, n, 4, max_len, 1.0, 0, {2, std::nan("")}));
}

TEST_CASE("search: the beam steered toward some words finds captions with them, each keeping its own log p") {
  Rng rng(23);
  DecoderConfig cfg = small_config(0, false);
  Decoder dec(cfg);
  dec.init(rng);
  const int n = 5, beam = 4, max_len = 8, V = cfg.vocab_size;
  Mat F = random_features(n, cfg, rng);
  const auto plain = beam_search_nbest(dec, F, n, beam, max_len, 1.0, 0);
  auto says = [](const Hypothesis& h, int w) {
    return std::find(h.tokens.begin(), h.tokens.end(), w) != h.tokens.end();
  };
  // Two words of one group (0), the others in none; the words the plain beam says least often are chosen, so the
  // steering has something to change.
  std::vector<int> count(V, 0);
  for (auto& list : plain)
    for (auto& h : list)
      for (int w : std::set<int>(h.tokens.begin(), h.tokens.end())) ++count[w];
  std::vector<int> words;
  for (int w = 4; w < V; ++w) words.push_back(w);
  std::stable_sort(words.begin(), words.end(), [&](int a, int b) { return count[a] < count[b]; });
  const int w1 = words[0], w2 = words[1];
  BeamSteering steering;
  steering.word_group.assign(V, -1);
  steering.word_group[w1] = steering.word_group[w2] = 0;
  auto steered = [&](float bonus) {
    steering.bonus = Mat::Constant(n, 1, bonus);
    return beam_search_nbest(dec, F, n, beam, max_len, 1.0, 0, {}, steering);
  };
  // No bonus: the plain search, caption for caption.
  const auto zero = steered(0.f);
  for (int i = 0; i < n; ++i) {
    REQUIRE(zero[i].size() == plain[i].size());
    for (size_t k = 0; k < plain[i].size(); ++k) {
      CHECK(zero[i][k].tokens == plain[i][k].tokens);
      CHECK(zero[i][k].logprob == plain[i][k].logprob);
    }
  }
  // A prohibitive bonus: from the second step every row has said a word of the group, so every caption does; a
  // prohibitive cost: none does. Either way each caption's log p is the one teacher forcing gives it.
  int plain_with = 0;
  for (auto& list : plain)
    for (auto& h : list) plain_with += says(h, w1) || says(h, w2);
  for (const float bonus : {100.f, -100.f}) {
    CAPTURE(bonus);
    const auto found = steered(bonus);
    int with = 0, total = 0;
    for (int i = 0; i < n; ++i) {
      std::vector<std::vector<int>> captions;
      for (auto& h : found[i]) {
        with += says(h, w1) || says(h, w2), ++total;
        if ((int)h.tokens.size() < max_len) captions.push_back(h.tokens);
      }
      for (size_t k = 1; k < found[i].size(); ++k) CHECK(found[i][k - 1].score >= found[i][k].score);
      const auto scored = score_captions(dec, F.middleRows(i * cfg.locations(), cfg.locations()), captions, max_len);
      size_t c = 0;
      for (auto& h : found[i])
        if ((int)h.tokens.size() < max_len) CHECK(scored[c++].logprob == doctest::Approx(h.logprob).epsilon(1e-5));
    }
    CHECK(with == (bonus > 0 ? total : 0));
  }
  CHECK(plain_with < n * beam);  // the plain beam leaves the words out of some captions: the checks above can fail
  // The bonus is each image's: steering image 0 alone leaves the others' captions as they were.
  steering.bonus = Mat::Zero(n, 1);
  steering.bonus(0, 0) = 100.f;
  const auto first_only = beam_search_nbest(dec, F, n, beam, max_len, 1.0, 0, {}, steering);
  for (auto& h : first_only[0]) CHECK((says(h, w1) || says(h, w2)));
  for (int i = 1; i < n; ++i)
    for (size_t k = 0; k < plain[i].size(); ++k) CHECK(first_only[i][k].tokens == plain[i][k].tokens);
  // A group gains once per caption: were every mention to gain, no row would ever take <end> over another mention
  // worth 100, and every caption would run to the length limit.
  steering.bonus = Mat::Constant(n, 1, 100.f);
  int ended = 0;
  for (auto& list : steered(100.f))
    for (auto& h : list) ended += h.alphas.size() == h.tokens.size() + 1;  // finished by <end>, not cut off
  CHECK(ended > 0);
  // Shapes and values checked.
  auto error_with = [&](const BeamSteering& s) {
    return error_of([&] { beam_search_nbest(dec, F, n, beam, max_len, 1.0, 0, {}, s); });
  };
  BeamSteering bad = steering;
  bad.word_group.pop_back();
  CHECK(error_with(bad).find("word groups for a vocabulary of") != std::string::npos);
  bad = steering;
  bad.bonus = Mat::Zero(n - 1, 1);
  CHECK(error_with(bad).find("bonuses of 4 x 1 for 5 images") != std::string::npos);
  bad = steering;
  bad.word_group[w1] = 1;
  CHECK(error_with(bad).find("word group 1 out of range") != std::string::npos);
  bad = steering;
  bad.bonus(2, 0) = std::numeric_limits<float>::infinity();
  CHECK(error_with(bad).find("not finite") != std::string::npos);
}

TEST_CASE("search: a caption constrained to say a word is the best such caption, found as exhaustive search finds it") {
  // Three words and captions of at most 4: a beam of 200 holds every caption, so the plain search's list is every
  // caption there is, and the best of those that say the word is what the constrained search must find.
  for (const double norm : {0.0, 1.0}) {
    CAPTURE(norm);
    Rng rng(29);
    DecoderConfig cfg = small_config(0, false);
    cfg.vocab_size = 7;  // <pad> <start> <end> <unk> and words 4, 5, 6
    Decoder dec(cfg);
    dec.init(rng);
    for (auto* p : dec.params())  // sharper than the initial model, so captions differ in score
      for (auto& v : p->value) v *= 3.f;
    const int n = 3, max_len = 4;
    Mat F = random_features(n, cfg, rng);
    const auto every = beam_search_nbest(dec, F, n, 200, max_len, norm);
    for (int word = 4; word < 7; ++word) {
      CAPTURE(word);
      const auto found = beam_search_including(dec, F, n, 200, max_len, norm, 0, std::vector<int>(n, word));
      const auto narrow = beam_search_including(dec, F, n, 2, max_len, norm, 0, std::vector<int>(n, word));
      for (int i = 0; i < n; ++i) {
        CHECK(every[i].size() == 3 + 9 + 27 + 81);  // 1 to 3 words and <end>, or 4 words cut off
        std::vector<const Hypothesis*> saying;
        for (auto& h : every[i])
          if (std::count(h.tokens.begin(), h.tokens.end(), word)) saying.push_back(&h);
        REQUIRE(found[i].size() == std::min<size_t>(saying.size(), 200));
        CHECK(found[i][0].tokens == saying[0]->tokens);  // both lists are best first
        CHECK(found[i][0].score == doctest::Approx(saying[0]->score).epsilon(1e-5));
        REQUIRE(!narrow[i].empty());
        CHECK(narrow[i].size() <= 2);
        for (auto& h : narrow[i]) CHECK(std::count(h.tokens.begin(), h.tokens.end(), word) > 0);
        for (size_t k = 1; k < narrow[i].size(); ++k) CHECK(narrow[i][k - 1].score >= narrow[i][k].score);
        for (auto& h : found[i]) CHECK(h.alphas.size() >= h.tokens.size());
      }
    }
  }
  Rng rng(3);
  DecoderConfig cfg = small_config(0, false);
  Decoder dec(cfg);
  dec.init(rng);
  Mat F = random_features(2, cfg, rng);
  CHECK_THROWS(beam_search_including(dec, F, 2, 3, 8, 1.0, 0, {5}));      // one word per image
  CHECK_THROWS(beam_search_including(dec, F, 2, 3, 8, 1.0, 0, {5, 2}));   // <end> is not a word to say
  CHECK_THROWS(beam_search_including(dec, F, 2, 3, 8, 1.0, 0, {5, 11}));  // outside the vocabulary
  // with repeats blocked, the word still appears and no word repeats
  const auto once = beam_search_including(dec, F, 2, 3, 8, 1.0, 1, {5, 7});
  for (int i = 0; i < 2; ++i)
    for (auto& h : once[i]) {
      CHECK(std::count(h.tokens.begin(), h.tokens.end(), i == 0 ? 5 : 7) == 1);
      CHECK(std::set<int>(h.tokens.begin(), h.tokens.end()).size() == h.tokens.size());
    }
}

TEST_CASE("search: sampled first words follow the model's distribution") {
  Rng rng(13);
  DecoderConfig cfg = small_config(0, false);
  Decoder dec(cfg);
  dec.init(rng);
  Param& out_bias = param_named(dec, "out.bias");
  for (int w = 4; w < cfg.vocab_size; ++w) out_bias.value[w] = 0.4f * (w % 4);  // an uneven distribution
  Mat F1 = random_features(1, cfg, rng);
  Decoder::State st;
  dec.begin(F1, 1, st);
  Mat logp, alpha;
  dec.step({1}, st, logp, alpha);  // <start>
  std::vector<double> p(cfg.vocab_size, 0.0);
  double allowed = 0;
  for (int w = 4; w < cfg.vocab_size; ++w) allowed += p[w] = std::exp((double)logp(0, w));
  const int n = 4000;
  Mat F((int64_t)n * cfg.locations(), cfg.feature_dim);
  for (int i = 0; i < n; ++i) F.middleRows((int64_t)i * cfg.locations(), cfg.locations()) = F1;
  Rng draw(21);
  auto hyps = sample_search(dec, F, n, 3, draw);
  std::vector<int> count(cfg.vocab_size, 0);
  for (auto& h : hyps) {
    REQUIRE(!h.tokens.empty());
    count[h.tokens[0]]++;
  }
  for (int w = 0; w < 4; ++w) CHECK(count[w] == 0);  // specials and <end> at the first step: never
  for (int w = 4; w < cfg.vocab_size; ++w) {
    const double q = p[w] / allowed, se = std::sqrt(q * (1 - q) / n);
    CAPTURE(w);
    CHECK(std::abs(count[w] / (double)n - q) < 4 * se + 1e-9);
  }
}

TEST_CASE("search: <unk>, <pad> and <start> are never emitted, even when the model prefers them") {
  Rng rng(7);
  DecoderConfig cfg = small_config(0, false);
  Decoder dec(cfg);
  dec.init(rng);
  Param& out_bias = param_named(dec, "out.bias");
  out_bias.value[0] = out_bias.value[1] = out_bias.value[3] = 50.f;  // <pad>, <start>, <unk> win by far
  Mat F = random_features(4, cfg, rng);
  for (auto& hyps : {greedy_search(dec, F, 4, 6), beam_search(dec, F, 4, 3, 6)})
    for (auto& h : hyps) {
      CHECK(!h.tokens.empty());
      for (int w : h.tokens) CHECK((w != 0 && w != 1 && w != 3));
    }
}

TEST_CASE("REINFORCE: the estimator of hard attention is unbiased on a toy problem with a known gradient") {
  // J(e) = E_{s ~ softmax(e)} f(s). Exact: dJ/de_i = alpha_i (f_i - J). The estimator add_reinforce_grad gives for
  // the loss -J (lambda_r = 1, advantage f(s) - b) must average to -dJ/de, for any baseline b.
  const int L = 5;
  const float e[L] = {0.3f, -1.0f, 0.8f, 0.1f, -0.4f}, f[L] = {1.0f, 3.0f, -2.0f, 0.5f, 4.0f};
  float alpha[L], mx = *std::max_element(e, e + L), sum = 0;
  for (int i = 0; i < L; ++i) sum += alpha[i] = std::exp(e[i] - mx);
  double J = 0;
  for (int i = 0; i < L; ++i) alpha[i] /= sum, J += alpha[i] * f[i];
  for (float baseline : {0.f, 1.2f}) {
    Rng rng(99);
    const int N = 40000;
    std::vector<double> mean(L, 0), sq(L, 0);
    for (int k = 0; k < N; ++k) {
      double u = rng.uniform(), acc = 0;
      int s = L - 1;
      for (int i = 0; i < L; ++i)
        if ((acc += alpha[i]) > u) {
          s = i;
          break;
        }
      float de[L] = {0};
      add_reinforce_grad(alpha, L, s, f[s] - baseline, 1.f, 0.f, 1.f, de);
      for (int i = 0; i < L; ++i) mean[i] += de[i] / N, sq[i] += (double)de[i] * de[i] / N;
    }
    for (int i = 0; i < L; ++i) {
      double exact = -alpha[i] * (f[i] - J), se = std::sqrt((sq[i] - mean[i] * mean[i]) / N);
      CAPTURE(baseline);
      CAPTURE(i);
      CHECK(std::fabs(mean[i] - exact) < 4 * se);
      CHECK(se < 0.05);  // enough samples for the check to mean something
    }
  }
  // The entropy bonus is deterministic: lambda_e * d(-H)/de against finite differences.
  float de[L] = {0};
  add_reinforce_grad(alpha, L, 0, 0.f, 0.f, 1.f, 1.f, de);
  auto negH = [&](const float* x) {
    float a[L], m = *std::max_element(x, x + L), z = 0;
    for (int i = 0; i < L; ++i) z += a[i] = std::exp(x[i] - m);
    double h = 0;
    for (int i = 0; i < L; ++i) h += (a[i] / z) * std::log(a[i] / z);
    return h;
  };
  for (int i = 0; i < L; ++i) {
    float xp[L], xm[L];
    std::copy(e, e + L, xp), std::copy(e, e + L, xm);
    xp[i] += 1e-3f, xm[i] -= 1e-3f;
    CHECK(de[i] == doctest::Approx((negH(xp) - negH(xm)) / 2e-3).epsilon(1e-2));
  }
}

TEST_CASE("REINFORCE with a leave-one-out baseline over K samples is unbiased and has less variance than no baseline") {
  // Same toy problem, rewards shifted far from zero (like log p of a whole caption): f(s) + 20. K samples per
  // estimate; sample k's weight is its reward minus the mean reward of the other K - 1.
  const int L = 5, K = 4, N = 20000;
  const float e[L] = {0.3f, -1.0f, 0.8f, 0.1f, -0.4f}, f[L] = {21.0f, 23.0f, 18.0f, 20.5f, 24.0f};
  float alpha[L], mx = *std::max_element(e, e + L), sum = 0;
  for (int i = 0; i < L; ++i) sum += alpha[i] = std::exp(e[i] - mx);
  double J = 0;
  for (int i = 0; i < L; ++i) alpha[i] /= sum, J += alpha[i] * f[i];
  CHECK_THROWS_AS(leave_one_out_advantages({1.0, 2.0, 3.0}, 2), Error);
  const std::vector<double> adv = leave_one_out_advantages({1.0, 3.0, 5.0, 10.0, 20.0, 30.0}, 3);
  CHECK(adv[0] == doctest::Approx(1.0 - 4.0));
  CHECK(adv[4] == doctest::Approx(20.0 - 20.0));
  double var_loo = 0, var_plain = 0;
  for (bool loo : {true, false}) {
    Rng rng(7);
    std::vector<double> mean(L, 0), sq(L, 0);
    for (int k = 0; k < N; ++k) {
      std::vector<int> s(K, L - 1);
      std::vector<double> reward(K);
      for (int j = 0; j < K; ++j) {
        double u = rng.uniform(), acc = 0;
        for (int i = 0; i < L; ++i)
          if ((acc += alpha[i]) > u) {
            s[j] = i;
            break;
          }
        reward[j] = f[s[j]];
      }
      const std::vector<double> a = loo ? leave_one_out_advantages(reward, K) : reward;
      float de[L] = {0};
      for (int j = 0; j < K; ++j) add_reinforce_grad(alpha, L, s[j], (float)a[j], 1.f, 0.f, 1.f / K, de);
      for (int i = 0; i < L; ++i) mean[i] += de[i] / N, sq[i] += (double)de[i] * de[i] / N;
    }
    double var = 0;
    for (int i = 0; i < L; ++i) {
      double exact = -alpha[i] * (f[i] - J), se = std::sqrt((sq[i] - mean[i] * mean[i]) / N);
      CAPTURE(loo);
      CAPTURE(i);
      CHECK(std::fabs(mean[i] - exact) < 4 * se);
      var += sq[i] - mean[i] * mean[i];
    }
    (loo ? var_loo : var_plain) = var;
  }
  CHECK(var_loo < 0.05 * var_plain);  // the shared offset of the rewards no longer enters the weights
}

TEST_CASE("few-rows product: equals Eigen's product at every row count, width and stride, set or accumulated") {
  Rng rng(17);
  auto random = [&](int r, int c) {
    Mat m(r, c);
    for (int64_t i = 0; i < m.size(); ++i) m.data()[i] = (float)rng.normal();
    return m;
  };
  int checked = 0;
  for (int B : {1, 2, 5, 10, 12, 13, 24, 25, 31})
    for (int K : {0, 1, 7, 64, 300})
      for (int N : {1, 31, 32, 33, 96, 257}) {
        CAPTURE(B);
        CAPTURE(K);
        CAPTURE(N);
        // Views into larger matrices: leading dimensions wider than the rows.
        const Mat Xbig = random(B, K + 3), Wbig = random(std::max(K, 1), N + 5);
        const auto X = Xbig.leftCols(K);
        const auto W = Wbig.topLeftCorner(K, N);
        const Mat want = X * W;
        Mat outbig = random(B, N + 2);
        const Mat before = outbig;
        few_rows_product(X.data(), Xbig.outerStride(), B, K, W.data(), Wbig.outerStride(), N, outbig.data(),
                         outbig.outerStride(), false);
        CHECK((outbig.leftCols(N) - want).cwiseAbs().maxCoeff() <= 1e-4f * (1 + std::sqrt((float)K)));
        CHECK(outbig.rightCols(2) == before.rightCols(2));  // nothing written past N
        few_rows_product(X.data(), Xbig.outerStride(), B, K, W.data(), Wbig.outerStride(), N, outbig.data(),
                         outbig.outerStride(), true);
        CHECK((outbig.leftCols(N) - 2 * want).cwiseAbs().maxCoeff() <= 2e-4f * (1 + std::sqrt((float)K)));
        // times(): the few-rows product up to kFewRows rows, Eigen's above; the same result either way.
        Mat viaTimes;
        times(Mat(X), Mat(W), viaTimes, false);
        CHECK(viaTimes.rows() == B);
        CHECK(viaTimes.cols() == N);
        CHECK((viaTimes - want).cwiseAbs().maxCoeff() <= 1e-4f * (1 + std::sqrt((float)K)));
        Mat acc = Mat::Ones(B, N);
        times(Mat(X), Mat(W), acc, true);
        CHECK((acc - want - Mat::Ones(B, N)).cwiseAbs().maxCoeff() <= 1e-4f * (1 + std::sqrt((float)K)));
        ++checked;
      }
  CHECK(checked == 9 * 5 * 6);
}
