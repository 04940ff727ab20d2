// A training run's setup (train/trainer_steps.hpp): the checkpoint it resumes, its options checked, its data, the
// model (fresh, from --init-from, or with more of its encoder fine-tuned), the optimizer and the caches the steps
// read (feature caches, decoded photos, captions as word ids).
#include <cmath>
#include <cstdarg>
#include <cstdio>
#include <map>
#include <omp.h>
#include <set>

#include "datasets/io.hpp"
#include "datasets/json_checks.hpp"
#include "train/extract.hpp"
#include "train/model_surgery.hpp"
#include "train/object_mentions.hpp"
#include "train/progress.hpp"
#include "train/trainer_steps.hpp"
#include "vision/image.hpp"

namespace sat {

using nlohmann::json;

std::vector<std::string> mirror_caption(const std::vector<std::string>& tokens) {
  std::vector<std::string> out = tokens;
  for (auto& w : out)
    if (w == "left")
      w = "right";
    else if (w == "right")
      w = "left";
  return out;
}

CaptionSet load_caption_set(const std::string& data, const std::string& images, const std::string& split) {
  CaptionSet set;
  const bool is_dir = is_directory(data);
  // A Karpathy split file names its splits inside: --train-split train (or val, test, restval).
  const bool named_split =
      (split == "train" || split == "val" || split == "test" || split == "restval") && !file_exists(split);
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

namespace trainer {

void ImageBank::load(const CaptionSet& set, int S, const std::string& label, bool show) {
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

void ImageBank::planes(const std::vector<int>& idx, const EncoderConfig& cfg, std::vector<float>& out) const {
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

void note(bool lead, const char* format, ...) {
  if (!lead) return;
  va_list args;
  va_start(args, format);
  std::vfprintf(stderr, format, args);
  va_end(args);
}

namespace {

// One line on how a model was made, from its info: the model --init-from names, its training command, recipe and
// epoch, the steps after training (averaged, compacted, search settings), and where it started from in turn.
std::string provenance_of(const std::string& path, const json& info) {
  std::string out = path;
  const char* sep = ": ";
  for (const char* key :
       {"command", "recipe", "epoch", "averaged", "compacted", "search_set", "rebased", "started_from"}) {
    if (!info.is_object() || !info.contains(key)) continue;
    const json& v = info[key];
    const std::string text = v.is_string() ? v.get<std::string>() : v.dump();
    if (text.empty()) continue;
    out += sep + std::string(key) + " " + text;
    sep = "; ";
  }
  return out;
}

// --resume: the options, state, random numbers, optimizer step and model the checkpoint holds. Returns its tensors,
// whose Adam moments are read once the model's parameters are attached (attach_optimizer).
TensorFile read_checkpoint(TrainRun& run) {
  const std::string& resume_path = run.resume_path;
  TrainOptions& opt = run.opt;
  const int threads_asked = opt.threads;  // a resumed run may use another thread count: it changes speed only
  TensorFile ckpt = load_safetensors(resume_path);
  if (!ckpt.metadata.count("checkpoint")) fail(resume_path, "not a training checkpoint (no optimizer state)");
  json c;
  try {
    c = parse_json_checked(ckpt.metadata["checkpoint"], resume_path, "checkpoint state is malformed");
    opt = TrainOptions::from_json(c.at("options"));
    run.st = TrainState::from_json(c.at("state"));
    run.rng.set_state(c.at("rng").get<std::string>());
    run.adam.step = c.at("adam_step");
  } catch (const Error& e) {
    std::string msg = e.what();
    if (msg.rfind(resume_path, 0) == 0) throw;
    fail(resume_path, msg);
  } catch (const std::exception& e) {
    fail(resume_path, std::string("checkpoint state is malformed (") + e.what() + ")");
  }
  run.model = CaptionModel::from_tensor_file(ckpt, resume_path);
  // Continue where the checkpoint lies (it may have been moved since).
  auto slash = resume_path.rfind('/');
  opt.out = slash == std::string::npos ? "." : resume_path.substr(0, slash);
  if (threads_asked > 0) opt.threads = threads_asked;
  return ckpt;
}

// --language-captions: a new decoder over grids read from a cache (a frozen encoder's), in one process.
void check_language_options(const TrainRun& run) {
  const TrainOptions& opt = run.opt;
  if (opt.language_captions.empty() != (opt.language_epochs == 0))
    throw Error("train: --language-epochs needs --language-captions (and they need at least one epoch)");
  if (opt.language_captions.empty() || !run.resume_path.empty()) return;
  if (opt.objective != "xe") throw Error("train: --language-captions is for cross-entropy training, not --objective cider");
  if (!opt.init_from.empty() && !opt.fresh_decoder)
    throw Error("train: --language-captions trains a new decoder: with --init-from, give --fresh-decoder too");
  if (opt.init_from.empty() && opt.encoder.empty())
    throw Error("train: --language-captions needs a pretrained --encoder (its grids come from a feature cache)");
  if (!opt.tune_from.empty()) throw Error("train: --language-captions needs a frozen encoder, not --tune-from");
  if (opt.neighbour_words > 0)
    throw Error("train: --language-captions trains on text alone, not with --neighbour-words");
  if (run.parallel) throw Error("train: --language-captions runs in one process, not under mpirun yet");
}

// What a resumed run may change (ResumeOverrides), the thread count, and the checks of the training options.
void settle_options(TrainRun& run, const ResumeOverrides& more) {
  TrainOptions& opt = run.opt;
  if (more.epochs > 0) opt.epochs = more.epochs;
  if (more.patience > 0) opt.patience = more.patience;
  if (more.keep_epochs) opt.keep_epochs = true;
  if (opt.threads > 0) omp_set_num_threads(opt.threads);
  opt.precision = product_precision_name(parse_product_precision(
      opt.precision, run.resume_path.empty() ? "train: --precision" : "train: " + run.resume_path + ": its precision"));
  if (opt.metric != "bleu4" && opt.metric != "cider") throw Error("train: --metric must be bleu4 or cider");
  if (opt.batch_images < 1 || opt.epochs < 0 || opt.max_len < 1)
    throw Error("train: --batch and --max-len must be positive, --epochs not negative");
  if (opt.objective != "xe" && opt.objective != "cider") throw Error("train: --objective must be xe or cider");
  run.self_critical = opt.objective == "cider";
  const bool self_critical = run.self_critical;
  if (!(opt.label_smoothing >= 0 && opt.label_smoothing < 1)) throw Error("train: --label-smoothing must be in [0, 1)");
  if (!(opt.object_word_weight > 0 && opt.object_word_weight <= 100))
    throw Error("train: --object-word-weight must be in (0, 100]");
  if (self_critical && opt.object_word_weight != 1)
    throw Error("train: --object-word-weight is for cross-entropy training, not --objective cider");
  if (self_critical && opt.label_smoothing > 0)
    throw Error("train: --label-smoothing is for cross-entropy training, not --objective cider");
  if (self_critical && opt.scst_samples < 2)
    throw Error("train: --scst-samples must be at least 2 (the baseline is the other samples' mean)");
  check_language_options(run);
}

// The training and validation caption sets (--val-limit applied), and the output folder.
void load_data(TrainRun& run) {
  const TrainOptions& opt = run.opt;
  run.train_set = load_caption_set(opt.data, opt.images, opt.train_split);
  run.val_set = load_caption_set(opt.val_data.empty() ? opt.data : opt.val_data,
                                 opt.val_data.empty() ? opt.images : opt.val_images, opt.val_split);
  CaptionSet& val_set = run.val_set;
  if (opt.val_limit > 0 && (int)val_set.images.size() > opt.val_limit) {
    std::vector<std::string> names;
    for (int i = 0; i < opt.val_limit; ++i) names.push_back(val_set.images[i].file_name);
    val_set = val_set.subset(names, "--val-limit");
  }
  if (run.lead) make_dirs(opt.out);  // only rank 0 writes into it
}

// --objects with --init-from: the detector's object channels joined to the model's encoder grid (a tuned one's too), so
// a fresh decoder can read them; the model's own object channels, if any, stay unless --objects asks otherwise.
void join_object_channels(TrainRun& run) {
  const TrainOptions& opt = run.opt;
  CaptionModel& model = *run.model;
  EncoderConfig& e = model.encoder_config;
  if (opt.objects <= 0) {
    if (opt.objects_as != "maps") fail(opt.init_from, "--objects-as " + opt.objects_as + " without --objects SCALE");
    return;
  }
  if (e.object_channels > 0 && e.object_scale == opt.objects && e.object_form == opt.objects_as) return;
  if (!e.pretrained()) fail(opt.init_from, "object channels join a pretrained encoder's grid, and its is a small CNN");
  if (!valid_object_form(opt.objects_as))
    throw Error("train: --objects-as " + opt.objects_as + " is not " + kObjectForms);
  if (!opt.fresh_decoder)
    fail(opt.init_from, "its decoder reads " + std::to_string(e.feature_dim()) +
                            " features per location; new object channels need a decoder trained on them: give "
                            "--fresh-decoder too");
  e.object_channels = object_form_channels(opt.objects_as, (int)coco_class_names().size(), kCenternetTrunkChannels);
  e.object_scale = opt.objects, e.object_form = opt.objects_as;
  model.object_standardization = ObjectStandardization{};  // the new channels' own, once the caches are open
  model.build_photo_encoder();  // the encoder with the detector beside it (found like the encoder weights)
  note(run.lead, "object channels joined to its encoder's grid: %d (%s, scale %g)\n", e.object_channels,
       e.object_form.c_str(), e.object_scale);
}

// --neighbour-words with --init-from: the words the decoder will read the shares of, chosen from the model's caption
// memory. Whether the decoder must widen to read them (a model already reading them keeps its own).
bool join_neighbour_words(TrainRun& run) {
  const TrainOptions& opt = run.opt;
  CaptionModel& model = *run.model;
  NeighbourWords& nw = model.neighbour_words;
  if (opt.neighbour_words < 0 || opt.neighbour_words > kMaxNeighbourWords)
    throw Error("train: --neighbour-words must be in [0, " + std::to_string(kMaxNeighbourWords) + "]");
  if (nw.on()) {
    if (opt.neighbour_words != 0 && opt.neighbour_words != nw.count())
      fail(opt.init_from, "its decoder reads " + std::to_string(nw.count()) + " neighbour words, not " +
                              std::to_string(opt.neighbour_words));
    return false;
  }
  if (opt.neighbour_words == 0) return false;
  if (opt.neighbour_count < 1 || opt.neighbour_count > model.memory_photos())
    throw Error("train: --neighbour-count must be in [1, " + std::to_string(model.memory_photos()) +
                "] (the photos of " + opt.init_from + "'s caption memory)");
  if (!(opt.neighbour_scale > 0 && opt.neighbour_scale <= kMaxNeighbourWordScale))
    throw Error("train: --neighbour-scale must be in (0, " + std::to_string((int)kMaxNeighbourWordScale) + "]");
  model.memory->check_grid(model.encoder_config.feature_dim(), opt.init_from);  // the grid it finds neighbours by
  nw.words = most_said_words(*model.memory, model.vocab, opt.neighbour_words);
  if (nw.words.empty()) fail(opt.init_from, "its caption memory says none of its vocabulary's words");
  nw.neighbours = opt.neighbour_count, nw.scale = opt.neighbour_scale;
  note(run.lead,
       "its decoder reads the shares of %d words among the captions of each photo's %d nearest memory photos "
       "(x %g), from \"%s\" to \"%s\"\n",
       nw.count(), nw.neighbours, nw.scale, nw.words.front().c_str(), nw.words.back().c_str());
  return true;
}

// --init-from: the trained model the run starts from (its weights, vocabulary and sizes), with its decoder built
// anew from the seed under --fresh-decoder.
void start_from_model(TrainRun& run) {
  TrainOptions& opt = run.opt;
  std::unique_ptr<CaptionModel>& model = run.model;
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
  // decoder: the trained model is another one (sat model memory builds it a memory of its own). A decoder that reads
  // the neighbours' words keeps it: they come from it.
  const bool reads_neighbours = opt.neighbour_words > 0 || model->neighbour_words.on();
  if (reads_neighbours && !model->memory)
    fail(opt.init_from, "has no caption memory for --neighbour-words (sat model memory builds one)");
  if (!reads_neighbours) model->memory.reset();
  model->consensus = ConsensusSettings{};
  // int8 ranges stay: they describe the frozen part (the fine-tuned units always run in float32), which a later
  // --tune-from only shortens
  opt.started_from = provenance_of(opt.init_from, model->info);
  model->info = json::object();
  note(run.lead, "starting from %s\n", opt.init_from.c_str());
  join_object_channels(run);
  const bool widen = join_neighbour_words(run);
  if (opt.fresh_decoder) {  // a decoder built anew (every weight and bias from the seed), the same config
    DecoderConfig& c = model->decoder_config;  // but for the sizes given with --fresh-decoder
    if (opt.fresh_embed > 0) c.embed_dim = opt.fresh_embed;
    if (opt.fresh_hidden > 0) c.hidden_dim = opt.fresh_hidden;
    if (opt.fresh_attn > 0) c.attn_dim = opt.fresh_attn;
    if (opt.fresh_dropout >= 0) c.dropout = opt.fresh_dropout;
    if (!opt.fresh_order.empty()) c.order = opt.fresh_order;
    // object channels and neighbour words joined above widen it
    c.feature_dim = model->encoder_config.feature_dim() + model->neighbour_words.count();
    c = DecoderConfig::from_json(c.to_json());  // the config's own range checks
    model->decoder = std::make_unique<Decoder>(c);
    model->decoder->init(run.rng);
    note(run.lead,
         "its decoder starts afresh (seed %llu; embedding %d, hidden %d, attention %d, dropout %g, %s order); its "
         "encoder and vocabulary are kept\n",
         (unsigned long long)opt.seed, c.embed_dim, c.hidden_dim, c.attn_dim, c.dropout, c.order.c_str());
  } else if (widen) {
    model->decoder = widened_decoder(*model->decoder, model->neighbour_words.count());
    model->decoder_config = model->decoder->config();
  }
}

// --tune-from on a model that tunes fewer of its encoder's layers (or none): the model rebuilt with the layers after
// --tune-from tuned, its decoder's trained weights kept.
void tune_more_of_encoder(TrainRun& run) {
  const TrainOptions& opt = run.opt;
  std::unique_ptr<CaptionModel>& model = run.model;
  // A frozen model goes on training with its encoder's top units fine-tuned: the units after --tune-from start
  // from the weights file the model names, the decoder from the model's trained weights. A model that already
  // fine-tuned the units after a later layer tunes more of them: those keep their trained weights, the units
  // in between start from the weights file.
  const EncoderConfig& was = model->encoder_config;  // its object channels, if any, stay
  auto tuned = pretrained_encoder_model(model->encoder_weights_path, was.cut, was.input_size, false, false,
                                        was.object_channels > 0 ? was.object_scale : 0.f, was.object_form);
  tuned->encoder_config.tune_from = opt.tune_from;
  tuned->vocab = model->vocab;
  tuned->decoder_config = model->decoder_config;
  tuned->neighbour_words = model->neighbour_words;  // the decoder reads them from the memory kept for them
  if (model->neighbour_words.on()) tuned->memory = model->memory;
  tuned->max_len = model->max_len, tuned->beam = model->beam;
  tuned->length_norm = model->length_norm, tuned->no_repeat_ngram = model->no_repeat_ngram;
  tuned->beam_diversity = model->beam_diversity;
  // its encoder's arithmetic, and int8 ranges that still cover the (now shorter) frozen part
  tuned->encoder_precision = model->encoder_precision, tuned->encoder_int8_ranges = model->encoder_int8_ranges;
  tuned->object_standardization = model->object_standardization;  // the same channels, the same photos
  try {
    tuned->build();
  } catch (const Error& e) {
    throw Error("train: --tune-from " + opt.tune_from + " with " + opt.init_from + ": " + e.what());
  }
  std::vector<Param*> from = model->decoder->params(), to = tuned->decoder->params();
  if (from.size() != to.size()) throw Error("train: " + opt.init_from + ": its decoder does not rebuild alike");
  for (size_t k = 0; k < from.size(); ++k) {
    if (to[k]->shape != from[k]->shape)
      throw Error("train: " + opt.init_from + ": its decoder does not rebuild alike (" + from[k]->name + ")");
    to[k]->value = from[k]->value;
  }
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
  note(run.lead, "fine-tuning the encoder after %s, from the weights in %s%s\n", opt.tune_from.c_str(),
       model->encoder_weights_path.c_str(),
       kept.empty() ? "" : (" (the layers after " + kept + " from their fine-tuned weights)").c_str());
}

// A new model from the options: its encoder (pretrained, or the small CNN), the vocabulary of the training
// captions, the decoder, and every weight initialized from the seed.
void build_new_model(TrainRun& run) {
  const TrainOptions& opt = run.opt;
  std::unique_ptr<CaptionModel>& model = run.model;
  if (run.self_critical) throw Error("train: --objective cider fine-tunes a trained model: give it --init-from MODEL");
  if (!opt.encoder.empty()) {
    model = pretrained_encoder_model(opt.encoder, opt.cut, opt.encoder_size, false, false, opt.objects,
                                     opt.objects_as);  // built below
  } else {
    model = std::make_unique<CaptionModel>();
    model->encoder_config.input_size = opt.input_size;
    model->encoder_config.blocks = EncoderConfig::parse_blocks(opt.blocks);
    model->encoder_config.coord_channels = opt.coord_channels;
    model->encoder_config = EncoderConfig::from_json(model->encoder_config.to_json());  // validates
  }
  std::vector<std::vector<std::string>> caps;
  for (auto& c : run.train_set.captions) caps.push_back(c.tokens);
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
  model->init(run.rng);
}

// The model of the run: the checkpoint's (read already), --init-from's, or a new one.
void set_up_model(TrainRun& run) {
  const TrainOptions& opt = run.opt;
  const std::string& resume_path = run.resume_path;
  std::unique_ptr<CaptionModel>& model = run.model;
  if (!model && !opt.init_from.empty()) {
    start_from_model(run);
  } else if (opt.fresh_decoder && resume_path.empty()) {
    throw Error("train: --fresh-decoder needs --init-from MODEL (whose encoder and vocabulary it keeps)");
  }
  if (model && resume_path.empty() && !opt.tune_from.empty() && model->encoder_config.pretrained() &&
      model->encoder_config.tune_from != opt.tune_from && !model->encoder_weights_path.empty())
    tune_more_of_encoder(run);
  if (model && !opt.tune_from.empty() && model->encoder_config.tune_from != opt.tune_from)
    throw Error("train: --tune-from applies to a new model; " + (resume_path.empty() ? opt.init_from : resume_path) +
                " " +
                (model->encoder_config.tuned() ? "tunes its encoder after " + model->encoder_config.tune_from
                                               : "has a frozen encoder"));
  if (run.self_critical && model && model->decoder_config.hard())
    throw Error(
        "train: --objective cider needs a soft, local or no-attention model (hard attention samples its "
        "glimpses inside the cross-entropy objective)");
  if (!model) build_new_model(run);
}

// Adam over the model's parameters (a resumed run's moments from its checkpoint, which is let go of then), and the
// ranks' check that they start alike.
void attach_optimizer(TrainRun& run, TensorFile& ckpt) {
  const std::string& resume_path = run.resume_path;
  auto& params = run.params;
  params = run.model->params();
  run.adam.attach(params);
  if (!resume_path.empty()) {
    for (size_t k = 0; k < params.size(); ++k) {
      if (!params[k]->trainable) continue;
      run.adam.m[k] = ckpt.get("adam.m/" + params[k]->name, resume_path).value;
      run.adam.v[k] = ckpt.get("adam.v/" + params[k]->name, resume_path).value;
    }
    ckpt = TensorFile();
    note(run.lead, "resuming %s at epoch %d, step %d\n", resume_path.c_str(), run.st.epoch + 1, run.st.step_in_epoch);
  }
  // Every rank built or loaded its model from the same options, seed and files: they must hold the same weights.
  if (run.parallel && !run.ranks.same_everywhere(parameter_checksum(params), "the starting weights"))
    throw Error(
        "train: the ranks start from different weights (every rank needs the same options and files: is "
        "--resume or --init-from on a disk they share?)");
  if (run.parallel)
    note(run.lead, "data-parallel: %d ranks share each batch of %d photos (gradients summed across ranks)\n",
         run.ranks.size(), run.opt.batch_images);
  const CaptionModel& model = *run.model;
  note(run.lead, "train: %zu images, %zu captions; val: %zu images; vocabulary %d words; grid %dx%dx%d\n",
       run.train_set.images.size(), run.train_set.captions.size(), run.val_set.images.size(), model.vocab.size(),
       model.encoder_config.grid_h(), model.encoder_config.grid_w(), model.encoder_config.feature_dim());
}

// The grid sizes, whether grids come from feature caches, and a tuned encoder's blocks with their learning rate.
void set_up_encoder_side(TrainRun& run) {
  const TrainOptions& opt = run.opt;
  const CaptionModel& model = *run.model;
  run.L = model.encoder_config.locations(), run.D = model.decoder_config.feature_dim;  // with any neighbour words
  if (model.neighbour_words.on()) {  // each training photo's own memory photo, left out of its neighbours
    std::vector<std::vector<std::string>> refs;
    for (int i = 0; i < (int)run.train_set.images.size(); ++i) refs.push_back(run.train_set.references(i));
    run.own_memory_photo = own_memory_photos(*model.memory, refs);
    const int64_t found =
        std::count_if(run.own_memory_photo.begin(), run.own_memory_photo.end(), [](int p) { return p >= 0; });
    note(run.lead, "neighbour words: %lld of the %zu training photos are in the caption memory (their own left out)\n",
         (long long)found, run.own_memory_photo.size());
  }
  run.from_features = model.encoder_config.pretrained();
  // Cached grids: the encoder's output, or for a tuned encoder its frozen part's (the blocks run on them).
  const EncoderConfig cache_cfg = model.encoder_config.cache_config();
  run.cache_L = cache_cfg.locations(), run.cache_D = cache_cfg.feature_dim();
  TunableBlocks* tuned = run.tuned = model.tuned.get();
  run.tail_learns = tuned && opt.tune_lr > 0;  // --tune-lr 0: the tuned blocks run forward only
  if (opt.tune_lr < 0) throw Error("train: --tune-lr must not be negative");
  const auto& params = run.params;
  run.lr_scale.assign(params.size(), 1.f);  // tuned blocks step at tune_lr, the rest at lr
  if (tuned) {
    for (size_t k = 0; k < params.size(); ++k)
      for (auto& p : tuned->params())
        if (params[k] == &p) run.lr_scale[k] = opt.lr > 0 ? opt.tune_lr / opt.lr : 0.f;
    if (run.tail_learns)
      note(run.lead, "fine-tuning the encoder after %s up to %s (%.2f GMAC per image), learning rate %g\n",
           model.encoder_config.tune_from.c_str(), model.encoder_config.cut.c_str(), tuned->macs_per_image() / 1e9,
           opt.tune_lr);
    else
      note(run.lead, "the encoder's layers after %s up to %s run as they are (%.2f GMAC per image; --tune-lr 0)\n",
           model.encoder_config.tune_from.c_str(), model.encoder_config.cut.c_str(), tuned->macs_per_image() / 1e9);
  }
}

// The default feature cache, <out>/features.feat (set as opt.features): unless it is there already, the frozen
// encoder runs once over every training and validation photo into it.
void extract_features_once(TrainRun& run) {
  TrainOptions& opt = run.opt;
  CaptionModel& model = *run.model;
  opt.features = join_path(opt.out, "features.feat");
  if (file_exists(opt.features)) return;
  if (run.parallel)
    throw Error("train: " + opt.features +
                " is missing: under mpirun, make the feature cache first (sat extract, "
                "then --features), or run once in one process");
  std::vector<std::string> paths, names;
  std::set<std::string> seen;
  for (const CaptionSet* set : {&run.train_set, &run.val_set})
    for (auto& img : set->images)
      if (seen.insert(img.file_name).second) paths.push_back(set->image_path(img)), names.push_back(img.file_name);
  std::fprintf(stderr, "encoding %zu images once into %s\n", names.size(), opt.features.c_str());
  // with tuned layers, the frozen part's records (extract_features): the tuned blocks run on them at every step
  extract_features(model, paths, names, opt.features, ExtractOptions());
}

// Photos the cache left out as unreadable (sat extract --skip-bad) are left out here too, and said so.
void drop_skipped_photos(bool lead, CaptionSet& set, const FeatureCache& cache, const char* which) {
  std::vector<std::string> keep;
  for (auto& img : set.images)
    if (!cache.was_skipped(img.file_name)) keep.push_back(img.file_name);
  if (keep.size() == set.images.size()) return;
  note(lead,
       "%s: the feature cache lacks %zu of the %zu %s photos (unreadable when it was extracted); "
       "going on without them\n",
       cache.path().c_str(), set.images.size() - keep.size(), set.images.size(), which);
  if (keep.empty()) fail(cache.path(), std::string("the feature cache holds none of the ") + which + " photos");
  set = set.subset(keep, cache.path());
}

// A pretrained encoder's grids: the training, validation and (--mirror-features) mirrored feature caches, checked
// to hold this encoder's grids of every photo.
void open_feature_caches(TrainRun& run) {
  const TrainOptions& opt = run.opt;
  const CaptionModel& model = *run.model;
  // The frozen encoder runs once per image (sat extract); training reads the memory-mapped grids.
  if (opt.features.empty()) extract_features_once(run);
  run.train_feats = std::make_unique<FeatureCache>(opt.features);
  if (opt.val_features.empty() || opt.val_features == opt.features) {
    run.val_feats = run.train_feats.get();
  } else {
    run.val_feats_own = std::make_unique<FeatureCache>(opt.val_features);
    run.val_feats = run.val_feats_own.get();
  }
  drop_skipped_photos(run.lead, run.train_set, *run.train_feats, "training");
  drop_skipped_photos(run.lead, run.val_set, *run.val_feats, "validation");
  std::vector<std::string> train_names, val_names;
  for (auto& img : run.train_set.images) train_names.push_back(img.file_name);
  for (auto& img : run.val_set.images) val_names.push_back(img.file_name);
  run.train_feats->require(model.encoder_id(), train_names);
  run.val_feats->require(model.encoder_id(), val_names);
  if (!opt.mirror_features.empty()) {
    run.mirror_feats = std::make_unique<FeatureCache>(opt.mirror_features);
    run.mirror_feats->require(model.encoder_id(), train_names, true);
    note(run.lead, "mirror augmentation: each step reads a photo mirrored (from %s) with probability %g\n",
         opt.mirror_features.c_str(), opt.mirror_prob);
  }
}

// The small CNN's photos: every training and validation photo decoded once, and the validation ones as planes.
void load_image_banks(TrainRun& run) {
  const int S = run.model->encoder_config.input_size;
  run.train_bank.load(run.train_set, S, "loading train images", run.lead);
  run.val_bank.load(run.val_set, S, "loading val images", run.lead);
  if (run.parallel)
    note(run.lead,
         "the small CNN's batch norm normalizes each rank's share of a batch by the share's own statistics "
         "(running statistics are averaged): the model differs from a single process's beyond rounding\n");
  std::vector<int> all(run.val_set.images.size());
  for (size_t i = 0; i < all.size(); ++i) all[i] = (int)i;
  run.val_bank.planes(all, run.model->encoder_config, run.val_planes);
}

// Where the steps' grids come from: feature caches (a pretrained encoder), or the photos decoded (the small CNN).
void set_up_grid_sources(TrainRun& run) {
  const TrainOptions& opt = run.opt;
  if (!opt.mirror_features.empty()) {
    if (!run.from_features)
      throw Error("train: --mirror-features needs a pretrained --encoder (it is a feature cache of mirrored photos)");
    if (run.self_critical) throw Error("train: --mirror-features is for cross-entropy training, not --objective cider");
    if (!(opt.mirror_prob > 0 && opt.mirror_prob <= 1)) throw Error("train: --mirror-prob must be in (0, 1]");
  }
  if (run.from_features)
    open_feature_caches(run);
  else
    load_image_banks(run);
}

// A new model (or one given new object channels) whose object channels hold the detector's trunk: those channels
// standardized over the training photos (mean 0, spread kTrunkChannelSpread; the tags stay as they are), from up to
// kStandardizationPhotos of their records spread evenly through the set. The channels are the same at every location,
// so each record's rows count alike. A model that has its standardization (resumed, or started from) keeps it.
constexpr int kStandardizationPhotos = 1000;

void standardize_trunk_channels(TrainRun& run) {
  CaptionModel& model = *run.model;
  const EncoderConfig& e = model.encoder_config;
  if (!run.from_features || e.object_channels == 0 || !object_form_has_trunk(e.object_form) ||
      model.object_standardization.on())
    return;
  const int n = (int)run.train_set.images.size(), count = std::min(n, kStandardizationPhotos);
  const int K = e.object_channels, tags = (int)coco_class_names().size();
  ObjectChannelStats stats(K);
  std::vector<float> record((size_t)run.cache_L * run.cache_D);
  for (int k = 0; k < count; ++k) {
    run.train_feats->read(run.train_record[(int64_t)k * n / count], record.data());
    stats.add(record.data(), run.cache_L, run.cache_D, run.cache_D - K);
  }
  model.object_standardization = stats.standardization(tags, kTrunkChannelSpread);
  note(run.lead, "object channels: the trunk's %d standardized over %d training photos (mean 0, spread %g)\n",
       K - tags, count, kTrunkChannelSpread);
}

// Where the steps read each photo's grid, each caption as word ids (mirrored too, with --mirror-features), and the
// self-critical reward's scorer.
void index_training_data(TrainRun& run) {
  const CaptionSet& train_set = run.train_set;
  const CaptionModel& model = *run.model;
  run.train_record.resize(train_set.images.size());
  for (size_t i = 0; run.from_features && i < run.train_record.size(); ++i)
    run.train_record[i] = run.train_feats->index_of(train_set.images[i].file_name);
  run.caption_ids.resize(train_set.captions.size());
  for (size_t i = 0; i < run.caption_ids.size(); ++i)
    run.caption_ids[i] = model.vocab.encode(train_set.captions[i].tokens);
  if (run.mirror_feats) {
    for (auto& img : train_set.images) run.mirror_record.push_back(run.mirror_feats->index_of(img.file_name));
    for (auto& c : train_set.captions) run.mirrored_caption_ids.push_back(model.vocab.encode(mirror_caption(c.tokens)));
  }
  if (run.self_critical) {
    std::vector<std::vector<Tokens>> refs(train_set.images.size());
    for (size_t i = 0; i < refs.size(); ++i)
      for (int c : train_set.images[i].caption_indices) refs[i].push_back(train_set.captions[c].tokens);
    run.cider = std::make_unique<CiderDScorer>(refs);
  }
}

}  // namespace

TrainRun set_up_run(TrainOptions options, const std::string& resume_path, const ResumeOverrides& more,
                    Collective& ranks) {
  TrainRun run(ranks);
  run.rng = Rng(options.seed);
  run.opt = std::move(options);
  run.resume_path = resume_path;
  TensorFile ckpt;
  if (!resume_path.empty()) ckpt = read_checkpoint(run);
  settle_options(run, more);
  load_data(run);
  const bool pretrains_language = run.opt.language_epochs > 0 && resume_path.empty();
  if (pretrains_language) run.language_texts = load_caption_texts(run.opt.language_captions);
  set_up_model(run);
  run.model->decoder_precision =
      run.opt.precision == "bf16" ? ProductPrecision::bf16 : ProductPrecision::f32;  // resolved by settle_options
  run.model->apply_decoder_precision(/*as_asked=*/true);
  note(run.lead, "decoder products in %s\n",
       run.opt.precision == "bf16" ? "bf16 (float32 sums, master weights and Adam)" : "float32");
  attach_optimizer(run, ckpt);
  set_up_encoder_side(run);
  set_up_grid_sources(run);
  index_training_data(run);
  if (resume_path.empty()) standardize_trunk_channels(run);
  if (pretrains_language) {
    if (!run.from_features || run.tuned)
      throw Error("train: --language-captions needs grids read from a feature cache, without fine-tuned encoder blocks");
    pretrain_language(run);
  }
  const TrainOptions& opt = run.opt;
  run.ckpt_path = join_path(opt.out, "checkpoint.sat");
  run.best_path = join_path(opt.out, "model.sat");
  run.n_images = (int)run.train_set.images.size();
  run.steps_per_epoch = (run.n_images + opt.batch_images - 1) / opt.batch_images;
  run.word_weight = object_word_weights(run.model->vocab, opt.object_word_weight);
  return run;
}

std::vector<float> object_word_weights(const Vocab& vocab, float object_weight) {
  if (object_weight == 1) return {};
  std::vector<float> out(vocab.size(), 1.f);
  for (const ObjectGroup& g : object_groups())
    if (g.rare)
      for (const std::string& w : g.words)
        if (vocab.contains(w)) out[vocab.id(w)] = object_weight;
  return out;
}

}  // namespace trainer

}  // namespace sat
