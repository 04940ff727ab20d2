#include "train/model.hpp"

#include <algorithm>
#include <cctype>
#include <cstdio>
#include <filesystem>
#include <set>

#include "datasets/json_checks.hpp"
#include "datasets/features.hpp"
#include "vision/image.hpp"

namespace sat {

static const char* kFormat = "sat-caption-model";
static const int kVersion = 1;

// Where an ensemble's k-th decoder (k >= 2) keeps its tensors in the model file.
static std::string member_prefix(int k) { return "member" + std::to_string(k) + "/"; }

// Each parameter's value from the file's tensor named prefix + its name, its shape checked. True when any of
// them was stored as float16.
static bool read_params(const std::vector<Param*>& params, const TensorFile& tf, const std::string& prefix,
                        const std::string& path) {
  bool half = false;
  for (Param* p : params) {
    const std::string name = prefix + p->name;
    if (auto h = tf.mapped_half.find(name); h != tf.mapped_half.end()) {  // converted straight into the parameter
      if (h->second.shape != p->shape)
        fail(path, "tensor '" + name + "' has shape " + shape_str(h->second.shape) + ", expected " + shape_str(p->shape));
      h->second.to_floats(p->value.data());
      half = true;
      continue;
    }
    const Param& src = tf.get(name, path);
    if (src.shape != p->shape)
      fail(path, "tensor '" + name + "' has shape " + shape_str(src.shape) + ", expected " + shape_str(p->shape));
    p->value = src.value;
    if (tf.half.count(name)) half = true;
  }
  return half;
}

std::vector<Decoder*> CaptionModel::member_decoders() {
  std::vector<Decoder*> out{decoder.get()};
  for (auto& d : more_members) out.push_back(d.get());
  return out;
}

void CaptionModel::build(bool sync_encoder) {
  decoder_config.vocab_size = vocab.size();
  decoder_config.feature_dim = encoder_config.feature_dim();
  decoder_config.grid_h = encoder_config.grid_h();
  decoder_config.grid_w = encoder_config.grid_w();
  decoder_config = DecoderConfig::from_json(decoder_config.to_json());  // validates the attention choice
  build_encoder(sync_encoder);
  decoder = std::make_unique<Decoder>(decoder_config);
}

std::unique_ptr<CaptionModel> pretrained_encoder_model(const std::string& encoder_file, const std::string& cut, int size,
                                                       bool raw, bool build) {
  PretrainedNet net = load_pretrained_net(encoder_file);
  auto m = std::make_unique<CaptionModel>();
  try {
    m->encoder_config =
        EncoderConfig::make_pretrained(net.graph, cut, size > 0 ? size : net.input_size, net.mean, net.stdev, raw);
  } catch (const Error& e) {
    fail(encoder_file, e.what());
  }
  if (!net.external_file.empty()) m->encoder_weights_path = encoder_file;
  m->encoder_config.weights_file = net.external_file;
  m->encoder_config.weights_sha256 = net.external_sha256;
  m->encoder_weights =
      std::make_shared<const TensorFile>(select_tensors(m->encoder_config.graph, std::move(net.weights), encoder_file));
  if (build) m->build_encoder();
  return m;
}

void CaptionModel::build_encoder(bool sync_encoder) {
  if (encoder_config.pretrained()) {
    if (!encoder_weights) throw Error("a pretrained encoder's weights are not set");
    encoder.reset();
    tuned.reset();
    if (encoder_config.tuned())
      tuned = std::make_unique<TunableBlocks>(encoder_config.graph, *encoder_weights, encoder_config.tune_from,
                                              encoder_config.input_size, "encoder weights");
    if (sync_encoder || !tuned) sync_tuned();
  } else {
    pretrained.reset();
    tuned.reset();
    encoder = std::make_unique<CnnEncoder>(encoder_config);
  }
}

void CaptionModel::sync_tuned() {
  // The encoder shares the imported weights (ResNet-101: 110 MB as float32, not copied); the tuned units' trained
  // weights reach it as an overlay, the graph's tuned nodes renamed to them (TunableBlocks::write_back).
  NetGraph graph = encoder_config.graph;
  TensorFile overlay;
  if (tuned) tuned->write_back(graph, overlay);
  const Precision precision = encoder_precision_in_use();
  if (precision == Precision::int8 && encoder_int8_ranges.empty())
    throw Error("its encoder in int8 needs activation ranges calibrated on photos, and it has none (sat model "
                "calibrate writes a copy with them)");
  pretrained = std::make_unique<PretrainedEncoder>(graph, encoder_weights, std::move(overlay), encoder_config.input_size,
                                                   "encoder weights", precision,
                                                   precision == Precision::int8 ? encoder_int8_ranges : Int8Ranges());
}

void CaptionModel::drop_int8_ranges() {
  encoder_int8_ranges.clear();
  if (encoder_precision == PrecisionChoice::int8) encoder_precision = PrecisionChoice::auto_;
}

Precision CaptionModel::encoder_precision_in_use() const {
  if (encoder_precision_override) return resolve(*encoder_precision_override);
  return resolve(encoder_precision_setting().value_or(encoder_precision));
}

Mat CaptionModel::features_from_cache(const float* grids, int n) {
  const int64_t rows = (int64_t)n * encoder_config.locations();
  if (!tuned) return Eigen::Map<const Mat>(grids, rows, encoder_config.feature_dim());
  std::vector<float> out;
  tuned->forward(grids, n, false, out);
  return Eigen::Map<const Mat>(out.data(), rows, encoder_config.feature_dim());
}

std::string CaptionModel::encoder_id() const {
  const EncoderConfig cfg_used = encoder_config.cache_config();
  std::string cfg = cfg_used.to_json().dump();
  uint64_t h = fnv1a64(cfg.data(), cfg.size());
  auto* self = const_cast<CaptionModel*>(this);
  if (encoder_config.pretrained() && !encoder_config.weights_file.empty()) {
    // the config names the weights file by its sha256: hashing the config covers the weights
  } else if (encoder_config.pretrained()) {
    const TensorFile used = encoder_config.tuned() ? select_tensors(cfg_used.graph, *encoder_weights, "encoder weights")
                                                   : TensorFile();
    const TensorFile& w = encoder_config.tuned() ? used : *encoder_weights;
    for (auto& [name, t] : w.quantized) {
      h = fnv1a64(name.data(), name.size(), h);
      h = fnv1a64(&t.min, 4, h), h = fnv1a64(&t.scale, 4, h);
      h = fnv1a64(t.data.data(), t.data.size(), h);
    }
    for (auto& [name, p] : w.tensors) {
      h = fnv1a64(name.data(), name.size(), h);
      h = fnv1a64(p.value.data(), p.value.size() * 4, h);
    }
    for (auto& [name, t] : w.mapped_half) {
      h = fnv1a64(name.data(), name.size(), h);
      h = fnv1a64(t.data, (size_t)t.size() * 2, h);
    }
  } else {
    for (auto& p : self->encoder->params()) h = fnv1a64(p.value.data(), p.value.size() * 4, h);
  }
  char buf[32];
  std::snprintf(buf, sizeof buf, "%016llx", (unsigned long long)h);
  return buf;
}

void CaptionModel::init(Rng& rng) {
  if (encoder) encoder->init(rng);
  decoder->init(rng);
}

std::vector<Param*> CaptionModel::params() {
  std::vector<Param*> out;
  if (encoder)
    for (auto& p : encoder->params()) out.push_back(&p);
  if (tuned)
    for (auto& p : tuned->params()) out.push_back(&p);
  for (auto* p : decoder->params()) out.push_back(p);
  return out;
}

TensorFile CaptionModel::to_tensor_file() const {
  TensorFile tf;
  tf.metadata["format"] = kFormat;
  tf.metadata["version"] = std::to_string(kVersion);
  tf.metadata["encoder"] = encoder_config.to_json().dump();
  tf.metadata["decoder"] = decoder_config.to_json().dump();
  tf.metadata["vocab"] = nlohmann::json(vocab.words).dump();
  tf.metadata["max_len"] = std::to_string(max_len);
  tf.metadata["length_norm"] = nlohmann::json(length_norm).dump();
  tf.metadata["beam"] = std::to_string(beam);
  tf.metadata["no_repeat_ngram"] = std::to_string(no_repeat_ngram);
  if (beam_diversity.groups > 1)
    tf.metadata["beam_diversity"] =
        nlohmann::json{{"groups", beam_diversity.groups}, {"penalty", beam_diversity.penalty}}.dump();
  if (encoder_precision != PrecisionChoice::f32) tf.metadata["encoder_precision"] = precision_name(encoder_precision);
  if (!encoder_int8_ranges.empty()) tf.metadata["encoder_int8_ranges"] = int8_ranges_to_json(encoder_int8_ranges).dump();
  tf.metadata["info"] = info.dump();
  auto* self = const_cast<CaptionModel*>(this);
  for (auto* p : self->params()) {
    Param copy(p->name, p->shape, false);
    copy.value = p->value;
    tf.tensors.emplace(p->name, std::move(copy));
  }
  if (half_precision) {  // the decoder and tuned blocks: batch-norm statistics of a CNN encoder can be too small
    for (auto* p : decoder->params()) tf.half.insert(p->name);
    if (tuned)
      for (auto& p : tuned->params()) tf.half.insert(p.name);
  }
  if (!more_members.empty()) {
    nlohmann::json configs = nlohmann::json::array();
    for (size_t k = 0; k < more_members.size(); ++k) {
      configs.push_back(more_members[k]->config().to_json());
      const std::string prefix = member_prefix((int)k + 2);
      for (auto* p : more_members[k]->params()) {
        Param copy(prefix + p->name, p->shape, false);
        copy.value = p->value;
        if (half_precision) tf.half.insert(copy.name);
        tf.tensors.emplace(copy.name, std::move(copy));
      }
    }
    tf.metadata["ensemble"] = configs.dump();
  }
  if (memory) {  // consensus reranking: the training photos' pooled grid vectors (float16) and their captions
    nlohmann::json settings = {{"neighbours", consensus.neighbours}, {"weight", consensus.weight}};
    if (consensus.memory_candidates > 0) settings["memory_candidates"] = consensus.memory_candidates;  // absent: 0
    if (memory->pooling != KeyPooling::mean) settings["key_pooling"] = key_pooling_name(memory->pooling);  // absent: mean
    tf.metadata["consensus"] = settings.dump();
    tf.metadata["memory_captions"] = nlohmann::json(memory->captions).dump();
    Param keys(kMemoryKeys, {memory->keys.rows(), memory->keys.cols()}, false);
    std::copy(memory->keys.data(), memory->keys.data() + memory->keys.size(), keys.value.begin());
    tf.tensors.emplace(kMemoryKeys, std::move(keys));
    tf.half.insert(kMemoryKeys);
  }
  // A pretrained encoder's weights named by file and sha256 are found at load; a small CNN's are its params above.
  if (!encoder_config.weights_file.empty() || !encoder_weights) return tf;
  for (auto& [name, p] : encoder_weights->tensors) {
    Param copy(name, p.shape, false);
    copy.value = p.value;
    tf.tensors.emplace(name, std::move(copy));
  }
  for (auto& [name, q] : encoder_weights->quantized) tf.quantized[name] = q;
  for (auto& [name, h] : encoder_weights->mapped_half) tf.mapped_half[name] = h;
  return tf;
}

void CaptionModel::save(const std::string& path) const { save_safetensors(path, to_tensor_file()); }

std::unique_ptr<CaptionModel> CaptionModel::from_tensor_file(const TensorFile& tf, const std::string& path,
                                                             const std::string& weights_dir,
                                                             std::optional<PrecisionChoice> encoder_precision) {
  if (tf.metadata.count("format") == 0 || tf.metadata.at("format") != kFormat)
    fail(path, "not a sat caption model (no \"format\": \"" + std::string(kFormat) + "\" in its header)");
  if (tf.meta("version", path) != std::to_string(kVersion))
    fail(path, "model file version " + tf.meta("version", path) + " is not supported (expected " +
                   std::to_string(kVersion) + ")");
  auto m = std::make_unique<CaptionModel>();
  m->encoder_precision_override = encoder_precision;
  std::shared_ptr<WeightsHashHeadStart> weights_hash;
  try {
    m->encoder_config = EncoderConfig::from_json(parse_json_checked(tf.meta("encoder", path), path, "model header is malformed"));
    // The encoder's weights file, when the model names one, is hashed on a thread from here on, beside the rest
    // of the loading (load_external_weights waits for it before anything uses the weights).
    if (m->encoder_config.pretrained() && !m->encoder_config.weights_file.empty())
      weights_hash = start_weights_hash(m->encoder_config.weights_file, weights_dir);
    m->decoder_config = DecoderConfig::from_json(parse_json_checked(tf.meta("decoder", path), path, "model header is malformed"));
    m->vocab = Vocab::from_words(parse_json_checked(tf.meta("vocab", path), path, "model header is malformed").get<std::vector<std::string>>(), path);
    m->max_len = std::stoi(tf.meta("max_len", path));
    if (tf.metadata.count("length_norm")) {  // files written before it existed use 1
      m->length_norm = parse_json_checked(tf.metadata.at("length_norm"), path, "model header is malformed").get<double>();
      if (!(m->length_norm >= 0 && m->length_norm <= 2)) fail(path, "length_norm must be in [0, 2]");
    }
    if (tf.metadata.count("beam")) {  // files written before it existed use 3
      m->beam = parse_json_checked(tf.metadata.at("beam"), path, "model header is malformed").get<int>();
      if (m->beam < 1 || m->beam > kMaxBeam) fail(path, "beam must be in [1, " + std::to_string(kMaxBeam) + "]");
    }
    if (tf.metadata.count("no_repeat_ngram")) {  // files written before it existed use 0 (off)
      m->no_repeat_ngram = parse_json_checked(tf.metadata.at("no_repeat_ngram"), path, "model header is malformed").get<int>();
      if (m->no_repeat_ngram < 0 || m->no_repeat_ngram > kMaxNoRepeat)
        fail(path, "no_repeat_ngram must be in [0, " + std::to_string(kMaxNoRepeat) + "]");
    }
    if (tf.metadata.count("beam_diversity")) {  // files without it search one group
      const auto d = parse_json_checked(tf.metadata.at("beam_diversity"), path, "model header is malformed");
      m->beam_diversity.groups = d.at("groups").get<int>();
      m->beam_diversity.penalty = d.at("penalty").get<double>();
      try {
        check_diversity(m->beam_diversity, m->beam);
      } catch (const Error& e) {
        fail(path, std::string("beam_diversity: ") + e.what());
      }
    }
    if (tf.metadata.count("encoder_precision")) m->encoder_precision = parse_precision(tf.metadata.at("encoder_precision"));
    if (tf.metadata.count("encoder_int8_ranges"))
      m->encoder_int8_ranges = int8_ranges_from_json(
          parse_json_checked(tf.metadata.at("encoder_int8_ranges"), path, "model header is malformed"));
    m->info = parse_json_checked(tf.meta("info", path), path, "model header is malformed");
  } catch (const Error& e) {
    std::string msg = e.what();
    if (msg.rfind(path, 0) == 0) throw;
    fail(path, msg);
  } catch (const std::exception& e) {
    fail(path, std::string("model header is malformed (") + e.what() + ")");
  }
  if (m->vocab.size() != m->decoder_config.vocab_size)
    fail(path, "vocabulary has " + std::to_string(m->vocab.size()) + " words but the decoder expects " +
                   std::to_string(m->decoder_config.vocab_size));
  // The caption memory first: its scorer builds on a thread of its own (CaptionMemory::prepare) while the encoder's
  // weights load and the networks are built.
  const bool has_keys = tf.shape_of(kMemoryKeys) != nullptr;
  if (has_keys || tf.metadata.count("memory_captions") || tf.metadata.count("consensus")) {
    if (!has_keys || !tf.metadata.count("memory_captions") || !tf.metadata.count("consensus"))
      fail(path, "caption memory is incomplete (it needs the tensor '" + std::string(kMemoryKeys) +
                     "' and the header's \"memory_captions\" and \"consensus\")");
    auto memory = std::make_shared<CaptionMemory>();
    const std::vector<int64_t>& keys_shape = *tf.shape_of(kMemoryKeys);
    if (keys_shape.size() != 2 || tf.quantized.count(kMemoryKeys))
      fail(path, "tensor '" + std::string(kMemoryKeys) + "' must be photos x channels of floats");
    if (auto h = tf.mapped_half.find(kMemoryKeys); h != tf.mapped_half.end()) {
      memory->keys.resize(keys_shape[0], keys_shape[1]);  // row-major, as stored
      h->second.to_floats(memory->keys.data());
    } else {
      memory->keys = Eigen::Map<const Mat>(tf.tensors.at(kMemoryKeys).value.data(), keys_shape[0], keys_shape[1]);
    }
    try {
      try {
        memory->captions = parse_caption_lists(tf.metadata.at("memory_captions"));
      } catch (const nlohmann::json::parse_error&) {
        fail(path, "model header is malformed (its caption memory's \"memory_captions\" is not JSON)");
      }
      auto settings = parse_json_checked(tf.metadata.at("consensus"), path, "model header is malformed");
      m->consensus.neighbours = settings.at("neighbours").get<int>();
      m->consensus.weight = settings.at("weight").get<double>();
      m->consensus.memory_candidates = settings.value("memory_candidates", 0);
      memory->pooling = parse_key_pooling(settings.value("key_pooling", std::string("mean")));
    } catch (const Error& e) {
      if (std::string(e.what()).rfind(path, 0) == 0) throw;
      fail(path, e.what());
    } catch (const std::exception& e) {
      fail(path, std::string("model header is malformed (caption memory: ") + e.what() + ")");
    }
    if (m->consensus.neighbours < 1 || m->consensus.neighbours > memory->photos())
      fail(path, "consensus neighbours must be in [1, " + std::to_string(memory->photos()) + "], got " +
                     std::to_string(m->consensus.neighbours));
    if (m->consensus.memory_candidates < 0 || m->consensus.memory_candidates > memory->photos())
      fail(path, "consensus memory_candidates must be in [0, " + std::to_string(memory->photos()) + "], got " +
                     std::to_string(m->consensus.memory_candidates));
    if (!(m->consensus.weight >= 0 && m->consensus.weight <= kMaxConsensusWeight))
      fail(path, "consensus weight must be in [0, " + std::to_string((int)kMaxConsensusWeight) + "]");
    memory->prepare(m->encoder_config.feature_dim(), path);
    m->memory = std::move(memory);
  }
  if (m->encoder_config.pretrained()) {
    const EncoderConfig& ec = m->encoder_config;
    if (ec.weights_file.empty()) {
      m->encoder_weights = std::make_shared<const TensorFile>(select_tensors(ec.graph, tf, path));
    } else {
      m->encoder_weights = std::make_shared<const TensorFile>(select_tensors(
          ec.graph, load_external_weights(ec.weights_file, ec.weights_sha256, path, &m->encoder_weights_path, weights_dir,
                                weights_hash),
          m->encoder_weights_path));
    }
  }
  try {
    m->build(false);  // a tuned encoder's network is built once, below, with the file's tuned weights
  } catch (const Error& e) {
    fail(path, e.what());
  }
  if (read_params(m->params(), tf, "", path)) m->half_precision = true;
  if (tf.metadata.count("ensemble")) {  // the decoders after the first (sat model ensemble)
    nlohmann::json configs = parse_json_checked(tf.metadata.at("ensemble"), path, "model header is malformed");
    if (!configs.is_array() || configs.empty())
      fail(path, "model header is malformed (\"ensemble\" must list the decoders after the first)");
    for (size_t k = 0; k < configs.size(); ++k) {
      const int member = (int)k + 2;
      DecoderConfig dc;
      try {
        dc = DecoderConfig::from_json(configs[k]);
      } catch (const std::exception& e) {
        fail(path, "ensemble member " + std::to_string(member) + ": " + e.what());
      }
      if (dc.vocab_size != m->vocab.size() || dc.feature_dim != m->decoder_config.feature_dim ||
          dc.grid_h != m->decoder_config.grid_h || dc.grid_w != m->decoder_config.grid_w)
        fail(path, "ensemble member " + std::to_string(member) + " reads another vocabulary or grid than the encoder gives");
      std::unique_ptr<Decoder> dec;
      try {
        dec = std::make_unique<Decoder>(dc);
      } catch (const Error& e) {
        fail(path, "ensemble member " + std::to_string(member) + ": " + e.what());
      }
      read_params(dec->params(), tf, member_prefix(member), path);
      m->more_members.push_back(std::move(dec));
    }
    try {
      DecoderEnsemble check(m->member_decoders());
    } catch (const Error& e) {
      fail(path, e.what());
    }
  }
  try {
    if (m->tuned) m->sync_tuned();
  } catch (const Error& e) {
    fail(path, e.what());
  }
  return m;
}

std::unique_ptr<CaptionModel> CaptionModel::load(const std::string& path, const std::string& weights_dir,
                                                 std::optional<PrecisionChoice> encoder_precision) {
  // Mapped: the float16 decoder weights and memory keys are converted straight into the model's own memory.
  return from_tensor_file(decode_mapped_safetensors(std::make_shared<const MappedFile>(path)), path, weights_dir,
                          encoder_precision);
}

std::unique_ptr<CaptionModel> average_models(const std::vector<std::string>& paths) {
  if (paths.empty()) throw Error("model average: no model files");
  auto out = CaptionModel::load(paths[0]);
  if (out->members() > 1) fail(paths[0], "is an ensemble: average its members' own files");
  std::vector<Param*> sum = out->params();
  // Summed in double and divided once: weights every model holds alike (a frozen fine-tuned unit, say) come out
  // exactly as they were, so the average still shares them (sat model ensemble compares them exactly).
  std::vector<std::vector<double>> total(sum.size());
  for (size_t i = 0; i < sum.size(); ++i) total[i].assign(sum[i]->value.begin(), sum[i]->value.end());
  for (size_t k = 1; k < paths.size(); ++k) {
    auto m = CaptionModel::load(paths[k]);
    if (m->members() > 1) fail(paths[k], "is an ensemble: average its members' own files");
    auto differs = [&](const std::string& what) {
      fail(paths[k], what + " differs from " + paths[0] + "'s: only models that differ in their weights average");
    };
    if (m->encoder_config.to_json() != out->encoder_config.to_json()) differs("the encoder");
    // a pretrained encoder's frozen part is not averaged: it must be the same network (a CNN trains whole)
    if (out->encoder_config.pretrained() && m->encoder_id() != out->encoder_id()) differs("the frozen encoder");
    if (m->decoder_config.to_json() != out->decoder_config.to_json()) differs("the decoder");
    if (m->vocab.words != out->vocab.words) differs("the vocabulary");
    std::vector<Param*> add = m->params();
    if (add.size() != sum.size()) differs("the parameter list");
    for (size_t i = 0; i < sum.size(); ++i) {
      if (add[i]->name != sum[i]->name || add[i]->shape != sum[i]->shape) differs("parameter " + add[i]->name);
      for (size_t j = 0; j < sum[i]->value.size(); ++j) total[i][j] += add[i]->value[j];
    }
  }
  // int8 ranges describe the first model's fine-tuned units: kept only when every model's were the same
  bool tuned_alike = true;
  if (out->tuned)
    for (auto& p : out->tuned->params()) {
      const size_t i = std::find(sum.begin(), sum.end(), &p) - sum.begin();
      for (size_t j = 0; i < sum.size() && j < p.value.size() && tuned_alike; ++j)
        tuned_alike = total[i][j] == (double)p.value[j] * (double)paths.size();
    }
  for (size_t i = 0; i < sum.size(); ++i)
    for (size_t j = 0; j < sum[i]->value.size(); ++j) sum[i]->value[j] = (float)(total[i][j] / (double)paths.size());
  if (!tuned_alike) out->drop_int8_ranges();
  if (out->tuned) out->sync_tuned();  // the whole network runs the averaged blocks
  return out;
}

std::vector<float> CaptionModel::load_planes(const std::vector<std::string>& paths, bool mirror) const {
  const int S = encoder_config.input_size;
  std::vector<float> planes(paths.size() * 3 * S * S);
  for (size_t i = 0; i < paths.size(); ++i) {
    cv::Mat bgr = load_image_bgr(paths[i]);
    if (mirror) cv::flip(bgr, bgr, 1);
    image_to_planes(bgr, S, encoder_config.mean, encoder_config.stdev, planes.data() + i * 3 * S * S);
  }
  return planes;
}

void CaptionModel::load_plane(const std::string& path, float* out) const {
  image_to_planes(load_image_bgr(path), encoder_config.input_size, encoder_config.mean, encoder_config.stdev, out);
}

Mat CaptionModel::encode(const std::vector<float>& planes, int n) {
  std::vector<float> grid;
  if (pretrained) pretrained->forward(planes.data(), n, grid);
  else encoder->forward(planes.data(), n, false, grid);
  return Eigen::Map<Mat>(grid.data(), (int64_t)n * encoder_config.locations(), encoder_config.feature_dim());
}

std::vector<Hypothesis> CaptionModel::search(const Mat& F, int n, int beam) {
  return search(F, n, beam, length_norm, no_repeat_ngram);
}

std::vector<Hypothesis> CaptionModel::search(const Mat& F, int n, int beam, double norm, int no_repeat,
                                             double consensus_weight, int memory_candidates,
                                             std::optional<BeamDiversity> diversity) {
  const double weight = consensus_weight >= 0 ? consensus_weight : consensus.weight;
  const BeamDiversity groups = diversity.value_or(beam_diversity);
  if (beam <= 1 || !memory || weight == 0) {  // the plain searches: no candidate lists to build
    if (more_members.empty())
      return beam <= 1 ? greedy_search(*decoder, F, n, max_len, no_repeat)
                       : beam_search(*decoder, F, n, beam, max_len, norm, no_repeat, groups);
    DecoderEnsemble all(member_decoders());
    return beam <= 1 ? greedy_search(all, F, n, max_len, no_repeat)
                     : beam_search(all, F, n, beam, max_len, norm, no_repeat, groups);
  }
  std::vector<CandidateList> lists =
      search_candidates(F, n, beam, norm, no_repeat, consensus_weight, memory_candidates, groups);
  std::vector<Hypothesis> out;
  out.reserve(n);
  for (auto& list : lists) out.push_back(std::move(list.candidates[list.chosen].hypothesis));
  return out;
}

// A search's captions for one image as candidates (total = score until reranking), best first as found.
static CaptionModel::CandidateList candidate_list(std::vector<Hypothesis> found, bool reranked) {
  CaptionModel::CandidateList list;
  list.reranked = reranked;
  for (auto& h : found) {
    CaptionModel::Candidate c;
    c.total = h.score;
    c.hypothesis = std::move(h);
    list.candidates.push_back(std::move(c));
  }
  return list;
}

// Consensus reranking of one image's candidates against the captions of its nearest memory photos: each candidate's
// agreement and total (score + weight x agreement), and the list's choice, the first of the best totals.
static void choose_by_agreement(CaptionModel::CandidateList& list, const CaptionMemory& memory,
                                const std::vector<int>& photos, double weight, const Vocab& vocab) {
  std::vector<Tokens> words;
  std::vector<int> leave_out;
  for (auto& c : list.candidates) {
    words.push_back(vocab.decode(c.hypothesis.tokens));
    leave_out.push_back(c.memory_photo);
  }
  const std::vector<double> agree = memory.agreements(words, photos, leave_out);
  std::vector<double> scores;
  for (auto& c : list.candidates) scores.push_back(c.hypothesis.score);
  const std::vector<double> totals = consensus_totals(scores, agree, weight);
  for (size_t k = 0; k < list.candidates.size(); ++k)
    list.candidates[k].agreement = agree[k], list.candidates[k].total = totals[k];
  list.chosen = best_total(totals);
}

std::vector<CaptionModel::CandidateList> CaptionModel::search_candidates(const Mat& F, int n, int beam, double norm,
                                                                         int no_repeat, double consensus_weight,
                                                                         int memory_candidates,
                                                                         std::optional<BeamDiversity> diversity) {
  const BeamDiversity groups = diversity.value_or(beam_diversity);
  ConsensusSettings rerank = consensus;
  if (consensus_weight >= 0) rerank.weight = consensus_weight;
  if (memory_candidates >= 0) rerank.memory_candidates = memory_candidates;
  std::vector<std::vector<Hypothesis>> found;
  if (beam <= 1) {
    std::vector<Hypothesis> greedy = search(F, n, 1, norm, no_repeat, 0);
    for (auto& h : greedy) found.push_back({std::move(h)});
  } else if (more_members.empty()) {
    found = beam_search_nbest(*decoder, F, n, beam, max_len, norm, no_repeat, groups);
  } else {
    DecoderEnsemble all(member_decoders());
    found = beam_search_nbest(all, F, n, beam, max_len, norm, no_repeat, groups);
  }
  const bool reranked = beam > 1 && memory && rerank.weight > 0;
  const Mat means = reranked ? pooled_grid_vectors(F, n, memory->pooling) : Mat();
  const int64_t L = n > 0 ? F.rows() / n : 0;
  std::vector<CandidateList> out(n);
  for (int i = 0; i < n; ++i) {
    CandidateList& list = out[i];
    list = candidate_list(std::move(found[i]), reranked);
    if (!reranked) continue;
    const std::vector<int> photos = memory->nearest(means.row(i).data(), rerank.neighbours);
    if (rerank.memory_candidates > 0) {
      std::set<std::vector<int>> seen;
      for (auto& c : list.candidates) seen.insert(c.hypothesis.tokens);
      std::vector<std::vector<int>> captions;
      std::vector<int> from;
      for (int m = 0; m < std::min<int>(rerank.memory_candidates, (int)photos.size()); ++m)
        for (const Tokens& words : memory->caption_words(photos[m])) {
          if (words.empty() || (int)words.size() >= max_len) continue;
          std::vector<int> ids;
          for (auto& w : words)
            if (vocab.contains(w)) ids.push_back(vocab.id(w));
          if (ids.size() != words.size() || !seen.insert(ids).second) continue;  // a word it cannot say; a repeat
          captions.push_back(std::move(ids));
          from.push_back(photos[m]);
        }
      const Mat grid = F.middleRows(i * L, L);
      std::vector<Hypothesis> scored;
      if (more_members.empty()) {
        scored = score_captions(*decoder, grid, captions, max_len, norm, no_repeat);
      } else {
        DecoderEnsemble all(member_decoders());
        scored = score_captions(all, grid, captions, max_len, norm, no_repeat);
      }
      for (size_t k = 0; k < scored.size(); ++k) {
        Candidate c;
        c.hypothesis = std::move(scored[k]);
        c.memory_photo = from[k];
        list.candidates.push_back(std::move(c));
      }
      std::stable_sort(list.candidates.begin(), list.candidates.end(), [](const Candidate& a, const Candidate& b) {
        return a.hypothesis.score > b.hypothesis.score;  // best score first, as the beam's own list
      });
    }
    choose_by_agreement(list, *memory, photos, rerank.weight, vocab);
  }
  return out;
}

int CaptionModel::sayable_word(const std::string& text) const {
  const std::vector<std::string> words = tokenize_caption(text);
  if (words.size() != 1 || !vocab.contains(words[0])) return -1;
  const int id = vocab.id(words[0]);
  return id > Vocab::kUnk ? id : -1;  // <pad> <start> <end> <unk> come first
}

std::vector<CaptionModel::CandidateList> CaptionModel::search_including(const Mat& F, int n,
                                                                        const std::vector<int>& words, int beam,
                                                                        double norm, int no_repeat,
                                                                        double consensus_weight) {
  const double weight = consensus_weight >= 0 ? consensus_weight : consensus.weight;
  std::vector<std::vector<Hypothesis>> found;
  if (more_members.empty()) {
    found = beam_search_including(*decoder, F, n, beam, max_len, norm, no_repeat, words);
  } else {
    DecoderEnsemble all(member_decoders());
    found = beam_search_including(all, F, n, beam, max_len, norm, no_repeat, words);
  }
  const bool reranked = memory && weight > 0;
  const Mat means = reranked ? pooled_grid_vectors(F, n, memory->pooling) : Mat();
  std::vector<CandidateList> out(n);
  for (int i = 0; i < n; ++i) {
    if (found[i].empty())
      throw Error("no caption says '" + vocab.words[words[i]] + "' within " + std::to_string(max_len) + " words");
    CandidateList& list = out[i];
    list = candidate_list(std::move(found[i]), reranked);
    if (reranked)
      choose_by_agreement(list, *memory, memory->nearest(means.row(i).data(), consensus.neighbours), weight, vocab);
  }
  return out;
}

std::unique_ptr<CaptionModel> ensemble_member(const std::string& path, int k) {
  auto m = CaptionModel::load(path);
  if (k < 1 || k > m->members())
    fail(path, "has " + std::to_string(m->members()) + (m->members() == 1 ? " decoder" : " decoders") +
                   ": there is no member " + std::to_string(k));
  if (k > 1) {
    std::swap(m->decoder, m->more_members[k - 2]);
    m->decoder_config = m->decoder->config();
  }
  m->more_members.clear();
  return m;
}

std::unique_ptr<CaptionModel> ensemble_models(const std::vector<std::string>& paths) {
  if (paths.size() < 2) throw Error("model ensemble: give at least two model files");
  auto out = CaptionModel::load(paths[0]);
  out->half_precision = false;  // the members' weights as loaded; compact again to store float16
  std::vector<const std::string*> member_file(out->members(), &paths[0]);  // where each decoder came from
  // Each decoder's provenance, in order: a model gives its own, an ensemble the list it already holds.
  nlohmann::json provenance = nlohmann::json::array();
  auto add_provenance = [&](const nlohmann::json& info, const std::string& path) {
    if (info.contains("members") && info["members"].is_array()) {
      for (const auto& one : info["members"]) provenance.push_back(one);
      return;
    }
    nlohmann::json one = {{"file", path}};
    for (const char* key : {"command", "epoch", "averaged", "git_commit"})
      if (info.contains(key)) one[key] = info[key];
    provenance.push_back(one);
  };
  add_provenance(out->info, paths[0]);
  const std::string first_id = out->encoder_id();
  std::vector<Param*> first_tuned;
  if (out->tuned)
    for (auto& p : out->tuned->params()) first_tuned.push_back(&p);
  for (size_t k = 1; k < paths.size(); ++k) {
    auto m = CaptionModel::load(paths[k]);
    auto differs = [&](const std::string& what) {  // what: "the vocabulary differs", ...
      fail(paths[k], what + " from " + paths[0] + "'s: an ensemble's members share their encoder and "
                     "vocabulary (train members with sat train --init-from " + paths[0] + " --fresh-decoder --tune-lr 0)");
    };
    if (m->vocab.words != out->vocab.words) differs("the vocabulary differs");
    if (m->encoder_config.to_json() != out->encoder_config.to_json()) differs("the encoder differs");
    if (m->encoder_id() != first_id) differs("the encoder's weights differ");
    if (out->tuned) {  // fine-tuned layers: the very same weights
      std::vector<Param*> theirs;
      for (auto& p : m->tuned->params()) theirs.push_back(&p);
      if (theirs.size() != first_tuned.size()) differs("the fine-tuned encoder layers differ");
      for (size_t i = 0; i < theirs.size(); ++i)
        if (theirs[i]->name != first_tuned[i]->name || theirs[i]->value != first_tuned[i]->value)
          differs("the fine-tuned encoder weight " + theirs[i]->name + " differs");
    }
    member_file.insert(member_file.end(), m->members(), &paths[k]);
    add_provenance(m->info, paths[k]);
    out->more_members.push_back(std::move(m->decoder));
    for (auto& d : m->more_members) out->more_members.push_back(std::move(d));
  }
  try {
    DecoderEnsemble check(out->member_decoders());
  } catch (const EnsembleMemberError& e) {  // named by its file; "member 1" is the first file's first decoder
    std::string problem = e.problem;
    const size_t at = problem.find("member 1");
    if (at != std::string::npos && (at + 8 == problem.size() || !std::isdigit((unsigned char)problem[at + 8])))
      problem.replace(at, 8, paths[0]);
    fail(*member_file[e.member - 1], problem);
  }
  out->info["members"] = provenance;
  // the first member's epoch, greedy validation and dev scores describe it alone
  for (const char* key : {"epoch", "val_scores", "scores", "scores_command"}) out->info.erase(key);
  return out;
}

namespace {

// One string of a model's provenance with its paths rebased (see rebase_recorded_paths).
std::string rebase_text(const std::string& text, const std::string& ran_in,
                        const std::function<bool(const std::string&)>& exists,
                        std::vector<std::pair<std::string, std::string>>* rewrites, const std::string& here) {
  std::string out;
  std::string previous;  // the word before, as written
  size_t i = 0;
  while (i < text.size()) {
    if (text[i] == ' ') {
      out += text[i++];
      continue;
    }
    const size_t end = std::min(text.find(' ', i), text.size());
    const std::string word = text.substr(i, end - i);
    i = end;
    // "(path", "path:", "path;" and "path)," name the path inside
    size_t first = word.find_first_not_of('('), last = word.find_last_not_of(":;,)");
    std::string core = first != std::string::npos && last != std::string::npos && last >= first
                           ? word.substr(first, last - first + 1)
                           : std::string();
    const bool option_value = previous.rfind("--", 0) == 0;
    const bool looks_like_path = core.find('/') != std::string::npos || core.find('.') != std::string::npos;
    std::string replaced = word;
    const bool absolute_here = !here.empty() && core.rfind(here + "/", 0) == 0;
    if (absolute_here || (!core.empty() && core[0] != '-' && core[0] != '/' && (option_value || looks_like_path) &&
                          exists(ran_in + "/" + core))) {
      std::string rebased =
          absolute_here
              ? std::filesystem::path(core).lexically_normal().lexically_relative(std::filesystem::path(here).lexically_normal()).string()
              : (std::filesystem::path(ran_in) / core).lexically_normal().string();
      while (rebased.size() > 1 && rebased.back() == '/') rebased.pop_back();
      if (rebased.empty()) rebased = ".";
      replaced = word.substr(0, first) + rebased + word.substr(last + 1);
      if (rewrites && rebased != core &&
          std::find(rewrites->begin(), rewrites->end(), std::make_pair(core, rebased)) == rewrites->end())
        rewrites->emplace_back(core, rebased);
    }
    out += replaced;
    previous = word;
  }
  return out;
}

}  // namespace

nlohmann::json rebase_recorded_paths(const nlohmann::json& info, const std::string& ran_in,
                                     const std::function<bool(const std::string&)>& exists,
                                     std::vector<std::pair<std::string, std::string>>* rewrites,
                                     const std::string& here) {
  if (info.is_string()) return rebase_text(info.get<std::string>(), ran_in, exists, rewrites, here);
  if (info.is_array()) {
    nlohmann::json out = nlohmann::json::array();
    for (const auto& v : info) out.push_back(rebase_recorded_paths(v, ran_in, exists, rewrites, here));
    return out;
  }
  if (info.is_object()) {
    nlohmann::json out = nlohmann::json::object();
    for (const auto& [key, v] : info.items())
      out[key] = key == "scores" || key == "val_scores" || key == "git_commit"
                     ? v
                     : rebase_recorded_paths(v, ran_in, exists, rewrites, here);
    return out;
  }
  return info;
}

}  // namespace sat
