#include <cstdio>
#include <nlohmann/json.hpp>

#include "tools/commands.hpp"
#include "train/grounding.hpp"
#include "train/metrics.hpp"
#include "train/trainer.hpp"

namespace sat {

void add_eval_commands(CLI::App& app) {
  struct GroundArgs {
    std::string model = default_model_path(), data, images, split;
    bool json = false;
  };
  auto g = std::make_shared<GroundArgs>();
  auto* gr = app.add_subcommand("eval-grounding",
                                "Grounding accuracy on a synthetic set: how often the attention argmax falls on the object a word names");
  gr->add_option("--model", g->model, "Model file")->capture_default_str();
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
    for (auto& [w, c] : r.by_word) std::printf("  %-10s %.4f  (%lld)\n", w.c_str(), (double)c.first / c.second, (long long)c.second);
  });

  struct EvalArgs {
    std::string model = default_model_path(), data, images, split, results_out;
    int beam = 3;
    bool json = false;
  };
  auto e = std::make_shared<EvalArgs>();
  auto* ev = app.add_subcommand("eval", "Caption a data set with a model and score it (coco-caption BLEU)");
  ev->add_option("--model", e->model, "Model file")->capture_default_str();
  ev->add_option("--data", e->data, "Data directory or COCO captions JSON")->required();
  ev->add_option("--images", e->images, "Image folder when --data is a JSON file");
  ev->add_option("--split", e->split, "Only these image file names (one per line)");
  ev->add_option("--beam", e->beam, "Beam size (1 = greedy)")->capture_default_str();
  ev->add_option("--results-out", e->results_out, "Also write a COCO results file [{image_id, caption}]");
  ev->add_flag("--json", e->json, "Print JSON");
  ev->callback([e] {
    auto model = CaptionModel::load(e->model);
    CaptionSet set = load_caption_set(e->data, e->images, e->split);
    std::vector<Tokens> hyps;
    std::vector<std::vector<Tokens>> refs;
    nlohmann::json results = nlohmann::json::array();
    const size_t chunk = 64;
    for (size_t s = 0; s < set.images.size(); s += chunk) {
      std::vector<std::string> paths;
      for (size_t i = s; i < std::min(set.images.size(), s + chunk); ++i) paths.push_back(set.image_path(set.images[i]));
      auto planes = model->load_planes(paths);
      auto caps = caption_planes(*model, planes, (int)paths.size(), e->beam);
      for (size_t k = 0; k < caps.size(); ++k) {
        const ImageEntry& img = set.images[s + k];
        hyps.push_back(caps[k]);
        std::vector<Tokens> r;
        for (int ci : img.caption_indices) r.push_back(set.captions[ci].tokens);
        refs.push_back(r);
        results.push_back({{"image_id", img.id}, {"caption", join_words(caps[k])}});
      }
    }
    if (!e->results_out.empty()) write_file_atomic(e->results_out, results.dump(1) + "\n");
    BleuResult b = corpus_bleu(hyps, refs);
    if (e->json) {
      std::printf("%s\n", nlohmann::json{{"Bleu_1", b.bleu[0]}, {"Bleu_2", b.bleu[1]}, {"Bleu_3", b.bleu[2]},
                                         {"Bleu_4", b.bleu[3]}, {"images", hyps.size()}}.dump(2).c_str());
    } else {
      std::printf("%zu images, beam %d\n", hyps.size(), e->beam);
      for (int k = 0; k < 4; ++k) std::printf("Bleu_%d  %.4f\n", k + 1, b.bleu[k]);
    }
  });
}

}  // namespace sat
