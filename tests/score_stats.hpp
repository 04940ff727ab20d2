// Per-image score statistics written by hand, for the tests of what reads them (the paired bootstrap, the choice
// check).
#pragma once
#include <vector>

#include "train/paired_bootstrap.hpp"

namespace sat::test {

// Only CIDEr-D varies (the other metrics' counts are all zero; no METEOR statistics, no object rows).
inline ImageScoreStats cider_only(const std::vector<double>& per_image) {
  ImageScoreStats s;
  s.cider_d = per_image;
  s.rouge_l.assign(per_image.size(), 0.0);
  s.bleu.assign(per_image.size(), BleuResult{});
  return s;
}

}  // namespace sat::test
