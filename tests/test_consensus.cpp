// Consensus reranking: the beam's candidate lists, the caption memory (nearest photos, pooled CIDEr-D), the choice,
// and the memory in a model file.
#include <doctest/doctest.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <functional>
#include <numeric>
#include <set>

#include "datasets/safetensors.hpp"
#include "seq/search.hpp"
#include "tests/decoder_fixtures.hpp"
#include "tests/scratch.hpp"
#include "train/consensus.hpp"
#include "train/metrics.hpp"
#include "train/model.hpp"
#include "train/object_mentions.hpp"
#include "train/ptb_tokenizer.hpp"
#include "train/search_policy.hpp"
#include "tests/model_fixtures.hpp"

using namespace sat;
using test::error_of;
using test::random_features;
using test::small_config;
using test::TempDir;

namespace {

// A memory of `photos` random unit vectors of dimension D, photo i's captions given by `captions(i)`.
CaptionMemory random_memory(int photos, int D, Rng& rng, const std::function<std::vector<std::string>(int)>& captions) {
  CaptionMemory m;
  m.keys.resize(photos, D);
  for (int i = 0; i < photos; ++i) {
    for (int d = 0; d < D; ++d) m.keys(i, d) = (float)rng.normal();
    m.keys.row(i).normalize();
    m.captions.push_back(captions(i));
  }
  return m;
}

std::string joined(const Tokens& words) {
  std::string out;
  for (auto& w : words) out += (out.empty() ? "" : " ") + w;
  return out;
}

Tokens word_list(const Vocab& vocab, const Hypothesis& h) {
  return vocab.decode(h.tokens);
}

}  // namespace

TEST_CASE("consensus: the beam's candidate lists are best first, and the first is beam_search's caption") {
  for (uint64_t seed : {1, 2, 3}) {
    Rng rng(seed);
    DecoderConfig cfg = small_config(0);
    Decoder dec(cfg);
    dec.init(rng);
    const int n = 6, beam = 4;
    Mat F = random_features(n, cfg, rng);
    for (double norm : {0.0, 0.5, 1.0}) {
      auto best = beam_search(dec, F, n, beam, 8, norm, 2);
      auto lists = beam_search_nbest(dec, F, n, beam, 8, norm, 2);
      REQUIRE(lists.size() == (size_t)n);
      for (int i = 0; i < n; ++i) {
        CAPTURE(i);
        REQUIRE(!lists[i].empty());
        CHECK(lists[i].size() >= (size_t)beam);  // beam captions end, or more are still live at max_len
        CHECK(lists[i][0].tokens == best[i].tokens);
        CHECK(lists[i][0].logprob == best[i].logprob);
        for (size_t k = 1; k < lists[i].size(); ++k) CHECK(lists[i][k - 1].score >= lists[i][k].score);
        std::set<std::vector<int>> distinct;
        for (auto& h : lists[i]) distinct.insert(h.tokens);
        CHECK(distinct.size() == lists[i].size());  // a beam never finishes one caption twice
      }
    }
  }
}

TEST_CASE("consensus: score_captions gives a caption the log-probability and score the searches give it") {
  for (uint64_t seed : {4, 5}) {
    Rng rng(seed);
    DecoderConfig cfg = small_config(0);
    Decoder dec(cfg);
    dec.init(rng);
    const int n = 3, beam = 4, max_len = 20;
    Mat F = random_features(n, cfg, rng);
    const int64_t L = cfg.locations();
    int checked = 0;
    for (double norm : {0.0, 0.5, 1.0}) {
      auto lists = beam_search_nbest(dec, F, n, beam, max_len, norm, 2);
      auto greedy = greedy_search(dec, F, n, max_len, 2);
      for (int i = 0; i < n; ++i) {
        CAPTURE(i);
        std::vector<std::vector<int>> captions;
        std::vector<const Hypothesis*> wanted;
        for (auto* h : {&greedy[i]}) lists[i].push_back(*h);
        for (auto& h : lists[i])
          if ((int)h.tokens.size() < max_len) captions.push_back(h.tokens), wanted.push_back(&h);  // ended with <end>
        const Mat grid = F.middleRows(i * L, L);
        checked += (int)captions.size();
        auto scored = score_captions(dec, grid, captions, max_len, norm, 2);
        REQUIRE(scored.size() == captions.size());
        for (size_t k = 0; k < captions.size(); ++k) {
          CAPTURE(k);
          const Hypothesis& want = *wanted[k];
          CHECK(scored[k].tokens == captions[k]);
          CHECK(scored[k].logprob == doctest::Approx(want.logprob).epsilon(1e-5));
          CHECK(scored[k].score ==
                doctest::Approx(want.logprob / std::pow(captions[k].size() + 1.0, norm)).epsilon(1e-5));
          REQUIRE(scored[k].alphas.size() == captions[k].size() + 1);  // one map per word and one for <end>
          for (size_t t = 0; t < want.alphas.size(); ++t)
            for (size_t l = 0; l < want.alphas[t].size(); ++l)
              CHECK(scored[k].alphas[t][l] == doctest::Approx(want.alphas[t][l]));
        }
      }
    }
    CHECK(checked >= 10);  // enough captions ended before max_len to compare
    const Mat grid = F.topRows(L);
    // A caption the search could never emit: a repeated bigram under no_repeat 2, <unk>.
    auto banned = score_captions(dec, grid, {{5, 6, 5, 6}, {Vocab::kUnk, 5}, {5, 6, 5}}, 8, 1.0, 2);
    CHECK(std::isinf(banned[0].logprob));
    CHECK(std::isinf(banned[1].logprob));
    CHECK(std::isfinite(banned[2].logprob));                                                // "5 6 5" repeats no bigram
    CHECK(std::isfinite(score_captions(dec, grid, {{5, 6, 5, 6}}, 8, 1.0, 0)[0].logprob));  // repeats allowed
    CHECK(score_captions(dec, grid, {}, 8).empty());
    CHECK(error_of([&] { score_captions(dec, grid, {{}}, 8); }).find("1 to 7 words") != std::string::npos);
    CHECK(error_of([&] {
            score_captions(dec, grid, {{5, 5, 5, 5, 5, 5, 5, 5}}, 8);
          }).find("1 to 7 words") != std::string::npos);
    CHECK(error_of([&] { score_captions(dec, grid, {{cfg.vocab_size}}, 8); }).find("outside the vocabulary") !=
          std::string::npos);
    CHECK(error_of([&] { score_captions(dec, F, {{5}}, 8); }).find("one image's grid") != std::string::npos);
  }
}

TEST_CASE("consensus: CIDEr-D against pooled references is the reference-weighted mean of the per-photo scores") {
  std::vector<std::vector<Tokens>> refs = {{{"a", "dog", "runs"}, {"a", "brown", "dog", "runs", "fast"}},
                                           {{"a", "man", "rides", "a", "bike"}},
                                           {{"two", "dogs", "play"}, {"dogs", "in", "snow"}, {"a", "dog", "runs"}}};
  CiderDScorer scorer(refs);
  for (const Tokens& h : {Tokens{"a", "dog", "runs"}, Tokens{"a", "man", "on", "a", "bike"}, Tokens{"zebra"}}) {
    const double s0 = scorer.score(h, 0), s1 = scorer.score(h, 1), s2 = scorer.score(h, 2);
    CHECK(scorer.score(h, std::vector<int>{0, 2}) == doctest::Approx((2 * s0 + 3 * s2) / 5).epsilon(1e-12));
    CHECK(scorer.score(h, std::vector<int>{0, 1, 2}) == doctest::Approx((2 * s0 + s1 + 3 * s2) / 6).epsilon(1e-12));
    CHECK(scorer.score(h, std::vector<int>{1}) == s1);
  }
  // Reference vectors built on demand (the caption memory's scorer) give the same scores.
  CiderDScorer lazy(refs, 6.0, CiderDScorer::ReferenceVectors::on_demand);
  CHECK(lazy.images() == 3);
  const std::vector<Tokens> hyps = {{"a", "dog", "runs"}, {"two", "dogs"}, {"a", "man", "on", "a", "bike"}};
  const auto many = lazy.scores(hyps, {2, 0, 1});
  for (size_t k = 0; k < hyps.size(); ++k) {
    CHECK(many[k] == doctest::Approx(scorer.score(hyps[k], std::vector<int>{2, 0, 1})).epsilon(1e-12));
    CHECK(lazy.score(hyps[k], 1) == doctest::Approx(scorer.score(hyps[k], 1)).epsilon(1e-12));
  }
  // Leaving a photo out compares a caption with the others' references only.
  for (auto* one : {&scorer, &lazy}) {
    const auto left = one->scores(hyps, {2, 0, 1}, {0, -1, 2});
    CHECK(left[0] == doctest::Approx(scorer.score(hyps[0], std::vector<int>{2, 1})).epsilon(1e-12));
    CHECK(left[1] == doctest::Approx(scorer.score(hyps[1], std::vector<int>{2, 0, 1})).epsilon(1e-12));
    CHECK(left[2] == doctest::Approx(scorer.score(hyps[2], std::vector<int>{0, 1})).epsilon(1e-12));
    CHECK(one->scores({hyps[0]}, {1}, {1})[0] == 0.0);  // nothing left to compare with
    CHECK_THROWS(one->scores(hyps, {0}, {-1}));         // one leave-out per caption
  }
  CHECK_THROWS(lazy.score(Tokens{"a"}, std::vector<int>{3}));
  CHECK_THROWS(scorer.score(Tokens{"a"}, std::vector<int>{}));
  CHECK_THROWS(scorer.score(Tokens{"a"}, std::vector<int>{0, 3}));
}

TEST_CASE("consensus: the memory finds the nearest photos by cosine and checks its shapes") {
  Rng rng(5);
  const int D = 16, photos = 40;
  CaptionMemory m = random_memory(photos, D, rng, [](int i) {
    return std::vector<std::string>{"photo " + std::to_string(i), "a picture"};
  });
  m.prepare(D, "mem");
  CHECK(m.photos() == photos);
  for (int q = 0; q < 5; ++q) {
    std::vector<float> query(D);
    for (auto& v : query) v = (float)rng.normal() * 3;  // any length
    Eigen::Map<Eigen::VectorXf> qv(query.data(), D);
    std::vector<float> cosine(photos);
    for (int i = 0; i < photos; ++i) cosine[i] = m.keys.row(i).dot(qv.transpose()) / qv.norm();
    std::vector<int> order(photos);
    std::iota(order.begin(), order.end(), 0);
    std::sort(order.begin(), order.end(), [&](int a, int b) { return cosine[a] > cosine[b]; });
    auto near = m.nearest(query.data(), 7);
    CHECK(near == std::vector<int>(order.begin(), order.begin() + 7));
    CHECK(m.nearest(query.data(), photos + 5).size() == (size_t)photos);
  }
  // A photo's own vector finds it first.
  CHECK(m.nearest(m.keys.row(17).data(), 1) == std::vector<int>{17});

  auto broken = [&](const std::function<void(CaptionMemory&)>& damage, int dim = 16) {
    CaptionMemory copy = m;
    damage(copy);
    return error_of([&] { copy.prepare(dim, "mem.sat"); });
  };
  CHECK(broken([](CaptionMemory&) {}, D + 1)
            .find("mem.sat: caption memory vectors have 16 values, the model's grid has 17") == 0);
  CHECK(broken([](CaptionMemory& c) { c.captions.pop_back(); }).find("40 photos but 39 caption lists") !=
        std::string::npos);
  CHECK(broken([](CaptionMemory& c) { c.captions[3].clear(); }).find("photo 3 has no captions") != std::string::npos);
  CHECK(broken([](CaptionMemory& c) { c.captions[4][1] = "  "; }).find("photo 4 has an empty caption") !=
        std::string::npos);
  CHECK(broken([](CaptionMemory& c) { c.keys.row(2) *= 2; }).find("vector 2 is not of unit length") !=
        std::string::npos);
  CHECK(broken([](CaptionMemory& c) {
          c.keys.resize(0, D);
          c.captions.clear();
        }).find("holds no photos") != std::string::npos);
  CHECK(error_of([&] { CaptionMemory{}.agreement({"a"}, {0}); }) != "");
}

TEST_CASE("consensus: a memory's captions read fast exactly as the JSON parser reads them") {
  using Lists = std::vector<std::vector<std::string>>;
  auto full = [](const std::string& text) { return nlohmann::json::parse(text).get<Lists>(); };
  // what model files hold (nlohmann's dump), with every character a caption could carry
  std::string all_bytes;
  for (int c = 1; c < 256; ++c)
    if (c < 0x80) all_bytes += (char)c;
  const Lists lists = {
      {"a dog runs", "a \"quoted\" dog \\ here", "tab\there", all_bytes}, {}, {"caf\xc3\xa9 \xf0\x9f\x98\x80"}};
  const std::string dumped = nlohmann::json(lists).dump();
  CHECK(parse_caption_lists(dumped) == lists);
  CHECK(parse_caption_lists("[]").empty());
  CHECK(parse_caption_lists("[[]]") == Lists{{}});
  // escapes dump() does not write, and whitespace (the full parser's path): the same result either way
  for (const std::string text : {R"([["caf\u00e9 \ud83d\ude00 \/ \b\f\n\r\t"]])", "[ [\"a\", \"b\"] ,\n [] ]",
                                 R"([["a"],["b","c"]])", R"([["\u0041\u00"]])"}) {
    CAPTURE(text);
    bool full_ok = true;
    Lists want;
    try {
      want = full(text);
    } catch (const nlohmann::json::exception&) {
      full_ok = false;
    }
    if (full_ok)
      CHECK(parse_caption_lists(text) == want);
    else
      CHECK_THROWS_AS(parse_caption_lists(text), nlohmann::json::exception);
  }
  // what is not a list of caption lists is refused as the JSON parser refuses it
  for (const std::string text :
       {"", "[", "[[\"a\"]", "[[\"a\"]]x", "[[\"a\\q\"]]", "[[\"\\ud800\"]]", "[[\"a\"],[1]]", "{\"x\": 1}",
        "[[\"a\nb\"]]", "[\"a\"]",
        // ill-formed UTF-8: a stray continuation byte, an overlong '/', a surrogate, a cut
        "[[\"q\x8c\x90ted\"]]", "[[\"\xc0\xaf\"]]", "[[\"\xed\xa0\x80\"]]", "[[\"\xe2\x80\"]]"}) {
    CAPTURE(text);
    CHECK_THROWS_AS(parse_caption_lists(text), nlohmann::json::exception);
  }
}

TEST_CASE("consensus: memory keys pool each photo's grid by mean, max or generalized mean") {
  // Two photos of three cells and two channels.
  Mat F(6, 2);
  F << 1, -2, 3, 0, 2, 4,  //
      0, 1, 0, 1, 0, 7;
  const Mat mean = pooled_grid_vectors(F, 2, KeyPooling::mean);
  CHECK(mean(0, 0) == doctest::Approx(2.0));
  CHECK(mean(0, 1) == doctest::Approx(2.0 / 3));
  CHECK(mean(1, 1) == doctest::Approx(3.0));
  CHECK(mean.isApprox(mean_grid_vectors(F, 2)));
  const Mat max = pooled_grid_vectors(F, 2, KeyPooling::max);
  CHECK(max(0, 0) == 3);
  CHECK(max(0, 1) == 4);
  CHECK(max(1, 0) == 0);
  CHECK(max(1, 1) == 7);
  const Mat gem = pooled_grid_vectors(F, 2, KeyPooling::gem);  // (mean of max(x, 0)^3)^(1/3)
  CHECK(gem(0, 0) == doctest::Approx(std::cbrt((1.0 + 27 + 8) / 3)).epsilon(1e-5));
  CHECK(gem(0, 1) == doctest::Approx(std::cbrt(64.0 / 3)).epsilon(1e-5));  // the -2 counts as 0
  CHECK(gem(1, 0) == 0);
  CHECK(gem(1, 1) == doctest::Approx(std::cbrt((1.0 + 1 + 343) / 3)).epsilon(1e-5));
  for (int k = 0; k < 2; ++k)  // between the mean and the maximum of the non-negative parts
    for (int c = 0; c < 2; ++c) CHECK((gem(k, c) >= mean(k, c) - 1e-6 && gem(k, c) <= max(k, c) + 1e-6));
  for (KeyPooling p : {KeyPooling::mean, KeyPooling::max, KeyPooling::gem})
    CHECK(parse_key_pooling(key_pooling_name(p)) == p);
  CHECK(error_of([] { parse_key_pooling("median"); }) == "key pooling must be mean, max or gem, got 'median'");
  CHECK(error_of([&] { pooled_grid_vectors(F, 4, KeyPooling::max); }).find("do not split") != std::string::npos);
}

TEST_CASE("consensus: memory keys weight the grid's object channels, and the nearest photos follow the objects") {
  // Three photos of two cells; channels: two of the grid's own, then one object channel (a detector's tag).
  Mat F(6, 3);
  F << 4, 0, 0, 4, 0, 0,  // photo 0: the grid of photo 1, no object
      4, 0, 1, 4, 0, 1,   // photo 1: an object
      3, 1, 1, 3, 1, 1;   // photo 2: a little another grid, the same object
  CaptionMemory memory;
  memory.object_channels = 1;
  const Mat plain = memory.key_vectors(F, 3);
  CHECK(plain.isApprox(pooled_grid_vectors(F, 3, KeyPooling::mean)));
  memory.object_weight = 5;
  const Mat weighted = memory.key_vectors(F, 3);
  CHECK(weighted.leftCols(2).isApprox(plain.leftCols(2)));
  CHECK(weighted(1, 2) == doctest::Approx(5.0));
  CHECK(weighted(2, 2) == doctest::Approx(5.0));
  memory.object_weight = 0;
  CHECK(memory.key_vectors(F, 3).col(2).isZero());
  // Photo 1's nearest other photo: photo 0 (the same grid) when the object counts as the grid has it, photo 2 (the
  // same object) when it is weighted.
  auto nearest_other = [&](float weight) {
    memory.object_weight = weight;
    Mat keys = memory.key_vectors(F, 3);
    memory.keys = keys.rowwise().normalized();
    memory.captions = {{"a"}, {"b"}, {"c"}};
    const auto order = memory.nearest(keys.row(1).data(), 3);
    CHECK(std::find(order.begin(), order.begin() + 2, 1) != order.begin() + 2);  // itself first, or tied first
    return order[0] == 1 ? order[1] : order[0];
  };
  CHECK(nearest_other(1) == 0);
  CHECK(nearest_other(5) == 2);
  CHECK(nearest_other(0) == 0);  // without the object, photos 0 and 1 are one key
  // What prepare() refuses: more object channels than the grid has, a weight out of range
  memory.object_weight = 1;
  memory.object_channels = 4;
  CHECK(error_of([&] { memory.prepare(3, "m.sat"); }) == "m.sat: caption memory keys weight 4 object channels of a grid of 3");
  CHECK(error_of([&] { memory.key_vectors(F, 3); }).find("4 object channels in a grid of 3") != std::string::npos);
  memory.object_channels = 1;
  memory.object_weight = -1;
  CHECK(error_of([&] { memory.prepare(3, "m.sat"); }).find("m.sat: caption memory's object weight must be in [0, 100]") ==
        0);
  memory.object_weight = kMaxKeyObjectWeight * 2;
  CHECK(error_of([&] { memory.prepare(3, "m.sat"); }).find("object weight must be in") != std::string::npos);
}

TEST_CASE("consensus: the choice is the best score + weight x agreement, and weight 0 keeps the beam's best") {
  Rng rng(7);
  DecoderConfig cfg = small_config(0);
  Decoder dec(cfg);
  dec.init(rng);
  std::vector<std::string> names = {"<pad>", "<start>", "<end>", "<unk>"};
  for (int w = 4; w < cfg.vocab_size; ++w) names.push_back("w" + std::to_string(w));
  Vocab vocab = Vocab::from_words(names, "test");
  const int n = 8;
  Mat F = random_features(n, cfg, rng);
  auto lists = beam_search_nbest(dec, F, n, 5, 7, 0.5, 0);
  const Mat means = mean_grid_vectors(F, n);
  CHECK(means.row(3).isApprox(F.middleRows(3 * cfg.locations(), cfg.locations()).colwise().mean()));
  int moved = 0;
  for (int i = 0; i < n; ++i) {
    CAPTURE(i);
    const auto& cands = lists[i];
    REQUIRE(cands.size() >= 2);
    std::vector<Tokens> words;
    for (auto& h : cands) words.push_back(word_list(vocab, h));
    // The memory: this image's own mean vector, whose captions are the last candidate's words, and random photos
    // whose captions share nothing with any candidate.
    CaptionMemory memory = random_memory(12, cfg.feature_dim, rng, [](int) {
      return std::vector<std::string>{"zebra crossing", "an elephant"};
    });
    memory.keys.row(0) = means.row(i).normalized();
    memory.captions[0] = {joined(words.back()), joined(words.back())};
    memory.prepare(cfg.feature_dim, "mem");
    std::vector<double> agree;
    CHECK(choose_by_consensus(cands, words, memory, means.row(i).data(), {3, 0.0}, &agree) == 0);
    const int chosen = choose_by_consensus(cands, words, memory, means.row(i).data(), {3, 1000.0}, &agree);
    CHECK(chosen == (int)cands.size() - 1);  // its words are the nearest photo's captions
    // By hand: the same neighbours, the same pooled CIDEr-D, the same sum.
    const auto near = memory.nearest(means.row(i).data(), 3);
    CHECK(near[0] == 0);
    int best = 0;
    for (size_t k = 0; k < cands.size(); ++k) {
      CHECK(agree[k] == memory.agreement(words[k], near));
      if (cands[k].score + 1000.0 * agree[k] > cands[best].score + 1000.0 * agree[best]) best = (int)k;
    }
    CHECK(best == chosen);
    const int mild = choose_by_consensus(cands, words, memory, means.row(i).data(), {3, 0.05}, &agree);
    moved += mild != 0;
  }
  CHECK(moved < n);  // a small weight mostly keeps the beam's choice
}

TEST_CASE("consensus: a model's memory reranks its search, survives its file, and damaged memories are errors") {
  TempDir dir;
  CaptionModel m;
  build_tiny_model(m, {{"a", "red", "circle"}, {"a", "blue", "square"}, {"the", "green", "triangle"}});
  Rng rng(9);
  m.init(rng);
  const int n = 6, D = m.encoder_config.feature_dim();
  const std::vector<float> planes = random_tiny_photos(rng, n);
  Mat F = m.encode(planes, n);
  const auto plain = m.search_kept(F, n, search_with(m, 4, 0.5, 0, {}, {}, {}));
  const auto lists = beam_search_nbest(*m.decoder, F, n, 4, m.max_len, 0.5, 0);

  auto memory = std::make_shared<CaptionMemory>(random_memory(20, D, rng, [](int i) {
    const char* captions[] = {"a red circle", "the green triangle", "a blue square", "red red red"};
    return std::vector<std::string>{captions[i % 4], captions[(i + 1) % 4]};
  }));
  memory->prepare(D, "mem");
  m.memory = memory;
  m.consensus = {5, 0.0};
  auto off = m.search_kept(F, n, search_with(m, 4, 0.5, 0, {}, {}, {}));
  m.consensus.weight = 50;
  auto on = m.search_kept(F, n, search_with(m, 4, 0.5, 0, {}, {}, {}));
  auto greedy = m.search_kept(F, n, search_with(m, 1, 0.5, 0, {}, {}, {}));  // one candidate: nothing to rerank
  auto greedy_plain = greedy_search(*m.decoder, F, n, m.max_len, 0);
  const Mat means = mean_grid_vectors(F, n);
  int moved = 0;
  for (int i = 0; i < n; ++i) {
    CAPTURE(i);
    CHECK(greedy[i].tokens == greedy_plain[i].tokens);
    CHECK(off[i].tokens == plain[i].tokens);
    moved += on[i].tokens != plain[i].tokens;
    std::vector<Tokens> words;
    for (auto& h : lists[i]) words.push_back(word_list(m.vocab, h));
    const int k = choose_by_consensus(lists[i], words, *memory, means.row(i).data(), m.consensus);
    CHECK(on[i].tokens == lists[i][k].tokens);
    CHECK(on[i].alphas.size() == lists[i][k].alphas.size());  // the chosen caption's own attention maps
  }
  CHECK(moved > 0);  // the memory changed some captions

  // The candidate lists behind each search: the kept one is what search() returns; totals add the weighted agreement.
  const auto reranked = m.search(F, n, search_with(m, 4, 0.5, 0, {}, {}, {}, kMaxBeam));
  const auto unranked = m.search(F, n, search_with(m, 4, 0.5, 0, 0.0, {}, {}, kMaxBeam));
  const auto one = m.search(F, n, search_with(m, 1, 0.5, 0, {}, {}, {}, kMaxBeam));
  REQUIRE(reranked.size() == (size_t)n);
  for (int i = 0; i < n; ++i) {
    CAPTURE(i);
    CHECK(reranked[i].reranked);
    CHECK_FALSE(unranked[i].reranked);
    REQUIRE(reranked[i].candidates.size() == lists[i].size());
    CHECK(reranked[i].candidates[reranked[i].chosen].hypothesis.tokens == on[i].tokens);
    CHECK(unranked[i].chosen == 0);
    CHECK(unranked[i].candidates[0].hypothesis.tokens == plain[i].tokens);
    std::vector<Tokens> words;
    for (auto& h : lists[i]) words.push_back(word_list(m.vocab, h));
    const std::vector<double> agree = memory->agreements(words, memory->nearest(means.row(i).data(), 5));
    for (size_t k = 0; k < lists[i].size(); ++k) {
      const auto& c = reranked[i].candidates[k];
      CHECK(c.hypothesis.tokens == lists[i][k].tokens);
      CHECK(c.agreement == doctest::Approx(agree[k]));
      CHECK(c.total == doctest::Approx(c.hypothesis.score + 50 * agree[k]));
      CHECK(c.total <= reranked[i].candidates[reranked[i].chosen].total);
      CHECK(unranked[i].candidates[k].total == unranked[i].candidates[k].hypothesis.score);
    }
    REQUIRE(one[i].candidates.size() == 1);  // greedy: its one caption
    CHECK(one[i].candidates[0].hypothesis.tokens == greedy_plain[i].tokens);
    CHECK_FALSE(one[i].reranked);
  }

  CandidateList five;
  five.candidates.resize(5);
  five.chosen = 3;
  CHECK(five.shown(2) == std::vector<int>{0, 1, 3});  // the kept one after the first two
  CHECK(five.shown(9) == std::vector<int>{0, 1, 2, 3, 4});
  five.chosen = 1;
  CHECK(five.shown(2) == std::vector<int>{0, 1});

  // The memory's captions as candidates: those of the 2 nearest photos join the beam's, scored by the decoder, each
  // compared with the other neighbours' captions only.
  m.consensus.memory_candidates = 2;
  const auto joined_lists = m.search(F, n, search_with(m, 4, 0.5, 0, {}, {}, {}, kMaxBeam));
  const auto joined_best = m.search_kept(F, n, search_with(m, 4, 0.5, 0, {}, {}, {}));
  int from_memory = 0, memory_chosen = 0;
  for (int i = 0; i < n; ++i) {
    CAPTURE(i);
    const auto& list = joined_lists[i];
    const std::vector<int> photos = memory->nearest(means.row(i).data(), 5);
    std::set<std::vector<int>> distinct;
    double best_total = -1e300;
    for (size_t k = 0; k < list.candidates.size(); ++k) {
      const auto& c = list.candidates[k];
      CHECK(distinct.insert(c.hypothesis.tokens).second);  // a caption appears once
      if (k > 0) CHECK(list.candidates[k - 1].hypothesis.score >= c.hypothesis.score);
      best_total = std::max(best_total, c.total);
      const Tokens words = word_list(m.vocab, c.hypothesis);
      if (c.memory_photo < 0) {
        CHECK(c.agreement == doctest::Approx(memory->agreements({words}, photos)[0]));
        continue;
      }
      ++from_memory;
      CHECK((c.memory_photo == photos[0] || c.memory_photo == photos[1]));
      const auto& own = memory->captions[c.memory_photo];
      CHECK(std::find(own.begin(), own.end(), joined(words)) != own.end());
      const auto rescored = score_captions(*m.decoder, F.middleRows(i * F.rows() / n, F.rows() / n),
                                           {c.hypothesis.tokens}, m.max_len, 0.5, 0);
      CHECK(c.hypothesis.score == doctest::Approx(rescored[0].score));
      CHECK(c.hypothesis.alphas.size() == words.size() + 1);
      CHECK(c.agreement == doctest::Approx(memory->agreements({words}, photos, {c.memory_photo})[0]));
      CHECK(c.total == doctest::Approx(c.hypothesis.score + 50 * c.agreement));
    }
    CHECK(list.candidates[list.chosen].total == best_total);
    CHECK(joined_best[i].tokens == list.candidates[list.chosen].hypothesis.tokens);
    memory_chosen += list.candidates[list.chosen].memory_photo >= 0;
  }
  CHECK(from_memory > 0);
  MESSAGE(memory_chosen << " of " << n << " captions taken from the memory");
  m.consensus.memory_candidates = 0;
  for (int i = 0; i < n; ++i)  // the call's weight over the model's
    CHECK(m.search_kept(F, n, search_with(m, 4, 0.5, 0, 0.0, {}, {}))[i].tokens == plain[i].tokens);

  const std::string path = dir.file("mem.sat");
  m.save(path);
  auto loaded = CaptionModel::load(path);
  REQUIRE(loaded->memory);
  for (Param* p : loaded->params()) CHECK(p->grad.empty());  // loaded to caption: no gradients allocated
  CHECK(loaded->consensus.neighbours == 5);
  CHECK(loaded->consensus.weight == 50);
  CHECK(loaded->memory->captions == memory->captions);
  CHECK((loaded->memory->keys - memory->keys).cwiseAbs().maxCoeff() < 1e-3f);  // stored in float16
  CHECK(loaded->consensus.memory_candidates == 0);
  auto again = loaded->search_kept(loaded->encode(planes, n), n, search_with(*loaded, 4, 0.5, 0, {}, {}, {}));
  for (int i = 0; i < n; ++i) CHECK(again[i].tokens == on[i].tokens);
  m.consensus.memory_candidates = 2;
  m.save(dir.file("mem2.sat"));
  m.consensus.memory_candidates = 0;
  auto loaded2 = CaptionModel::load(dir.file("mem2.sat"));
  CHECK(loaded2->consensus.memory_candidates == 2);
  auto again2 = loaded2->search_kept(loaded2->encode(planes, n), n, search_with(*loaded2, 4, 0.5, 0, {}, {}, {}));
  for (int i = 0; i < n; ++i) CHECK(again2[i].tokens == joined_best[i].tokens);

  // Diverse beam groups: the model's setting is stored, reloaded and searched with; a call's setting overrides it.
  const auto diverse = m.search(F, n, search_with(m, 4, 0.5, 0, 50.0, 0, BeamDiversity{2, 3.0}, kMaxBeam));
  const auto diverse_found = beam_search_nbest(*m.decoder, F, n, 4, m.max_len, 0.5, 0, {2, 3.0});
  m.beam_diversity = {2, 3.0};
  m.beam = 4;
  m.save(dir.file("diverse.sat"));
  m.beam_diversity = {};
  auto loaded3 = CaptionModel::load(dir.file("diverse.sat"));
  CHECK(loaded3->beam_diversity.groups == 2);
  CHECK(loaded3->beam_diversity.penalty == 3.0);
  CHECK(loaded->beam_diversity.groups == 1);  // files without it search one group
  const Mat F3 = loaded3->encode(planes, n);
  const auto lists3 = loaded3->search(F3, n, search_with(*loaded3, 4, 0.5, 0, 50.0, 0, {}, kMaxBeam));
  const auto stored_search = loaded3->search_kept(F3, n, search_with(*loaded3, 4, 0.5, 0, 50.0, 0, {}));
  int differ = 0;
  for (int i = 0; i < n; ++i) {
    REQUIRE(lists3[i].candidates.size() == diverse_found[i].size());
    for (size_t k = 0; k < diverse_found[i].size(); ++k)
      CHECK(diverse[i].candidates[k].hypothesis.tokens == diverse_found[i][k].tokens);
    for (size_t k = 0; k < lists3[i].candidates.size(); ++k)
      CHECK(lists3[i].candidates[k].hypothesis.tokens == diverse_found[i][k].tokens);  // float16 keys: same beam
    CHECK(stored_search[i].tokens == lists3[i].candidates[lists3[i].chosen].hypothesis.tokens);
    CHECK(loaded3->search_kept(F3, n, search_with(*loaded3, 4, 0.5, 0, 50.0, 0, BeamDiversity{}))[i].tokens ==
          again[i].tokens);
    std::vector<std::vector<int>> grouped, plain_found;
    for (auto& h : diverse_found[i]) grouped.push_back(h.tokens);
    for (auto& h : lists[i]) plain_found.push_back(h.tokens);
    differ += grouped != plain_found;
  }
  CHECK(differ > 0);
  auto damaged_diversity = [&](const std::string& name, const std::string& value) {
    TensorFile tf = load_safetensors(dir.file("diverse.sat"));
    tf.metadata["beam_diversity"] = value;
    save_safetensors(dir.file(name), tf);
    return error_of([&] { CaptionModel::load(dir.file(name)); });
  };
  CHECK(damaged_diversity("d1.sat", "{\"groups\": 3, \"penalty\": 1}")
            .find("beam groups must divide the beam size (4)") != std::string::npos);
  CHECK(damaged_diversity("d2.sat", "{\"groups\": 2, \"penalty\": -2}").find("penalty must be in") !=
        std::string::npos);
  CHECK(damaged_diversity("d3.sat", "[2, 1]").find(dir.file("d3.sat") + ": ") == 0);

  // Max-pooled keys: stored with the memory, and the search pools each photo the same way to find its neighbours.
  m.beam_diversity = {};
  auto max_memory = std::make_shared<CaptionMemory>(*memory);
  max_memory->pooling = KeyPooling::max;
  const Mat max_keys = pooled_grid_vectors(F, n, KeyPooling::max);
  for (int i = 0; i < n; ++i) max_memory->keys.row(i) = max_keys.row(i).normalized();  // photo i's own key
  max_memory->prepare(D, "max");
  m.memory = max_memory;
  m.consensus = {1, 50.0};
  m.save(dir.file("max.sat"));
  auto loaded_max = CaptionModel::load(dir.file("max.sat"));
  CHECK(loaded_max->memory->pooling == KeyPooling::max);
  CHECK(loaded->memory->pooling == KeyPooling::mean);  // files without it: mean
  const auto max_lists =
      loaded_max->search(loaded_max->encode(planes, n), n, search_with(*loaded_max, 4, 0.5, 0, {}, {}, {}, kMaxBeam));
  for (int i = 0; i < n; ++i) {  // each photo's one neighbour is its own key: agreement with memory photo i
    const auto& list = max_lists[i];
    std::vector<Tokens> words;
    for (auto& c : list.candidates) words.push_back(loaded_max->vocab.decode(c.hypothesis.tokens));
    const auto want = loaded_max->memory->agreements(words, {i});
    for (size_t k = 0; k < words.size(); ++k) CHECK(list.candidates[k].agreement == doctest::Approx(want[k]));
  }
  const Mat mean_queries = mean_grid_vectors(F, n);
  int elsewhere = 0;  // a mean-pooled query would find other neighbours: the check above can fail
  for (int i = 0; i < n; ++i) elsewhere += max_memory->nearest(mean_queries.row(i).data(), 1)[0] != i;
  CHECK(elsewhere > 0);
  {
    TensorFile tf = load_safetensors(dir.file("max.sat"));
    tf.metadata["consensus"] = "{\"neighbours\": 1, \"weight\": 1, \"key_pooling\": \"median\"}";
    save_safetensors(dir.file("p1.sat"), tf);
    CHECK(error_of([&] { CaptionModel::load(dir.file("p1.sat")); }) ==
          dir.file("p1.sat") + ": key pooling must be mean, max or gem, got 'median'");
  }

  {  // an object standardization in a model without object channels
    TensorFile tf = load_safetensors(dir.file("max.sat"));
    Param center(kObjectCenter, {1, 2}, false);
    tf.tensors.emplace(kObjectCenter, center);
    save_safetensors(dir.file("s1.sat"), tf);
    CHECK(error_of([&] { CaptionModel::load(dir.file("s1.sat")); }) ==
          dir.file("s1.sat") + ": standardizes object channels ('objects.center' and 'objects.gain'), and its encoder "
                               "has none");
  }

  {  // a memory whose keys weight object channels the model does not have, or by an absurd weight
    TensorFile tf = load_safetensors(dir.file("max.sat"));
    tf.metadata["consensus"] = "{\"neighbours\": 1, \"weight\": 1, \"key_object_weight\": 3, \"key_object_channels\": 2}";
    save_safetensors(dir.file("o1.sat"), tf);
    CHECK(error_of([&] { CaptionModel::load(dir.file("o1.sat")); }) ==
          dir.file("o1.sat") + ": caption memory keys weight 2 object channels, the model's grid has 0");
    tf.metadata["consensus"] = "{\"neighbours\": 1, \"weight\": 1, \"key_object_weight\": -3, \"key_object_channels\": 0}";
    save_safetensors(dir.file("o2.sat"), tf);
    CHECK(error_of([&] { CaptionModel::load(dir.file("o2.sat")); }).find(dir.file("o2.sat") + ": caption memory's object weight") == 0);
    tf.metadata["consensus"] = "{\"neighbours\": 1, \"weight\": 1, \"key_object_weight\": \"x\"}";
    save_safetensors(dir.file("o3.sat"), tf);
    CHECK(error_of([&] { CaptionModel::load(dir.file("o3.sat")); }).find(dir.file("o3.sat") + ": ") == 0);
    CHECK(loaded_max->memory->object_weight == 1);  // files without it: the grid's own weighting
  }

  auto damaged = [&](const std::string& name, const std::function<void(TensorFile&)>& damage) {
    TensorFile tf = load_safetensors(path);
    damage(tf);
    save_safetensors(dir.file(name), tf);
    return error_of([&] { CaptionModel::load(dir.file(name)); });
  };
  CHECK(damaged("a.sat", [](TensorFile& tf) {
          tf.tensors.erase(kMemoryKeys);
          tf.half.erase(kMemoryKeys);
        }).find("caption memory is incomplete") != std::string::npos);
  CHECK(damaged("b.sat", [](TensorFile& tf) {
          tf.metadata["memory_captions"] = "[[\"a\"]]";
        }).find("20 photos but 1 caption lists") != std::string::npos);
  CHECK(damaged("c.sat", [](TensorFile& tf) {
          tf.metadata["memory_captions"] = "{\"x\": 1";
        }).find(dir.file("c.sat") + ": ") == 0);
  CHECK(damaged("d.sat", [](TensorFile& tf) {
          tf.metadata["consensus"] = "{\"neighbours\": 0, \"weight\": 1}";
        }).find("consensus neighbours must be in [1, 20]") != std::string::npos);
  CHECK(damaged("e.sat", [](TensorFile& tf) {
          tf.metadata["consensus"] = "{\"neighbours\": 3, \"weight\": -1}";
        }).find("consensus weight must be in") != std::string::npos);
  CHECK(damaged("f.sat", [](TensorFile& tf) { tf.metadata["consensus"] = "[1, 2]"; }).find(dir.file("f.sat") + ": ") ==
        0);
  CHECK(damaged("h.sat", [](TensorFile& tf) {
          tf.metadata["consensus"] = "{\"neighbours\": 3, \"weight\": 1, \"memory_candidates\": 21}";
        }).find("consensus memory_candidates must be in [0, 20], got 21") != std::string::npos);
  CHECK(damaged("i.sat", [](TensorFile& tf) {
          tf.metadata["consensus"] = "{\"neighbours\": 3, \"weight\": 1, \"memory_candidates\": \"x\"}";
        }).find(dir.file("i.sat") + ": ") == 0);
  CHECK(damaged("g.sat", [&](TensorFile& tf) {
          Param wrong(kMemoryKeys, {20, (int64_t)D + 1}, false);
          tf.tensors.erase(kMemoryKeys);
          tf.tensors.emplace(kMemoryKeys, std::move(wrong));
        }).find("caption memory vectors have " + std::to_string(D + 1) + " values") != std::string::npos);
}

TEST_CASE("consensus: the memory's scorer builds in the background; its errors come with ready() and name the file") {
  Rng rng(9);
  const int D = 8;
  // 30 000 distinct words: more than CIDEr-D's word index holds. prepare() returns; ready() and agreements throw.
  CaptionMemory big = random_memory(3, D, rng, [](int i) {
    std::vector<std::string> caps;
    for (int k = 0; k < 10000; ++k) caps.push_back("w" + std::to_string(i * 10000 + k));
    return caps;
  });
  big.prepare(D, "big.sat");
  const std::string at_ready = error_of([&] { big.ready(); });
  CHECK(at_ready.find("big.sat: caption memory: cider: more than") == 0);
  CHECK(error_of([&] { big.agreement({"w1"}, {0}); }) == at_ready);
  CaptionMemory copied = big;  // copies share the scorer, and its error
  CHECK(error_of([&] { copied.ready(); }) == at_ready);
  // A good memory: copies made while the scorer builds, and the original gone, still score alike.
  CaptionMemory good = random_memory(4, D, rng, [](int i) {
    return std::vector<std::string>{i == 0 ? "a dog runs on the grass" : "a cat sleeps on a bed", "a picture"};
  });
  auto original = std::make_unique<CaptionMemory>(good);
  original->prepare(D, "good.sat");
  CaptionMemory copy = *original;
  const double want = original->agreement({"a", "dog", "runs"}, {0, 1, 2});
  original.reset();
  CHECK(copy.agreement({"a", "dog", "runs"}, {0, 1, 2}) == want);
  CHECK_NOTHROW(copy.ready());
  CHECK(want > 0);
}

TEST_CASE("search options: resolved against the model in one place, unset fields taking its settings") {
  CaptionModel m;
  build_tiny_model(m);
  m.beam = 4;
  m.length_norm = 0.7;
  m.no_repeat_ngram = 3;
  m.beam_diversity = {2, 1.5};
  auto error_of_options = [&](const SearchOptions& o, OptionSpelling spelling) -> std::string {
    try {
      resolve_search(m, o, "m.sat", spelling);
    } catch (const Error& e) {
      return e.what();
    }
    return "(no error)";
  };

  const SearchSettings stored = resolve_search(m, {}, "m.sat");
  CHECK(stored.beam == 4);
  CHECK(stored.length_norm == 0.7);
  CHECK(stored.no_repeat_ngram == 3);
  CHECK(stored.diversity.groups == 2);
  CHECK(stored.diversity.penalty == 1.5);
  CHECK(stored.consensus.weight == 0);
  CHECK(stored.include == -1);
  CHECK(stored.candidates == 0);
  CHECK(stored_search(m, 1).beam == 1);
  CHECK(stored_search(m, 1).length_norm == 0.7);

  SearchOptions o;
  o.beam = 6, o.length_norm = 0.0, o.no_repeat_ngram = 0, o.beam_groups = 3, o.diversity = 0.5, o.candidates = 2;
  o.include = "Circle";  // tokenized as captions are
  const SearchSettings given = resolve_search(m, o, "m.sat");
  CHECK(given.beam == 6);
  CHECK(given.length_norm == 0.0);
  CHECK(given.no_repeat_ngram == 0);
  CHECK(given.diversity.groups == 3);
  CHECK(given.candidates == 2);
  CHECK(given.include == m.vocab.id("circle"));

  // Each problem, in both spellings: the library's (and the server's) and the command line's.
  SearchOptions bad;
  bad.beam = 0;
  CHECK(error_of_options(bad, OptionSpelling::library) == "beam must be in [1, 100]");
  CHECK(error_of_options(bad, OptionSpelling::command_line) == "--beam must be in [1, 100]");
  bad = {};
  bad.length_norm = 2.5;
  CHECK(error_of_options(bad, OptionSpelling::library) == "length_norm must be in [0, 2]");
  bad = {};
  bad.no_repeat_ngram = 10;
  CHECK(error_of_options(bad, OptionSpelling::command_line) == "--no-repeat must be in [0, 9]");
  bad = {};
  bad.consensus_weight = 2.0;
  CHECK(error_of_options(bad, OptionSpelling::command_line) ==
        "m.sat: has no caption memory for --consensus-weight (sat model memory builds one)");
  CHECK(error_of_options(bad, OptionSpelling::library) ==
        "m.sat: has no caption memory for consensus_weight (sat model memory builds one)");
  bad = {};
  bad.memory_candidates = 1;
  CHECK(error_of_options(bad, OptionSpelling::library) ==
        "m.sat: has no caption memory for memory_candidates (sat model memory builds one)");
  bad = {};
  bad.neighbours = 3;
  CHECK(error_of_options(bad, OptionSpelling::command_line) ==
        "m.sat: has no caption memory for --neighbours (sat model memory builds one)");
  bad = {};
  bad.relevance_weight = 1.0;
  CHECK(error_of_options(bad, OptionSpelling::command_line) ==
        "m.sat: has no caption memory for --relevance-weight (sat model memory builds one)");
  bad.relevance_weight = 101.0;
  CHECK(error_of_options(bad, OptionSpelling::library) == "relevance_weight must be in [0, 100]");
  bad = {};
  bad.neighbour_evidence = 1.5;
  CHECK(error_of_options(bad, OptionSpelling::command_line) == "--neighbour-evidence must be in [0, 1]");
  CHECK(error_of_options(bad, OptionSpelling::library) == "neighbour_evidence must be in [0, 1]");
  bad.neighbour_evidence = 0.5;  // read only with the detector's evidence on: nothing to check without it
  CHECK(error_of_options(bad, OptionSpelling::library) == "(no error)");
  bad = {};
  bad.beam_evidence = 101.0;
  CHECK(error_of_options(bad, OptionSpelling::command_line) == "--beam-evidence must be in [0, 100]");
  CHECK(error_of_options(bad, OptionSpelling::library) == "beam_evidence must be in [0, 100]");
  bad.beam_evidence = 2.0;  // this model reads no detector
  CHECK(error_of_options(bad, OptionSpelling::command_line) ==
        "m.sat: has no object channels for --beam-evidence (its encoder reads no detector: sat train --objects)");
  bad = {};
  bad.beam = 3;  // the stored two groups do not divide three rows
  CHECK(error_of_options(bad, OptionSpelling::library) == "beam groups must divide the beam size (3); got 2");
  bad.beam = 1;  // greedy: no groups to check
  CHECK(error_of_options(bad, OptionSpelling::library) == "(no error)");
  bad = {};
  bad.candidates = 101;
  CHECK(error_of_options(bad, OptionSpelling::library) == "candidates must be in [0, 100]");
  bad = {};
  bad.include = "red circle";
  CHECK(error_of_options(bad, OptionSpelling::command_line) == "--include takes one word, got 'red circle'");
  bad.include = "zebra";
  CHECK(error_of_options(bad, OptionSpelling::library) ==
        "m.sat: does not know the word 'zebra' (include): its vocabulary has 5 words");
  bad.include = "<end>";  // tokenized to "end", which the model does not know either; the special ids never pass
  CHECK(error_of_options(bad, OptionSpelling::library).find("does not know the word") != std::string::npos);

  // With a memory of three photos: reranking is allowed, and more neighbours or memory photos than it holds are not.
  Rng rng(3);
  auto memory = std::make_shared<CaptionMemory>(random_memory(
      3, m.encoder_config.feature_dim(), rng, [](int) { return std::vector<std::string>{"a red circle"}; }));
  memory->prepare(m.encoder_config.feature_dim(), "mem");
  m.memory = memory;
  SearchOptions with_memory;
  with_memory.consensus_weight = 5.0;
  with_memory.neighbours = 3;
  with_memory.memory_candidates = 2;
  const SearchSettings reranking = resolve_search(m, with_memory, "m.sat");
  CHECK(reranking.consensus.weight == 5.0);
  CHECK(reranking.consensus.neighbours == 3);
  CHECK(reranking.consensus.memory_candidates == 2);
  SearchOptions relevance;  // a memory without a key projection has no word side
  relevance.relevance_weight = 0.5;
  CHECK(error_of_options(relevance, OptionSpelling::library) ==
        "m.sat: has no word side in its caption memory's key projection for relevance_weight (sat model memory --cca "
        "builds one)");
  with_memory.neighbours = 4;
  CHECK(error_of_options(with_memory, OptionSpelling::command_line) ==
        "m.sat: its caption memory holds 3 photos: --neighbours 4 is more");
  with_memory.neighbours = 0;
  CHECK(error_of_options(with_memory, OptionSpelling::library) == "neighbours must be 1 or more");
}

TEST_CASE("consensus: the detector's evidence weighs in the totals, with or without the memory's agreement") {
  const Vocab vocab = Vocab::from_words({"<pad>", "<start>", "<end>", "<unk>", "a", "man", "rides", "horse", "dog", "runs"}, "test");
  auto candidate = [&](const std::string& text, double score) {
    Candidate c;
    for (const std::string& w : ptb_tokenize(text)) c.hypothesis.tokens.push_back(vocab.id(w));
    c.hypothesis.score = score;
    return c;
  };
  CandidateList list;
  list.candidates = {candidate("a man rides", -1.0), candidate("a man rides a horse", -1.2),
                     candidate("a dog runs", -1.3)};
  list.reranked = true;
  std::vector<double> peaks(object_groups().size(), 0.0);
  for (size_t g = 0; g < peaks.size(); ++g) {
    if (object_groups()[g].name == "horse") peaks[g] = 0.5;
    if (object_groups()[g].name == "dog") peaks[g] = 0.05;
    if (object_groups()[g].name == "person") peaks[g] = 0.15;  // "man": exactly the threshold, no gain
  }
  weigh_object_evidence(list, peaks, 0.15, vocab);
  CHECK(list.candidates[0].evidence == doctest::Approx(0.0));
  CHECK(list.candidates[1].evidence == doctest::Approx(0.35));
  CHECK(list.candidates[2].evidence == doctest::Approx(-0.1));
  ConsensusSettings s;  // weight 0: no memory
  s.object_evidence = 0;
  choose_by_totals(list, s);
  CHECK(list.chosen == 0);  // off: the best score
  CHECK(list.candidates[1].total == doctest::Approx(-1.2));
  s.object_evidence = 2;
  choose_by_totals(list, s);
  CHECK(list.candidates[0].total == doctest::Approx(-1.0));
  CHECK(list.candidates[1].total == doctest::Approx(-1.2 + 2 * 0.35));
  CHECK(list.candidates[2].total == doctest::Approx(-1.3 - 2 * 0.1));
  CHECK(list.chosen == 1);  // the horse the detector saw
  // with the memory: score + weight x agreement + object_evidence x evidence
  list.candidates[0].agreement = 0.9, list.candidates[1].agreement = 0.1, list.candidates[2].agreement = 0.5;
  s.weight = 2;
  choose_by_totals(list, s);
  CHECK(list.candidates[0].total == doctest::Approx(-1.0 + 1.8));
  CHECK(list.candidates[1].total == doctest::Approx(-1.2 + 0.2 + 0.7));
  CHECK(list.candidates[2].total == doctest::Approx(-1.3 + 1.0 - 0.2));
  CHECK(list.chosen == 0);
  // and the captions' relevance: + relevance_weight x relevance
  list.candidates[0].relevance = -0.5, list.candidates[1].relevance = 0.4, list.candidates[2].relevance = 0.1;
  s.relevance_weight = 2;
  choose_by_totals(list, s);
  CHECK(list.candidates[0].total == doctest::Approx(-1.0 + 1.8 - 1.0));
  CHECK(list.candidates[1].total == doctest::Approx(-1.2 + 0.2 + 0.7 + 0.8));
  CHECK(list.candidates[2].total == doctest::Approx(-1.3 + 1.0 - 0.2 + 0.2));
  CHECK(list.chosen == 1);
}

TEST_CASE("consensus: the neighbours' captions in the objects' evidence: their shares, mixed with the peaks") {
  Rng rng(5);
  CaptionMemory memory = random_memory(3, 4, rng, [](int i) {
    switch (i) {
      case 0: return std::vector<std::string>{"a man rides a horse", "a horse in a field", "a man on a dirt bike"};
      case 1: return std::vector<std::string>{"a dog catches a ball"};
      default: return std::vector<std::string>{"two dogs play", "a dog runs"};
    }
  });
  memory.prepare(4, "mem");
  auto group = [](const std::string& name) {
    for (size_t g = 0; g < object_groups().size(); ++g)
      if (object_groups()[g].name == name) return g;
    FAIL("no group " << name);
    return size_t(0);
  };
  // photos 0 and 2: five captions, two name the horse, one the motorcycle ("dirt bike"), two a dog, none a ball
  const std::vector<double> shares = memory.object_shares({0, 2});
  REQUIRE(shares.size() == object_groups().size());
  CHECK(shares[group("horse")] == doctest::Approx(2.0 / 5));
  CHECK(shares[group("motorcycle")] == doctest::Approx(1.0 / 5));
  CHECK(shares[group("bicycle")] == 0.0);  // the phrase's "bike" names no bicycle
  CHECK(shares[group("dog")] == doctest::Approx(2.0 / 5));
  CHECK(shares[group("ball")] == 0.0);
  CHECK(shares[group("person")] == doctest::Approx(2.0 / 5));  // "a man" twice
  CHECK(memory.object_shares({1})[group("ball")] == doctest::Approx(1.0));
  CHECK(memory.object_shares({}) == std::vector<double>(object_groups().size(), 0.0));

  std::vector<double> peaks(object_groups().size(), 0.0);
  peaks[group("horse")] = 0.1, peaks[group("ball")] = 0.6;
  const std::vector<double> mixed = mixed_object_evidence(peaks, shares, 0.75);
  CHECK(mixed[group("horse")] == doctest::Approx(0.25 * 0.1 + 0.75 * 0.4));
  CHECK(mixed[group("ball")] == doctest::Approx(0.25 * 0.6));
  CHECK(mixed_object_evidence(peaks, shares, 0.0) == peaks);
  CHECK(mixed_object_evidence(peaks, shares, 1.0) == shares);
  CHECK_THROWS_WITH(mixed_object_evidence(peaks, {0.5}, 0.5), doctest::Contains("one caption share per object group"));
  CHECK_THROWS_WITH(mixed_object_evidence(peaks, shares, 1.5), doctest::Contains("in [0, 1]"));
  // In the choice: "a man rides a horse" gains where the neighbours name the horse, though the detector barely saw it.
  const Vocab vocab = Vocab::from_words({"<pad>", "<start>", "<end>", "<unk>", "a", "man", "rides", "horse", "ball"},
                                        "test");
  CandidateList list;
  for (const auto& [text, score] : std::vector<std::pair<std::string, double>>{{"a man rides a ball", -1.0},
                                                                               {"a man rides a horse", -1.1}}) {
    Candidate c;
    for (const std::string& w : ptb_tokenize(text)) c.hypothesis.tokens.push_back(vocab.id(w));
    c.hypothesis.score = score;
    list.candidates.push_back(c);
  }
  list.reranked = true;
  ConsensusSettings s;
  s.object_evidence = 2, s.evidence_threshold = 0.15;
  weigh_object_evidence(list, peaks, s.evidence_threshold, vocab);  // the peaks alone: the ball wins
  choose_by_totals(list, s);
  CHECK(list.chosen == 0);
  weigh_object_evidence(list, mixed, s.evidence_threshold, vocab);  // with the neighbours' captions: the horse
  CHECK(list.candidates[1].evidence == doctest::Approx(mixed[group("person")] + mixed[group("horse")] - 0.3));
  choose_by_totals(list, s);
  CHECK(list.chosen == 1);
}

TEST_CASE("consensus: the objects' evidence steering the beam: each word's group and each image's bonuses") {
  const Vocab vocab = Vocab::from_words(
      {"<pad>", "<start>", "<end>", "<unk>", "a", "man", "rides", "horse", "bike", "dirt", "dogs"}, "test");
  auto group = [](const std::string& name) {
    for (size_t g = 0; g < object_groups().size(); ++g)
      if (object_groups()[g].name == name) return (int)g;
    FAIL("no group " << name);
    return 0;
  };
  std::vector<std::vector<double>> evidence(2, std::vector<double>(object_groups().size(), 0.0));
  evidence[0][group("horse")] = 0.7, evidence[0][group("person")] = 0.3;
  evidence[1][group("dog")] = 0.5;
  const BeamSteering steering = evidence_steering(vocab, evidence, 4.0, 0.3);
  REQUIRE(steering.active());
  REQUIRE(steering.word_group.size() == vocab.words.size());
  CHECK(steering.word_group[vocab.id("horse")] == group("horse"));
  CHECK(steering.word_group[vocab.id("man")] == group("person"));
  CHECK(steering.word_group[vocab.id("dogs")] == group("dog"));
  CHECK(steering.word_group[vocab.id("bike")] == group("bicycle"));
  for (const char* none : {"<pad>", "<start>", "<end>", "<unk>", "a", "rides", "dirt"})
    CHECK(steering.word_group[vocab.id(none)] == -1);
  REQUIRE(steering.bonus.rows() == 2);
  REQUIRE(steering.bonus.cols() == (int64_t)object_groups().size());
  CHECK(steering.bonus(0, group("horse")) == doctest::Approx(4 * (0.7 - 0.3)));
  CHECK(steering.bonus(0, group("person")) == doctest::Approx(0.0));  // at the threshold: neither gain nor cost
  CHECK(steering.bonus(0, group("dog")) == doctest::Approx(-4 * 0.3));
  CHECK(steering.bonus(1, group("dog")) == doctest::Approx(4 * 0.2));
  CHECK(steering.bonus(1, group("horse")) == doctest::Approx(-1.2));
  CHECK_NOTHROW(check_steering(steering, 2, (int)vocab.words.size()));
  CHECK_THROWS_WITH(evidence_steering(vocab, {{0.5}}, 4.0, 0.3), doctest::Contains("one evidence per object group"));
}
