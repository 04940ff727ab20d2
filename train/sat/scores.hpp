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

}  // namespace sat
