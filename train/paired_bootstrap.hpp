// Is one system's caption set really better than another's on the same images, or is the difference the luck of
// which images were scored? The paired bootstrap (Koehn 2004; Efron & Tibshirani 1993): draw the image set again
// with replacement many times, score both systems on each draw from per-image statistics, and read the interval of
// the differences. Corpus metrics are recomputed per draw the way the corpus score is made: BLEU and METEOR from
// summed per-image counts, ROUGE-L and CIDEr-D as means of per-image scores (CIDEr-D's document frequencies stay
// those of the whole set's references, as coco-caption computes them once for the set).
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "datasets/coco.hpp"
#include "train/evaluate.hpp"
#include "train/meteor.hpp"
#include "train/metrics.hpp"
#include "train/object_mentions.hpp"
#include "train/sat/scores.hpp"

namespace sat {

// Every metric's per-image statistics for one system's captions of a set of images.
struct ImageScoreStats {
  std::vector<BleuResult> bleu;      // counts only (image_bleu_stats)
  std::vector<MeteorStats> meteor;   // empty: METEOR not available here
  std::vector<double> rouge_l;
  std::vector<double> cider_d;
  std::vector<ObjectRow> rarer_objects;  // per image, the object table's pooled rarer groups (photos, named, false)
  int images() const { return (int)cider_d.size(); }
};
// Raw captions and references in, tokenized as score_captions tokenizes them.
ImageScoreStats image_score_stats(const std::vector<std::string>& hyps,
                                  const std::vector<std::vector<std::string>>& refs);

// The metrics drawn: Bleu_4, METEOR (when both have its statistics), ROUGE_L, CIDEr, and from the object table
// rarer_named (the share of the rarer objects' photos whose caption names them; left out when no image shows one) and
// rarer_false (captions naming a rarer object no reference names, a count over the images drawn).
// One system's scores with the interval they would range over had other images of the same kind been scored: each
// metric on the full set (value) and the central `confidence` share of its values over `resamples` draws of the
// images with replacement (low, high).
struct MetricInterval {
  std::string metric;
  double value = 0, low = 0, high = 0;
};
std::vector<MetricInterval> score_intervals(const ImageScoreStats& stats, int resamples, uint64_t seed,
                                            double confidence = 0.95);

// The intervals of a results file's scores (each result naming an image of `refs`, once; errors name `path`), as
// JSON ({"Bleu_4": {"low", "high"}, ...} with resamples, seed, confidence) and as the lines sat eval prints.
std::vector<MetricInterval> result_intervals(const std::vector<ResultEntry>& results, const CaptionSet& refs,
                                             const std::string& path, int resamples, uint64_t seed);
nlohmann::json intervals_json(const std::vector<MetricInterval>& intervals, int resamples, uint64_t seed);
std::string intervals_text(const std::vector<MetricInterval>& intervals, int resamples, uint64_t seed);

// The results as the public API gives them (sat/scores.hpp: Comparison, MetricDifference), as JSON and as the table
// sat eval prints.
nlohmann::json comparison_json(const Comparison& c);
std::string comparison_table(const Comparison& c);

// One metric of kMetricNames' list (Bleu_4, METEOR, ROUGE_L, CIDEr, rarer_named, rarer_false) over a multiset of
// the images (counts[i]: how many times image i counts), computed as the corpus score is; an unknown name, or METEOR
// without its statistics, is an Error.
double corpus_metric(const ImageScoreStats& stats, const std::vector<int>& counts, const std::string& metric);

// The limits sat eval enforces.
constexpr int kMaxBootstrapResamples = 1000000;

// Both statistics are of the same images in the same order (else an Error). Resamples in [1, kMaxBootstrapResamples],
// confidence in (0, 1). The draws depend only on the seed and the number of images.
Comparison paired_bootstrap(const ImageScoreStats& baseline, const ImageScoreStats& candidate, int resamples,
                            uint64_t seed, double confidence = 0.95);

// The captions of `of` (a results file's, read from of_path) in the order of `images` (indices into refs.images,
// another file's: images_path): an image it has no caption for is an Error naming both files.
std::vector<std::string> captions_in_order(const MatchedResults& of, const std::string& of_path,
                                           const std::vector<int>& images, const std::string& images_path,
                                           const CaptionSet& refs);

// Two COCO results files of the same images (in any order; each result must name an image of `refs`, once) compared:
// errors name the file at fault.
Comparison compare_results_files(const std::string& results_path, const std::string& baseline_path,
                                 const CaptionSet& refs, int resamples, uint64_t seed);

}  // namespace sat
