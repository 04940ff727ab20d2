// sat model, and its subcommands on one model file: info / compact / rebase / set / memory / calibrate. What a model
// file holds, a smaller copy of it for shipping, a copy whose recorded paths read from here, its search settings, a
// caption memory for consensus reranking, and int8 ranges for its encoder. The subcommands over several files
// (average, ensemble, member, diff) are in tools/cli/cmd_model_several.cpp.
#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <map>
#include <sys/stat.h>

#include "datasets/io.hpp"
#include "tools/cli/cmd_model.hpp"
#include "tools/cli/commands.hpp"
#include "train/captioning.hpp"
#include "train/model.hpp"
#include "train/recorded_paths.hpp"
#include "train/trainer.hpp"

namespace sat {

namespace {

long long file_bytes(const std::string& path) {
  struct stat st;
  return stat(path.c_str(), &st) == 0 ? (long long)st.st_size : -1;
}

// ", objects weighted W" when a memory's keys weight the object channels, else nothing
std::string object_weight_text(double weight) {
  if (weight == 1) return "";
  char text[64];
  std::snprintf(text, sizeof text, ", objects weighted %g", weight);
  return text;
}

// ", keys projected by CCA to N directions (power P)" when a memory projects its keys, else nothing
std::string projection_text(const CaptionMemory& memory) {
  if (!memory.projected()) return "";
  char text[96];
  std::snprintf(text, sizeof text, ", keys projected by CCA onto %d directions (power %g)",
                (int)memory.projection.map.cols(), memory.projection_options.power);
  return text;
}

// How much of each object's evidence comes from the nearest memory photos' captions.
std::string neighbour_evidence_text(double share) {
  char text[96];
  std::snprintf(text, sizeof text, "%g of it from the nearest memory photos' captions", share);
  return text;
}

// How much the objects' evidence steers the beam.
std::string beam_evidence_text(double weight) {
  char text[96];
  std::snprintf(text, sizeof text, "it steers the beam with weight %g", weight);
  return text;
}

// "; the detector's evidence ..." when the model weighs it in reranking or in the beam, else nothing
std::string evidence_text(const CaptionModel& m) {
  const ConsensusSettings& c = m.consensus;
  if (c.object_evidence <= 0 && c.beam_evidence <= 0) return "";
  char text[96];
  if (c.object_evidence > 0)
    std::snprintf(text, sizeof text, "; the detector's evidence weighed %g (threshold %g)", c.object_evidence,
                  c.evidence_threshold);
  else
    std::snprintf(text, sizeof text, "; the detector's evidence steering the beam %g (threshold %g)", c.beam_evidence,
                  c.evidence_threshold);
  std::string out = text;
  if (c.object_evidence > 0 && c.beam_evidence > 0) out += "; " + beam_evidence_text(c.beam_evidence);
  if (m.memory && c.neighbour_evidence > 0) out += "; " + neighbour_evidence_text(c.neighbour_evidence);
  return out;
}

// "; the captions' relevance weighed ..." when the model weighs it in reranking, else nothing
std::string relevance_text(const CaptionModel& m) {
  if (m.consensus.relevance_weight <= 0) return "";
  char text[96];
  std::snprintf(text, sizeof text, "; the captions' relevance weighed %g", m.consensus.relevance_weight);
  return text;
}

// "; consensus reranking ..." when the model has a caption memory, else nothing
std::string consensus_text(const CaptionModel& m) {
  if (!m.memory) return evidence_text(m);
  char text[240];
  std::snprintf(
      text, sizeof text, "; consensus reranking %s (weight %g, %d nearest of %d memory photos, %s-pooled%s%s%s)",
      m.consensus.weight > 0 ? "on" : "off", m.consensus.weight, m.consensus.neighbours, m.memory->photos(),
      key_pooling_name(m.memory->pooling), object_weight_text(m.memory->object_weight).c_str(),
      projection_text(*m.memory).c_str(),
      m.consensus.memory_candidates > 0
          ? (", the " + std::to_string(m.consensus.memory_candidates) + " nearest's captions as candidates").c_str()
          : "");
  return text + evidence_text(m) + relevance_text(m);
}

// "; no N-word phrase repeated" when the search blocks repeats, else nothing
std::string no_repeat_text(int n) {
  return n > 0 ? "; no " + std::to_string(n) + "-word phrase repeated" : "";
}

// "; in G diverse groups (penalty P)" for a diverse beam search, else nothing
std::string diversity_text(int groups, double penalty) {
  if (groups <= 1) return "";
  char text[96];
  std::snprintf(text, sizeof text, "; in %d diverse groups (penalty %g)", groups, penalty);
  return text;
}

// A memory's key projection for model info's JSON (null: keys as pooled).
nlohmann::json key_projection_json(const CaptionMemory& memory) {
  if (!memory.projected()) return nullptr;
  return {{"kind", "cca"},
          {"dims", memory.projection.map.cols()},
          {"power", memory.projection_options.power},
          {"regularization", memory.projection_options.regularization},
          {"words", memory.projection.words},
          {"word_side", memory.projection.has_word_side()}};
}

nlohmann::json model_summary(const std::string& path) {
  auto m = CaptionModel::load(path);
  const EncoderConfig& e = m->encoder_config;
  const DecoderConfig& d = m->decoder_config;
  nlohmann::json enc = {{"kind", e.kind},
                        {"input_size", e.input_size},
                        {"grid", {e.grid_h(), e.grid_w()}},
                        {"feature_dim", e.feature_dim()}};
  if (e.pretrained()) {
    enc["cut"] = e.cut;
    enc["precision"] = precision_name(m->encoder_precision);  // stored: f32, bf16, int8 or auto
    enc["precision_in_use"] = precision_name(m->encoder_precision_in_use());
    if (!m->encoder_int8_ranges.empty()) enc["int8_ranges"] = m->encoder_int8_ranges.size();
  }
  if (!e.weights_file.empty())
    enc["weights"] = {{"file", e.weights_file}, {"sha256", e.weights_sha256}, {"found", m->encoder_weights_path}};
  if (e.object_channels > 0 && m->detector)
    enc["objects"] = {{"channels", e.object_channels},
                      {"scale", e.object_scale},
                      {"form", e.object_form},
                      {"detector", m->detector->path()}};
  if (e.object_channels > 0 && m->detector && m->object_standardization.on()) {  // the channels it moves or rescales
    const auto& st = m->object_standardization;
    int from = 0;
    while (from < (int)st.gain.size() && st.center[from] == 0.f && st.gain[from] == 1.f) ++from;
    enc["objects"]["standardized_from"] = from;
  }
  if (m->tuned) {
    int64_t tuned_params = 0;
    for (auto& p : m->tuned->params()) tuned_params += p.size();
    enc["tune_from"] = e.tune_from;
    enc["tuned_parameters"] = tuned_params;
  }
  int64_t decoder_params = 0;  // every member's, for an ensemble
  for (auto* dec : m->member_decoders())
    for (auto* p : dec->params()) decoder_params += p->size();
  return {{"file", path},
          {"bytes", file_bytes(path)},
          {"encoder", enc},
          {"decoder", d.to_json()},
          {"decoder_parameters", decoder_params},
          {"decoders", m->members()},
          {"decoder_storage", m->half_precision ? "float16" : "float32"},
          {"decoder_precision", product_precision_name(m->decoder_precision)},
          {"decoder_precision_in_use", product_precision_name(m->decoder->precision())},
          {"vocabulary", m->vocab.size()},
          {"max_len", m->max_len},
          {"length_norm", m->length_norm},
          {"beam", m->beam},
          {"no_repeat_ngram", m->no_repeat_ngram},
          {"beam_groups", m->beam_diversity.groups},
          {"diversity", m->beam_diversity.penalty},
          {"object_evidence", m->consensus.object_evidence > 0 || m->consensus.beam_evidence > 0
                                  ? nlohmann::json{{"weight", m->consensus.object_evidence},
                                                   {"threshold", m->consensus.evidence_threshold},
                                                   {"beam", m->consensus.beam_evidence}}
                                  : nlohmann::json(nullptr)},
          {"caption_memory", m->memory ? nlohmann::json{{"photos", m->memory->photos()},
                                                        {"neighbours", m->consensus.neighbours},
                                                        {"consensus_weight", m->consensus.weight},
                                                        {"relevance_weight", m->consensus.relevance_weight},
                                                        {"neighbour_evidence", m->consensus.neighbour_evidence},
                                                        {"memory_candidates", m->consensus.memory_candidates},
                                                        {"key_pooling", key_pooling_name(m->memory->pooling)},
                                                        {"key_object_weight", m->memory->object_weight},
                                                        {"key_projection", key_projection_json(*m->memory)}}
                                       : nlohmann::json(nullptr)},
          {"neighbour_words", m->neighbour_words.on() ? m->neighbour_words.to_json() : nlohmann::json(nullptr)},
          {"info", m->info}};
}

// What `sat model info` prints from model_summary's object: the encoder, decoder, vocabulary, search and caption
// memory.
void print_model_summary(const std::string& path, const nlohmann::json& s) {
  const auto& e = s["encoder"];
  const auto& d = s["decoder"];
  std::printf("%s: %.1f MB\n", path.c_str(), s["bytes"].get<long long>() / 1e6);
  std::printf("encoder: %s%s, %dx%d input -> %dx%d grid of %d features\n", e["kind"].get<std::string>().c_str(),
              e.contains("cut") ? (" cut at " + e["cut"].get<std::string>()).c_str() : "", e["input_size"].get<int>(),
              e["input_size"].get<int>(), e["grid"][0].get<int>(), e["grid"][1].get<int>(),
              e["feature_dim"].get<int>());
  if (e.contains("weights"))
    std::printf("encoder weights: %s (sha256 %s), not stored in the model: found at %s\n",
                e["weights"]["file"].get<std::string>().c_str(), e["weights"]["sha256"].get<std::string>().c_str(),
                e["weights"]["found"].get<std::string>().c_str());
  if (e.contains("precision"))
    std::printf("encoder arithmetic: %s (the model's choice: %s; --encoder-precision overrides it)\n",
                e["precision_in_use"].get<std::string>().c_str(), e["precision"].get<std::string>().c_str());
  if (e.contains("objects")) {
    const std::string form = e["objects"].value("form", std::string("maps"));
    const char* what =
        form == "tags"         ? "each class's peak over the photo, at every location"
        : form == "both"       ? "its class heat max-pooled onto the grid, then each class's peak over the photo"
        : form == "tags+trunk" ? "each class's peak over the photo, then its trunk's output averaged over the photo, "
                                 "at every location"
                               : "its class heat max-pooled onto the grid";
    std::printf("objects (%s): the last %d features come from the COCO detector: %s, x %g (%s, sha256-checked, not stored "
                "in the model)\n",
                form.c_str(), e["objects"]["channels"].get<int>(), what, e["objects"]["scale"].get<double>(),
                e["objects"]["detector"].get<std::string>().c_str());
    if (e["objects"].contains("standardized_from"))
      std::printf("objects standardized: the object channels from %d on, by their training photos' mean and spread "
                  "(stored in the model)\n",
                  e["objects"]["standardized_from"].get<int>());
  }
  if (e.contains("int8_ranges"))
    std::printf("int8 ready: the ranges of %d activations calibrated on photos (sat model calibrate)\n",
                e["int8_ranges"].get<int>());
  if (e.contains("tune_from"))
    std::printf("encoder fine-tuned after %s: %lld parameters trained with the decoder (feature caches hold %s)\n",
                e["tune_from"].get<std::string>().c_str(), e["tuned_parameters"].get<long long>(),
                e["tune_from"].get<std::string>().c_str());
  std::printf(
      "decoder: %s attention (%s score, %s order), embedding %d, hidden %d, attention %d; %lld parameters "
      "stored as %s\n",
      d.value("attention", "soft").c_str(), d.value("score", "additive").c_str(), d.value("order", "bahdanau").c_str(),
      d.value("embed_dim", 0), d.value("hidden_dim", 0), d.value("attn_dim", 0),
      s["decoder_parameters"].get<long long>(), s["decoder_storage"].get<std::string>().c_str());
  std::printf("decoder products: %s (the model's choice: %s; bf16 where it is the faster arithmetic)\n",
              s["decoder_precision_in_use"].get<std::string>().c_str(), s["decoder_precision"].get<std::string>().c_str());
  if (s["decoders"].get<int>() > 1)
    std::printf(
        "ensemble of %d decoders over that encoder (word distributions averaged; the parameters above "
        "count all of them)\n",
        s["decoders"].get<int>());
  std::printf("vocabulary: %d words; captions up to %d words; beam search of width %d ranks by log p / words^%g%s%s\n",
              s["vocabulary"].get<int>(), s["max_len"].get<int>(), s["beam"].get<int>(), s["length_norm"].get<double>(),
              no_repeat_text(s["no_repeat_ngram"].get<int>()).c_str(),
              diversity_text(s["beam_groups"].get<int>(), s["diversity"].get<double>()).c_str());
  if (!s["caption_memory"].is_null()) {
    const auto& c = s["caption_memory"];
    const int from_memory = c["memory_candidates"].get<int>();
    std::printf(
        "consensus reranking %s: weight %g, the captions of the %d nearest of %d memory photos (grids "
        "%s-pooled%s%s)%s\n",
        c["consensus_weight"].get<double>() > 0 ? "on" : "off", c["consensus_weight"].get<double>(),
        c["neighbours"].get<int>(), c["photos"].get<int>(), c["key_pooling"].get<std::string>().c_str(),
        object_weight_text(c["key_object_weight"].get<double>()).c_str(),
        c["key_projection"].is_null()
            ? ""
            : (", keys projected by CCA onto " + std::to_string(c["key_projection"]["dims"].get<int>()) +
               " directions learned from " + std::to_string(c["key_projection"]["words"].get<int>()) + " words")
                  .c_str(),
        from_memory > 0
            ? ("; the " + std::to_string(from_memory) + " nearest photos' captions join the beam's candidates").c_str()
            : "");
    if (c["relevance_weight"].get<double>() > 0)
      std::printf("the captions' relevance weighs in reranking: weight %g (the cosine of a caption's words with the "
                  "photo in the memory's CCA space)\n",
                  c["relevance_weight"].get<double>());
  }
  if (!s["neighbour_words"].is_null()) {
    const auto& nw = s["neighbour_words"];
    const auto words = nw["words"].get<std::vector<std::string>>();
    std::printf(
        "the decoder reads its neighbours' words: the shares of %zu words (from \"%s\" to \"%s\") among the "
        "captions of the %d nearest memory photos, x %g, beside every location\n",
        words.size(), words.front().c_str(), words.back().c_str(), nw["neighbours"].get<int>(),
        nw["scale"].get<double>());
  }
  if (!s["object_evidence"].is_null()) {
    const double weight = s["object_evidence"]["weight"].get<double>();
    const double beam = s["object_evidence"]["beam"].get<double>();
    std::printf("the detector's evidence %s: weight %g, the peak above which naming an object gains %g%s%s\n",
                weight > 0 ? "weighs in reranking" : "steers the beam", weight > 0 ? weight : beam,
                s["object_evidence"]["threshold"].get<double>(),
                weight > 0 && beam > 0 ? ("; " + beam_evidence_text(beam)).c_str() : "",
                !s["caption_memory"].is_null() && s["caption_memory"]["neighbour_evidence"].get<double>() > 0
                    ? ("; " + neighbour_evidence_text(s["caption_memory"]["neighbour_evidence"].get<double>())).c_str()
                    : "");
  }
}

// What `sat model info` prints from a model's info object: how it was made and the scores on record.
void print_provenance(const nlohmann::json& i) {
  for (const char* key :
       {"command", "recipe", "data", "train_split", "val_split", "git_commit", "epoch", "averaged", "ensembled",
        "members", "member_of", "compacted", "search_set", "caption_memory", "rebased", "started_from"}) {
    if (!i.contains(key) || (i[key].is_string() && i[key].get<std::string>().empty())) continue;
    std::printf("%s: %s\n", key, i[key].is_string() ? i[key].get<std::string>().c_str() : i[key].dump().c_str());
  }
  if (i.contains("scores") && i["scores"].is_object()) {
    std::printf("scores:");
    for (auto [key, label] : {std::pair{"Bleu_1", "BLEU-1"},
                              {"Bleu_2", "BLEU-2"},
                              {"Bleu_3", "BLEU-3"},
                              {"Bleu_4", "BLEU-4"},
                              {"METEOR", "METEOR"},
                              {"ROUGE_L", "ROUGE-L"},
                              {"CIDEr", "CIDEr-D"}})
      if (i["scores"].contains(key) && i["scores"][key].is_number())
        std::printf(" %s %.4f", label, i["scores"][key].get<double>());
    if (i["scores"].contains("images")) std::printf(" (%s images)", i["scores"]["images"].dump().c_str());
    std::printf("\n");
    if (i.contains("scores_command"))
      std::printf("scores_command: %s\n", i["scores_command"].get<std::string>().c_str());
  }
  if (i.contains("val_scores") && i["val_scores"].is_object()) {
    std::printf("validation scores (greedy):");
    for (auto [key, label] : {std::pair{"Bleu_1", "BLEU-1"},
                              {"Bleu_4", "BLEU-4"},
                              {"METEOR", "METEOR"},
                              {"ROUGE_L", "ROUGE-L"},
                              {"CIDEr", "CIDEr-D"}})
      if (i["val_scores"].contains(key) && i["val_scores"][key].is_number())
        std::printf(" %s %.3f", label, i["val_scores"][key].get<double>());
    if (i["val_scores"].contains("images")) std::printf(" (%s images)", i["val_scores"]["images"].dump().c_str());
    std::printf("\n");
  }
}

void add_model_info(CLI::App& model) {
  struct InfoArgs {
    std::string in;
    bool json = false;
  };
  auto a = std::make_shared<InfoArgs>();
  auto* info = model.add_subcommand("info",
                                    "Print a model's encoder, decoder, vocabulary and provenance "
                                    "(training command, data, git commit, validation scores)");
  info->add_option("model", a->in, "Model file (default: the bundled model)");
  info->add_flag("--json", a->json, "One JSON object instead of text");
  info->callback([a] {
    std::string path = a->in.empty() ? default_model_path() : a->in;
    nlohmann::json s = model_summary(path);
    if (a->json) {
      std::printf("%s\n", s.dump(1).c_str());
      return;
    }
    print_model_summary(path, s);
    print_provenance(s["info"]);
  });
}

void add_model_compact(CLI::App& model) {
  struct CompactArgs {
    std::string in, out, recipe;
  };
  auto a = std::make_shared<CompactArgs>();
  auto* compact =
      model.add_subcommand("compact",
                           "Write a copy whose decoder weights are stored as float16 (about half the decoder's bytes; "
                           "computation stays float32). The copy records the command that made it");
  compact->add_option("model", a->in, "Model file")->required();
  compact->add_option("--out", a->out, "Compact model file to write")->required();
  compact->add_option("--recipe", a->recipe, "The project command that rebuilds this model (recorded in info.recipe)");
  compact->callback([a] {
    auto m = CaptionModel::load(a->in);
    m->half_precision = true;
    m->info["compacted"] = command_line();
    if (!a->recipe.empty()) m->info["recipe"] = a->recipe;
    m->save(a->out);
    std::printf("%s (%.1f MB) -> %s (%.1f MB): decoder weights as float16\n", a->in.c_str(), file_bytes(a->in) / 1e6,
                a->out.c_str(), file_bytes(a->out) / 1e6);
  });
}

void add_model_rebase(CLI::App& model) {
  struct RebaseArgs {
    std::string in, ran_in, out;
  };
  auto a = std::make_shared<RebaseArgs>();
  auto* rebase = model.add_subcommand(
      "rebase",
      "Write a copy whose recorded paths read from this folder: for a model trained (or averaged, compacted, "
      "joined) in another folder, such as a run started inside runs/x, whose commands name paths from there. "
      "Every relative path on record that names a file or folder under --ran-in is rewritten, and every "
      "absolute path inside this folder becomes relative to it; the copy records the command");
  rebase->add_option("model", a->in, "Model file")->required();
  rebase->add_option("--ran-in", a->ran_in, "The folder the model's recorded commands ran in, from here")->required();
  rebase->add_option("--out", a->out, "Model file to write (may be the input: it is replaced atomically)")->required();
  rebase->callback([a] {
    if (!is_directory(a->ran_in)) fail(a->ran_in, "is not a folder (--ran-in)");
    auto m = CaptionModel::load(a->in);
    std::vector<std::pair<std::string, std::string>> rewrites;
    m->info =
        rebase_recorded_paths(m->info, a->ran_in, file_exists, &rewrites, std::filesystem::current_path().string());
    m->info["rebased"] = command_line();
    m->save(a->out);
    std::printf("%s -> %s: %zu recorded path%s rebased from %s\n", a->in.c_str(), a->out.c_str(), rewrites.size(),
                rewrites.size() == 1 ? "" : "s", a->ran_in.c_str());
    for (const auto& [from, to] : rewrites) std::printf("  %s -> %s\n", from.c_str(), to.c_str());
  });
}

struct SetArgs {
  std::string in, out;
  double length_norm = -1;       // < 0: unchanged
  int beam = 0;                  // 0: unchanged
  int no_repeat = -1;            // < 0: unchanged
  std::string precision;         // "": unchanged
  std::string decoder_precision;  // "": unchanged
  double consensus_weight = -1;  // < 0: unchanged
  int memory_candidates = -1;    // < 0: unchanged
  double object_evidence = -1;   // < 0: unchanged
  double evidence_threshold = -1;  // < 0: unchanged
  double relevance_weight = -1;  // < 0: unchanged
  double neighbour_evidence = -1;  // < 0: unchanged
  double beam_evidence = -1;     // < 0: unchanged
  int neighbours = 0;            // 0: unchanged
  int beam_groups = 0;           // 0: unchanged
  double diversity = -1;         // < 0: unchanged
};

// Writes a copy of the model with the settings given changed, after checking that the model can use them.
void set_search_settings(const SetArgs& a) {
  if (a.length_norm < 0 && a.beam == 0 && a.no_repeat < 0 && a.precision.empty() && a.decoder_precision.empty() &&
      a.consensus_weight < 0 && a.neighbours == 0 && a.memory_candidates < 0 && a.beam_groups == 0 &&
      a.diversity < 0 && a.object_evidence < 0 && a.evidence_threshold < 0 && a.relevance_weight < 0 &&
      a.neighbour_evidence < 0 && a.beam_evidence < 0)
    throw CLI::RequiredError(
        "--length-norm, --beam, --no-repeat, --encoder-precision, --decoder-precision, --consensus-weight, "
        "--neighbours, --memory-candidates, --object-evidence, --evidence-threshold, --neighbour-evidence, "
        "--beam-evidence, --relevance-weight, --beam-groups or --diversity");
  std::optional<PrecisionChoice> precision;
  if (!a.precision.empty()) precision = parse_precision(a.precision);
  std::optional<ProductPrecision> decoder_precision;
  if (!a.decoder_precision.empty())
    decoder_precision = parse_product_precision(a.decoder_precision, "--decoder-precision");
  auto m = CaptionModel::load(a.in);
  if ((a.consensus_weight >= 0 || a.neighbours > 0 || a.memory_candidates >= 0) && !m->memory)
    fail(a.in,
         "has no caption memory (sat model memory builds one; --consensus-weight, --neighbours and "
         "--memory-candidates set its use)");
  if (a.neighbours > m->memory_photos())
    fail(a.in, "its caption memory holds " + std::to_string(m->memory_photos()) + " photos: --neighbours " +
                   std::to_string(a.neighbours) + " is more");
  if (a.consensus_weight >= 0) m->consensus.weight = a.consensus_weight;
  if (a.neighbours > 0) m->consensus.neighbours = a.neighbours;
  if (a.memory_candidates >= 0) m->consensus.memory_candidates = a.memory_candidates;
  if (a.object_evidence > 0 && m->encoder_config.object_channels == 0)
    fail(a.in, "has no object channels for --object-evidence (its encoder reads no detector: sat train --objects)");
  if (a.object_evidence >= 0) m->consensus.object_evidence = a.object_evidence;
  if (a.beam_evidence > 0 && m->encoder_config.object_channels == 0)
    fail(a.in, "has no object channels for --beam-evidence (its encoder reads no detector: sat train --objects)");
  if (a.beam_evidence >= 0) m->consensus.beam_evidence = a.beam_evidence;
  if (a.evidence_threshold >= 0) m->consensus.evidence_threshold = a.evidence_threshold;
  if (a.neighbour_evidence > 0 && !m->memory)
    fail(a.in, "has no caption memory for --neighbour-evidence (sat model memory builds one)");
  if (a.neighbour_evidence >= 0) m->consensus.neighbour_evidence = a.neighbour_evidence;
  if (a.relevance_weight > 0 && !(m->memory && m->memory->weighs_relevance()))
    fail(a.in, "has no word side in its caption memory's key projection for --relevance-weight (sat model memory "
               "--cca builds one)");
  if (a.relevance_weight >= 0) m->consensus.relevance_weight = a.relevance_weight;
  if (precision) {
    if (!m->encoder_config.pretrained()) fail(a.in, "has no pretrained encoder (--encoder-precision is for those)");
    if (*precision == PrecisionChoice::int8 && m->encoder_int8_ranges.empty())
      fail(a.in, "has no int8 activation ranges (sat model calibrate writes a copy with them)");
    m->encoder_precision = *precision;
  }
  if (decoder_precision) m->decoder_precision = *decoder_precision;
  if (a.length_norm >= 0) m->length_norm = a.length_norm;
  if (a.beam > 0) m->beam = a.beam;
  if (a.no_repeat >= 0) m->no_repeat_ngram = a.no_repeat;
  if (a.beam_groups > 0) m->beam_diversity.groups = a.beam_groups;
  if (a.diversity >= 0) m->beam_diversity.penalty = a.diversity;
  try {
    check_diversity(m->beam_diversity, m->beam);
  } catch (const Error& e) {
    fail(a.in, e.what());
  }
  // each setting's command stays on record
  std::string before = m->info.value("search_set", "");
  m->info["search_set"] = before.empty() ? command_line() : before + "; " + command_line();
  m->save(a.out);
  std::printf("%s -> %s: beam search of width %d ranks by log p / words^%g%s%s%s%s; decoder products %s\n",
              a.in.c_str(), a.out.c_str(), m->beam, m->length_norm, no_repeat_text(m->no_repeat_ngram).c_str(),
              diversity_text(m->beam_diversity.groups, m->beam_diversity.penalty).c_str(), consensus_text(*m).c_str(),
              m->encoder_config.pretrained()
                  ? ("; encoder arithmetic " + std::string(precision_name(m->encoder_precision))).c_str()
                  : "",
              product_precision_name(m->decoder_precision));
}

void add_model_set(CLI::App& model) {
  auto a = std::make_shared<SetArgs>();
  auto* set = model.add_subcommand("set",
                                   "Write a copy with different search settings (the weights are unchanged); "
                                   "the copy records the command that set them");
  set->add_option("model", a->in, "Model file")->required();
  set->add_option("--out", a->out, "Model file to write (may be the input: it is replaced atomically)")->required();
  set->add_option("--length-norm", a->length_norm,
                  "Beam search ranks finished captions by log p / words^A (1: "
                  "per-word mean, 0: plain log-probability); choose it on dev data")
      ->check(CLI::Range(0.0, 2.0));
  set->add_option("--beam", a->beam,
                  "The beam width captioning uses when none is asked for (1: greedy); choose it "
                  "on dev data")
      ->check(CLI::Range(1, kMaxBeam));
  set->add_option("--no-repeat", a->no_repeat, "Captions never repeat an N-word phrase (0: off); choose it on dev data")
      ->check(CLI::Range(0, kMaxNoRepeat));
  set->add_option("--encoder-precision", a->precision,
                  "A pretrained encoder's arithmetic: f32, bf16, int8 (needs sat "
                  "model calibrate) or auto (bf16 where it is the CPU's faster "
                  "arithmetic); choose it on dev data");
  set->add_option("--decoder-precision", a->decoder_precision,
                  "The decoder's products when captioning: f32, or bf16 (bfloat16 with float32 accumulation, where "
                  "it is the CPU's faster arithmetic, else f32); default: the arithmetic it trained in; choose it "
                  "on dev data")
      ->check(CLI::IsMember({"f32", "bf16"}));
  set->add_option("--consensus-weight", a->consensus_weight,
                  "Consensus reranking's weight W (0: off; the model "
                  "needs a caption memory); choose it on dev data")
      ->check(CLI::Range(0.0, kMaxConsensusWeight));
  set->add_option("--neighbours", a->neighbours,
                  "Consensus reranking: how many nearest training photos' captions a "
                  "candidate is compared with; choose it on dev data")
      ->check(CLI::PositiveNumber);
  set->add_option("--memory-candidates", a->memory_candidates,
                  "Consensus reranking: the captions of the M nearest training photos join the beam's candidates "
                  "(0: the beam's alone); choose it on dev data")
      ->check(CLI::Range(0, kMaxMemoryCandidates));
  set->add_option("--object-evidence", a->object_evidence,
                  "A model that reads the object detector: each beam candidate's total also gains V x (sum over "
                  "the objects it names of the detector's peak minus the threshold) (0: off); choose it on dev data")
      ->check(CLI::Range(0.0, kMaxObjectEvidence));
  set->add_option("--evidence-threshold", a->evidence_threshold,
                  "The detector's evidence: the peak above which naming an object gains, below which it costs")
      ->check(CLI::Range(0.0, 1.0));
  set->add_option("--neighbour-evidence", a->neighbour_evidence,
                  "The detector's evidence, a model with a caption memory: each object's evidence is (1 - M) x the "
                  "detector's peak + M x the share of the nearest memory photos' captions that name it (0: the peak "
                  "alone); choose it on dev data")
      ->check(CLI::Range(0.0, 1.0));
  set->add_option("--beam-evidence", a->beam_evidence,
                  "A model that reads the object detector: the same evidence steers the beam, each row's rank "
                  "gaining B x (the object's evidence minus the threshold) the first time it names the object (0: "
                  "off); choose it on dev data")
      ->check(CLI::Range(0.0, kMaxObjectEvidence));
  set->add_option("--relevance-weight", a->relevance_weight,
                  "Each beam candidate's total also gains R x the cosine of its words with the photo in the caption "
                  "memory's CCA space (0: off; needs a memory built with --cca); choose it on dev data")
      ->check(CLI::Range(0.0, kMaxRelevanceWeight));
  set->add_option("--beam-groups", a->beam_groups,
                  "Diverse beam search: the beam in G groups kept apart by the "
                  "diversity penalty (G divides the beam; 1: plain beam search)")
      ->check(CLI::Range(1, kMaxBeam));
  set->add_option("--diversity", a->diversity,
                  "Diverse beam search: what a word an earlier group took at the same "
                  "step costs a later group (log p units)")
      ->check(CLI::Range(0.0, kMaxDiversityPenalty));
  set->callback([a] { set_search_settings(*a); });
}

struct MemoryArgs {
  std::string in, out, data, images, split, features;
  int neighbours = 60;  // the defaults: chosen on Flickr8k's dev photos for the shipped model (README)
  double weight = 12;
  std::string pooling = "mean";
  float object_weight = 1;
  KeyProjectionOptions projection{0};  // dims 0: keys not projected
};

// Writes a copy of the model holding a caption memory of the split's photos, consensus reranking set to use it.
void write_caption_memory(const MemoryArgs& mem) {
  const KeyPooling pooling = parse_key_pooling(mem.pooling);
  auto m = CaptionModel::load(mem.in);
  CaptionSet set = load_caption_set(mem.data, mem.images, mem.split);
  std::unique_ptr<FeatureCache> cache;
  if (!mem.features.empty()) {
    cache = std::make_unique<FeatureCache>(mem.features);
    std::vector<std::string> names;
    for (auto& img : set.images) names.push_back(img.file_name);
    cache->require(m->encoder_id(), names);
  }
  std::shared_ptr<CaptionMemory> built;
  try {
    built = build_caption_memory(*m, set, cache.get(), pooling, mem.object_weight,
                                 mem.projection.dims > 0 ? &mem.projection : nullptr);
  } catch (const Error& e) {  // the projection is learned from the split's photos and captions: name it
    if (std::string(e.what()).rfind("key projection: ", 0) == 0) throw Error(mem.split + ": " + e.what());
    throw;
  }
  if (mem.neighbours > built->photos())
    throw Error("--neighbours " + std::to_string(mem.neighbours) + " is more than the " +
                std::to_string(built->photos()) + " photos of " + mem.split);
  if (m->neighbour_words.on() && m->neighbour_words.neighbours > built->photos())
    fail(mem.in, "its decoder reads the words of its " + std::to_string(m->neighbour_words.neighbours) +
                     " nearest memory photos, more than the " + std::to_string(built->photos()) + " of " + mem.split);
  built->prepare(m->encoder_config.feature_dim(), mem.split);
  built->ready();  // what building the scorer throws, before the file is written
  m->memory = built;
  // What reads the memory starts afresh (its relevance off: chosen on dev data for a memory); the detector's evidence,
  // which does not read it, stays as set.
  const ConsensusSettings before = m->consensus;
  m->consensus = {mem.neighbours, mem.weight};
  m->consensus.object_evidence = before.object_evidence;
  m->consensus.evidence_threshold = before.evidence_threshold;
  m->consensus.beam_evidence = before.beam_evidence;
  m->info["caption_memory"] = command_line();
  m->save(mem.out);
  size_t captions = 0;
  for (auto& c : built->captions) captions += c.size();
  std::printf("%s -> %s: caption memory of %d photos, %zu captions%s\n", mem.in.c_str(), mem.out.c_str(),
              built->photos(), captions, consensus_text(*m).c_str());
}

void add_model_memory(CLI::App& model) {
  auto mem = std::make_shared<MemoryArgs>();
  auto* memory = model.add_subcommand(
      "memory",
      "Write a copy holding a caption memory for consensus reranking: each training photo's pooled grid "
      "vector and its captions. Beam search then keeps the candidate with the best score + W x CIDEr-D "
      "against the captions of the photo's K nearest memory photos (Devlin et al. 2015). Build it from the "
      "training split only, and choose W and K on dev data");
  memory->add_option("model", mem->in, "Model file")->required();
  memory
      ->add_option("--data", mem->data,
                   "The photos and their captions: a data dir, COCO captions JSON or "
                   "captions.csv")
      ->required();
  memory->add_option("--images", mem->images, "Image folder when --data is a JSON/CSV file");
  memory->add_option("--split", mem->split, "Only these image file names (one per line): the training split")
      ->required();
  memory->add_option("--features", mem->features,
                     "Read the photos' grids from this cache (sat extract; the one the "
                     "model trained on) instead of encoding them");
  memory->add_option("--neighbours", mem->neighbours, "K")->capture_default_str()->check(CLI::PositiveNumber);
  memory->add_option("--consensus-weight", mem->weight, "W (0: stored but off)")
      ->capture_default_str()
      ->check(CLI::Range(0.0, kMaxConsensusWeight));
  memory
      ->add_option("--pooling", mem->pooling,
                   "How a photo's grid becomes its memory key: mean (over the grid's "
                   "cells), max, or gem (the generalized mean of order 3); the search "
                   "pools each photo the same way")
      ->capture_default_str();
  memory
      ->add_option("--object-weight", mem->object_weight,
                   "A model with object channels (the detector's): how much they weigh in the keys "
                   "against the grid's own (1: as the grid has them; above 1, photos with the same "
                   "objects are nearer; 0: left out)")
      ->capture_default_str()
      ->check(CLI::Range(0.0f, kMaxKeyObjectWeight));
  memory
      ->add_option("--cca", mem->projection.dims,
                   "Project the keys onto the N directions that best predict the words of the memory photos' "
                   "captions (canonical correlation analysis, learned from the memory's photos; 0: keys as pooled)")
      ->capture_default_str()
      ->check(CLI::Range(0, kMaxKeyProjectionDims));
  memory
      ->add_option("--cca-power", mem->projection.power,
                   "Each direction weighed by its canonical correlation to this power (0: all alike)")
      ->capture_default_str()
      ->check(CLI::Range(0.0, 16.0));
  memory
      ->add_option("--cca-regularization", mem->projection.regularization,
                   "The ridge added to both covariances, as a fraction of their mean variance")
      ->capture_default_str()
      ->check(CLI::Range(1e-6, 100.0));
  memory->add_option("--out", mem->out, "Model file to write (may be the input: it is replaced atomically)")
      ->required();
  memory->callback([mem] { write_caption_memory(*mem); });
}

struct CalibrateArgs {
  std::string in, out, data, images, split;
  int photos = 64;
  size_t per_node = 262144;
};

// Writes a copy of the model with the int8 ranges of its encoder's activations, chosen from photos spread evenly over
// the split.
void calibrate_int8(const CalibrateArgs& cal) {
  auto m = CaptionModel::load(cal.in, "", PrecisionChoice::f32);
  if (!m->encoder_config.pretrained()) fail(cal.in, "has no pretrained encoder (int8 is for those)");
  for (auto& node : m->encoder_config.graph.nodes)
    if (node.op == "concat") fail(cal.in, "its encoder concatenates (int8 runs ResNet v2 trunks only)");
  CaptionSet set = load_caption_set(cal.data, cal.images, cal.split);
  if (set.images.empty()) fail(cal.split.empty() ? cal.data : cal.split, "holds no photos");
  const int photos = std::min<int>(cal.photos, (int)set.images.size());
  std::vector<std::string> paths;
  for (int k = 0; k < photos; ++k) paths.push_back(set.image_path(set.images[(size_t)k * set.images.size() / photos]));
  std::map<std::string, std::vector<float>> samples;
  const size_t per_photo = std::max<size_t>(1, cal.per_node / photos);
  const int batch = 8;
  for (int start = 0; start < photos; start += batch) {
    const std::vector<std::string> chunk(paths.begin() + start, paths.begin() + std::min(photos, start + batch));
    const std::vector<float> planes = m->load_planes(chunk);
    m->pretrained->sample_activations(planes.data(), (int)chunk.size(), samples, per_photo * chunk.size());
  }
  m->encoder_int8_ranges = choose_int8_ranges(samples);
  m->info["int8_calibration"] = command_line();
  m->save(cal.out);
  std::printf(
      "%s -> %s: int8 ranges of %zu activations from %d photos of %s (use: --encoder-precision int8, or "
      "sat model set --encoder-precision int8)\n",
      cal.in.c_str(), cal.out.c_str(), m->encoder_int8_ranges.size(), photos,
      (cal.split.empty() ? cal.data : cal.split).c_str());
}

void add_model_calibrate(CLI::App& model) {
  auto cal = std::make_shared<CalibrateArgs>();
  auto* calibrate = model.add_subcommand(
      "calibrate",
      "Write a copy that can run its pretrained encoder in int8 (--encoder-precision int8): the range of "
      "each 8-bit activation, chosen from the float32 encoder's activations on photos (for each, the "
      "clip that quantizes its sampled values with the least squared error). Calibrate on training "
      "photos");
  calibrate->add_option("model", cal->in, "Model file (a pretrained encoder: ResNet v2)")->required();
  calibrate->add_option("--data", cal->data, "The photos: a data dir, COCO captions JSON or captions.csv")->required();
  calibrate->add_option("--images", cal->images, "Image folder when --data is a JSON/CSV file");
  calibrate->add_option("--split", cal->split,
                        "Only these image file names (one per line): training photos (default: "
                        "all of --data's)");
  calibrate->add_option("--photos", cal->photos, "How many photos, spread evenly over the split")
      ->capture_default_str()
      ->check(CLI::Range(1, 100000));
  calibrate->add_option("--out", cal->out, "Model file to write (may be the input: it is replaced atomically)")
      ->required();
  calibrate->callback([cal] { calibrate_int8(*cal); });
}

}  // namespace

void add_model_commands(CLI::App& app) {
  auto* model = app.add_subcommand("model",
                                   "Model file tools: what a model holds, a compact copy for shipping, search "
                                   "settings, averages, ensembles and their members, differences");
  model->require_subcommand(1);
  // in this order in the help
  add_model_info(*model);
  add_model_compact(*model);
  add_model_average(*model);
  add_model_ensemble(*model);
  add_model_member(*model);
  add_model_diff(*model);
  add_model_rebase(*model);
  add_model_set(*model);
  add_model_memory(*model);
  add_model_calibrate(*model);
}

}  // namespace sat
