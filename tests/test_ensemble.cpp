// Ensembles of decoders (seq/ensemble.hpp): the mean distribution, searches over it, and what cannot be averaged.
#include <doctest/doctest.h>

#include <cmath>
#include <limits>

#include "seq/ensemble.hpp"
#include "seq/search.hpp"
#include "tests/decoder_fixtures.hpp"

using namespace sat;
using sat::test::random_features;
using sat::test::small_config;

namespace {
constexpr int kStart = 1, kEnd = 2;
constexpr float kNone = -std::numeric_limits<float>::infinity();

// One image's grid (rows i*L .. i*L + L - 1 of F).
Mat grid_of(const Mat& F, int i, int L) {
  return F.middleRows((int64_t)i * L, L);
}
}  // namespace

TEST_CASE("ensemble: the mean distribution is log((1/K) sum_k p_k), exact for identical members") {
  Mat a(2, 3), b(2, 3);
  a << std::log(0.5f), std::log(0.3f), std::log(0.2f), kNone, std::log(0.25f), std::log(0.75f);
  b << std::log(0.1f), std::log(0.6f), std::log(0.3f), kNone, kNone, 0.f;
  Mat mean;
  mean_of_distributions({a, b}, mean);
  const float expect[2][3] = {{0.3f, 0.45f, 0.25f}, {0.f, 0.125f, 0.875f}};
  for (int r = 0; r < 2; ++r)
    for (int w = 0; w < 3; ++w) CHECK(std::exp(mean(r, w)) == doctest::Approx(expect[r][w]).epsilon(1e-6));
  CHECK(mean(1, 0) == kNone);  // no member gives it any probability
  // far in the tail, where exp() of the log-probabilities themselves would underflow to 0
  Mat tiny_a(1, 1), tiny_b(1, 1);
  tiny_a << -200.f;
  tiny_b << -201.f;
  mean_of_distributions({tiny_a, tiny_b}, mean);
  CHECK(mean(0, 0) == doctest::Approx(-200.f + std::log((1.f + std::exp(-1.f)) / 2)).epsilon(1e-6));
  // identical members: their own log-probabilities, bit for bit
  mean_of_distributions({a, a, a}, mean);
  CHECK(mean == a);
}

TEST_CASE("ensemble: one member, or copies of one decoder, search exactly as that decoder alone") {
  Rng rng(3);
  DecoderConfig cfg = small_config(0.f, true);
  Decoder dec(cfg), twin(cfg), triplet(cfg);  // the same weights in three decoders (each keeps its own rows)
  dec.init(rng);
  std::vector<Param*> from = dec.params(), to_twin = twin.params(), to_triplet = triplet.params();
  for (size_t k = 0; k < from.size(); ++k) to_twin[k]->value = to_triplet[k]->value = from[k]->value;
  const int n = 6;
  Mat F = random_features(n, cfg, rng);
  DecoderEnsemble one({&dec}), copies({&dec, &twin, &triplet});
  for (DecoderEnsemble* ens : {&one, &copies}) {
    auto g = greedy_search(*ens, F, n, 9, 2), g_alone = greedy_search(dec, F, n, 9, 2);
    auto b = beam_search(*ens, F, n, 4, 9, 0.5, 2), b_alone = beam_search(dec, F, n, 4, 9, 0.5, 2);
    for (int i = 0; i < n; ++i) {
      CHECK(g[i].tokens == g_alone[i].tokens);
      CHECK(g[i].logprob == g_alone[i].logprob);
      CHECK(b[i].tokens == b_alone[i].tokens);
      CHECK(b[i].logprob == doctest::Approx(b_alone[i].logprob).epsilon(1e-6));
      CHECK(b[i].alphas.size() == b_alone[i].alphas.size());
    }
  }
}

TEST_CASE("ensemble: a beam caption's log-probability and attention are the members' means along it, replayed alone") {
  // Members of different orderings and sizes; the search reorders every member's rows alike, so replaying a found
  // caption word by word through each member on its own image must give the same sum and the same maps.
  Rng rng(8);
  DecoderConfig first = small_config(0.f), second = small_config(0.f, false, "general"), third = small_config(0.f);
  second.order = "luong";
  third.hidden_dim = 9;
  Decoder d1(first), d2(second), d3(third);
  d1.init(rng), d2.init(rng), d3.init(rng);
  DecoderEnsemble ens({&d1, &d2, &d3});
  const int n = 5, L = first.locations();
  Mat F = random_features(n, first, rng);
  auto found = beam_search(ens, F, n, 3, 8, 1.0);
  int differ_from_first = 0;
  auto alone = beam_search(d1, F, n, 3, 8, 1.0);
  for (int i = 0; i < n; ++i) {
    const Hypothesis& h = found[i];
    differ_from_first += h.tokens != alone[i].tokens;
    const Mat grid = grid_of(F, i, L);
    std::vector<Decoder::State> st(3);
    d1.begin(grid, 1, st[0]), d2.begin(grid, 1, st[1]), d3.begin(grid, 1, st[2]);
    std::vector<int> path = h.tokens;
    const bool ended = h.alphas.size() > h.tokens.size();
    if (ended) path.push_back(kEnd);
    double sum = 0, worst_alpha = 0;
    int previous = kStart;
    for (size_t t = 0; t < path.size(); ++t) {
      std::vector<Mat> logps(3);
      Mat alpha_sum = Mat::Zero(1, L), alpha;
      int k = 0;
      for (Decoder* d : {&d1, &d2, &d3}) {
        d->step({previous}, st[k], logps[k], alpha);
        alpha_sum += alpha;
        ++k;
      }
      Mat mean;
      mean_of_distributions(logps, mean);
      sum += mean(0, path[t]);
      for (int l = 0; l < L; ++l)
        worst_alpha = std::max(worst_alpha, (double)std::abs(alpha_sum(0, l) / 3 - h.alphas[t][l]));
      previous = path[t];
    }
    CHECK(sum == doctest::Approx(h.logprob).epsilon(1e-5));
    CHECK(worst_alpha < 1e-6);
  }
  CHECK(differ_from_first > 0);  // the other members change some captions
}

TEST_CASE("ensemble: hard attention, another vocabulary or grid, and mixing attending with not attending are refused") {
  DecoderConfig soft = small_config(0.f), hard = small_config(0.f, false, "additive", "hard"),
                none = small_config(0.f, false, "additive", "none"), words = small_config(0.f),
                grid = small_config(0.f);
  words.vocab_size = 12;
  grid.grid_w = 4;
  Decoder d_soft(soft), d_hard(hard), d_none(none), d_words(words), d_grid(grid);
  CHECK_THROWS_WITH(DecoderEnsemble({&d_soft, &d_hard}),
                    "ensemble: member 2 uses hard attention, which an ensemble cannot average");
  CHECK_THROWS_WITH(DecoderEnsemble({&d_soft, &d_words}),
                    "ensemble: member 2 reads another vocabulary or grid than member 1");
  CHECK_THROWS_WITH(DecoderEnsemble({&d_soft, &d_grid}),
                    "ensemble: member 2 reads another vocabulary or grid than member 1");
  CHECK_THROWS_WITH(DecoderEnsemble({&d_soft, &d_none}), "ensemble: member 2 does not attend and member 1 does");
  CHECK_THROWS_WITH(DecoderEnsemble({}), "ensemble: no decoders");
  CHECK_THROWS_WITH(DecoderEnsemble({&d_soft, &d_soft}),
                    "ensemble: member 2 is the same decoder object as member 1 (each member searches with its own)");
}
