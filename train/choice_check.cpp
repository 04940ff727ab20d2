#include "train/choice_check.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <numeric>
#include <random>

#include "sat/error.hpp"
#include "train/evaluate.hpp"

namespace sat {

namespace {

const std::vector<std::string> kChoiceMetrics = {"Bleu_4", "METEOR", "ROUGE_L", "CIDEr", "rarer_named"};

// The median of the values (the mean of the two middle ones for an even count).
double median_of(std::vector<double> values) {
  std::sort(values.begin(), values.end());
  const size_t n = values.size();
  return n % 2 ? values[n / 2] : (values[n / 2 - 1] + values[n / 2]) / 2;
}

// The first of the best.
int best_of(const std::vector<double>& values) {
  return (int)(std::max_element(values.begin(), values.end()) - values.begin());
}

// Every system's metric over the images that `counts` marks.
std::vector<double> scores_over(const std::vector<ImageScoreStats>& systems, const std::vector<int>& counts,
                                const std::string& metric) {
  std::vector<double> out;
  out.reserve(systems.size());
  for (const ImageScoreStats& s : systems) out.push_back(corpus_metric(s, counts, metric));
  return out;
}

// The metric and the number of splits, checked before any file is read.
void check_choice_settings(const std::string& metric, int splits) {
  if (std::find(kChoiceMetrics.begin(), kChoiceMetrics.end(), metric) == kChoiceMetrics.end())
    throw Error("choose by one of Bleu_4, METEOR, ROUGE_L, CIDEr, rarer_named (higher is better), not '" + metric +
                "'");
  if (splits < 1 || splits > kMaxChoiceSplits)
    throw Error("the splits must be in [1, " + std::to_string(kMaxChoiceSplits) + "]");
}

}  // namespace

ChoiceCheck check_choice(const std::vector<ImageScoreStats>& systems, const std::string& metric, int splits,
                         uint64_t seed) {
  check_choice_settings(metric, splits);
  if (systems.size() < 2) throw Error("a choice needs at least 2 systems, got " + std::to_string(systems.size()));
  const int n = systems[0].images();
  if (n < 2) throw Error("a choice check splits the images in two: it needs at least 2, got " + std::to_string(n));
  for (size_t k = 0; k < systems.size(); ++k)
    if (systems[k].images() != n || systems[k].bleu.size() != (size_t)n || systems[k].rouge_l.size() != (size_t)n)
      throw Error("system " + std::to_string(k + 1) + " has statistics of " + std::to_string(systems[k].images()) +
                  " images, the first " + std::to_string(n));

  ChoiceCheck c;
  c.metric = metric;
  c.systems = (int)systems.size();
  c.images = n;
  c.splits = splits;
  c.seed = seed;
  c.on_all = scores_over(systems, std::vector<int>(n, 1), metric);
  c.best_on_all = best_of(c.on_all);
  c.median_on_all = median_of(c.on_all);
  c.times_chosen.assign(systems.size(), 0);

  std::mt19937_64 rng(seed);
  std::vector<int> order(n), own(n), other(n);
  std::vector<double> overstated;
  for (int split = 0; split < splits; ++split) {
    std::iota(order.begin(), order.end(), 0);
    for (int i = n - 1; i > 0; --i) std::swap(order[i], order[(size_t)(((unsigned __int128)rng() * (i + 1)) >> 64)]);
    for (int k = 0; k < n; ++k) {
      own[order[k]] = k < n / 2 ? 1 : 0;
      other[order[k]] = 1 - own[order[k]];
    }
    const std::vector<double> on_own = scores_over(systems, own, metric);
    const int chosen = best_of(on_own);
    const std::vector<double> on_other = scores_over(systems, other, metric);
    ++c.times_chosen[chosen];
    c.chosen_own_half += on_own[chosen];
    c.chosen_other_half += on_other[chosen];
    c.median_other_half += median_of(on_other);
    overstated.push_back(on_own[chosen] - on_other[chosen]);
  }
  c.chosen_own_half /= splits;
  c.chosen_other_half /= splits;
  c.median_other_half /= splits;
  std::sort(overstated.begin(), overstated.end());
  c.overstated_low = overstated[(size_t)std::clamp((int)(0.05 * splits), 0, splits - 1)];
  c.overstated_high = overstated[(size_t)std::clamp((int)std::ceil(0.95 * splits) - 1, 0, splits - 1)];
  return c;
}

ChoiceCheck check_choice_of_files(const std::vector<std::string>& paths, const CaptionSet& refs,
                                  const std::string& metric, int splits, uint64_t seed) {
  check_choice_settings(metric, splits);
  if (paths.size() < 2)
    throw Error("--choose-among needs at least 2 results files, got " + std::to_string(paths.size()));
  std::vector<ImageScoreStats> systems;
  MatchedResults first;  // its images are the order every file's captions are put in
  for (const std::string& path : paths) {
    const MatchedResults m = match_results(load_results(path), refs, path);
    if (systems.empty()) first = m;
    if (m.images.size() != first.images.size())
      throw Error(path + ": captions " + std::to_string(m.images.size()) + " images, " + paths[0] + " " +
                  std::to_string(first.images.size()) + ": a choice among them needs the same images");
    systems.push_back(image_score_stats(captions_in_order(m, path, first.images, paths[0], refs), first.refs));
  }
  return check_choice(systems, metric, splits, seed);
}

std::string choice_check_text(const ChoiceCheck& c, const std::vector<std::string>& names) {
  char buf[512];
  std::string s;
  std::snprintf(buf, sizeof buf, "choosing by %s among %d systems on %d images: %d random halves (seed %llu)\n",
                c.metric.c_str(), c.systems, c.images, c.splits, (unsigned long long)c.seed);
  s += buf;
  std::snprintf(buf, sizeof buf, "  on all the images: the best %.4f (%s), the median %.4f\n", c.on_all[c.best_on_all],
                names[c.best_on_all].c_str(), c.median_on_all);
  s += buf;
  std::snprintf(buf, sizeof buf,
                "  chosen on one half: %.4f there, %.4f on the other half, where the median system scores %.4f\n",
                c.chosen_own_half, c.chosen_other_half, c.median_other_half);
  s += buf;
  std::snprintf(buf, sizeof buf,
                "  the choice's own half overstates it by %+.4f (90%% of splits in [%+.4f, %+.4f]); on the other half "
                "it buys %+.4f over the median\n",
                c.chosen_own_half - c.chosen_other_half, c.overstated_low, c.overstated_high,
                c.chosen_other_half - c.median_other_half);
  s += buf;
  std::vector<int> by_times(c.systems);
  std::iota(by_times.begin(), by_times.end(), 0);
  std::stable_sort(by_times.begin(), by_times.end(),
                   [&](int a, int b) { return c.times_chosen[a] > c.times_chosen[b]; });
  s += "  chosen most often:";
  for (int k = 0; k < std::min(3, c.systems) && c.times_chosen[by_times[k]] > 0; ++k) {
    std::snprintf(buf, sizeof buf, "%s %s (%.0f%%)", k ? "," : "", names[by_times[k]].c_str(),
                  100.0 * c.times_chosen[by_times[k]] / c.splits);
    s += buf;
  }
  return s + "\n";
}

nlohmann::json choice_check_json(const ChoiceCheck& c, const std::vector<std::string>& names) {
  nlohmann::json systems = nlohmann::json::array();
  for (int k = 0; k < c.systems; ++k)
    systems.push_back({{"name", names[k]}, {"on_all", c.on_all[k]}, {"times_chosen", c.times_chosen[k]}});
  return {{"metric", c.metric},
          {"images", c.images},
          {"splits", c.splits},
          {"seed", c.seed},
          {"best_on_all", names[c.best_on_all]},
          {"median_on_all", c.median_on_all},
          {"chosen_own_half", c.chosen_own_half},
          {"chosen_other_half", c.chosen_other_half},
          {"median_other_half", c.median_other_half},
          {"overstated", {{"mean", c.chosen_own_half - c.chosen_other_half},
                          {"low", c.overstated_low},
                          {"high", c.overstated_high}}},
          {"systems", systems}};
}

}  // namespace sat
