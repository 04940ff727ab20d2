// The attention report: a model's captions of a caption set with their word-by-word attention maps and scores,
// written as one self-contained HTML page (photos as base64 JPEG thumbnails, maps as numbers drawn by the page's
// own script on a canvas over each photo; no network, no external file).
#pragma once
#include <functional>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "datasets/coco.hpp"
#include "datasets/features.hpp"
#include "train/evaluate.hpp"
#include "train/model.hpp"

namespace sat {

struct ReportPhoto {
  std::string file_name;
  std::vector<std::string> words;          // the caption
  std::vector<std::vector<float>> alphas;  // grid_h * grid_w weights per word, then one for the step emitting <end>
  std::vector<int> locations;              // hard attention: the glimpse's grid cell per word (and <end>)
  std::vector<std::string> references;
  double cider_d = 0;  // this photo's term of the corpus CIDEr-D (document frequencies from the report's references)
  double bleu_4 = 0;   // coco-caption's sentence BLEU-4 (its smoothing, brevity penalty of this caption alone)
  double rouge_l = 0;
  std::string jpeg;           // the thumbnail's bytes
  int width = 0, height = 0;  // thumbnail size in pixels
};

struct SkippedPhoto {
  std::string file_name;
  std::string message;  // "<file>: <problem>", as every library error
};

struct Report {
  std::string title;                                          // the model file
  std::vector<std::pair<std::string, std::string>> settings;  // model and run, shown as a table
  CaptionScores scores;
  std::string attention = "soft";  // the decoder's attention kind: soft, local, hard or none
  int grid_h = 0, grid_w = 0;
  int hard_window = 1;  // hard attention: the glimpse covers this many cells across, centred on its location
  std::vector<ReportPhoto> photos;
  std::vector<SkippedPhoto> skipped;  // unreadable photos, left out of the report and of its scores
};

struct ReportOptions {
  // How to search (train/search_policy.hpp: resolve_search); unset: the model's stored settings, greedy.
  std::optional<SearchSettings> search;
  int thumbnail_side = 224;  // the thumbnail's long side in pixels
  int jpeg_quality = 85;
  int batch = 16;  // photos encoded and searched together
  // Called once per unreadable photo (it is left out), and after each batch with (photos done, photos in all).
  std::function<void(const SkippedPhoto&)> on_skip;
  std::function<void(int, int)> on_progress;
};

// Captions every photo of `set` with the model, keeping each word's attention map, and scores the captions (corpus
// scores as `sat eval`, per-photo CIDEr-D, BLEU-4 and ROUGE-L). With a cache the captions come from its grids (as
// `sat eval --features`) and the photos are read only for their thumbnails; without one they are encoded. An
// unreadable photo is left out and passed to on_skip. When no photo can be read the error says so (a set of one
// photo: that photo's own error). settings describe the model and the search; the caller sets the title and may add
// rows (model file, data, command).
Report build_report(CaptionModel& model, const CaptionSet& set, const FeatureCache* cache, const ReportOptions& opt);

// The whole page.
std::string report_html(const Report& report);

// Text for HTML content and quoted attribute values: & < > " ' as character references.
std::string html_escape(const std::string& text);
// JSON to embed in a <script> element: every '<' is written as \u003c, so no string in it can end the element
// ("</script>") or open a comment ("<!--"); JSON.parse reads it back unchanged. Invalid UTF-8 becomes U+FFFD.
std::string script_safe_json(const nlohmann::json& value);
// One attention map as the page embeds it: {"peak": largest weight (4 significant digits), "map": each weight in
// thousandths of the peak, integers 0..1000, row-major}. Lean (a 14x14 map is ~600 bytes) and exact to 0.05% of
// the peak, which is more than a colour map shows. An all-zero map has peak 0 and zeros.
nlohmann::json attention_map_json(const std::vector<float>& alpha);
std::string base64_encode(const std::string& bytes);

}  // namespace sat
