// Scoring captions the coco-caption way: PTB-tokenize hypotheses and references, then every metric.
#pragma once
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "datasets/coco.hpp"
#include "train/metrics.hpp"
#include "train/object_mentions.hpp"

namespace sat {

struct CaptionScores {
  int images = 0;
  std::array<double, 4> bleu{};
  double length_ratio =
      0;               // hypothesis words / closest-reference words, corpus-wide (BLEU's brevity penalty < 1 below 1)
  double meteor = -1;  // < 0: not computed
  double rouge_l = 0;
  double cider_d = 0;
  ObjectTable objects;  // object naming: recall and false mentions per object group (train/object_mentions.hpp)
  nlohmann::json to_json() const;
  static CaptionScores from_json(const nlohmann::json& j);  // what to_json wrote
  std::string table() const;                                // aligned, one metric per line, then the object table
};

// Captions and their references tokenized as the toolkit's PTBTokenizer step does (in parallel), the input every
// metric reads; differing counts are an error.
struct TokenizedCaptions {
  std::vector<Tokens> hyps;
  std::vector<std::vector<Tokens>> refs;
};
TokenizedCaptions tokenize_for_scoring(const std::vector<std::string>& hyps,
                                       const std::vector<std::vector<std::string>>& refs);

// Raw text in; tokenization as the toolkit's PTBTokenizer step. The object table is made from the same tokens.
CaptionScores score_captions(const std::vector<std::string>& hyps, const std::vector<std::vector<std::string>>& refs);

// A COCO results file: [{"image_id": ..., "caption": "..."}]. image_id may be a number or a file name.
struct ResultEntry {
  nlohmann::json image_id;
  std::string caption;
};
std::vector<ResultEntry> load_results(const std::string& path);
// Each result's image in a caption set (its index in refs.images), caption and references, in the results' order;
// every result must name an image of the set, once (else an error naming the results file).
struct MatchedResults {
  std::vector<int> images;
  std::vector<std::string> hyps;
  std::vector<std::vector<std::string>> refs;
};
MatchedResults match_results(const std::vector<ResultEntry>& results, const CaptionSet& refs,
                             const std::string& results_path);
// Scores results against a caption set; every result must name an image of the set, once.
CaptionScores score_results(const std::vector<ResultEntry>& results, const CaptionSet& refs,
                            const std::string& results_path);

}  // namespace sat
