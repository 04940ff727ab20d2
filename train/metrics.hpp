// Caption metrics, defined as the coco-caption toolkit computes them.
#pragma once
#include <array>
#include <cstdint>
#include <string>
#include <vector>

namespace sat {

using Tokens = std::vector<std::string>;

// BLEU-1..4 as coco-caption's BleuScorer (option "closest"): clipped n-gram counts summed over the corpus,
// one brevity penalty at corpus level from each image's closest reference length (ties to the shorter).
struct BleuResult {
  int64_t testlen = 0, reflen = 0;
  std::array<int64_t, 4> guess{}, correct{};
  std::array<double, 4> bleu{};
};
BleuResult corpus_bleu(const std::vector<Tokens>& hyps, const std::vector<std::vector<Tokens>>& refs);

}  // namespace sat
