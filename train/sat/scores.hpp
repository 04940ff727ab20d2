// Caption metrics as the coco-caption toolkit computes them, the numbers `sat eval` prints: captions and references
// are PTB-tokenized, then BLEU-1..4, METEOR (approximated: its exact, stem and WordNet-synonym stages, not the
// paraphrase table), ROUGE-L and CIDEr-D over the whole set (docs/metrics.md).
//
//   sat::Scores s = sat::score({"a dog runs"}, {{"a dog is running", "the dog runs on grass"}});  // s.cider_d ...
//
// Part of libsat.so (link sat::sat); problems with the input throw sat::Error with a one-line message.
#pragma once
#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include <sat/error.hpp>  // in this checkout: datasets/sat/error.hpp

namespace sat {

struct Scores {
  int images = 0;
  std::array<double, 4> bleu{};  // BLEU-1..4
  double length_ratio = 0;       // caption words / closest-reference words over the set (BLEU's brevity penalty)
  double meteor = -1;            // < 0: not computed (WordNet's files, Debian's wordnet-base, are not installed)
  double rouge_l = 0;
  double cider_d = 0;  // CIDEr-D, document frequencies from the references of the captions scored together
};

// captions[i] against references[i] (one or more captions of the same image). Differing counts, or an image without
// references, throw sat::Error.
SAT_API Scores score(const std::vector<std::string>& captions,
                     const std::vector<std::vector<std::string>>& references);

// A COCO results file ([{"image_id", "caption"}], an image_id being a number or a file name) against references (a
// COCO captions JSON, Flickr8k's captions.csv or a data folder holding either): `sat eval --results R --refs F`.
SAT_API Scores score_files(const std::string& results, const std::string& references);

// The same with the results in memory: captions[i] is the caption of image image_ids[i] (a file name, with or without
// its extension, or a COCO image id: digits only).
SAT_API Scores score_files(const std::vector<std::string>& image_ids, const std::vector<std::string>& captions,
                           const std::string& references);

// Is one results file better than another of the same images, or is the difference the luck of which images were
// scored? The paired bootstrap: the image set drawn again with replacement `resamples` times, both files scored on
// each draw (docs/metrics.md). One row per metric: Bleu_4, METEOR (when computed), ROUGE_L, CIDEr.
struct MetricDifference {
  std::string metric;
  double baseline = 0, candidate = 0;  // on all the images
  double difference = 0;               // candidate - baseline on all the images
  double low = 0, high = 0;            // the 95% interval of the resampled differences (percentiles)
  double share_not_above_zero = 0;     // the share of draws whose difference is <= 0
};
struct Comparison {
  int images = 0, resamples = 0;
  uint64_t seed = 0;
  double confidence = 0.95;
  std::vector<MetricDifference> metrics;
  int better = 0, worse = 0, equal = 0;  // images whose CIDEr-D the candidate raises, lowers, leaves
};

// `sat eval --results RESULTS --baseline BASELINE --refs REFERENCES`: the two files must caption the same images (in
// any order), else sat::Error naming the file. The draws depend only on the seed and the number of images.
SAT_API Comparison compare_files(const std::string& results, const std::string& baseline,
                                 const std::string& references, int resamples = 2000, uint64_t seed = 1);

// Does choosing the best of several results files (several settings scored on dev, say) hold on images the choice
// was not made on? The images split into two random halves `splits` times; each time the file best by `metric` on
// one half is chosen and scored on the other half, beside the median file there (docs/metrics.md).
struct ChoiceCheck {
  std::string metric;  // Bleu_4, METEOR, ROUGE_L, CIDEr or rarer_named (higher is better for each)
  int systems = 0, images = 0, splits = 0;
  uint64_t seed = 0;
  std::vector<double> on_all;  // each file's score on all the images
  int best_on_all = 0;         // the first of the best
  double median_on_all = 0;    // the median file's score (the mean of the two middle ones for an even count)
  // Means over the splits: the file chosen on one half (the first of the best there), on that half and on the
  // other; and the median file's score on the other half.
  double chosen_own_half = 0, chosen_other_half = 0, median_other_half = 0;
  // The central 90% of the chosen file's own-half score minus its other-half score over the splits.
  double overstated_low = 0, overstated_high = 0;
  std::vector<int> times_chosen;  // per file: in how many splits it was the choice
};

// `sat eval --choose-among R1 R2 ... --refs REFERENCES --by METRIC`: at least 2 COCO results files of the same images
// (in any order), else sat::Error naming the file. The splits depend only on the seed and the number of images.
SAT_API ChoiceCheck check_choice_files(const std::vector<std::string>& results, const std::string& references,
                                       const std::string& metric = "Bleu_4", int splits = 200, uint64_t seed = 1);

}  // namespace sat
