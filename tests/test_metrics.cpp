#include <doctest/doctest.h>

#include <fstream>
#include <nlohmann/json.hpp>
#include <set>

#include "datasets/io.hpp"
#include "train/meteor.hpp"
#include "train/metrics.hpp"
#include "train/ptb_tokenizer.hpp"

using namespace sat;

namespace {
Tokens split(const std::string& s) {
  Tokens t;
  std::string cur;
  for (char c : s) {
    if (c == ' ') {
      if (!cur.empty()) t.push_back(cur);
      cur.clear();
    } else {
      cur += c;
    }
  }
  if (!cur.empty()) t.push_back(cur);
  return t;
}
const std::string kCocoEval = SAT_SHARED_DATA "/coco-eval/";

// The toolkit's demo: 1000 already tokenized hypotheses with their references. False when absent.
bool load_demo(std::vector<Tokens>& hyps, std::vector<std::vector<Tokens>>& refs) {
  const std::string path = kCocoEval + "fakecap_tokenized_hyp_refs_1000.json";
  if (!file_exists(path)) return false;
  for (auto& e : nlohmann::json::parse(read_file(path))) {
    hyps.push_back(split(e["test"]));
    refs.emplace_back();
    for (auto& r : e["refs"]) refs.back().push_back(split(r));
  }
  return true;
}
}  // namespace

TEST_CASE("coco-caption demo: BLEU counts and scores, ROUGE-L, CIDEr-D match the toolkit") {
  std::vector<Tokens> hyps;
  std::vector<std::vector<Tokens>> refs;
  if (!load_demo(hyps, refs)) {
    MESSAGE("skipped: " << kCocoEval << " not present");
    return;
  }
  BleuResult b = corpus_bleu(hyps, refs);
  CHECK(b.testlen == 9893);
  CHECK(b.reflen == 9855);
  CHECK(b.guess == std::array<int64_t, 4>{9893, 8893, 7893, 6893});
  CHECK(b.correct == std::array<int64_t, 4>{5732, 2510, 1043, 423});
  CHECK(std::fabs(b.bleu[0] - 0.5794) < 5e-4);
  CHECK(std::fabs(b.bleu[1] - 0.4044) < 5e-4);
  CHECK(std::fabs(b.bleu[2] - 0.2785) < 5e-4);
  CHECK(std::fabs(b.bleu[3] - 0.1908) < 5e-4);
  const double rouge = corpus_rouge_l(hyps, refs), cider = corpus_cider_d(hyps, refs).score;
  MESSAGE("coco-caption demo: Bleu_1..4 " << b.bleu[0] << " " << b.bleu[1] << " " << b.bleu[2] << " " << b.bleu[3]
                                          << ", ROUGE_L " << rouge << ", CIDEr " << cider);
  CHECK(std::fabs(rouge - 0.3963) < 5e-4);
  CHECK(std::fabs(cider - 0.5998) < 5e-4);
}

TEST_CASE("PTB tokenization matches the toolkit's tokenized references (>= 99%)") {
  const std::string tok_path = kCocoEval + "fakecap_tokenized_hyp_refs_1000.json";
  const std::string raw_path = kCocoEval + "val2014_refs4_codalab.json";
  if (!file_exists(tok_path) || !file_exists(raw_path)) {
    MESSAGE("skipped: coco-eval data not present");
    return;
  }
  auto tok = nlohmann::json::parse(read_file(tok_path));
  auto raw = nlohmann::json::parse(read_file(raw_path));
  int total = 0, same = 0;
  for (auto& e : tok) {
    std::string id = std::to_string(e["image_id"].get<int64_t>());
    if (!raw.contains(id)) continue;
    std::set<std::string> refs;
    for (auto& r : e["refs"]) refs.insert(r.get<std::string>());
    for (auto& s : raw[id][0]) {
      ++total;
      same += refs.count(ptb_tokenize_joined(s.get<std::string>())) > 0;
    }
  }
  MESSAGE("PTB tokenizer: " << same << " of " << total << " sentences identical");
  CHECK(total == 4005);
  CHECK(same >= 0.99 * total);
}

TEST_CASE("PTB tokenization: hand-made cases") {
  CHECK(ptb_tokenize_joined("A man's dog, (running) fast.") == "a man 's dog running fast");
  CHECK(ptb_tokenize_joined("They don't know; I can't.") == "they do n't know i ca n't");
  CHECK(ptb_tokenize_joined("The \"Store\" sign -- closed...") == "the store sign closed");
  CHECK(ptb_tokenize_joined("Mr. Smith at 3:30 paid $5, 50% off") == "mr. smith at 3:30 paid $ 5 50 % off");
  CHECK(ptb_tokenize_joined("twin-hulled boat") == "twin-hulled boat");
  CHECK(ptb_tokenize_joined("players' gear") == "players gear");
  CHECK(ptb_tokenize_joined("   ").empty());
}

TEST_CASE("ROUGE-L and CIDEr-D on hand-made vectors") {
  // identical hypothesis and reference
  CHECK(rouge_l({"a", "b", "c"}, {{"a", "b", "c"}}) == doctest::Approx(1.0));
  // one hypothesis, two references: best precision and best recall may come from different references
  double p = 2.0 / 3, r = 1.0;  // LCS("a b c", "a c") = 2
  double expect = (1 + 1.44) * p * r / (r + 1.44 * p);
  CHECK(rouge_l({"a", "b", "c"}, {{"a", "c"}, {"x", "y", "z", "w"}}) == doctest::Approx(expect));
  CHECK(rouge_l({"x"}, {{"a", "b"}}) == 0.0);
  CHECK(rouge_l({}, {{"a", "b"}}) == 0.0);  // empty hypothesis
  // a single image: every n-gram has document frequency 1 = the number of images, so idf is 0 and so is CIDEr
  CHECK(corpus_cider_d({{"a", "b"}}, {{{"a", "b"}}}).score == 0.0);
  // identical captions in a set where n-grams are informative score high; disjoint ones score 0
  std::vector<Tokens> hyps = {{"a", "red", "circle"}, {"a", "blue", "square"}};
  std::vector<std::vector<Tokens>> refs = {{{"a", "red", "circle"}}, {{"a", "blue", "square"}}};
  auto c = corpus_cider_d(hyps, refs);
  CHECK(c.score > 5.0);
  auto z = corpus_cider_d({{"x", "y", "z"}, {"q"}}, refs);
  CHECK(z.score == 0.0);
  // the length penalty: a longer copy scores less than an exact one
  auto longer = corpus_cider_d({{"a", "red", "circle", "a", "red", "circle"}, {"a", "blue", "square"}}, refs);
  CHECK(longer.per_image[0] < c.per_image[0]);
}

TEST_CASE("CIDEr-D scorer with fixed document frequencies: equals the corpus metric on its own references") {
  // Six images of a small synthetic corpus; the scorer's df comes from these references, as corpus_cider_d's
  // does when it scores a hypothesis for each of them.
  std::vector<std::vector<Tokens>> refs = {
      {{"a", "dog", "runs", "on", "the", "grass"}, {"a", "brown", "dog", "runs"}},
      {{"a", "man", "rides", "a", "bike"}, {"a", "person", "on", "a", "bike"}, {"man", "riding", "bike"}},
      {{"two", "dogs", "play", "in", "the", "snow"}},
      {{"a", "girl", "in", "a", "red", "dress"}, {"a", "little", "girl", "smiles"}},
      {{"a", "boy", "jumps", "into", "the", "water"}, {"a", "child", "swims"}},
      {{"a", "dog", "in", "the", "water"}, {"a", "wet", "dog"}}};
  std::vector<Tokens> hyps = {{"a", "dog", "runs", "on", "grass"},      {"a", "man", "on", "a", "bike"},
                              {"a", "dog", "plays", "in", "snow"},      {"a", "girl", "in", "a", "dress"},
                              {"a", "zebra", "jumps", "into", "water"}, {"a", "dog", "a", "dog", "a", "dog"}};
  auto corpus = corpus_cider_d(hyps, refs);
  CiderDScorer scorer(refs);
  CHECK(scorer.images() == 6);
  for (int i = 0; i < 6; ++i) {
    CAPTURE(i);
    CHECK(scorer.score(hyps[i], i) == doctest::Approx(corpus.per_image[i]).epsilon(1e-12));
  }
  CHECK(corpus.per_image[4] > 0);  // "zebra" is in no reference: it only lowers the score
  CHECK(scorer.score({"zebra", "zebra"}, 0) == 0.0);
  CHECK_THROWS(scorer.score(hyps[0], 6));
  CHECK_THROWS(CiderDScorer({{{"a"}}, {}}));
}

TEST_CASE("CIDEr-D scorer: its sorted document-frequency table equals the corpus metric's counts on a large corpus") {
  // 400 images of 1-5 random captions over 3000 words (word ids past 11 bits, so every radix digit of the n-gram
  // keys varies), common words drawn often enough that n-grams repeat across images: both of the scorer's modes
  // must give corpus_cider_d's per-image scores, whose document frequencies come from a hash map.
  Rng rng(17);
  auto word = [&](int limit) { return "w" + std::to_string(rng.integer(0, limit - 1)); };
  std::vector<std::vector<Tokens>> refs(400);
  std::vector<Tokens> hyps;
  for (auto& image : refs) {
    const int captions = (int)rng.integer(1, 5);
    for (int c = 0; c < captions; ++c) {
      Tokens t;
      const int len = (int)rng.integer(1, 14);
      for (int k = 0; k < len; ++k) t.push_back(rng.uniform() < 0.7 ? word(40) : word(3000));
      image.push_back(t);
    }
    Tokens h = image[0];
    if (h.size() > 2) h[1] = word(40);
    hyps.push_back(h);
  }
  const auto corpus = corpus_cider_d(hyps, refs);
  CiderDScorer precomputed(refs), on_demand(refs, 6.0, CiderDScorer::ReferenceVectors::on_demand);
  // The same references as the caption memory gives them: words joined by spaces (some doubled, and leading or
  // trailing ones, which split_words skips).
  std::vector<std::vector<std::string>> joined(refs.size());
  for (size_t i = 0; i < refs.size(); ++i)
    for (auto& t : refs[i]) {
      std::string text = i % 3 == 0 ? " " : "";
      for (size_t k = 0; k < t.size(); ++k) text += (k ? (k % 4 == 0 ? "  " : " ") : "") + t[k];
      joined[i].push_back(text + (i % 5 == 0 ? " " : ""));
    }
  CiderDScorer from_joined(CiderDScorer::SpaceJoined{joined}, 6.0, CiderDScorer::ReferenceVectors::on_demand);
  for (int i = 0; i < 400; ++i) {
    CAPTURE(i);
    CHECK(precomputed.score(hyps[i], i) == doctest::Approx(corpus.per_image[i]).epsilon(1e-12));
    CHECK(on_demand.score(hyps[i], i) == doctest::Approx(corpus.per_image[i]).epsilon(1e-12));
    CHECK(from_joined.score(hyps[i], i) == on_demand.score(hyps[i], i));
  }
  const std::vector<int> pooled{3, 50, 399};
  CHECK(from_joined.scores(hyps, pooled) == on_demand.scores(hyps, pooled));
}

TEST_CASE("METEOR approximation: formulas, stages, and the toolkit's demo within 0.01") {
  std::string why;
  if (!meteor_available(&why)) {
    MESSAGE("skipped: " << why);
    return;
  }
  MeteorParams p;
  // identical: Fmean 1, a single chunk covering both -> no fragmentation penalty
  CHECK(meteor_stats({"a", "dog", "runs"}, {"a", "dog", "runs"}).score(p) == doctest::Approx(1.0));
  CHECK(meteor_stats({"x", "y"}, {"a", "b"}).score(p) == 0.0);
  CHECK(meteor_stats({}, {"a", "b"}).score(p) == 0.0);
  // the stem stage: "riding" ~ "rides"; the synonym stage: "car" ~ "automobile"
  MeteorStats st = meteor_stats({"man", "riding"}, {"man", "rides"});
  CHECK(st.test_content[1] == 1);
  MeteorStats sy = meteor_stats({"red", "car"}, {"red", "automobile"});
  CHECK(sy.test_content[2] == 1);
  // stage weights: an exact match beats a stem match beats nothing
  double exact = meteor_stats({"man", "rides"}, {"man", "rides"}).score(p);
  double stem = st.score(p);
  double none = meteor_stats({"man", "xyz"}, {"man", "rides"}).score(p);
  CHECK(exact > stem);
  CHECK(stem > none);
  // fragmentation: the same words out of order score lower
  CHECK(meteor_stats({"b", "a", "d", "c"}, {"a", "b", "c", "d"}).score(p) <
        meteor_stats({"a", "b", "c", "d"}, {"a", "b", "c", "d"}).score(p));

  std::vector<Tokens> hyps;
  std::vector<std::vector<Tokens>> refs;
  if (!load_demo(hyps, refs)) return;
  double m = corpus_meteor(hyps, refs);
  MESSAGE("METEOR (approximation) on the coco-caption demo: " << m << " (the jar: 0.195)");
  CHECK(std::fabs(m - 0.195) < 0.01);
}
