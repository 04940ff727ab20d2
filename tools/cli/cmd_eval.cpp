#include <cstdio>
#include <nlohmann/json.hpp>

#include "tools/cli/commands.hpp"
#include "train/choice_check.hpp"
#include "train/grounding.hpp"
#include "train/evaluate.hpp"
#include "train/paired_bootstrap.hpp"
#include "train/trainer.hpp"

namespace sat {

void add_eval_commands(CLI::App& app) {
  struct GroundArgs {
    std::string model = default_model_path(), data, images, split;
    bool json = false;
  };
  auto g = std::make_shared<GroundArgs>();
  auto* gr = app.add_subcommand(
      "eval-grounding",
      "Grounding accuracy on a synthetic set: how often the attention argmax falls on the object a word names");
  add_model_option(gr, g->model);
  gr->add_option("--data", g->data, "Synthetic data directory (from `sat synth`) or its captions JSON")->required();
  gr->add_option("--images", g->images, "Image folder when --data is a JSON file");
  gr->add_option("--split", g->split, "Only these image file names (one per line)");
  gr->add_flag("--json", g->json, "Print JSON");
  gr->callback([g] {
    auto model = CaptionModel::load(g->model);
    CaptionSet set = load_caption_set(g->data, g->images, g->split);
    GroundingResult r = eval_grounding(*model, set);
    if (g->json) {
      nlohmann::json j = {{"grounding_accuracy", r.accuracy()}, {"words", r.words}, {"hits", r.hits}};
      for (auto& [w, c] : r.by_word) j["by_word"][w] = (double)c.first / c.second;
      std::printf("%s\n", j.dump(2).c_str());
      return;
    }
    std::printf("grounding accuracy %.4f (%lld of %lld object words)\n", r.accuracy(), (long long)r.hits,
                (long long)r.words);
    for (auto& [w, c] : r.by_word)
      std::printf("  %-10s %.4f  (%lld)\n", w.c_str(), (double)c.first / c.second, (long long)c.second);
  });

  struct EvalArgs {
    std::string model = default_model_path(), data, images, split, results_out, results, refs, features, baseline;
    std::vector<std::string> choose_among;
    std::string choose_by = "Bleu_4";
    int resamples = 2000, splits = 200;
    uint64_t seed = 1;
    SearchFlags search;
    bool json = false, record = false, intervals = false;
  };
  auto e = std::make_shared<EvalArgs>();
  auto* ev = app.add_subcommand(
      "eval",
      "Score captions with coco-caption metrics: a results file against references (--results, --refs), or a "
      "model on a data set (--model, --data)");
  ev->add_option("--results", e->results, "COCO results file [{\"image_id\", \"caption\"}] to score");
  ev->add_option("--refs", e->refs,
                 "References for --results: COCO captions JSON, Flickr8k captions.csv or a data dir");
  add_model_option(ev, e->model, "Model file (when captioning --data)");
  ev->add_option("--data", e->data, "Data to caption and score: a data dir, COCO captions JSON or captions.csv");
  ev->add_option("--images", e->images, "Image folder when --data is a JSON/CSV file");
  ev->add_option("--split", e->split, "Only these image file names (one per line)");
  ev->add_option("--features", e->features,
                 "Read the images' features from this cache (sat extract) instead of encoding them");
  e->search.add_to(ev);
  ev->add_option("--baseline", e->baseline,
                 "With --results: another results file for the same images; prints the paired bootstrap of the "
                 "results against it (each metric's difference and its 95% interval over image sets drawn again)");
  ev->add_flag("--intervals", e->intervals,
              "Also print each metric's 95% interval over image sets drawn again with replacement (the bootstrap: "
              "how much the score owes to which images were scored)");
  ev->add_option("--resamples", e->resamples, "With --baseline or --intervals: how many image sets are drawn")
      ->check(CLI::Range(1, kMaxBootstrapResamples));
  ev->add_option("--choose-among", e->choose_among,
                 "Results files of the same images (several settings scored on dev, say): how much choosing the best "
                 "of them holds on images the choice was not made on (with --refs: random halves, the choice made on "
                 "one, scored on the other beside the median file)");
  ev->add_option("--by", e->choose_by, "With --choose-among: the metric chosen by (Bleu_4, METEOR, ROUGE_L, CIDEr, "
                 "rarer_named)");
  ev->add_option("--splits", e->splits, "With --choose-among: how many random halves")
      ->check(CLI::Range(1, kMaxChoiceSplits));
  ev->add_option("--seed", e->seed, "With --baseline, --intervals or --choose-among: the draws' seed");
  ev->add_option("--results-out", e->results_out, "Also write the generated captions as a COCO results file");
  ev->add_flag("--json", e->json, "Print JSON");
  ev->add_flag("--record", e->record,
               "Also store the scores and this command in the model file (sat model info "
               "prints them; the file is replaced atomically)");
  ev->callback([e] {
    CaptionScores scores;
    std::vector<MetricInterval> intervals;
    if (!e->choose_among.empty()) {
      if (!e->results.empty() || !e->data.empty())
        throw CLI::ValidationError("--choose-among", "scores results files of its own: give it --refs, not "
                                   "--results or --data");
      if (!e->baseline.empty() || e->intervals || e->record || !e->results_out.empty())
        throw CLI::ValidationError("--choose-among", "checks a choice among results files: --baseline, --intervals, "
                                   "--record and --results-out do not apply");
      if (e->refs.empty()) throw CLI::RequiredError("--refs (with --choose-among)");
      const CaptionSet refs = load_caption_set(e->refs, e->images, e->split);
      const ChoiceCheck c = check_choice_of_files(e->choose_among, refs, e->choose_by, e->splits, e->seed);
      std::printf("%s", e->json ? (choice_check_json(c, e->choose_among).dump(2) + "\n").c_str()
                                : choice_check_text(c, e->choose_among).c_str());
      return;
    }
    if (!e->results.empty()) {
      if (e->record) throw CLI::ValidationError("--record", "stores a model's scores: use it with --model and --data");
      if (e->refs.empty()) throw CLI::RequiredError("--refs (with --results)");
      CaptionSet refs = load_caption_set(e->refs, e->images, e->split);
      if (!e->baseline.empty()) {
        const Comparison c = compare_results_files(e->results, e->baseline, refs, e->resamples, e->seed);
        std::printf("%s", e->json ? (comparison_json(c).dump(2) + "\n").c_str() : comparison_table(c).c_str());
        return;
      }
      const std::vector<ResultEntry> entries = load_results(e->results);
      scores = score_results(entries, refs, e->results);
      if (e->intervals) intervals = result_intervals(entries, refs, e->results, e->resamples, e->seed);
    } else {
      if (!e->baseline.empty()) throw CLI::ValidationError("--baseline", "compares two results files: use it with --results");
      if (e->data.empty()) throw CLI::RequiredError("--data (or --results with --refs)");
      auto model = CaptionModel::load(e->model);
      const SearchSettings search = e->search.resolve(*model, e->model);
      CaptionSet set = load_caption_set(e->data, e->images, e->split);
      nlohmann::json results;
      if (!e->features.empty()) {
        FeatureCache cache(e->features);
        std::vector<std::string> names;
        for (auto& img : set.images) names.push_back(img.file_name);
        cache.require(model->encoder_id(), names);
        scores = validate_features(*model, set, cache, search, &results);
      } else {
        scores = caption_and_score(*model, set, search, &results);
      }
      if (!e->results_out.empty()) write_file_atomic(e->results_out, results.dump(1) + "\n");
      if (e->intervals) {
        std::vector<ResultEntry> entries;
        for (const auto& r : results) entries.push_back({r.at("image_id"), r.at("caption").get<std::string>()});
        intervals = result_intervals(entries, set, "the captions", e->resamples, e->seed);
      }
      if (e->record) {  // a fresh copy: the flags above only set this run's search
        auto stored = CaptionModel::load(e->model);
        stored->info["scores"] = scores.to_json();
        stored->info["scores_command"] = command_line();
        stored->save(e->model);
      }
    }
    if (e->json) {
      nlohmann::json j = scores.to_json();
      if (e->intervals) j["intervals"] = intervals_json(intervals, e->resamples, e->seed);
      std::printf("%s\n", j.dump(2).c_str());
    } else {
      std::printf("%s", scores.table().c_str());
      if (e->intervals) std::printf("%s", intervals_text(intervals, e->resamples, e->seed).c_str());
    }
  });
}

}  // namespace sat
