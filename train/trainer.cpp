#include "train/trainer.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdarg>
#include <cstdio>
#include <map>
#include <omp.h>
#include <set>

#include "datasets/io.hpp"
#include "datasets/json_checks.hpp"
#include "seq/search.hpp"
#include "train/extract.hpp"
#include "train/metrics.hpp"
#include "train/optimizer.hpp"
#include "train/progress.hpp"
#include "vision/image.hpp"

namespace sat {

using nlohmann::json;

json TrainOptions::to_json() const {
  return {{"data", data}, {"images", images}, {"train_split", train_split}, {"val_data", val_data},
          {"val_images", val_images}, {"val_split", val_split}, {"out", out}, {"blocks", blocks},
          {"input_size", input_size}, {"coord_channels", coord_channels}, {"embed_dim", embed_dim},
          {"hidden_dim", hidden_dim}, {"attn_dim", attn_dim}, {"dropout", dropout}, {"coverage", coverage}, {"max_len", max_len},
          {"min_count", min_count}, {"epochs", epochs}, {"batch_images", batch_images},
          {"captions_per_image", captions_per_image}, {"lr", lr}, {"lr_decay", lr_decay}, {"clip", clip},
          {"penalty", penalty}, {"label_smoothing", label_smoothing}, {"patience", patience}, {"val_limit", val_limit}, {"encoder", encoder}, {"cut", cut},
          {"encoder_size", encoder_size}, {"features", features}, {"val_features", val_features},
          {"mirror_features", mirror_features}, {"mirror_prob", mirror_prob},
          {"tune_from", tune_from}, {"tune_lr", tune_lr},
          {"attention", attention}, {"score", score}, {"order", order}, {"hard_window", hard_window},
          {"hard_samples", hard_samples}, {"hard_soft_prob", hard_soft_prob}, {"hard_soft_warmup", hard_soft_warmup},
          {"reinforce_weight", reinforce_weight}, {"entropy_weight", entropy_weight},
          {"local_sigma", local_sigma}, {"init_from", init_from}, {"fresh_decoder", fresh_decoder}, {"fresh_embed", fresh_embed}, {"fresh_hidden", fresh_hidden}, {"fresh_attn", fresh_attn}, {"fresh_dropout", fresh_dropout}, {"fresh_order", fresh_order}, {"started_from", started_from}, {"objective", objective}, {"scst_samples", scst_samples},
          {"checkpoint_every", checkpoint_every}, {"keep_epochs", keep_epochs}, {"metric", metric}, {"seed", seed}, {"threads", threads}, {"command", command}};
}

TrainOptions TrainOptions::from_json(const json& j) {
  TrainOptions o;
  try {
#define GET(k) o.k = j.at(#k).get<decltype(o.k)>()
    GET(data); GET(images); GET(train_split); GET(val_data); GET(val_images); GET(val_split); GET(out);
    GET(blocks); GET(input_size); GET(coord_channels); GET(embed_dim); GET(hidden_dim); GET(attn_dim);
    GET(dropout); GET(max_len); GET(min_count); GET(epochs); GET(batch_images); GET(captions_per_image);
    GET(lr); GET(lr_decay); GET(clip); GET(penalty); GET(patience); GET(val_limit); GET(checkpoint_every);
    GET(seed); GET(threads); GET(command);
#undef GET
    o.metric = j.value("metric", std::string("bleu4"));
    o.keep_epochs = j.value("keep_epochs", false);
    o.coverage = j.value("coverage", false);
    o.encoder = j.value("encoder", std::string());
    o.cut = j.value("cut", std::string("mixed5"));
    o.encoder_size = j.value("encoder_size", 0);
    o.features = j.value("features", std::string());
    o.val_features = j.value("val_features", std::string());
    o.mirror_features = j.value("mirror_features", std::string());
    o.mirror_prob = j.value("mirror_prob", 0.5f);
    o.label_smoothing = j.value("label_smoothing", 0.f);
    o.tune_from = j.value("tune_from", std::string());
    o.tune_lr = j.value("tune_lr", 1e-4f);
    o.attention = j.value("attention", std::string("soft"));
    o.score = j.value("score", std::string("additive"));
    o.order = j.value("order", std::string("bahdanau"));
    o.hard_window = j.value("hard_window", 1);
    o.hard_samples = j.value("hard_samples", 1);
    o.hard_soft_prob = j.value("hard_soft_prob", 0.5f);
    o.hard_soft_warmup = j.value("hard_soft_warmup", 0.f);
    o.reinforce_weight = j.value("reinforce_weight", 1.f);
    o.entropy_weight = j.value("entropy_weight", 0.002f);
    o.local_sigma = j.value("local_sigma", 0.f);
    o.init_from = j.value("init_from", std::string());
    o.fresh_decoder = j.value("fresh_decoder", false);
    o.fresh_embed = j.value("fresh_embed", 0), o.fresh_hidden = j.value("fresh_hidden", 0);
    o.fresh_attn = j.value("fresh_attn", 0), o.fresh_dropout = j.value("fresh_dropout", -1.f);
    o.fresh_order = j.value("fresh_order", std::string());
    o.started_from = j.value("started_from", std::string());
    o.objective = j.value("objective", std::string("xe"));
    o.scst_samples = j.value("scst_samples", 5);
  } catch (const std::exception& e) {
    throw Error(std::string("training options are malformed (") + e.what() + ")");
  }
  return o;
}

std::vector<std::string> mirror_caption(const std::vector<std::string>& tokens) {
  std::vector<std::string> out = tokens;
  for (auto& w : out)
    if (w == "left") w = "right";
    else if (w == "right") w = "left";
  return out;
}

CaptionSet load_caption_set(const std::string& data, const std::string& images, const std::string& split) {
  CaptionSet set;
  const bool is_dir = is_directory(data);
  // A Karpathy split file names its splits inside: --train-split train (or val, test, restval).
  const bool named_split = (split == "train" || split == "val" || split == "test" || split == "restval") && !file_exists(split);
  if (is_dir) {
    set = load_data_dir(data);
  } else {
    std::string dir = images;
    if (dir.empty()) {
      auto slash = data.rfind('/');
      std::string parent = slash == std::string::npos ? "." : data.substr(0, slash);
      dir = data.size() > 4 && data.substr(data.size() - 4) != ".json" && file_exists(join_path(parent, "images"))
                ? join_path(parent, "images")
                : parent;
    }
    std::string format = detect_caption_format(data);
    if (named_split && format != "karpathy")
      fail(data, "split '" + split + "' names a Karpathy split, but this is not a Karpathy split file");
    set = load_captions_any(data, dir, format, named_split ? split : "");
  }
  if (!split.empty() && !named_split) set = set.subset(read_name_list(split), split);
  if (set.images.empty()) fail(set.json_path, "no images in this caption set");
  if (set.captions.empty()) fail(set.json_path, "no captions in this caption set");
  return set;
}

namespace {

// Every image of a set decoded and resized once, kept as 8-bit RGB.
struct ImageBank {
  int size = 0;
  std::vector<uint8_t> rgb;  // N x S x S x 3
  void load(const CaptionSet& set, int S, const std::string& label, bool show) {
    size = S;
    const int n = (int)set.images.size();
    rgb.resize((size_t)n * S * S * 3);
    std::string error;
    Progress bar(label, n);
    int done = 0;
#pragma omp parallel for schedule(dynamic, 8)
    for (int i = 0; i < n; ++i) {
      try {
        cv::Mat img = load_image_bgr(set.image_path(set.images[i]));
        const float zero[3] = {0, 0, 0}, one[3] = {1.f / 255, 1.f / 255, 1.f / 255};
        std::vector<float> planes(3 * S * S);
        image_to_planes(img, S, zero, one, planes.data());  // planes hold 0..255
        uint8_t* dst = rgb.data() + (size_t)i * S * S * 3;
        for (int p = 0; p < S * S; ++p)
          for (int c = 0; c < 3; ++c) dst[p * 3 + c] = (uint8_t)std::lround(planes[c * S * S + p]);
      } catch (const std::exception& e) {
#pragma omp critical
        if (error.empty()) error = e.what();
      }
#pragma omp atomic
      ++done;
      if (show && omp_get_thread_num() == 0) bar.update(done, "images");
    }
    if (!error.empty()) throw Error(error);
    if (show) bar.finish("images decoded");
  }
  void planes(const std::vector<int>& idx, const EncoderConfig& cfg, std::vector<float>& out) const {
    const int S = size;
    out.resize(idx.size() * 3 * S * S);
    for (size_t k = 0; k < idx.size(); ++k) {
      const uint8_t* src = rgb.data() + (size_t)idx[k] * S * S * 3;
      float* dst = out.data() + k * 3 * S * S;
      for (int c = 0; c < 3; ++c) {
        const float a = 1.f / (255.f * cfg.stdev[c]), b = -cfg.mean[c] / cfg.stdev[c];
        for (int p = 0; p < S * S; ++p) dst[c * S * S + p] = src[p * 3 + c] * a + b;
      }
    }
  }
};

struct TrainState {
  int epoch = 0;          // current epoch (0-based)
  int step_in_epoch = 0;  // batches already done in this epoch
  uint64_t epoch_seed = 0;
  int64_t global_step = 0;
  double best_score = -1;
  int best_epoch = -1;
  int bad_epochs = 0;
  json history = json::array();
  json to_json() const {
    return {{"epoch", epoch}, {"step_in_epoch", step_in_epoch}, {"epoch_seed", epoch_seed},
            {"global_step", global_step}, {"best_score", best_score}, {"best_epoch", best_epoch},
            {"bad_epochs", bad_epochs}, {"history", history}};
  }
  static TrainState from_json(const json& j) {
    TrainState s;
    s.epoch = j.at("epoch");
    s.step_in_epoch = j.at("step_in_epoch");
    s.epoch_seed = j.at("epoch_seed");
    s.global_step = j.at("global_step");
    s.best_score = j.at("best_score");
    s.best_epoch = j.at("best_epoch");
    s.bad_epochs = j.at("bad_epochs");
    s.history = j.at("history");
    return s;
  }
};

void save_checkpoint(const std::string& path, CaptionModel& model, const Adam& adam, const TrainOptions& opt,
                     const TrainState& st, const Rng& rng) {
  TensorFile tf = model.to_tensor_file();
  auto params = model.params();
  for (size_t k = 0; k < params.size(); ++k) {
    if (!params[k]->trainable) continue;
    Param m("adam.m/" + params[k]->name, params[k]->shape, false), v("adam.v/" + params[k]->name, params[k]->shape, false);
    m.value = adam.m[k];
    v.value = adam.v[k];
    tf.tensors.emplace(m.name, std::move(m));
    tf.tensors.emplace(v.name, std::move(v));
  }
  tf.metadata["checkpoint"] = json{{"options", opt.to_json()}, {"state", st.to_json()}, {"rng", rng.state()},
                                   {"adam_step", adam.step}}.dump();
  save_safetensors(path, tf);
}

// One line on how a model was made, from its info: the model --init-from names, its training command, recipe and
// epoch, the steps after training (averaged, compacted, search settings), and where it started from in turn.
std::string provenance_of(const std::string& path, const json& info) {
  std::string out = path;
  const char* sep = ": ";
  for (const char* key : {"command", "recipe", "epoch", "averaged", "compacted", "search_set", "rebased", "started_from"}) {
    if (!info.is_object() || !info.contains(key)) continue;
    const json& v = info[key];
    const std::string text = v.is_string() ? v.get<std::string>() : v.dump();
    if (text.empty()) continue;
    out += sep + std::string(key) + " " + text;
    sep = "; ";
  }
  return out;
}

}  // namespace

SelfCriticalStep self_critical_step(CaptionModel& model, const float* grids, const std::vector<int>& images,
                                    const CiderDScorer& cider, int samples, uint64_t step_seed, int first,
                                    Collective& ranks, DecoderCache& cache) {
  const int n = (int)images.size(), K = samples, B = n * K;
  const int L = model.encoder_config.locations(), D = model.encoder_config.feature_dim();
  const Mat F = n ? Mat(Eigen::Map<const Mat>(grids, (int64_t)n * L, D)) : Mat();  // an image's K samples read its grid
  SelfCriticalStep r;
  CaptionBatch cb;
  if (n > 0) {
    std::vector<uint64_t> seeds(B);
    for (int b = 0; b < B; ++b) seeds[b] = row_seed(step_seed, (uint64_t)first * K + b);
    std::vector<Hypothesis> drawn = sample_search(*model.decoder, F, n, model.max_len, seeds, K);
    std::vector<double> rewards(B);
#pragma omp parallel for schedule(dynamic, 8)
    for (int b = 0; b < B; ++b) rewards[b] = cider.score(model.vocab.decode(drawn[b].tokens), images[b / K]);
    std::vector<double> advantage = leave_one_out_advantages(rewards, K);
    std::vector<std::vector<int>> caps(B);
    for (int b = 0; b < B; ++b) caps[b] = drawn[b].tokens;
    cb = CaptionBatch::from_ids(caps, model.max_len);
    for (int b = 0; b < B; ++b)  // a sample cut at max_len drew no <end>: its log-probability has no <end> term
      if (drawn[b].alphas.size() == drawn[b].tokens.size()) cb.mask[(size_t)b * cb.T + drawn[b].tokens.size()] = 0.f;
    cb.row_weight.assign(advantage.begin(), advantage.end());
    for (int b = 0; b < B; ++b) cb.grid.push_back(b / K);
    r.captions = B;
    for (double x : rewards) r.reward_sum += x;
  }
  // The tokens the whole global batch sampled normalize every rank's loss.
  double tokens = n ? (double)cb.real_tokens() : 0.0;
  ranks.sum(&tokens, 1, "the sampled captions' token count");
  if (n > 0) {
    cb.norm_tokens = (int64_t)tokens;
    // No dropout: the gradient is of the log-probability of the distribution the samples came from.
    model.decoder->forward(F, cb, 0.f, false, nullptr, cache);
    model.decoder->backward(cache, nullptr);
  }
  return r;
}

static double metric_of(const CaptionScores& s, const std::string& metric) {
  return metric == "cider" ? s.cider_d : s.bleu[3];
}

// A message on stderr from the leading rank (the others stay quiet).
__attribute__((format(printf, 2, 3))) static void note(bool lead, const char* format, ...) {
  if (!lead) return;
  va_list args;
  va_start(args, format);
  std::vfprintf(stderr, format, args);
  va_end(args);
}

TrainSummary train(TrainOptions opt, const std::string& resume_path, const ResumeOverrides& more,
                   int64_t stop_after_steps, Collective* ranks_given) {
  Collective alone;
  Collective& ranks = ranks_given ? *ranks_given : alone;
  const bool lead = ranks.leads(), parallel = ranks.size() > 1;
  std::unique_ptr<CaptionModel> model;
  TrainState st;
  Rng rng(opt.seed);
  Adam adam;
  TensorFile ckpt;
  const int threads_asked = opt.threads;  // a resumed run may use another thread count: it changes speed only
  if (!resume_path.empty()) {
    ckpt = load_safetensors(resume_path);
    if (!ckpt.metadata.count("checkpoint")) fail(resume_path, "not a training checkpoint (no optimizer state)");
    json c;
    try {
      c = parse_json_checked(ckpt.metadata["checkpoint"], resume_path, "checkpoint state is malformed");
      opt = TrainOptions::from_json(c.at("options"));
      st = TrainState::from_json(c.at("state"));
      rng.set_state(c.at("rng").get<std::string>());
      adam.step = c.at("adam_step");
    } catch (const Error& e) {
      std::string msg = e.what();
      if (msg.rfind(resume_path, 0) == 0) throw;
      fail(resume_path, msg);
    } catch (const std::exception& e) {
      fail(resume_path, std::string("checkpoint state is malformed (") + e.what() + ")");
    }
    model = CaptionModel::from_tensor_file(ckpt, resume_path);
    // Continue where the checkpoint lies (it may have been moved since).
    auto slash = resume_path.rfind('/');
    opt.out = slash == std::string::npos ? "." : resume_path.substr(0, slash);
    if (threads_asked > 0) opt.threads = threads_asked;
  }
  if (more.epochs > 0) opt.epochs = more.epochs;
  if (more.patience > 0) opt.patience = more.patience;
  if (more.keep_epochs) opt.keep_epochs = true;
  if (opt.threads > 0) omp_set_num_threads(opt.threads);
  if (opt.metric != "bleu4" && opt.metric != "cider") throw Error("train: --metric must be bleu4 or cider");
  if (opt.batch_images < 1 || opt.epochs < 0 || opt.max_len < 1) throw Error("train: --batch and --max-len must be positive, --epochs not negative");
  if (opt.objective != "xe" && opt.objective != "cider") throw Error("train: --objective must be xe or cider");
  const bool self_critical = opt.objective == "cider";
  if (!(opt.label_smoothing >= 0 && opt.label_smoothing < 1)) throw Error("train: --label-smoothing must be in [0, 1)");
  if (self_critical && opt.label_smoothing > 0)
    throw Error("train: --label-smoothing is for cross-entropy training, not --objective cider");
  if (self_critical && opt.scst_samples < 2) throw Error("train: --scst-samples must be at least 2 (the baseline is the other samples' mean)");

  CaptionSet train_set = load_caption_set(opt.data, opt.images, opt.train_split);
  CaptionSet val_set = load_caption_set(opt.val_data.empty() ? opt.data : opt.val_data,
                                        opt.val_data.empty() ? opt.images : opt.val_images, opt.val_split);
  if (opt.val_limit > 0 && (int)val_set.images.size() > opt.val_limit) {
    std::vector<std::string> names;
    for (int i = 0; i < opt.val_limit; ++i) names.push_back(val_set.images[i].file_name);
    val_set = val_set.subset(names, "--val-limit");
  }
  if (lead) make_dirs(opt.out);  // only rank 0 writes into it

  if (!model && !opt.init_from.empty()) {
    model = CaptionModel::load(opt.init_from);
    if (model->members() > 1) {
      // Another member for an ensemble needs only its encoder and vocabulary; its decoders do not train on.
      if (!opt.fresh_decoder)
        fail(opt.init_from, "is an ensemble of " + std::to_string(model->members()) +
                                " decoders: train from one of its members' own files, or give --fresh-decoder to "
                                "train another member over its encoder");
      model->more_members.clear();
    }
    model->half_precision = false;  // the weights keep training in float32
    // A caption memory holds grid vectors of the encoder it was built with, and its settings were chosen for that
    // decoder: the trained model is another one (sat model memory builds it a memory of its own).
    model->memory.reset();
    model->consensus = ConsensusSettings{};
    // int8 ranges were calibrated on the encoder as it was: once its fine-tuned units train on they describe it no
    // more (sat model calibrate the trained model again)
    if (opt.tune_lr != 0 && model->encoder_config.tuned()) model->drop_int8_ranges();
    opt.started_from = provenance_of(opt.init_from, model->info);
    model->info = json::object();
    note(lead, "starting from %s\n", opt.init_from.c_str());
    if (opt.fresh_decoder) {  // a decoder built anew (every weight and bias from the seed), the same config
      DecoderConfig& c = model->decoder_config;  // but for the sizes given with --fresh-decoder
      if (opt.fresh_embed > 0) c.embed_dim = opt.fresh_embed;
      if (opt.fresh_hidden > 0) c.hidden_dim = opt.fresh_hidden;
      if (opt.fresh_attn > 0) c.attn_dim = opt.fresh_attn;
      if (opt.fresh_dropout >= 0) c.dropout = opt.fresh_dropout;
      if (!opt.fresh_order.empty()) c.order = opt.fresh_order;
      c = DecoderConfig::from_json(c.to_json());  // the config's own range checks
      model->decoder = std::make_unique<Decoder>(c);
      model->decoder->init(rng);
      note(lead, "its decoder starts afresh (seed %llu; embedding %d, hidden %d, attention %d, dropout %g, %s order); its "
           "encoder and vocabulary are kept\n", (unsigned long long)opt.seed, c.embed_dim, c.hidden_dim, c.attn_dim,
           c.dropout, c.order.c_str());
    }
  } else if (opt.fresh_decoder && resume_path.empty()) {
    throw Error("train: --fresh-decoder needs --init-from MODEL (whose encoder and vocabulary it keeps)");
  }
  if (model && resume_path.empty() && !opt.tune_from.empty() && model->encoder_config.pretrained() &&
      model->encoder_config.tune_from != opt.tune_from && !model->encoder_weights_path.empty()) {
    // A frozen model goes on training with its encoder's top units fine-tuned: the units after --tune-from start
    // from the weights file the model names, the decoder from the model's trained weights. A model that already
    // fine-tuned the units after a later layer tunes more of them: those keep their trained weights, the units
    // in between start from the weights file.
    auto tuned = pretrained_encoder_model(model->encoder_weights_path, model->encoder_config.cut,
                                          model->encoder_config.input_size, false, false);
    tuned->encoder_config.tune_from = opt.tune_from;
    tuned->vocab = model->vocab;
    tuned->decoder_config = model->decoder_config;
    tuned->max_len = model->max_len, tuned->beam = model->beam;
    tuned->length_norm = model->length_norm, tuned->no_repeat_ngram = model->no_repeat_ngram;
    tuned->beam_diversity = model->beam_diversity;
    try {
      tuned->build();
    } catch (const Error& e) {
      throw Error("train: --tune-from " + opt.tune_from + " with " + opt.init_from + ": " + e.what());
    }
    std::vector<Param*> from = model->decoder->params(), to = tuned->decoder->params();
    if (from.size() != to.size()) throw Error("train: " + opt.init_from + ": its decoder does not rebuild alike");
    for (size_t k = 0; k < from.size(); ++k) to[k]->value = from[k]->value;
    const std::string kept = model->encoder_config.tune_from;  // empty: a frozen model
    if (model->tuned) {  // parameter names ("encoder.<layer>.weight") are the same whichever unit tuning starts at
      std::map<std::string, Param*> trained;
      for (auto& p : tuned->tuned->params()) trained[p.name] = &p;
      for (auto& p : model->tuned->params()) {
        auto it = trained.find(p.name);
        if (it == trained.end() || it->second->shape != p.shape)
          throw Error("train: --tune-from " + opt.tune_from + " with " + opt.init_from + ": that model fine-tuned " +
                      "the layers after " + kept + ", and layer '" + p.name.substr(8, p.name.rfind('.') - 8) +
                      "' would be frozen again (tune from a layer before " + kept + ")");
        it->second->value = p.value;
      }
    }
    tuned->info = json::object();
    model = std::move(tuned);
    note(lead, "fine-tuning the encoder after %s, from the weights in %s%s\n", opt.tune_from.c_str(),
         model->encoder_weights_path.c_str(),
         kept.empty() ? "" : (" (the layers after " + kept + " from their fine-tuned weights)").c_str());
  }
  if (model && !opt.tune_from.empty() && model->encoder_config.tune_from != opt.tune_from)
    throw Error("train: --tune-from applies to a new model; " +
                (resume_path.empty() ? opt.init_from : resume_path) + " " +
                (model->encoder_config.tuned() ? "tunes its encoder after " + model->encoder_config.tune_from
                                               : "has a frozen encoder"));
  if (self_critical && model && model->decoder_config.hard())
    throw Error("train: --objective cider needs a soft, local or no-attention model (hard attention samples its "
                "glimpses inside the cross-entropy objective)");
  if (!model) {
    if (self_critical) throw Error("train: --objective cider fine-tunes a trained model: give it --init-from MODEL");
    if (!opt.encoder.empty()) {
      model = pretrained_encoder_model(opt.encoder, opt.cut, opt.encoder_size, false, false);  // built below
    } else {
      model = std::make_unique<CaptionModel>();
      model->encoder_config.input_size = opt.input_size;
      model->encoder_config.blocks = EncoderConfig::parse_blocks(opt.blocks);
      model->encoder_config.coord_channels = opt.coord_channels;
      model->encoder_config = EncoderConfig::from_json(model->encoder_config.to_json());  // validates
    }
    std::vector<std::vector<std::string>> caps;
    for (auto& c : train_set.captions) caps.push_back(c.tokens);
    model->vocab = Vocab::build(caps, opt.min_count);
    DecoderConfig& dc = model->decoder_config;
    dc.embed_dim = opt.embed_dim, dc.hidden_dim = opt.hidden_dim, dc.attn_dim = opt.attn_dim;
    dc.dropout = opt.dropout, dc.coverage = opt.coverage;
    dc.attention = opt.attention, dc.score = opt.score, dc.order = opt.order;
    dc.hard_window = opt.hard_window, dc.reinforce_weight = opt.reinforce_weight, dc.hard_soft_prob = opt.hard_soft_prob;
    if (opt.hard_soft_warmup < 0 || opt.hard_samples < 1)
      throw Error("train: --hard-soft-warmup must be 0 or more and --hard-samples 1 or more");
    dc.entropy_weight = opt.entropy_weight, dc.local_sigma = opt.local_sigma;
    model->max_len = opt.max_len;
    if (!opt.tune_from.empty()) {
      if (!model->encoder_config.pretrained())
        throw Error("train: --tune-from fine-tunes a pretrained encoder's top layers: give --encoder and --cut too");
      model->encoder_config.tune_from = opt.tune_from;
    }
    model->build();
    model->init(rng);
  }
  auto params = model->params();
  adam.attach(params);
  if (!resume_path.empty()) {
    for (size_t k = 0; k < params.size(); ++k) {
      if (!params[k]->trainable) continue;
      adam.m[k] = ckpt.get("adam.m/" + params[k]->name, resume_path).value;
      adam.v[k] = ckpt.get("adam.v/" + params[k]->name, resume_path).value;
    }
    ckpt = TensorFile();
    note(lead, "resuming %s at epoch %d, step %d\n", resume_path.c_str(), st.epoch + 1, st.step_in_epoch);
  }
  // Every rank built or loaded its model from the same options, seed and files: they must hold the same weights.
  if (parallel && !ranks.same_everywhere(parameter_checksum(params), "the starting weights"))
    throw Error("train: the ranks start from different weights (every rank needs the same options and files: is "
                "--resume or --init-from on a disk they share?)");
  if (parallel)
    note(lead, "data-parallel: %d ranks share each batch of %d photos (gradients summed across ranks)\n", ranks.size(),
         opt.batch_images);
  note(lead, "train: %zu images, %zu captions; val: %zu images; vocabulary %d words; grid %dx%dx%d\n",
               train_set.images.size(), train_set.captions.size(), val_set.images.size(), model->vocab.size(),
               model->encoder_config.grid_h(), model->encoder_config.grid_w(), model->encoder_config.feature_dim());

  const int S = model->encoder_config.input_size, L = model->encoder_config.locations(),
            D = model->encoder_config.feature_dim();
  const bool from_features = model->encoder_config.pretrained();
  // Cached grids: the encoder's output, or for a tuned encoder its frozen part's (the blocks run on them).
  const EncoderConfig cache_cfg = model->encoder_config.cache_config();
  const int cache_L = cache_cfg.locations(), cache_D = cache_cfg.feature_dim();
  TunableBlocks* tuned = model->tuned.get();
  const bool tail_learns = tuned && opt.tune_lr > 0;  // --tune-lr 0: the tuned blocks run forward only
  if (opt.tune_lr < 0) throw Error("train: --tune-lr must not be negative");
  std::vector<float> lr_scale(params.size(), 1.f);  // tuned blocks step at tune_lr, the rest at lr
  if (tuned) {
    for (size_t k = 0; k < params.size(); ++k)
      for (auto& p : tuned->params())
        if (params[k] == &p) lr_scale[k] = opt.lr > 0 ? opt.tune_lr / opt.lr : 0.f;
    if (tail_learns)
      note(lead, "fine-tuning the encoder after %s up to %s (%.2f GMAC per image), learning rate %g\n",
           model->encoder_config.tune_from.c_str(), model->encoder_config.cut.c_str(), tuned->macs_per_image() / 1e9,
           opt.tune_lr);
    else
      note(lead, "the encoder's layers after %s up to %s run as they are (%.2f GMAC per image; --tune-lr 0)\n",
           model->encoder_config.tune_from.c_str(), model->encoder_config.cut.c_str(), tuned->macs_per_image() / 1e9);
  }
  ImageBank train_bank, val_bank;
  std::vector<float> val_planes;
  std::unique_ptr<FeatureCache> train_feats, val_feats_own, mirror_feats;
  if (!opt.mirror_features.empty()) {
    if (!from_features)
      throw Error("train: --mirror-features needs a pretrained --encoder (it is a feature cache of mirrored photos)");
    if (self_critical) throw Error("train: --mirror-features is for cross-entropy training, not --objective cider");
    if (!(opt.mirror_prob > 0 && opt.mirror_prob <= 1)) throw Error("train: --mirror-prob must be in (0, 1]");
  }
  const FeatureCache* val_feats = nullptr;
  if (from_features) {
    // The frozen encoder runs once per image (sat extract); training reads the memory-mapped grids.
    if (opt.features.empty()) {
      opt.features = join_path(opt.out, "features.feat");
      if (!file_exists(opt.features)) {
        if (parallel)
          throw Error("train: " + opt.features + " is missing: under mpirun, make the feature cache first (sat extract, "
                      "then --features), or run once in one process");
        std::vector<std::string> paths, names;
        std::set<std::string> seen;
        for (const CaptionSet* set : {&train_set, &val_set})
          for (auto& img : set->images)
            if (seen.insert(img.file_name).second) paths.push_back(set->image_path(img)), names.push_back(img.file_name);
        std::fprintf(stderr, "encoding %zu images once into %s\n", names.size(), opt.features.c_str());
        if (tuned) {  // the frozen part only (the model's own weights, --init-from too): the tuned blocks run at every step
          CaptionModel frozen;
          frozen.encoder_config = model->encoder_config.cache_config();
          frozen.encoder_weights = std::make_shared<const TensorFile>(
              select_tensors(frozen.encoder_config.graph, *model->encoder_weights, "encoder weights"));
          frozen.build_encoder();
          extract_features(frozen, paths, names, opt.features, ExtractOptions());
        } else
          extract_features(*model, paths, names, opt.features, ExtractOptions());
      }
    }
    train_feats = std::make_unique<FeatureCache>(opt.features);
    if (opt.val_features.empty() || opt.val_features == opt.features) {
      val_feats = train_feats.get();
    } else {
      val_feats_own = std::make_unique<FeatureCache>(opt.val_features);
      val_feats = val_feats_own.get();
    }
    // Photos the cache left out as unreadable (sat extract --skip-bad) are left out here too, and said so.
    auto without_skipped = [lead](CaptionSet& set, const FeatureCache& cache, const char* which) {
      std::vector<std::string> keep;
      for (auto& img : set.images)
        if (!cache.was_skipped(img.file_name)) keep.push_back(img.file_name);
      if (keep.size() == set.images.size()) return;
      note(lead, "%s: the feature cache lacks %zu of the %zu %s photos (unreadable when it was extracted); "
                 "going on without them\n",
                   cache.path().c_str(), set.images.size() - keep.size(), set.images.size(), which);
      if (keep.empty()) fail(cache.path(), std::string("the feature cache holds none of the ") + which + " photos");
      set = set.subset(keep, cache.path());
    };
    without_skipped(train_set, *train_feats, "training");
    without_skipped(val_set, *val_feats, "validation");
    std::vector<std::string> train_names, val_names;
    for (auto& img : train_set.images) train_names.push_back(img.file_name);
    for (auto& img : val_set.images) val_names.push_back(img.file_name);
    train_feats->require(model->encoder_id(), train_names);
    val_feats->require(model->encoder_id(), val_names);
    if (!opt.mirror_features.empty()) {
      mirror_feats = std::make_unique<FeatureCache>(opt.mirror_features);
      mirror_feats->require(model->encoder_id(), train_names, true);
      note(lead, "mirror augmentation: each step reads a photo mirrored (from %s) with probability %g\n",
           opt.mirror_features.c_str(), opt.mirror_prob);
    }
  } else {
    train_bank.load(train_set, S, "loading train images", lead);
    val_bank.load(val_set, S, "loading val images", lead);
    if (parallel)
      note(lead, "the small CNN's batch norm normalizes each rank's share of a batch by the share's own statistics "
                 "(running statistics are averaged): the model differs from a single process's beyond rounding\n");
    std::vector<int> all(val_set.images.size());
    for (size_t i = 0; i < all.size(); ++i) all[i] = (int)i;
    val_bank.planes(all, model->encoder_config, val_planes);
  }
  auto run_validation = [&]() { return validate_across(*model, val_set, val_feats, val_planes, ranks); };
  std::vector<int> train_record(train_set.images.size());
  for (size_t i = 0; from_features && i < train_record.size(); ++i)
    train_record[i] = train_feats->index_of(train_set.images[i].file_name);
  std::vector<std::vector<int>> caption_ids(train_set.captions.size());
  for (size_t i = 0; i < caption_ids.size(); ++i) caption_ids[i] = model->vocab.encode(train_set.captions[i].tokens);
  std::vector<int> mirror_record;  // --mirror-features: each training photo's record there, and its captions mirrored
  std::vector<std::vector<int>> mirrored_caption_ids;
  if (mirror_feats) {
    for (auto& img : train_set.images) mirror_record.push_back(mirror_feats->index_of(img.file_name));
    for (auto& c : train_set.captions) mirrored_caption_ids.push_back(model->vocab.encode(mirror_caption(c.tokens)));
  }
  std::unique_ptr<CiderDScorer> cider;  // self-critical reward: CIDEr-D with the training split's document frequencies
  if (self_critical) {
    std::vector<std::vector<Tokens>> refs(train_set.images.size());
    for (size_t i = 0; i < refs.size(); ++i)
      for (int c : train_set.images[i].caption_indices) refs[i].push_back(train_set.captions[c].tokens);
    cider = std::make_unique<CiderDScorer>(refs);
  }

  const std::string ckpt_path = join_path(opt.out, "checkpoint.sat");
  const std::string best_path = join_path(opt.out, "model.sat");
  const int n_images = (int)train_set.images.size();
  const int steps_per_epoch = (n_images + opt.batch_images - 1) / opt.batch_images;
  TrainSummary summary;
  summary.model_path = best_path;

  if (opt.epochs == 0 && resume_path.empty()) {  // the untrained baseline: initialized weights, scored once
    CaptionScores sc = run_validation();
    model->info = {{"command", opt.command}, {"data", opt.data}, {"git_commit", build_commit()}, {"epoch", 0},
                   {"val_scores", sc.to_json()}, {"options", opt.to_json()}, {"started_from", opt.started_from}};
    if (lead) model->save(best_path);
    note(lead, "untrained model (epochs 0): val BLEU-4 %.4f CIDEr-D %.4f -> %s\n", sc.bleu[3], sc.cider_d,
         best_path.c_str());
    summary.best_score = metric_of(sc, opt.metric);
    summary.metric = opt.metric;
    return summary;
  }
  std::vector<float> planes, grid, tuned_grid;
  Mat F, dF;
  std::vector<char> step_mirrored;  // this step's photos (this rank's share) that read their mirrored grids
  // Starts the disk reads of these photos' grids (the step's, and the next step's while this one computes)
  auto prefetch_grids = [&](const std::vector<int>& idx) {
    for (int i : idx) {
      train_feats->prefetch(train_record[i]);
      if (mirror_feats) mirror_feats->prefetch(mirror_record[i]);
    }
  };
  auto read_grids = [&](const std::vector<int>& idx, std::vector<float>& out) {
    out.resize(idx.size() * cache_L * cache_D);
    for (size_t k = 0; k < idx.size(); ++k)
      if (k < step_mirrored.size() && step_mirrored[k])
        mirror_feats->read(mirror_record[idx[k]], out.data() + k * cache_L * cache_D);
      else
        train_feats->read(train_record[idx[k]], out.data() + k * cache_L * cache_D);
  };
  // What a saved model records about its run and the epoch it ends.
  auto epoch_info = [&](int epoch, const json& val_scores) {
    return json{{"command", opt.command},     {"data", opt.data},       {"train_split", opt.train_split},
                {"val_data", opt.val_data.empty() ? opt.data : opt.val_data},
                {"val_split", opt.val_split}, {"git_commit", build_commit()}, {"epoch", epoch},
                {"val_scores", val_scores},   {"options", opt.to_json()}, {"started_from", opt.started_from}};
  };
  // --keep-epochs: each epoch's model as model-epochN.sat, beside the best one (rank 0 writes it).
  auto keep_epoch = [&](int epoch, const json& val_scores) {
    if (!lead) return;
    json best_info = model->info;  // the checkpoint goes on recording the best epoch's provenance
    model->info = epoch_info(epoch, val_scores);
    const std::string path = join_path(opt.out, "model-epoch" + std::to_string(epoch) + ".sat");
    model->save(path);
    model->info = best_info;
    note(lead, "kept epoch %d: %s\n", epoch, path.c_str());
  };
  // A run resumed at an epoch's end with --keep-epochs newly asked: the checkpoint holds that epoch's model.
  if (opt.keep_epochs && !resume_path.empty() && st.step_in_epoch == 0 && !st.history.empty() &&
      st.history.back().value("epoch", 0) == st.epoch &&
      !file_exists(join_path(opt.out, "model-epoch" + std::to_string(st.epoch) + ".sat")))
    keep_epoch(st.epoch, st.history.back().at("val"));

  DecoderCache cache;
  int64_t steps_this_run = 0;
  // What a step exchanges besides gradients and buffers: sums over the ranks' shares, for the log and the NaN check.
  enum Stat { kCrossEntropySum, kTokens, kPenaltySum, kRows, kAdvantageCount, kAdvantageSum, kAdvantageSquares,
              kRewardSum, kCaptions, kStats };
  std::unique_ptr<StepExchange> exchange;  // parallel runs only (as large as the gradients)
  if (parallel) exchange = std::make_unique<StepExchange>(params, kStats);
  std::set<const Param*> decoder_params;  // a buffer's weight is its rank's share of the rows (decoder) or photos
  for (Param* p : model->decoder->params()) decoder_params.insert(p);
  for (; st.epoch < opt.epochs; ++st.epoch, st.step_in_epoch = 0) {
    if (st.step_in_epoch == 0) st.epoch_seed = rng.engine();
    Rng order_rng(st.epoch_seed);
    std::vector<int> order(n_images);
    for (int i = 0; i < n_images; ++i) order[i] = i;
    shuffle(order, order_rng);
    const float lr = opt.lr * std::pow(opt.lr_decay, (float)st.epoch);
    char label[64];
    std::snprintf(label, sizeof label, "epoch %d/%d", st.epoch + 1, opt.epochs);
    Progress bar(label, steps_per_epoch);
    double loss_sum = 0, pen_sum = 0, adv_var_sum = 0;
    int loss_count = 0;
    int64_t captions_done = 0;
    auto t0 = std::chrono::steady_clock::now();
    const double sum_seconds_before = ranks.sum_seconds;
    // hard attention also shows the spread of the REINFORCE weights: the estimator's variance
    auto epoch_stats = [&](double captions_per_second) {
      char stats[200];
      const int n = std::max(loss_count, 1);
      if (self_critical)
        std::snprintf(stats, sizeof stats, "reward %.3f (samples' CIDEr-D)  %.0f cap/s", loss_sum / n, captions_per_second);
      else if (model->decoder_config.hard())
        std::snprintf(stats, sizeof stats, "loss %.3f  penalty %.3f  reinforce var %.3g  %.0f cap/s", loss_sum / n,
                      pen_sum / n, adv_var_sum / n, captions_per_second);
      else
        std::snprintf(stats, sizeof stats, "loss %.3f  penalty %.3f  %.0f cap/s", loss_sum / n, pen_sum / n,
                      captions_per_second);
      std::string line = stats;
      if (parallel) {
        const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        std::snprintf(stats, sizeof stats, "  allreduce %.0f%%", 100 * (ranks.sum_seconds - sum_seconds_before) / secs);
        line += stats;
      }
      return line;
    };
    const int samples = model->decoder_config.hard() ? opt.hard_samples : 1;  // decoder rows per caption
    for (int s = st.step_in_epoch; s < steps_per_epoch; ++s) {
      // The global batch, and this rank's contiguous share of its photos (every rank draws the same numbers from
      // rng, so the batch, the captions chosen and the step's seed are the same everywhere).
      auto step_batch = [&](int step) {
        return std::vector<int>(order.begin() + std::min<size_t>((size_t)step * opt.batch_images, order.size()),
                                order.begin() + std::min<size_t>((size_t)(step + 1) * opt.batch_images, order.size()));
      };
      auto share_in = [&](const std::vector<int>& photos) {
        const Share sh = share_of((int)photos.size(), ranks.size(), ranks.rank());
        return std::vector<int>(photos.begin() + sh.begin, photos.begin() + sh.end);
      };
      const std::vector<int> batch = step_batch(s);
      const Share mine = share_of((int)batch.size(), ranks.size(), ranks.rank());
      const std::vector<int> idx = share_in(batch);
      const int n = (int)idx.size();
      if (from_features) {
        prefetch_grids(idx);
        // the next step's share of photos, read while this step computes
        if (s + 1 < steps_per_epoch) prefetch_grids(share_in(step_batch(s + 1)));
      }
      auto load_grids = [&](bool training) {  // this rank's photos through the encoder (or the cache)
        if (from_features) {
          read_grids(idx, grid);
          if (tuned) {
            tuned->forward(grid.data(), n, training && tail_learns, tuned_grid);
            grid.swap(tuned_grid);
          }
        } else {
          train_bank.planes(idx, model->encoder_config, planes);
          model->encoder->forward(planes.data(), n, training, grid);
        }
      };
      const uint64_t step_seed = rng.engine();  // dropout masks, glimpses and samples: one stream per caption
      // --mirror-features: which photos of the global batch are read mirrored (from the step's seed, so every rank
      // and a resumed run choose alike; the run's other random numbers are those of a run without it)
      std::vector<char> batch_mirrored(mirror_feats ? batch.size() : 0);
      for (size_t k = 0; k < batch_mirrored.size(); ++k)
        batch_mirrored[k] = RowRng(row_seed(step_seed ^ 0x6d6972726f72ull, k)).uniform() < opt.mirror_prob;
      step_mirrored.clear();
      if (mirror_feats) step_mirrored.assign(batch_mirrored.begin() + mine.begin, batch_mirrored.begin() + mine.end);
      std::vector<double> stats(kStats, 0.0);
      double my_rows = 0, all_rows = 0;  // decoder rows: this rank's and the global batch's
      if (self_critical) {
        if (n > 0) load_grids(false);  // the encoder stays as it is
        SelfCriticalStep r = self_critical_step(*model, grid.data(), idx, *cider, opt.scst_samples, step_seed,
                                                mine.begin, ranks, cache);
        stats[kRewardSum] = r.reward_sum;
        stats[kCaptions] = r.captions;
        my_rows = n, all_rows = (double)batch.size();
      } else {
        // The global batch's captions (hard attention: several glimpse samples of each), in photo order; this rank's
        // rows are those of its photos. Each row's random stream is seeded by its place in the global batch.
        std::vector<std::vector<int>> caps;
        std::vector<int> cap_image;  // the row's photo, its place in the global batch
        for (int k = 0; k < (int)batch.size(); ++k) {
          std::vector<int> ci = train_set.images[batch[k]].caption_indices;
          if (opt.captions_per_image > 0 && (int)ci.size() > opt.captions_per_image) {
            shuffle(ci, rng);
            ci.resize(opt.captions_per_image);
          }
          const bool mirrored = !batch_mirrored.empty() && batch_mirrored[k];
          for (int c : ci)
            for (int r = 0; r < samples; ++r)
              caps.push_back(mirrored ? mirrored_caption_ids[c] : caption_ids[c]), cap_image.push_back(k);
        }
        if (caps.empty()) continue;  // alike on every rank
        int64_t global_tokens = 0;   // as CaptionBatch::from_ids masks them: the words kept, and <end>
        for (auto& c : caps) global_tokens += std::min((int)c.size(), opt.max_len) + 1;
        const int first = (int)(std::lower_bound(cap_image.begin(), cap_image.end(), mine.begin) - cap_image.begin());
        const int last = (int)(std::lower_bound(cap_image.begin(), cap_image.end(), mine.end) - cap_image.begin());
        const int B = last - first;
        if (B > 0) {
          load_grids(true);
          F = Eigen::Map<Mat>(grid.data(), (int64_t)n * L, D);
          CaptionBatch cb = CaptionBatch::from_ids({caps.begin() + first, caps.begin() + last}, opt.max_len);
          for (int r = first; r < last; ++r) {
            cb.grid.push_back(cap_image[r] - mine.begin);  // the captions of an image read its grid once
            cb.row_seed.push_back(row_seed(step_seed, r));
          }
          cb.label_smoothing = opt.label_smoothing;
          cb.norm_tokens = global_tokens;
          cb.norm_rows = (int)caps.size();
          if (model->decoder_config.hard()) {
            cb.samples = samples;
            const double progress =
                opt.hard_soft_warmup > 0 ? (st.epoch + (double)s / steps_per_epoch) / opt.hard_soft_warmup : 1.0;
            model->decoder->set_hard_soft_prob(
                (float)(opt.hard_soft_prob + (1.0 - opt.hard_soft_prob) * std::max(0.0, 1.0 - progress)));
          }
          DecoderLoss loss = model->decoder->forward(F, cb, opt.penalty, true, nullptr, cache);
          const bool encoder_learns = !from_features || tail_learns;
          model->decoder->backward(cache, encoder_learns ? &dF : nullptr);
          if (encoder_learns) {
            // dF: one block per image, summed over its captions by the decoder
            if (tuned) tuned->backward(dF.data());
            else model->encoder->backward(dF.data());
          }
          stats[kCrossEntropySum] = loss.cross_entropy * loss.tokens;
          stats[kTokens] = (double)loss.tokens;
          stats[kPenaltySum] = loss.penalty * B;
          stats[kAdvantageCount] = (double)loss.advantage_count;
          stats[kAdvantageSum] = loss.advantage_mean * loss.advantage_count;
          stats[kAdvantageSquares] =
              (loss.advantage_var + loss.advantage_mean * loss.advantage_mean) * loss.advantage_count;
        }
        stats[kRows] = B;
        stats[kCaptions] = B;
        my_rows = B, all_rows = (double)caps.size();
      }
      if (parallel) {  // the global batch's gradient, buffers and statistics, alike on every rank
        std::vector<float> buffer_weight(params.size());
        for (size_t k = 0; k < params.size(); ++k)
          buffer_weight[k] = (float)(decoder_params.count(params[k]) ? my_rows / all_rows : (double)n / batch.size());
        exchange->pack(params, buffer_weight, stats);
        ranks.sum(exchange->data(), exchange->size(), "the gradients of step " + std::to_string(st.global_step + 1));
        exchange->unpack(params, stats);
      }
      Adam::clip_grad_norm(params, opt.clip);
      adam.update(params, lr, &lr_scale);
      for (auto* p : params) p->zero_grad();
      if (self_critical) {
        loss_sum += stats[kRewardSum] / std::max(stats[kCaptions], 1.0);
      } else {
        const double cross_entropy = stats[kTokens] > 0 ? stats[kCrossEntropySum] / stats[kTokens] : 0.0;
        const double penalty = stats[kRows] > 0 ? stats[kPenaltySum] / stats[kRows] : 0.0;
        if (!std::isfinite(cross_entropy + penalty))
          throw Error("train: loss became " + std::to_string(cross_entropy + penalty) + " at step " +
                      std::to_string(st.global_step) + " (try a lower --lr)");
        loss_sum += cross_entropy;
        pen_sum += penalty;
        if (stats[kAdvantageCount] > 0) {
          const double mean = stats[kAdvantageSum] / stats[kAdvantageCount];
          adv_var_sum += std::max(0.0, stats[kAdvantageSquares] / stats[kAdvantageCount] - mean * mean);
        }
      }
      ++loss_count;
      captions_done += (int64_t)stats[kCaptions];
      ++st.global_step;
      st.step_in_epoch = s + 1;
      double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      if (lead) bar.update(s + 1, epoch_stats(captions_done / std::max(secs, 1e-9)));
      if (lead && opt.checkpoint_every > 0 && st.global_step % opt.checkpoint_every == 0 && s + 1 < steps_per_epoch)
        save_checkpoint(ckpt_path, *model, adam, opt, st, rng);
      if (stop_after_steps > 0 && ++steps_this_run == stop_after_steps && s + 1 < steps_per_epoch) {
        if (lead) save_checkpoint(ckpt_path, *model, adam, opt, st, rng);
        note(lead, "\nstopped after %lld steps (epoch %d, step %d); continue with --resume %s\n",
             (long long)stop_after_steps, st.epoch + 1, st.step_in_epoch, ckpt_path.c_str());
        summary.best_score = st.best_score;
        summary.best_epoch = st.best_epoch;
        summary.metric = opt.metric;
        return summary;
      }
    }
    double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (lead) bar.finish(epoch_stats(captions_done / std::max(secs, 1e-9)));
    // Every rank stepped alike from the same sums: a rank whose weights drifted would go on training another model.
    if (parallel &&
        !ranks.same_everywhere(parameter_checksum(params), "the weights after epoch " + std::to_string(st.epoch + 1)))
      throw Error("train: the ranks' weights differ after epoch " + std::to_string(st.epoch + 1) +
                  " (their sums of the gradients differed)");

    CaptionScores sc = run_validation();
    const double score = metric_of(sc, opt.metric);
    bool improved = score > st.best_score;
    st.history.push_back({{"epoch", st.epoch + 1}, {self_critical ? "reward" : "loss", loss_count ? loss_sum / loss_count : 0.0},
                          {"val", sc.to_json()}});
    note(lead, "epoch %d: val BLEU-4 %.4f  CIDEr-D %.4f  ROUGE-L %.4f%s\n", st.epoch + 1, sc.bleu[3], sc.cider_d,
         sc.rouge_l, improved ? "  (best so far, saved)" : "");
    if (improved) {
      st.best_score = score;
      st.best_epoch = st.epoch + 1;
      st.bad_epochs = 0;
      model->info = epoch_info(st.epoch + 1, sc.to_json());
      if (lead) model->save(best_path);
    } else {
      st.bad_epochs++;
    }
    if (opt.keep_epochs) keep_epoch(st.epoch + 1, sc.to_json());
    bool stop = st.bad_epochs >= opt.patience;
    // The checkpoint describes the start of the next epoch.
    TrainState next = st;
    next.epoch = st.epoch + 1;
    next.step_in_epoch = 0;
    if (stop) next.epoch = opt.epochs;
    if (lead) save_checkpoint(ckpt_path, *model, adam, opt, next, rng);
    summary.epochs_run++;
    if (stop) {
      note(lead, "early stop: no improvement for %d epochs\n", opt.patience);
      break;
    }
  }
  summary.best_score = st.best_score;
  summary.best_epoch = st.best_epoch;
  summary.metric = opt.metric;
  return summary;
}

}  // namespace sat
