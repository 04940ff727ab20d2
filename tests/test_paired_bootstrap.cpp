// The paired bootstrap of two caption sets on the same images: its full-set scores are score_captions', its
// intervals are those the normal approximation gives a known per-image difference, and a system against itself
// differs by exactly nothing.
#include <doctest/doctest.h>

#include <cmath>
#include <string>
#include <vector>

#include "sat/error.hpp"
#include "tests/scratch.hpp"
#include "tests/score_stats.hpp"
#include "train/evaluate.hpp"
#include "train/meteor.hpp"
#include "train/paired_bootstrap.hpp"

using namespace sat;
using test::cider_only;
using test::error_of;

namespace {

std::vector<std::vector<std::string>> small_refs() {
  return {{"a dog runs on the grass", "a brown dog is running through a field", "the dog runs"},
          {"a man rides a bike down the street", "a person on a bicycle", "a cyclist rides in the city"},
          {"two children play in the water", "kids splash in a pool", "two kids are swimming"},
          {"a woman sits on a bench", "a lady is sitting on a park bench", "a woman on a bench reading"}};
}

const MetricDifference& metric(const Comparison& p, const std::string& name) {
  for (const MetricDifference& m : p.metrics)
    if (m.metric == name) return m;
  throw Error("no metric " + name);
}

}  // namespace

TEST_CASE("paired bootstrap: the full-set scores are score_captions' and a system against itself differs by 0") {
  const auto refs = small_refs();
  const std::vector<std::string> a = {"a dog runs on the grass", "a man on a bike", "kids in a pool", "a man sits"};
  const std::vector<std::string> b = {"a brown dog is running", "a man rides a bicycle down the street",
                                      "two kids are swimming in the water", "a woman is sitting on a bench"};
  const CaptionScores sa = score_captions(a, refs), sb = score_captions(b, refs);
  const ImageScoreStats stats_a = image_score_stats(a, refs), stats_b = image_score_stats(b, refs);
  const Comparison p = paired_bootstrap(stats_a, stats_b, 300, 7);
  CHECK(p.images == 4);
  CHECK(metric(p, "Bleu_4").baseline == doctest::Approx(sa.bleu[3]).epsilon(1e-12));
  CHECK(metric(p, "Bleu_4").candidate == doctest::Approx(sb.bleu[3]).epsilon(1e-12));
  CHECK(metric(p, "ROUGE_L").baseline == doctest::Approx(sa.rouge_l).epsilon(1e-12));
  CHECK(metric(p, "CIDEr").baseline == doctest::Approx(sa.cider_d).epsilon(1e-12));
  CHECK(metric(p, "CIDEr").candidate == doctest::Approx(sb.cider_d).epsilon(1e-12));
  if (meteor_available()) {
    CHECK(metric(p, "METEOR").baseline == doctest::Approx(sa.meteor).epsilon(1e-12));
    CHECK(metric(p, "METEOR").candidate == doctest::Approx(sb.meteor).epsilon(1e-12));
  } else {
    CHECK(p.metrics.size() == 5);
  }
  // The object table's rarer groups: the bicycle photo (3 references name it) is named by b, not by a ("a man on a
  // bike" names it too: "bike" is a bicycle word); no caption names a rarer object its references do not.
  CHECK(metric(p, "rarer_named").baseline == doctest::Approx(sa.objects.rare.recall()));
  CHECK(metric(p, "rarer_named").candidate == doctest::Approx(sb.objects.rare.recall()));
  CHECK(metric(p, "rarer_named").candidate == 1);
  CHECK(metric(p, "rarer_false").candidate == sb.objects.rare.false_mentions);
  for (const MetricDifference& m : p.metrics) {
    CHECK(m.difference == doctest::Approx(m.candidate - m.baseline));
    CHECK(m.low <= m.high);
  }
  CHECK(p.better + p.worse + p.equal == 4);
  // The same seed draws the same image sets.
  const Comparison again = paired_bootstrap(stats_a, stats_b, 300, 7);
  CHECK(metric(again, "CIDEr").low == metric(p, "CIDEr").low);
  CHECK(metric(again, "Bleu_4").high == metric(p, "Bleu_4").high);

  const Comparison self = paired_bootstrap(stats_a, stats_a, 100, 1);
  for (const MetricDifference& m : self.metrics) {
    CHECK(m.difference == 0);
    CHECK(m.low == 0);
    CHECK(m.high == 0);
    CHECK(m.share_not_above_zero == 1);
  }
  CHECK(self.equal == 4);
}

TEST_CASE("paired bootstrap: a resampled corpus BLEU is the corpus BLEU of the images drawn") {
  // Two images with references of 7 words, the candidate right on the first and a wrong word on the second; the
  // baseline the reverse. A draw of the first image twice scores the candidate's BLEU-4 1 and the baseline's about
  // 0; a draw of each once scores both alike (the same counts). So every resampled difference is one of three
  // values, and the full set's is 0.
  const std::vector<std::vector<std::string>> refs = {{"a black dog runs on the grass"},
                                                      {"a man rides a red bike today"}};
  const ImageScoreStats cand = image_score_stats({"a black dog runs on the grass", "x"}, refs);
  const ImageScoreStats base = image_score_stats({"x", "a man rides a red bike today"}, refs);
  const Comparison p = paired_bootstrap(base, cand, 2000, 3);
  const MetricDifference& b4 = metric(p, "Bleu_4");
  CHECK(b4.difference == doctest::Approx(0).epsilon(1e-9));
  CHECK(b4.low == doctest::Approx(-1).epsilon(1e-6));  // the second image twice: 0 - 1
  CHECK(b4.high == doctest::Approx(1).epsilon(1e-6));   // the first twice
  // P(difference <= 0) = P(second twice) + P(one of each) = 3/4.
  CHECK(b4.share_not_above_zero == doctest::Approx(0.75).epsilon(0.05));
}

TEST_CASE("paired bootstrap: the interval of a known mean difference is the normal approximation's") {
  // 400 images, the candidate 1 better on 30% of them (CIDEr-D), else level: the mean difference 0.3 with standard
  // error sqrt(0.3 * 0.7 / 400) = 0.0229, so the 95% interval is 0.3 -+ 1.96 x 0.0229 = [0.255, 0.345].
  std::vector<double> base(400, 0.5), cand(400, 0.5);
  for (int i = 0; i < 400; ++i)
    if (i % 10 < 3) cand[i] = 1.5;
  const Comparison p = paired_bootstrap(cider_only(base), cider_only(cand), 20000, 11);
  const MetricDifference& c = metric(p, "CIDEr");
  CHECK(c.difference == doctest::Approx(0.3));
  CHECK(c.low == doctest::Approx(0.255).epsilon(0.02));
  CHECK(c.high == doctest::Approx(0.345).epsilon(0.02));
  CHECK(c.share_not_above_zero == 0);
  CHECK(p.better == 120);
  CHECK(p.equal == 280);
  // A 90% interval is narrower: 0.3 -+ 1.645 x 0.0229 = [0.262, 0.338].
  const Comparison p90 = paired_bootstrap(cider_only(base), cider_only(cand), 20000, 11, 0.9);
  CHECK(metric(p90, "CIDEr").low == doctest::Approx(0.262).epsilon(0.02));
  CHECK(metric(p90, "CIDEr").high == doctest::Approx(0.338).epsilon(0.02));
  // No difference on average: the interval straddles 0 and about half the draws are at or below it.
  std::vector<double> mixed(400, 0.5);
  for (int i = 0; i < 400; ++i) mixed[i] = i % 2 ? 1.0 : 0.0;
  const Comparison level = paired_bootstrap(cider_only(base), cider_only(mixed), 5000, 5);
  CHECK(metric(level, "CIDEr").low < 0);
  CHECK(metric(level, "CIDEr").high > 0);
  CHECK(metric(level, "CIDEr").share_not_above_zero == doctest::Approx(0.5).epsilon(0.1));
}

TEST_CASE("bootstrap intervals of one system: the normal approximation's for a known mean, the full-set value inside") {
  // 400 images scoring 1.5 (30%) or 0.5: mean 0.8, standard error sqrt(0.21 / 400) = 0.0229, so the 95% interval
  // is 0.8 -+ 0.0449.
  std::vector<double> per_image(400, 0.5);
  for (int i = 0; i < 400; ++i)
    if (i % 10 < 3) per_image[i] = 1.5;
  const std::vector<MetricInterval> v = score_intervals(cider_only(per_image), 20000, 3);
  REQUIRE(v.size() == 3);  // no METEOR statistics: Bleu_4, ROUGE_L, CIDEr
  CHECK(v[2].metric == "CIDEr");
  CHECK(v[2].value == doctest::Approx(0.8));
  CHECK(v[2].low == doctest::Approx(0.755).epsilon(0.01));
  CHECK(v[2].high == doctest::Approx(0.845).epsilon(0.01));
  // Real captions: every metric's full-set value lies in its interval, and the values are score_captions'.
  const auto refs = small_refs();
  const std::vector<std::string> hyps = {"a brown dog is running", "a man rides a bicycle down the street",
                                         "two kids are swimming in the water", "a woman is sitting on a bench"};
  const CaptionScores s = score_captions(hyps, refs);
  for (const MetricInterval& m : score_intervals(image_score_stats(hyps, refs), 500, 1)) {
    CHECK(m.low <= m.value);
    CHECK(m.value <= m.high);
    if (m.metric == "CIDEr") CHECK(m.value == doctest::Approx(s.cider_d).epsilon(1e-12));
    if (m.metric == "Bleu_4") CHECK(m.value == doctest::Approx(s.bleu[3]).epsilon(1e-12));
  }
  CHECK(error_of([&] { score_intervals(cider_only({}), 10, 1); }) == "paired bootstrap: the set has no images");
}

TEST_CASE("paired bootstrap: mismatched systems and bad settings are errors") {
  const ImageScoreStats three = cider_only({0.1, 0.2, 0.3}), two = cider_only({0.1, 0.2});
  CHECK(error_of([&] { paired_bootstrap(three, two, 10, 1); }) ==
        "paired bootstrap: the baseline has 3 images, the candidate 2");
  CHECK(error_of([&] { paired_bootstrap(cider_only({}), cider_only({}), 10, 1); }) ==
        "paired bootstrap: the baseline has no images");
  CHECK(error_of([&] { paired_bootstrap(three, three, 0, 1); }).find("paired bootstrap: resamples must be in [1, ") == 0);
  CHECK(error_of([&] { paired_bootstrap(three, three, 10, 1, 1.0); }) ==
        "paired bootstrap: the confidence must be in (0, 1)");
  ImageScoreStats short_rouge = three;
  short_rouge.rouge_l.pop_back();
  CHECK(error_of([&] { paired_bootstrap(three, short_rouge, 10, 1); }) ==
        "paired bootstrap: the candidate's statistics differ in number of images");
}
