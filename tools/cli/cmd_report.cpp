// sat report: one self-contained HTML page with a model's captions of a data set, their scores and attention maps.
#include <cstdio>
#include <memory>

#include "datasets/io.hpp"
#include "tools/cli/commands.hpp"
#include "train/progress.hpp"
#include "train/report.hpp"
#include "train/trainer.hpp"

namespace sat {

void add_report_command(CLI::App& app) {
  struct ReportArgs {
    std::string model = default_model_path(), data, images, split, features, out;
    SearchFlags search;
    int limit = 0, thumbnail = 224;
    bool quiet = false;
  };
  auto a = std::make_shared<ReportArgs>();
  auto* rep = app.add_subcommand(
      "report",
      "Write one self-contained HTML page: corpus scores, and per photo its caption, references, scores and "
      "word-by-word attention maps (sortable, filterable; no network needed)");
  CLI::Option* model_option = add_model_option(rep, a->model);
  rep->add_option("--data", a->data, "Data to caption: a data dir, COCO captions JSON or captions.csv")->required();
  rep->add_option("--images", a->images, "Image folder when --data is a JSON/CSV file");
  rep->add_option("--split", a->split, "Only these image file names (one per line)");
  rep->add_option("--features", a->features,
                  "Caption from this feature cache (sat extract); the photos are still read "
                  "for their thumbnails");
  rep->add_option("--limit", a->limit, "Only the first N photos (0: all)")->check(CLI::NonNegativeNumber);
  a->search.add_to(rep);
  rep->add_option("--thumbnail", a->thumbnail, "Long side of the embedded photos in pixels")
      ->capture_default_str()
      ->check(CLI::Range(32, 1024));
  rep->add_option("--out", a->out, "HTML file to write (replaced atomically)")->required();
  rep->add_flag("--quiet", a->quiet, "No progress line (it is shown only on a terminal)");
  rep->callback([a, model_option] {
    auto model = CaptionModel::load(a->model);
    const SearchSettings search = a->search.resolve(*model, a->model);
    CaptionSet set = load_caption_set(a->data, a->images, a->split);
    if (a->limit > 0 && (int)set.images.size() > a->limit) {
      std::vector<std::string> names;
      for (int i = 0; i < a->limit; ++i) names.push_back(set.images[i].file_name);
      set = set.subset(names, "--limit");
    }
    std::unique_ptr<FeatureCache> cache;
    if (!a->features.empty()) cache = std::make_unique<FeatureCache>(a->features);

    std::unique_ptr<Progress> bar;
    if (!a->quiet && Progress::is_terminal() && set.images.size() > 16)
      bar = std::make_unique<Progress>("report", (int64_t)set.images.size());
    ReportOptions opt;
    opt.search = search;
    opt.thumbnail_side = a->thumbnail;
    // Like sat caption: an unreadable photo is named and left out (a set of one photo fails with its error alone).
    const bool single = set.images.size() == 1;
    opt.on_skip = [&](const SkippedPhoto& s) {
      if (!single) std::fprintf(stderr, "%ssat: %s\n", bar ? "\r\033[K" : "", s.message.c_str());
    };
    opt.on_progress = [&](int done, int total) {
      if (bar) bar->update(done, "");
    };
    Report report = build_report(*model, set, cache.get(), opt);
    if (bar) bar->finish(std::to_string(report.photos.size()) + " photos");

    // The model as the user named it; the default by its file name alone (its folder is the build's or install's)
    const std::string model_name =
        model_option->count() > 0 ? a->model : a->model.substr(a->model.find_last_of('/') + 1);
    report.title = model_name;
    std::string data = a->data + (a->split.empty() ? "" : " (split " + a->split + ")");
    if (a->limit > 0) data += ", first " + std::to_string(a->limit) + " photos";
    std::string photos = std::to_string(report.photos.size()) + " in the report";
    if (!report.skipped.empty()) photos += ", " + std::to_string(report.skipped.size()) + " unreadable left out";
    report.settings.insert(report.settings.begin(), {{"model", model_name}, {"data", data}, {"photos", photos}});
    if (model->info.contains("command") && model->info["command"].is_string())
      report.settings.push_back({"trained by", model->info["command"].get<std::string>()});
    report.settings.push_back({"report by", command_line()});

    const std::string html = report_html(report);
    write_file_atomic(a->out, html);
    std::printf("%s: %zu photos, CIDEr-D %.4f, %.1f KB\n", a->out.c_str(), report.photos.size(), report.scores.cider_d,
                html.size() / 1024.0);
    if (!report.skipped.empty())  // the page is written, but the exit status says some photos are missing from it
      throw Error("report: " + std::to_string(report.photos.size()) + " photos in " + a->out + ", " +
                  std::to_string(report.skipped.size()) + " unreadable left out (named above)");
  });
}

}  // namespace sat
