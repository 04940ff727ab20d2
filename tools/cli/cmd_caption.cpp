#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <dirent.h>
#include <nlohmann/json.hpp>

#include "datasets/io.hpp"
#include "tools/cli/commands.hpp"
#include "train/captioning.hpp"
#include "train/model.hpp"
#include "train/progress.hpp"
#include "vision/image.hpp"
#include "vision/overlay.hpp"

namespace sat {

namespace {

// Directories expand to the image files they hold (sorted).
std::vector<std::string> expand_inputs(const std::vector<std::string>& inputs) {
  std::vector<std::string> out;
  for (auto& in : inputs) {
    if (!is_directory(in)) {
      out.push_back(in);
      continue;
    }
    std::vector<std::string> names;
    if (DIR* d = opendir(in.c_str())) {
      while (dirent* e = readdir(d)) {
        std::string n = e->d_name, lower = n;
        std::transform(lower.begin(), lower.end(), lower.begin(), ::tolower);
        for (const char* ext : {".jpg", ".jpeg", ".png", ".bmp", ".webp"})
          if (lower.size() > strlen(ext) && lower.compare(lower.size() - strlen(ext), strlen(ext), ext) == 0)
            names.push_back(n);
      }
      closedir(d);
    }
    std::sort(names.begin(), names.end());
    if (names.empty()) fail(in, "directory holds no images (.jpg, .png, .bmp, .webp)");
    for (auto& n : names) out.push_back(join_path(in, n));
  }
  return out;
}

// The first `shown` candidates (and the kept one, wherever it ranks), one per line under the image's caption.
// `weighed`: what the search weighed (the detector's evidence and the captions' relevance each get a column when it
// weighed them).
void print_candidates(const CaptionModel& model, const CandidateList& list, int shown,
                      const ConsensusSettings& weighed) {
  const bool evidence = list.reranked && weighed.object_evidence > 0;
  const bool relevance = list.reranked && weighed.relevance_weight > 0;
  std::string header = "  #  log p    score";
  if (list.reranked) header += std::string("   agree") + (evidence ? " objects" : "") + (relevance ? "  relev" : "") +
                               "   total";
  std::printf("%s  caption\n", header.c_str());
  for (int k : list.shown(shown)) {
    const auto& c = list.candidates[k];
    const std::string words = join_words(model.vocab.decode(c.hypothesis.tokens));
    const char mark = k == list.chosen ? '*' : ' ';
    char columns[32] = "";
    if (evidence) std::snprintf(columns, sizeof columns, " %7.3f", c.evidence);
    if (relevance)
      std::snprintf(columns + std::strlen(columns), sizeof columns - std::strlen(columns), " %6.3f", c.relevance);
    if (list.reranked)
      std::printf("%c%2d %7.3f %7.3f %7.3f%s %7.3f  %s%s\n", mark, k + 1, c.hypothesis.logprob, c.hypothesis.score,
                  c.agreement, columns, c.total, words.c_str(),
                  c.memory_photo >= 0 ? ("  [memory photo " + std::to_string(c.memory_photo) + "]").c_str() : "");
    else
      std::printf("%c%2d %7.3f %7.3f  %s\n", mark, k + 1, c.hypothesis.logprob, c.hypothesis.score, words.c_str());
  }
}

// Found objects as "person 0.479, dog 0.366" ("none" when nothing peaked above the threshold).
std::string objects_text(const std::vector<DetectedObject>& found) {
  std::string out;
  for (const DetectedObject& d : found) {
    char score[16];
    std::snprintf(score, sizeof score, "%.3f", d.score);
    out += (out.empty() ? "" : ", ") + coco_class_names()[d.cls] + " " + score;
  }
  return out.empty() ? "none" : out;
}

nlohmann::json candidates_json(const CaptionModel& model, const CandidateList& list, int shown,
                               const ConsensusSettings& weighed) {
  nlohmann::json out = nlohmann::json::array();
  for (int k : list.shown(shown)) {
    const auto& c = list.candidates[k];
    nlohmann::json one = {{"rank", k + 1},
                          {"caption", join_words(model.vocab.decode(c.hypothesis.tokens))},
                          {"logprob", c.hypothesis.logprob},
                          {"score", c.hypothesis.score},
                          {"chosen", k == list.chosen}};
    if (list.reranked) one["agreement"] = c.agreement, one["total"] = c.total;
    if (list.reranked && weighed.object_evidence > 0) one["object_evidence"] = c.evidence;
    if (list.reranked && weighed.relevance_weight > 0) one["relevance"] = c.relevance;
    if (c.memory_photo >= 0) one["memory_photo"] = c.memory_photo;
    out.push_back(one);
  }
  return out;
}

}  // namespace

// A flag that sets one of the search options (unset: the model's).
template <typename T>
CLI::Option* add_search_option(CLI::App* command, const std::string& name, std::optional<T>& to,
                               const std::string& help) {
  return command->add_option_function<T>(
      name, [&to](const T& value) { to = value; }, help);
}

void SearchFlags::add_to(CLI::App* command) {
  add_search_option(command, "--beam", options.beam, "Beam size (1 = greedy; default: the model's, chosen on dev data)")
      ->check(CLI::Range(1, kMaxBeam));
  add_search_option(command, "--length-norm", options.length_norm,
                    "Beam search: captions compete by log p / words^A (default: the model's, see sat model info)");
  add_search_option(command, "--no-repeat", options.no_repeat_ngram,
                    "Captions never repeat an N-word phrase (0: off; default: the model's)")
      ->check(CLI::Range(0, kMaxNoRepeat));
  add_search_option(command, "--consensus-weight", options.consensus_weight,
                    "Beam search: keep the candidate with the best score + W x CIDEr-D against the captions of the "
                    "nearest training photos (the model's caption memory; 0: off; default: the model's)")
      ->check(CLI::Range(0.0, kMaxConsensusWeight));
  add_search_option(command, "--neighbours", options.neighbours,
                    "Consensus reranking: how many nearest training photos' captions a candidate is compared with "
                    "(default: the model's)")
      ->check(CLI::PositiveNumber);
  add_search_option(command, "--memory-candidates", options.memory_candidates,
                    "Consensus reranking: the captions of the M nearest training photos join the beam's candidates, "
                    "scored by the decoder (0: the beam's alone; default: the model's)")
      ->check(CLI::Range(0, kMaxMemoryCandidates));
  add_search_option(command, "--object-evidence", options.object_evidence,
                    "Beam search, a model that reads the object detector: each candidate's total also gains V x "
                    "(sum over the objects it names of the detector's peak for them minus the threshold) (0: off; "
                    "default: the model's)")
      ->check(CLI::Range(0.0, kMaxObjectEvidence));
  add_search_option(command, "--evidence-threshold", options.evidence_threshold,
                    "The detector's evidence: the peak above which naming an object gains, below which it costs "
                    "(default: the model's)")
      ->check(CLI::Range(0.0, 1.0));
  add_search_option(command, "--neighbour-evidence", options.neighbour_evidence,
                    "The detector's evidence, a model with a caption memory: each object's evidence is (1 - M) x the "
                    "detector's peak + M x the share of the nearest memory photos' captions that name it (0: the "
                    "peak alone; default: the model's)")
      ->check(CLI::Range(0.0, 1.0));
  add_search_option(command, "--beam-evidence", options.beam_evidence,
                    "Beam search, a model that reads the object detector: the same evidence steers the beam, each "
                    "row's rank gaining B x (the object's evidence minus the threshold) the first time it names the "
                    "object (0: off; default: the model's)")
      ->check(CLI::Range(0.0, kMaxObjectEvidence));
  add_search_option(command, "--relevance-weight", options.relevance_weight,
                    "Beam search: each candidate's total also gains R x the cosine of its words with the image in the "
                    "caption memory's CCA space (needs a memory built with --cca; 0: off; default: the model's)")
      ->check(CLI::Range(0.0, kMaxRelevanceWeight));
  add_search_option(command, "--beam-groups", options.beam_groups,
                    "Diverse beam search: the beam split into G groups that the diversity penalty keeps apart (G "
                    "divides the beam; 1: plain beam search; default: the model's)")
      ->check(CLI::Range(1, kMaxBeam));
  add_search_option(command, "--diversity", options.diversity,
                    "Diverse beam search: how much a word taken at this step by an earlier group costs a later one "
                    "(log p units; default: the model's)")
      ->check(CLI::Range(0.0, kMaxDiversityPenalty));
  command->add_option("--include", options.include,
                      "A word every caption must say: the best caption with it (constrained beam search, chosen as "
                      "the model chooses; sat attend then shows where the model looks as it says it)");
}

SearchSettings SearchFlags::resolve(const CaptionModel& model, const std::string& model_path) const {
  return resolve_search(model, options, model_path, OptionSpelling::command_line);
}

void add_caption_commands(CLI::App& app) {
  struct CaptionArgs {
    std::vector<std::string> images;
    std::string model = default_model_path();
    SearchFlags search;
    int batch = 16, candidates = 0;
    bool json = false, timing = false, quiet = false, objects = false, allow_damaged = false;
    float object_threshold = 0.3f;
  };
  auto a = std::make_shared<CaptionArgs>();
  auto* cap = app.add_subcommand("caption", "Caption images (files or directories of images)");
  cap->add_option("images", a->images, "Image files or directories")->required();
  add_model_option(cap, a->model);
  a->search.add_to(cap);
  cap->add_option("--batch", a->batch, "Images encoded together")->check(CLI::Range(1, 256))->capture_default_str();
  cap->add_option("--candidates", a->candidates,
                  "Also show the N best captions the search considered, with their scores (and, when a caption "
                  "memory reranks them, each one's agreement with the nearest training photos' captions); the kept "
                  "one is marked *")
      ->check(CLI::Range(1, kMaxBeam));
  cap->add_flag("--json", a->json, "Print JSON: [{\"file\", \"caption\"}] (with --candidates, each image's list too)");
  cap->add_flag("--objects", a->objects,
                "Also name the COCO objects the detector finds (sat detect), with their peak scores: a line after "
                "the caption, or \"objects\" in --json");
  cap->add_option("--object-threshold", a->object_threshold, "With --objects: the lowest peak shown")
      ->check(CLI::Range(0.0, 1.0))
      ->capture_default_str();
  cap->add_flag("--timing", a->timing, "Print where the time went to stderr (load, decode images, encode, search)");
  cap->add_flag("--quiet", a->quiet, "No progress line (it is shown only on a terminal, for more than one batch)");
  add_allow_damaged_flag(cap, a->allow_damaged);
  cap->callback([a] {
    using clock = std::chrono::steady_clock;
    auto seconds = [](clock::time_point from) { return std::chrono::duration<double>(clock::now() - from).count(); };
    const auto start = clock::now();
    auto model = CaptionModel::load(a->model);
    SearchSettings search = a->search.resolve(*model, a->model);
    search.candidates = a->candidates;
    const double t_load = seconds(start);
    double t_images = 0;
    InferenceTiming timing;
    auto files = expand_inputs(a->images);
    nlohmann::json out = nlohmann::json::array();
    // A file that cannot be read is named on stderr and skipped; every readable image is captioned.
    const bool tty = Progress::is_terminal();
    const bool progress = !a->quiet && tty && (int)files.size() > std::max(1, a->batch);
    std::unique_ptr<Progress> bar;
    if (progress) bar = std::make_unique<Progress>("caption", (int64_t)files.size());
    const int S = model->encoder_config.input_size;
    const size_t plane = (size_t)3 * S * S;
    size_t failed = 0, done = 0;
    for (size_t s = 0; s < files.size(); s += std::max(1, a->batch)) {
      std::vector<std::string> chunk(files.begin() + s,
                                     files.begin() + std::min(files.size(), s + std::max(1, a->batch)));
      auto t0 = clock::now();
      std::vector<std::string> good;
      std::vector<float> planes(chunk.size() * plane);
      // The chunk's files are decoded on both cores (decoding one is serial: the other core would wait), then the
      // readable ones packed in order.
      std::vector<std::string> errors(chunk.size());
#pragma omp parallel for schedule(dynamic) if (chunk.size() > 1)
      for (size_t i = 0; i < chunk.size(); ++i) {
        try {
          model->load_plane(chunk[i], planes.data() + i * plane, DecodeOptions{a->allow_damaged});
        } catch (const DamagedImage& e) {
          errors[i] = std::string(e.what()) + " (--allow-damaged reads it anyway)";
        } catch (const Error& e) {
          errors[i] = e.what();
        } catch (const std::exception& e) {  // nothing may leave the parallel loop
          errors[i] = chunk[i] + ": " + e.what();
        }
      }
      for (size_t i = 0; i < chunk.size(); ++i) {
        if (!errors[i].empty()) {
          if (files.size() == 1) throw Error(errors[i]);  // one image: its error is the one line
          ++failed;
          std::fprintf(stderr, "%ssat: %s\n", bar ? "\r\033[K" : "", errors[i].c_str());
          if (a->json) out.push_back({{"file", chunk[i]}, {"error", errors[i]}});
          continue;
        }
        if (good.size() != i) std::copy_n(planes.data() + i * plane, plane, planes.data() + good.size() * plane);
        good.push_back(chunk[i]);
      }
      t_images += seconds(t0);
      done += chunk.size();
      if (good.empty()) continue;
      const std::vector<CandidateList> lists =
          caption_planes(*model, planes.data(), (int)good.size(), search, (int)good.size(), &timing);
      std::vector<std::vector<DetectedObject>> objects;
      if (a->objects) objects = detect_planes(*model, planes.data(), (int)good.size(), a->object_threshold);
      for (size_t i = 0; i < good.size(); ++i) {
        std::string caption = join_words(model->vocab.decode(lists[i].kept().tokens));
        if (a->json) {
          nlohmann::json one = {{"file", good[i]}, {"caption", caption}};
          if (a->candidates > 0)
            one["candidates"] = candidates_json(*model, lists[i], a->candidates, search.consensus);
          if (a->objects) one["objects"] = objects_to_json(objects[i]);
          out.push_back(one);
          continue;
        }
        if (files.size() == 1)
          std::printf("%s\n", caption.c_str());
        else
          std::printf("%s\t%s\n", good[i].c_str(), caption.c_str());
        if (a->objects) std::printf("  objects: %s\n", objects_text(objects[i]).c_str());
        if (a->candidates > 0)
          print_candidates(*model, lists[i], a->candidates, search.consensus);
      }
      std::fflush(stdout);
      if (bar) {
        char stats[64];
        std::snprintf(stats, sizeof stats, "%.1f images/s", done / std::max(1e-9, seconds(start) - t_load));
        bar->update((int64_t)done, stats);
      }
    }
    if (bar) bar->finish(std::to_string(files.size() - failed) + " captioned, " + std::to_string(failed) + " failed");
    if (a->json) std::printf("%s\n", out.dump(2).c_str());
    if (a->timing) {
      const double total = seconds(start), n = (double)files.size();
      std::fprintf(
          stderr,
          "%zu image(s) in %.3f s: model load %.3f s, image decode %.3f s, encode %.3f s, "
          "beam %d search %.3f s; %.1f ms per image, %.2f images/s after loading\n",
          files.size(), total, t_load, t_images, timing.encode_seconds, search.beam, timing.search_seconds,
          1000 * total / n, n / std::max(1e-9, total - t_load));
    }
    if (failed > 0)  // the summary is the last line, and the exit status says some images were not captioned
      throw Error("caption: " + std::to_string(files.size() - failed) + " captioned, " + std::to_string(failed) +
                  " failed (named above)");
  });

  struct AttendArgs {
    std::string image, out, model = default_model_path();
    SearchFlags search;
    int panel = 224, columns = 5;
    bool objects = false, allow_damaged = false;
    float object_threshold = 0.3f;
  };
  auto b = std::make_shared<AttendArgs>();
  auto* att = app.add_subcommand("attend", "Caption one image and draw where the model looked, word by word");
  att->add_option("image", b->image, "Image file")->required();
  att->add_option("--out", b->out, "Output image (.png or .jpg): one panel per word")->required();
  add_model_option(att, b->model);
  b->search.add_to(att);
  att->add_option("--panel", b->panel, "The longer side of each panel in pixels (the photo keeps its shape)")
      ->check(CLI::Range(kMinOverlayPanel, kMaxOverlayPanel))
      ->capture_default_str();
  att->add_option("--columns", b->columns, "Panels per row")
      ->check(CLI::Range(1, kMaxOverlayColumns))
      ->capture_default_str();
  att->add_flag("--objects", b->objects,
                "Mark on the input panel where each COCO object the detector finds peaks (sat detect), with its "
                "class and score");
  att->add_option("--object-threshold", b->object_threshold, "With --objects: the lowest peak marked")
      ->check(CLI::Range(0.0, 1.0))
      ->capture_default_str();
  add_allow_damaged_flag(att, b->allow_damaged);
  att->callback([b] {
    auto model = CaptionModel::load(b->model);
    const SearchSettings search = b->search.resolve(*model, b->model);
    cv::Mat img = load_image_bgr(b->image, DecodeOptions{b->allow_damaged});
    const EncoderConfig& encoder = model->encoder_config;
    std::vector<float> planes((size_t)3 * encoder.input_size * encoder.input_size);
    image_to_planes(img, encoder.input_size, encoder.mean, encoder.stdev, planes.data());
    const Hypothesis h = caption_planes(*model, planes.data(), 1, search, 1)[0].kept();
    auto words = model->vocab.decode(h.tokens);
    OverlayOptions o;
    o.panel = b->panel;
    o.columns = b->columns;
    const std::vector<DetectedObject> found =
        b->objects ? detect_planes(*model, planes.data(), 1, b->object_threshold)[0] : std::vector<DetectedObject>();
    for (const DetectedObject& d : found) {
      char label[48];
      std::snprintf(label, sizeof label, "%s %.2f", coco_class_names()[d.cls].c_str(), d.score);
      o.marks.push_back({label, d.x, d.y});
    }
    cv::Mat grid = attention_overlay(img, h.alphas, words, model->encoder_config.grid_h(),
                                     model->encoder_config.grid_w(), o, h.locations);
    write_image(b->out, grid);
    std::printf("%s\n", join_words(words).c_str());
    std::fflush(stdout);
    std::fprintf(stderr, "attention overlay (%zu words) written to %s\n", words.size(), b->out.c_str());
  });
}

}  // namespace sat
