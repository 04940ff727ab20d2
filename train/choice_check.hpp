// Does choosing among systems by their dev score hold on images the choice was not made on? Every setting tuned on
// the same photos it is reported on carries a winner's curse: the best of many noisy scores is partly luck. The
// check splits the images into two random halves many times, chooses the system best by one metric on one half,
// and scores that choice on the other half, beside the median system there (docs/metrics.md).
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "datasets/coco.hpp"
#include "train/paired_bootstrap.hpp"
#include "train/sat/scores.hpp"  // ChoiceCheck

namespace sat {

constexpr int kMaxChoiceSplits = 10000;  // 200 splits of 94 files of 1000 photos: 1.1 s (Zen 5)

// systems: per-image statistics of each system on the same images in the same order (at least 2 systems and 2
// images); splits in [1, kMaxChoiceSplits]. The splits depend only on the seed and the number of images.
ChoiceCheck check_choice(const std::vector<ImageScoreStats>& systems, const std::string& metric, int splits,
                         uint64_t seed);
// The same for COCO results files of the same images (in any order; each result naming an image of `refs`, once):
// errors name the file at fault.
ChoiceCheck check_choice_of_files(const std::vector<std::string>& paths, const CaptionSet& refs,
                                  const std::string& metric, int splits, uint64_t seed);

// As sat eval --choose-among prints it (names: one per system) and as JSON.
std::string choice_check_text(const ChoiceCheck& c, const std::vector<std::string>& names);
nlohmann::json choice_check_json(const ChoiceCheck& c, const std::vector<std::string>& names);

}  // namespace sat
