// METEOR 1.5 (English, "rank" task parameters) approximated without the Java jar: the exact, Snowball-stem
// and WordNet-synonym matching stages are reproduced; the paraphrase stage (its table is not available here)
// is not. The scoring formulas and corpus aggregation follow Meteor's MeteorScorer.
#pragma once
#include <array>
#include <string>
#include <vector>

#include "train/metrics.hpp"

namespace sat {

struct MeteorParams {
  double alpha = 0.85, beta = 0.20, gamma = 0.60, delta = 0.75;
  std::array<double, 3> weights = {1.0, 0.6, 0.8};  // exact, stem, synonym
};

// Sufficient statistics of one hypothesis against one reference; they add up over a corpus.
struct MeteorStats {
  double test_len = 0, ref_len = 0, test_func = 0, ref_func = 0;
  std::array<double, 3> test_content{}, ref_content{}, test_function{}, ref_function{};  // matches per stage
  double test_word_matches = 0, ref_word_matches = 0, chunks = 0;
  double score(const MeteorParams& p) const;
  void add(const MeteorStats& o);
};

// True when the resources (WordNet files, Snowball stemmer) are usable; otherwise `why` says what is missing.
bool meteor_available(std::string* why = nullptr);
MeteorStats meteor_stats(const Tokens& hyp, const Tokens& ref);
// Per image the statistics of its best-scoring reference: summed over any multiset of images they give its score.
std::vector<MeteorStats> image_meteor_stats(const std::vector<Tokens>& hyps,
                                            const std::vector<std::vector<Tokens>>& refs, const MeteorParams& p = {});
// Per image the best-scoring reference; the corpus score is computed from the summed statistics.
double corpus_meteor(const std::vector<Tokens>& hyps, const std::vector<std::vector<Tokens>>& refs,
                     const MeteorParams& p = {});

}  // namespace sat
