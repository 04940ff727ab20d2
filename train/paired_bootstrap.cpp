#include "train/paired_bootstrap.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <map>
#include <random>

#include "sat/error.hpp"
#include "train/evaluate.hpp"

namespace sat {

ImageScoreStats image_score_stats(const std::vector<std::string>& hyps,
                                  const std::vector<std::vector<std::string>>& refs) {
  const auto [h, r] = tokenize_for_scoring(hyps, refs);
  ImageScoreStats s;
  s.bleu = image_bleu_stats(h, r);
  for (size_t i = 0; i < h.size(); ++i) s.rouge_l.push_back(rouge_l(h[i], r[i]));
  s.cider_d = corpus_cider_d(h, r).per_image;
  if (meteor_available()) s.meteor = image_meteor_stats(h, r);
  for (size_t i = 0; i < h.size(); ++i) s.rarer_objects.push_back(object_table_of_tokens({h[i]}, {r[i]}).rare);
  return s;
}

namespace {

// One system's corpus scores over a multiset of its images (counts[i]: how many times image i was drawn).
struct CorpusScores {
  double bleu4 = 0, meteor = -1, rouge_l = 0, cider_d = 0, rarer_named = 0, rarer_false = 0;
};

CorpusScores corpus_scores(const ImageScoreStats& s, const std::vector<int>& counts) {
  BleuResult bleu;
  MeteorStats meteor;
  double rouge = 0, cider = 0;
  ObjectRow rarer;
  int64_t drawn = 0;
  for (size_t i = 0; i < counts.size(); ++i) {
    const int c = counts[i];
    if (c == 0) continue;
    drawn += c;
    for (int k = 0; k < c; ++k) {
      add_bleu_counts(bleu, s.bleu[i]);
      if (!s.meteor.empty()) meteor.add(s.meteor[i]);
    }
    rouge += c * s.rouge_l[i];
    cider += c * s.cider_d[i];
    if (!s.rarer_objects.empty()) {
      rarer.photos += c * s.rarer_objects[i].photos;
      rarer.named += c * s.rarer_objects[i].named;
      rarer.false_mentions += c * s.rarer_objects[i].false_mentions;
    }
  }
  CorpusScores out;
  out.bleu4 = bleu_from_counts(bleu).bleu[3];
  if (!s.meteor.empty()) out.meteor = meteor.score(MeteorParams{});
  out.rouge_l = rouge / (double)drawn;
  out.cider_d = cider / (double)drawn;
  out.rarer_named = rarer.recall();
  out.rarer_false = rarer.false_mentions;
  return out;
}

std::vector<double> as_list(const CorpusScores& s) {
  return {s.bleu4, s.meteor, s.rouge_l, s.cider_d, s.rarer_named, s.rarer_false};
}

void check_stats(const ImageScoreStats& s, const char* which) {
  const size_t n = s.cider_d.size();
  if (n == 0) throw Error(std::string("paired bootstrap: the ") + which + " has no images");
  if (s.bleu.size() != n || s.rouge_l.size() != n || (!s.meteor.empty() && s.meteor.size() != n) ||
      (!s.rarer_objects.empty() && s.rarer_objects.size() != n))
    throw Error(std::string("paired bootstrap: the ") + which + "'s statistics differ in number of images");
}

void check_settings(int resamples, double confidence) {
  if (resamples < 1 || resamples > kMaxBootstrapResamples)
    throw Error("paired bootstrap: resamples must be in [1, " + std::to_string(kMaxBootstrapResamples) + "]");
  if (!(confidence > 0 && confidence < 1)) throw Error("paired bootstrap: the confidence must be in (0, 1)");
}

const std::vector<std::string> kMetricNames = {"Bleu_4", "METEOR", "ROUGE_L", "CIDEr", "rarer_named", "rarer_false"};

// Whether metric m is drawn for these statistics: METEOR needs its statistics, the object rows theirs.
bool has_metric(const ImageScoreStats& s, size_t m) {
  if (kMetricNames[m] == "METEOR") return !s.meteor.empty();
  if (kMetricNames[m] == "rarer_named")  // a share of the photos showing a rarer object: none, no share
    return std::any_of(s.rarer_objects.begin(), s.rarer_objects.end(), [](const ObjectRow& r) { return r.photos > 0; });
  if (kMetricNames[m] == "rarer_false") return !s.rarer_objects.empty();
  return true;
}

// One draw: counts[i] = how many times image i is drawn, n draws uniformly with replacement.
void draw_images(std::mt19937_64& rng, std::vector<int>& counts) {
  const size_t n = counts.size();
  std::fill(counts.begin(), counts.end(), 0);
  for (size_t k = 0; k < n; ++k) ++counts[(size_t)(((unsigned __int128)rng() * n) >> 64)];
}

// The central `confidence` share of the values: its lowest and highest (percentiles of the sorted values).
std::pair<double, double> central_interval(std::vector<double>& values, double confidence) {
  std::sort(values.begin(), values.end());
  const int n = (int)values.size();
  const double tail = (1 - confidence) / 2;
  const int lo = std::clamp((int)std::floor(tail * n), 0, n - 1);
  const int hi = std::clamp((int)std::ceil((1 - tail) * n) - 1, 0, n - 1);
  return {values[lo], values[hi]};
}

}  // namespace

double corpus_metric(const ImageScoreStats& stats, const std::vector<int>& counts, const std::string& metric) {
  const auto at = std::find(kMetricNames.begin(), kMetricNames.end(), metric);
  if (at == kMetricNames.end()) throw Error("no metric '" + metric + "' (Bleu_4, METEOR, ROUGE_L, CIDEr, rarer_named)");
  const size_t m = (size_t)(at - kMetricNames.begin());
  if (metric == "METEOR" && stats.meteor.empty())
    throw Error("METEOR is not computed here (WordNet's files, Debian's wordnet-base, are not installed)");
  if (counts.size() != stats.cider_d.size())
    throw Error("corpus metric: " + std::to_string(counts.size()) + " counts for " +
                std::to_string(stats.cider_d.size()) + " images");
  return as_list(corpus_scores(stats, counts))[m];
}

std::vector<MetricInterval> score_intervals(const ImageScoreStats& stats, int resamples, uint64_t seed,
                                            double confidence) {
  check_stats(stats, "set");
  check_settings(resamples, confidence);
  const std::vector<double> all = as_list(corpus_scores(stats, std::vector<int>(stats.images(), 1)));
  std::mt19937_64 rng(seed);
  std::vector<std::vector<double>> drawn(kMetricNames.size());
  std::vector<int> counts(stats.images());
  for (int r = 0; r < resamples; ++r) {
    draw_images(rng, counts);
    const std::vector<double> v = as_list(corpus_scores(stats, counts));
    for (size_t m = 0; m < v.size(); ++m) drawn[m].push_back(v[m]);
  }
  std::vector<MetricInterval> out;
  for (size_t m = 0; m < kMetricNames.size(); ++m) {
    if (!has_metric(stats, m)) continue;
    const auto [low, high] = central_interval(drawn[m], confidence);
    out.push_back({kMetricNames[m], all[m], low, high});
  }
  return out;
}

Comparison paired_bootstrap(const ImageScoreStats& baseline, const ImageScoreStats& candidate, int resamples,
                            uint64_t seed, double confidence) {
  check_stats(baseline, "baseline");
  check_stats(candidate, "candidate");
  const int n = baseline.images();
  if (candidate.images() != n)
    throw Error("paired bootstrap: the baseline has " + std::to_string(n) + " images, the candidate " +
                std::to_string(candidate.images()));
  check_settings(resamples, confidence);

  Comparison out;
  out.images = n;
  out.resamples = resamples;
  out.seed = seed;
  out.confidence = confidence;
  const std::vector<double> all_a = as_list(corpus_scores(baseline, std::vector<int>(n, 1)));
  const std::vector<double> all_b = as_list(corpus_scores(candidate, std::vector<int>(n, 1)));

  std::mt19937_64 rng(seed);
  std::vector<std::vector<double>> differences(kMetricNames.size());
  std::vector<int> counts(n);
  for (int r = 0; r < resamples; ++r) {
    draw_images(rng, counts);
    const std::vector<double> a = as_list(corpus_scores(baseline, counts));
    const std::vector<double> b = as_list(corpus_scores(candidate, counts));
    for (size_t m = 0; m < kMetricNames.size(); ++m) differences[m].push_back(b[m] - a[m]);
  }
  for (size_t m = 0; m < kMetricNames.size(); ++m) {
    if (!has_metric(baseline, m) || !has_metric(candidate, m)) continue;
    std::vector<double>& d = differences[m];
    const auto [low, high] = central_interval(d, confidence);
    MetricDifference c;
    c.metric = kMetricNames[m];
    c.baseline = all_a[m];
    c.candidate = all_b[m];
    c.difference = all_b[m] - all_a[m];
    c.low = low;
    c.high = high;
    c.share_not_above_zero = (double)(std::upper_bound(d.begin(), d.end(), 0.0) - d.begin()) / resamples;
    out.metrics.push_back(c);
  }
  for (int i = 0; i < n; ++i) {
    const double diff = candidate.cider_d[i] - baseline.cider_d[i];
    (diff > 0 ? out.better : diff < 0 ? out.worse : out.equal) += 1;
  }
  return out;
}

std::vector<std::string> captions_in_order(const MatchedResults& of, const std::string& of_path,
                                           const std::vector<int>& images, const std::string& images_path,
                                           const CaptionSet& refs) {
  std::map<int, int> at;
  for (size_t k = 0; k < of.images.size(); ++k) at[of.images[k]] = (int)k;
  std::vector<std::string> hyps;
  hyps.reserve(images.size());
  for (int image : images) {
    auto it = at.find(image);
    if (it == at.end())
      throw Error(of_path + ": has no caption for image " + refs.images[image].file_name + " of " + images_path);
    hyps.push_back(of.hyps[it->second]);
  }
  return hyps;
}

Comparison compare_results_files(const std::string& results_path, const std::string& baseline_path,
                                 const CaptionSet& refs, int resamples, uint64_t seed) {
  const MatchedResults candidate = match_results(load_results(results_path), refs, results_path);
  const MatchedResults baseline = match_results(load_results(baseline_path), refs, baseline_path);
  const std::vector<std::string> baseline_hyps =
      captions_in_order(baseline, baseline_path, candidate.images, results_path, refs);
  if (baseline.images.size() != candidate.images.size())
    throw Error(baseline_path + ": captions " + std::to_string(baseline.images.size()) + " images, " + results_path +
                " " + std::to_string(candidate.images.size()) + ": a paired comparison needs the same images");
  return paired_bootstrap(image_score_stats(baseline_hyps, candidate.refs),
                          image_score_stats(candidate.hyps, candidate.refs), resamples, seed);
}

std::vector<MetricInterval> result_intervals(const std::vector<ResultEntry>& results, const CaptionSet& refs,
                                             const std::string& path, int resamples, uint64_t seed) {
  const MatchedResults m = match_results(results, refs, path);
  return score_intervals(image_score_stats(m.hyps, m.refs), resamples, seed);
}

nlohmann::json intervals_json(const std::vector<MetricInterval>& intervals, int resamples, uint64_t seed) {
  nlohmann::json j = {{"resamples", resamples}, {"seed", seed}, {"confidence", 0.95}};
  for (const MetricInterval& m : intervals) j["metrics"][m.metric] = {{"low", m.low}, {"high", m.high}};
  return j;
}

std::string intervals_text(const std::vector<MetricInterval>& intervals, int resamples, uint64_t seed) {
  char buf[160];
  std::snprintf(buf, sizeof buf, "95%% intervals over the images drawn again %d times (seed %llu):\n", resamples,
                (unsigned long long)seed);
  std::string s = buf;
  for (const MetricInterval& m : intervals) {
    std::snprintf(buf, sizeof buf, "  %-11s %.4f  [%.4f, %.4f]\n", m.metric.c_str(), m.value, m.low, m.high);
    s += buf;
  }
  return s;
}

nlohmann::json comparison_json(const Comparison& c) {
  nlohmann::json j = {{"images", c.images},         {"resamples", c.resamples},
                      {"seed", c.seed},             {"confidence", c.confidence},
                      {"cider_d_images_better", c.better}, {"cider_d_images_worse", c.worse},
                      {"cider_d_images_equal", c.equal}};
  for (const MetricDifference& m : c.metrics)
    j["metrics"][m.metric] = {{"baseline", m.baseline}, {"candidate", m.candidate},
                              {"difference", m.difference}, {"low", m.low},
                              {"high", m.high},         {"share_not_above_zero", m.share_not_above_zero}};
  return j;
}

std::string comparison_table(const Comparison& c) {
  char buf[256];
  std::snprintf(buf, sizeof buf,
                "paired bootstrap: %d images drawn again %d times (seed %llu); the candidate minus the baseline\n",
                c.images, c.resamples, (unsigned long long)c.seed);
  std::string s = buf;
  std::snprintf(buf, sizeof buf, "%-11s %9s %10s %11s   %-22s %s\n", "metric", "baseline", "candidate", "difference",
                (std::to_string((int)std::lround(c.confidence * 100)) + "% interval").c_str(), "resamples <= 0");
  s += buf;
  for (const MetricDifference& m : c.metrics) {
    std::snprintf(buf, sizeof buf, "%-11s %9.4f %10.4f %+11.4f   [%+.4f, %+.4f]       %.4f\n", m.metric.c_str(),
                  m.baseline, m.candidate, m.difference, m.low, m.high, m.share_not_above_zero);
    s += buf;
  }
  std::snprintf(buf, sizeof buf, "CIDEr-D per image: %d higher, %d lower, %d the same\n", c.better, c.worse, c.equal);
  return s + buf;
}

}  // namespace sat
