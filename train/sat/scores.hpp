// Caption metrics as the coco-caption toolkit computes them, the numbers `sat eval` prints: captions and references
// are PTB-tokenized, then BLEU-1..4, METEOR (approximated: its exact, stem and WordNet-synonym stages, not the
// paraphrase table), ROUGE-L and CIDEr-D over the whole set (docs/metrics.md).
//
//   sat::Scores s = sat::score({"a dog runs"}, {{"a dog is running", "the dog runs on grass"}});  // s.cider_d ...
//
// Part of libsat.so (link sat::sat); problems with the input throw sat::Error with a one-line message.
#pragma once
#include <array>
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

}  // namespace sat
