// The model file (train/model.hpp): the safetensors layout with the configs, vocabulary, search settings, caption
// memory and provenance in its header, and the weights of the encoder (unless it names a weights file), the decoder and
// any ensemble members.
#include "train/model.hpp"

#include <algorithm>
#include <cstdio>

#include "datasets/json_checks.hpp"
#include "datasets/features.hpp"

namespace sat {

static const char* const kModelFormat = "sat-caption-model";
static const int kModelVersion = 1;

// Where an ensemble's k-th decoder (k >= 2) keeps its tensors in the model file.
static std::string member_prefix(int k) {
  return "member" + std::to_string(k) + "/";
}

// Each parameter's value from the file's tensor named prefix + its name, its shape checked. True when any of
// them was stored as float16.
static bool read_params(const std::vector<Param*>& params, const TensorFile& tf, const std::string& prefix,
                        const std::string& path) {
  bool half = false;
  for (Param* p : params) {
    const std::string name = prefix + p->name;
    if (auto h = tf.mapped_half.find(name); h != tf.mapped_half.end()) {  // converted straight into the parameter
      if (h->second.shape != p->shape)
        fail(path,
             "tensor '" + name + "' has shape " + shape_str(h->second.shape) + ", expected " + shape_str(p->shape));
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

TensorFile CaptionModel::to_tensor_file() const {
  TensorFile tf;
  tf.metadata["format"] = kModelFormat;
  tf.metadata["version"] = std::to_string(kModelVersion);
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
  if (decoder_precision != ProductPrecision::f32)
    tf.metadata["decoder_precision"] = product_precision_name(decoder_precision);
  if (!encoder_int8_ranges.empty())
    tf.metadata["encoder_int8_ranges"] = int8_ranges_to_json(encoder_int8_ranges).dump();
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
  if (consensus.object_evidence > 0 || consensus.beam_evidence > 0) {  // the detector's evidence; absent: off
    nlohmann::json evidence = {{"weight", consensus.object_evidence}, {"threshold", consensus.evidence_threshold}};
    if (consensus.beam_evidence > 0) evidence["beam"] = consensus.beam_evidence;  // absent: 0, the beam unsteered
    tf.metadata["object_evidence"] = evidence.dump();
  }
  if (neighbour_words.on()) tf.metadata["neighbour_words"] = neighbour_words.to_json().dump();  // absent: none
  if (memory) {  // consensus reranking: the training photos' pooled grid vectors (float16) and their captions
    nlohmann::json settings = {{"neighbours", consensus.neighbours}, {"weight", consensus.weight}};
    if (consensus.memory_candidates > 0) settings["memory_candidates"] = consensus.memory_candidates;  // absent: 0
    if (consensus.relevance_weight > 0) settings["relevance_weight"] = consensus.relevance_weight;  // absent: 0
    if (consensus.neighbour_evidence > 0) settings["neighbour_evidence"] = consensus.neighbour_evidence;  // absent: 0
    if (memory->pooling != KeyPooling::mean)
      settings["key_pooling"] = key_pooling_name(memory->pooling);  // absent: mean
    if (memory->object_weight != 1.f) {  // absent: 1 (the object channels as the grid has them)
      settings["key_object_weight"] = memory->object_weight;
      settings["key_object_channels"] = memory->object_channels;
    }
    if (memory->projected()) {  // absent: the pooled keys as they are
      const KeyProjectionOptions& o = memory->projection_options;
      settings["key_projection"] = {{"kind", "cca"},
                                    {"dims", memory->projection.map.cols()},
                                    {"power", o.power},
                                    {"regularization", o.regularization},
                                    {"min_photos", o.min_photos},
                                    {"words", memory->projection.words}};
      Param center(kMemoryKeyCenter, {1, memory->projection.center.size()}, false);
      std::copy(memory->projection.center.data(), memory->projection.center.data() + memory->projection.center.size(),
                center.value.begin());
      tf.tensors.emplace(kMemoryKeyCenter, std::move(center));
      const Mat& map = memory->projection.map;  // float32: its columns are scaled by correlations to a power
      Param key_map(kMemoryKeyMap, {map.rows(), map.cols()}, false);
      std::copy(map.data(), map.data() + map.size(), key_map.value.begin());
      tf.tensors.emplace(kMemoryKeyMap, std::move(key_map));
      if (memory->projection.has_word_side()) {  // absent: no caption relevance
        settings["key_projection"]["vocabulary"] = memory->projection.vocabulary;
        const Mat& words = memory->projection.word_map;
        Param word_map(kMemoryWordMap, {words.rows(), words.cols()}, false);
        std::copy(words.data(), words.data() + words.size(), word_map.value.begin());
        tf.tensors.emplace(kMemoryWordMap, std::move(word_map));
        tf.half.insert(kMemoryWordMap);
        const Vec& word_center = memory->projection.word_center;
        Param wc(kMemoryWordCenter, {1, word_center.size()}, false);
        std::copy(word_center.data(), word_center.data() + word_center.size(), wc.value.begin());
        tf.tensors.emplace(kMemoryWordCenter, std::move(wc));
      }
    }
    tf.metadata["consensus"] = settings.dump();
    tf.metadata["memory_captions"] = nlohmann::json(memory->captions).dump();
    Param keys(kMemoryKeys, {memory->keys.rows(), memory->keys.cols()}, false);
    std::copy(memory->keys.data(), memory->keys.data() + memory->keys.size(), keys.value.begin());
    tf.tensors.emplace(kMemoryKeys, std::move(keys));
    tf.half.insert(kMemoryKeys);
  }
  if (object_standardization.on()) {
    for (auto [name, values] : {std::pair{kObjectCenter, &object_standardization.center},
                                std::pair{kObjectGain, &object_standardization.gain}}) {
      Param t(name, {1, (int64_t)values->size()}, false);
      t.value.assign(values->begin(), values->end());
      tf.tensors.emplace(name, std::move(t));
    }
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

void CaptionModel::save(const std::string& path) const {
  save_safetensors(path, to_tensor_file());
}

namespace {

// A two-dimensional tensor of floats (float32, or float16 left mapped or converted) into `out` (a Mat, or a Vec from a
// 1 x n tensor); false when it is absent, quantized or not two-dimensional.
template <typename Matrix>
bool read_float_matrix(const TensorFile& tf, const char* name, Matrix& out) {
  const auto* shape = tf.shape_of(name);
  if (!shape || shape->size() != 2 || tf.quantized.count(name)) return false;
  const int64_t rows = (*shape)[0], cols = (*shape)[1];
  if constexpr (Matrix::RowsAtCompileTime == 1) {
    if (rows != 1) return false;
  }
  if (auto h = tf.mapped_half.find(name); h != tf.mapped_half.end()) {
    out.resize(rows, cols);  // row-major, as stored
    h->second.to_floats(out.data());
    return true;
  }
  if (!tf.tensors.count(name)) return false;
  out = Eigen::Map<const Mat>(tf.tensors.at(name).value.data(), rows, cols);
  return true;
}

// A caption memory's key projection (train/key_projection.hpp): its settings from the header's "consensus" object,
// its centre and map from the float32 tensors; errors name the file.
void read_key_projection(const TensorFile& tf, const nlohmann::json& kp, const std::string& path,
                         CaptionMemory& memory) {
  if (kp.at("kind").get<std::string>() != "cca")
    fail(path, "caption memory's key projection is of an unknown kind '" + kp.at("kind").get<std::string>() +
                   "' (this build knows cca)");
  memory.projection_options.dims = kp.at("dims").get<int>();
  memory.projection_options.power = kp.at("power").get<double>();
  memory.projection_options.regularization = kp.at("regularization").get<double>();
  memory.projection_options.min_photos = kp.at("min_photos").get<int>();
  memory.projection.words = kp.at("words").get<int>();
  const auto* center_shape = tf.shape_of(kMemoryKeyCenter);
  const auto* map_shape = tf.shape_of(kMemoryKeyMap);
  if (!center_shape || !map_shape || !tf.tensors.count(kMemoryKeyCenter) || !tf.tensors.count(kMemoryKeyMap))
    fail(path, "caption memory's key projection needs the float32 tensors '" + std::string(kMemoryKeyCenter) +
                   "' and '" + kMemoryKeyMap + "'");
  if (center_shape->size() != 2 || (*center_shape)[0] != 1 || map_shape->size() != 2 ||
      (*map_shape)[0] != (*center_shape)[1] || (*map_shape)[1] != memory.projection_options.dims)
    fail(path, "caption memory's key projection tensors have the wrong shapes (a 1 x D centre and a D x " +
                   std::to_string(memory.projection_options.dims) + " map)");
  const auto& c = tf.tensors.at(kMemoryKeyCenter).value;
  memory.projection.center = Eigen::Map<const Vec>(c.data(), (int64_t)c.size());
  memory.projection.map =
      Eigen::Map<const Mat>(tf.tensors.at(kMemoryKeyMap).value.data(), (*map_shape)[0], (*map_shape)[1]);
  // The word side (caption relevance), in memories built since: a vocabulary in the header and two tensors.
  const bool has_tensors = tf.shape_of(kMemoryWordMap) || tf.shape_of(kMemoryWordCenter);
  if (!kp.contains("vocabulary")) {
    if (has_tensors)
      fail(path, "caption memory's key projection has word-side tensors but no \"vocabulary\" in its header");
    return;
  }
  memory.projection.vocabulary = kp.at("vocabulary").get<std::vector<std::string>>();
  if (!read_float_matrix(tf, kMemoryWordMap, memory.projection.word_map) ||
      !read_float_matrix(tf, kMemoryWordCenter, memory.projection.word_center) ||
      memory.projection.word_map.size() == 0)
    fail(path, "caption memory's key projection has a vocabulary but not the tensors '" + std::string(kMemoryWordMap) +
                   "' (words x dims) and '" + kMemoryWordCenter + "' (1 x dims)");
}

// The object channels' standardization (absent: none): both tensors, one finite value per object channel.
void read_object_standardization(const TensorFile& tf, const std::string& path, CaptionModel& m) {
  const bool center = tf.shape_of(kObjectCenter) != nullptr, gain = tf.shape_of(kObjectGain) != nullptr;
  if (!center && !gain) return;
  const int K = m.encoder_config.object_channels;
  const std::string both = "'" + std::string(kObjectCenter) + "' and '" + kObjectGain + "'";
  if (K == 0) fail(path, "standardizes object channels (" + both + "), and its encoder has none");
  Vec c, g;
  if (!read_float_matrix(tf, kObjectCenter, c) || !read_float_matrix(tf, kObjectGain, g) || c.size() != K ||
      g.size() != K)
    fail(path, "object standardization needs the tensors " + both + ", 1 x " + std::to_string(K) +
                   " floats each (the encoder's object channels)");
  if (!c.allFinite() || !g.allFinite() || (g.array() < 0).any() || (g.array().abs() > 1e6f).any())
    fail(path, "object standardization has a value that is not finite, or a gain that is negative or above 1e6");
  m.object_standardization.center.assign(c.data(), c.data() + K);
  m.object_standardization.gain.assign(g.data(), g.data() + K);
}

}  // namespace

std::unique_ptr<CaptionModel> CaptionModel::from_tensor_file(const TensorFile& tf, const std::string& path,
                                                             const std::string& weights_dir,
                                                             std::optional<PrecisionChoice> encoder_precision) {
  if (tf.metadata.count("format") == 0 || tf.metadata.at("format") != kModelFormat)
    fail(path, "not a sat caption model (no \"format\": \"" + std::string(kModelFormat) + "\" in its header)");
  if (tf.meta("version", path) != std::to_string(kModelVersion))
    fail(path, "model file version " + tf.meta("version", path) + " is not supported (expected " +
                   std::to_string(kModelVersion) + ")");
  auto m = std::make_unique<CaptionModel>();
  m->weights_dir = weights_dir;
  m->encoder_precision_override = encoder_precision;
  std::shared_ptr<WeightsHashHeadStart> weights_hash;
  try {
    m->encoder_config =
        EncoderConfig::from_json(parse_json_checked(tf.meta("encoder", path), path, "model header is malformed"));
    // The encoder's weights file, when the model names one, is hashed on a thread from here on, beside the rest
    // of the loading (load_external_weights waits for it before anything uses the weights).
    if (m->encoder_config.pretrained() && !m->encoder_config.weights_file.empty())
      weights_hash = start_weights_hash(m->encoder_config.weights_file, weights_dir);
    m->decoder_config =
        DecoderConfig::from_json(parse_json_checked(tf.meta("decoder", path), path, "model header is malformed"));
    m->vocab = Vocab::from_words(
        parse_json_checked(tf.meta("vocab", path), path, "model header is malformed").get<std::vector<std::string>>(),
        path);
    m->max_len = std::stoi(tf.meta("max_len", path));
    if (tf.metadata.count("length_norm")) {  // files written before it existed use 1
      m->length_norm =
          parse_json_checked(tf.metadata.at("length_norm"), path, "model header is malformed").get<double>();
      if (!(m->length_norm >= 0 && m->length_norm <= 2)) fail(path, "length_norm must be in [0, 2]");
    }
    if (tf.metadata.count("beam")) {  // files written before it existed use 3
      m->beam = parse_json_checked(tf.metadata.at("beam"), path, "model header is malformed").get<int>();
      if (m->beam < 1 || m->beam > kMaxBeam) fail(path, "beam must be in [1, " + std::to_string(kMaxBeam) + "]");
    }
    if (tf.metadata.count("no_repeat_ngram")) {  // files written before it existed use 0 (off)
      m->no_repeat_ngram =
          parse_json_checked(tf.metadata.at("no_repeat_ngram"), path, "model header is malformed").get<int>();
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
    if (tf.metadata.count("object_evidence")) {  // files without it leave the detector's evidence out
      const auto d = parse_json_checked(tf.metadata.at("object_evidence"), path, "model header is malformed");
      m->consensus.object_evidence = d.at("weight").get<double>();
      m->consensus.evidence_threshold = d.at("threshold").get<double>();
      m->consensus.beam_evidence = d.value("beam", 0.0);
      if (!(m->consensus.object_evidence >= 0 && m->consensus.object_evidence <= kMaxObjectEvidence))
        fail(path, "object_evidence weight must be in [0, " + std::to_string((int)kMaxObjectEvidence) + "]");
      if (!(m->consensus.evidence_threshold >= 0 && m->consensus.evidence_threshold <= 1))
        fail(path, "object_evidence threshold must be in [0, 1]");
      if (!(m->consensus.beam_evidence >= 0 && m->consensus.beam_evidence <= kMaxObjectEvidence))
        fail(path, "object_evidence beam weight must be in [0, " + std::to_string((int)kMaxObjectEvidence) + "]");
      if ((m->consensus.object_evidence > 0 || m->consensus.beam_evidence > 0) &&
          m->encoder_config.object_channels == 0)
        fail(path, "object_evidence needs object channels, and the encoder has none");
    }
    if (tf.metadata.count("encoder_precision"))
      m->encoder_precision = parse_precision(tf.metadata.at("encoder_precision"));
    if (tf.metadata.count("decoder_precision")) {
      const std::string p = tf.metadata.at("decoder_precision");
      if (p != "f32" && p != "bf16") fail(path, "decoder_precision must be f32 or bf16, not '" + p + "'");
      m->decoder_precision = p == "bf16" ? ProductPrecision::bf16 : ProductPrecision::f32;
    }
    if (tf.metadata.count("encoder_int8_ranges"))
      m->encoder_int8_ranges = int8_ranges_from_json(
          parse_json_checked(tf.metadata.at("encoder_int8_ranges"), path, "model header is malformed"));
    if (tf.metadata.count("neighbour_words"))  // files without it read the encoder's grid alone
      m->neighbour_words = NeighbourWords::from_json(
          parse_json_checked(tf.metadata.at("neighbour_words"), path, "model header is malformed"), path);
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
    if (!read_float_matrix(tf, kMemoryKeys, memory->keys))
      fail(path, "tensor '" + std::string(kMemoryKeys) + "' must be photos x channels of floats");
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
      m->consensus.relevance_weight = settings.value("relevance_weight", 0.0);
      m->consensus.neighbour_evidence = settings.value("neighbour_evidence", 0.0);
      memory->pooling = parse_key_pooling(settings.value("key_pooling", std::string("mean")));
      memory->object_weight = settings.value("key_object_weight", 1.f);
      memory->object_channels = settings.value("key_object_channels", m->encoder_config.object_channels);
      if (settings.contains("key_projection")) read_key_projection(tf, settings.at("key_projection"), path, *memory);
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
    if (!(m->consensus.relevance_weight >= 0 && m->consensus.relevance_weight <= kMaxRelevanceWeight))
      fail(path, "consensus relevance_weight must be in [0, " + std::to_string((int)kMaxRelevanceWeight) + "]");
    if (m->consensus.relevance_weight > 0 && !memory->weighs_relevance())
      fail(path, "consensus relevance_weight needs the word side of a key projection, and the caption memory has none");
    if (!(m->consensus.neighbour_evidence >= 0 && m->consensus.neighbour_evidence <= 1))
      fail(path, "consensus neighbour_evidence must be in [0, 1]");
    if (memory->object_channels != m->encoder_config.object_channels)
      fail(path, "caption memory keys weight " + std::to_string(memory->object_channels) +
                     " object channels, the model's grid has " + std::to_string(m->encoder_config.object_channels));
    memory->prepare(m->encoder_config.feature_dim(), path);
    m->memory = std::move(memory);
  }
  read_object_standardization(tf, path, *m);
  if (m->neighbour_words.on() && m->neighbour_words.neighbours > m->memory_photos())
    fail(path, "its decoder reads the words of its " + std::to_string(m->neighbour_words.neighbours) +
                   " nearest memory photos, and its caption memory holds " + std::to_string(m->memory_photos()));
  if (m->encoder_config.pretrained()) {
    const EncoderConfig& ec = m->encoder_config;
    if (ec.weights_file.empty()) {
      m->encoder_weights = std::make_shared<const TensorFile>(select_tensors(ec.graph, tf, path));
    } else {
      m->encoder_weights = std::make_shared<const TensorFile>(
          select_tensors(ec.graph,
                         load_external_weights(ec.weights_file, ec.weights_sha256, path, &m->encoder_weights_path,
                                               weights_dir, weights_hash),
                         m->encoder_weights_path));
    }
  }
  try {
    m->build();
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
        fail(path,
             "ensemble member " + std::to_string(member) + " reads another vocabulary or grid than the encoder gives");
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
  m->apply_decoder_precision();
  return m;
}

std::unique_ptr<CaptionModel> CaptionModel::load(const std::string& path, const std::string& weights_dir,
                                                 std::optional<PrecisionChoice> encoder_precision) {
  // Mapped: the float16 decoder weights and memory keys are converted straight into the model's own memory.
  return from_tensor_file(decode_mapped_safetensors(std::make_shared<const MappedFile>(path)), path, weights_dir,
                          encoder_precision);
}

}  // namespace sat
