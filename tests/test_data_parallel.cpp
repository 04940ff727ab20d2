#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>

#include "seq/decoder.hpp"
#include "train/data_parallel.hpp"

using namespace sat;

TEST_CASE("data parallel: shares are contiguous, in rank order, cover the batch and differ by at most one") {
  for (int n : {0, 1, 5, 16, 17})
    for (int ranks : {1, 2, 3, 4, 7}) {
      CAPTURE(n);
      CAPTURE(ranks);
      int next = 0, smallest = n, largest = 0;
      for (int r = 0; r < ranks; ++r) {
        Share s = share_of(n, ranks, r);
        CHECK(s.begin == next);
        next = s.end;
        smallest = std::min(smallest, s.size());
        largest = std::max(largest, s.size());
      }
      CHECK(next == n);
      CHECK(largest - smallest <= 1);
    }
  CHECK(share_of(17, 4, 0).size() == 5);  // the first n % ranks shares are the larger ones
  CHECK(share_of(17, 4, 3).begin == 13);
  CHECK_THROWS_AS(share_of(4, 2, 2), Error);
  CHECK_THROWS_AS(share_of(4, 0, 0), Error);
}

TEST_CASE("data parallel: the step exchange packs gradients, weighted buffers and statistics, and unpacks their sums") {
  Param w("w", {2, 3}), b("b", {3}), running("running_mean", {2}, false), v("v", {4});
  std::vector<Param*> params = {&w, &running, &b, &v};  // a buffer among the trained tensors
  for (Param* p : params) p->grad.assign(p->value.size(), 0.f);
  StepExchange exchange(params, 2);
  CHECK(exchange.gradient_floats() == 6 + 3 + 4);
  CHECK(exchange.size() == 6 + 3 + 4 + 2 + 2);
  // Two "ranks": each fills its gradients and buffer, packs, and the packed buffers are summed as MPI would.
  auto fill = [&](float base) {
    for (Param* p : params)
      for (size_t i = 0; i < p->value.size(); ++i) (p->trainable ? p->grad : p->value)[i] = base + (float)i;
  };
  fill(1.f);
  exchange.pack(params, {1.f, 0.25f, 1.f, 1.f}, {10.0, 2.0});
  std::vector<float> summed(exchange.data(), exchange.data() + exchange.size());
  fill(100.f);
  exchange.pack(params, {1.f, 0.75f, 1.f, 1.f}, {5.0, 1.0});
  for (int64_t i = 0; i < exchange.size(); ++i) exchange.data()[i] += summed[i];
  fill(-7.f);  // what unpacking must overwrite
  std::vector<double> stats;
  exchange.unpack(params, stats);
  for (Param* p : {&w, &b, &v})
    for (size_t i = 0; i < p->grad.size(); ++i) CHECK(p->grad[i] == 101.f + 2 * i);
  for (size_t i = 0; i < running.value.size(); ++i)  // the buffer: 0.25 of rank 0's value + 0.75 of rank 1's
    CHECK(running.value[i] == doctest::Approx(0.25 * (1 + i) + 0.75 * (100 + i)));
  CHECK(stats == std::vector<double>{15.0, 3.0});
  CHECK_THROWS_AS(exchange.pack(params, {1.f, 1.f, 1.f, 1.f}, {1.0}), Error);  // statistics count
  CHECK_THROWS_AS(exchange.pack({&w, &b}, {1.f, 1.f}, {1.0, 2.0}), Error);     // another parameter list
}

TEST_CASE(
    "data parallel: the ranks' shares of a batch sum to the whole batch's gradient and baseline, for every kind") {
  struct Kind {
    std::string attention, score, order;
    int samples;
  };
  const std::vector<Kind> kinds = {{"soft", "additive", "bahdanau", 1}, {"hard", "additive", "bahdanau", 1},
                                   {"hard", "additive", "luong", 2},    {"local", "dot", "bahdanau", 1},
                                   {"none", "additive", "bahdanau", 1}, {"soft", "cosine", "luong", 1},
                                   {"soft", "additive", "updown", 1},   {"hard", "dot", "updown", 2}};
  for (const Kind& kind : kinds) {
    CAPTURE(kind.attention);
    CAPTURE(kind.score);
    CAPTURE(kind.order);
    CAPTURE(kind.samples);
    DecoderConfig cfg;
    cfg.vocab_size = 13, cfg.embed_dim = 6, cfg.hidden_dim = 7, cfg.attn_dim = 5, cfg.feature_dim = 4;
    cfg.grid_h = 2, cfg.grid_w = 3, cfg.dropout = 0.3f,
    cfg.coverage = kind.score == "additive" && kind.attention == "soft";
    cfg.attention = kind.attention, cfg.score = kind.score, cfg.order = kind.order;
    Rng rng(5);
    Decoder dec(cfg);
    dec.init(rng);
    auto params = dec.params();
    std::vector<FloatBuffer> start;
    for (auto* p : params) start.push_back(p->value);
    const int L = cfg.locations(), photos = 3;
    Mat F((int64_t)photos * L, cfg.feature_dim);
    for (int64_t i = 0; i < F.size(); ++i) F.data()[i] = (float)rng.normal();
    // The global batch: photo k's captions (several glimpse samples of each with hard attention), in photo order.
    const std::vector<std::vector<std::vector<int>>> captions = {
        {{4, 5, 6, 7}, {8, 9}}, {{10, 4, 5}, {11, 12, 4, 5, 6}, {7}}, {{9, 10}}};
    std::vector<std::vector<int>> caps;
    std::vector<int> photo;
    for (int k = 0; k < photos; ++k)
      for (auto& c : captions[k])
        for (int r = 0; r < kind.samples; ++r) caps.push_back(c), photo.push_back(k);
    const uint64_t step_seed = 1234;
    // One step on the photos [first, last) of the batch, normalized by the whole batch: the gradients, the
    // gradient sent to the grids, and the baseline after the step.
    auto run = [&](int first, int last, Mat& dF) {
      for (size_t k = 0; k < params.size(); ++k) params[k]->value = start[k], params[k]->zero_grad();
      std::vector<std::vector<int>> rows;
      CaptionBatch cb;
      std::vector<int> grid;
      std::vector<uint64_t> seeds;
      for (size_t r = 0; r < caps.size(); ++r)
        if (photo[r] >= first && photo[r] < last) {
          rows.push_back(caps[r]);
          grid.push_back(photo[r] - first);
          seeds.push_back(row_seed(step_seed, r));
        }
      cb = CaptionBatch::from_ids(rows, 10);
      cb.grid = grid, cb.row_seed = seeds, cb.samples = kind.samples;
      cb.norm_tokens = CaptionBatch::from_ids(caps, 10).real_tokens();
      cb.norm_rows = (int)caps.size();
      const Mat share = F.middleRows((int64_t)first * L, (int64_t)(last - first) * L);
      DecoderCache cache;
      dec.forward(share, cb, 2.f, true, nullptr, cache);
      dec.backward(cache, &dF);
      return (double)rows.size() / caps.size();  // this share's weight for the buffers
    };
    Mat dF_whole, dF0, dF1;
    run(0, photos, dF_whole);
    std::vector<FloatBuffer> grad_whole, value_whole;
    for (auto* p : params) grad_whole.push_back(p->grad), value_whole.push_back(p->value);
    // Two ranks: photos 0-1 and photo 2, each packed; their sum unpacked (what the MPI sum does)
    StepExchange exchange(params, 0);
    const double w0 = run(0, 2, dF0);
    std::vector<float> weights0(params.size(), (float)w0);
    exchange.pack(params, weights0, {});
    std::vector<float> sum(exchange.data(), exchange.data() + exchange.size());
    const double w1 = run(2, 3, dF1);
    CHECK(w0 + w1 == doctest::Approx(1.0));
    exchange.pack(params, std::vector<float>(params.size(), (float)w1), {});
    for (int64_t i = 0; i < exchange.size(); ++i) exchange.data()[i] += sum[i];
    std::vector<double> no_stats;
    exchange.unpack(params, no_stats);
    for (size_t k = 0; k < params.size(); ++k) {
      CAPTURE(params[k]->name);
      const FloatBuffer& whole = params[k]->trainable ? grad_whole[k] : value_whole[k];
      const FloatBuffer& shared = params[k]->trainable ? params[k]->grad : params[k]->value;
      float largest = 0, worst = 0;  // summed in another order: compared against the tensor's own scale
      for (size_t i = 0; i < whole.size(); ++i) {
        largest = std::max(largest, std::abs(whole[i]));
        worst = std::max(worst, std::abs(shared[i] - whole[i]));
      }
      CHECK(worst <= 1e-5f * std::max(largest, 1e-3f));
    }
    // The grids' gradient (what fine-tuned encoder blocks receive): each rank's rows of the whole batch's.
    Mat dF_joined(dF_whole.rows(), dF_whole.cols());
    dF_joined << dF0, dF1;
    CHECK((dF_joined - dF_whole).cwiseAbs().maxCoeff() <= 1e-5f * std::max(1e-3f, dF_whole.cwiseAbs().maxCoeff()));
  }
}

TEST_CASE("data parallel: a caption's dropout masks and glimpses come from its own stream, whatever else is batched") {
  DecoderConfig cfg;
  cfg.vocab_size = 13, cfg.embed_dim = 6, cfg.hidden_dim = 7, cfg.attn_dim = 5, cfg.feature_dim = 4;
  cfg.grid_h = 2, cfg.grid_w = 3, cfg.dropout = 0.5f, cfg.attention = "hard";
  Rng rng(3);
  Decoder dec(cfg);
  dec.init(rng);
  Mat F(2 * cfg.locations(), cfg.feature_dim);
  for (int64_t i = 0; i < F.size(); ++i) F.data()[i] = (float)rng.normal();
  CaptionBatch both = CaptionBatch::from_ids({{4, 5, 6}, {7, 8, 9, 10}}, 10);
  both.row_seed = {row_seed(9, 0), row_seed(9, 1)};
  CaptionBatch second = CaptionBatch::from_ids({{7, 8, 9, 10}}, 10);
  second.row_seed = {row_seed(9, 1)};
  DecoderCache a, b;
  dec.forward(F, both, 0.f, true, nullptr, a);
  dec.forward(F.bottomRows(cfg.locations()), second, 0.f, true, nullptr, b);  // the second caption alone
  for (int t = 0; t < b.T; ++t) {
    CHECK(a.hdrop_mask.row((int64_t)t * a.B + 1) == b.hdrop_mask.row((int64_t)t * b.B));
    CHECK(a.odrop_mask.row((int64_t)t * a.B + 1) == b.odrop_mask.row((int64_t)t * b.B));
    CHECK(a.location[t][1] == b.location[t][0]);
    CHECK(a.soft_step[t][1] == b.soft_step[t][0]);
  }
  CHECK(a.hdrop_mask.row(0) != a.hdrop_mask.row(1));  // rows do not share a stream
  CHECK(row_seed(9, 1) != row_seed(10, 1));           // nor do steps
  CaptionBatch short_of_seeds = both;
  short_of_seeds.row_seed.pop_back();
  CHECK_THROWS_WITH_AS(dec.forward(F, short_of_seeds, 0.f, true, nullptr, b),
                       "decoder: row_seed has 1 entries for 2 rows", Error);
}
