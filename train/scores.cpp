// The public scoring functions (train/sat/scores.hpp) over the metrics `sat eval` runs (train/evaluate.hpp).
#include "train/sat/scores.hpp"

#include "train/choice_check.hpp"
#include "train/evaluate.hpp"
#include "train/paired_bootstrap.hpp"
#include "train/trainer.hpp"

namespace sat {

namespace {

Scores to_public(const CaptionScores& s) {
  Scores out;
  out.images = s.images;
  out.bleu = s.bleu;
  out.length_ratio = s.length_ratio;
  out.meteor = s.meteor;
  out.rouge_l = s.rouge_l;
  out.cider_d = s.cider_d;
  return out;
}

}  // namespace

Scores score(const std::vector<std::string>& captions, const std::vector<std::vector<std::string>>& references) {
  if (captions.size() != references.size())
    throw Error("score: " + std::to_string(captions.size()) + " captions but references for " +
                std::to_string(references.size()) + " images");
  for (size_t i = 0; i < references.size(); ++i)
    if (references[i].empty()) throw Error("score: references[" + std::to_string(i) + "] holds no captions");
  return to_public(score_captions(captions, references));
}

Scores score_files(const std::string& results, const std::string& references) {
  const std::vector<ResultEntry> entries = load_results(results);
  return to_public(score_results(entries, load_caption_set(references, "", ""), results));
}

Scores score_files(const std::vector<std::string>& image_ids, const std::vector<std::string>& captions,
                   const std::string& references) {
  if (image_ids.size() != captions.size())
    throw Error("score: " + std::to_string(captions.size()) + " captions but " + std::to_string(image_ids.size()) +
                " image ids");
  if (captions.empty()) throw Error("score: no captions to score");
  std::vector<ResultEntry> entries;
  for (size_t i = 0; i < captions.size(); ++i) {
    const std::string& id = image_ids[i];
    const bool number = !id.empty() && id.size() < 19 && id.find_first_not_of("0123456789") == std::string::npos;
    entries.push_back({number ? nlohmann::json(std::stoll(id)) : nlohmann::json(id), captions[i]});
  }
  return to_public(score_results(entries, load_caption_set(references, "", ""), "results"));
}

Comparison compare_files(const std::string& results, const std::string& baseline, const std::string& references,
                         int resamples, uint64_t seed) {
  if (resamples < 1 || resamples > kMaxBootstrapResamples)
    throw Error("compare: resamples must be in [1, " + std::to_string(kMaxBootstrapResamples) + "], got " +
                std::to_string(resamples));
  return compare_results_files(results, baseline, load_caption_set(references, "", ""), resamples, seed);
}

ChoiceCheck check_choice_files(const std::vector<std::string>& results, const std::string& references,
                               const std::string& metric, int splits, uint64_t seed) {
  return check_choice_of_files(results, load_caption_set(references, "", ""), metric, splits, seed);
}

}  // namespace sat
