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

std::vector<Decoder*> CaptionModel::member_decoders() {
  std::vector<Decoder*> out{decoder.get()};
  for (auto& d : more_members) out.push_back(d.get());
  return out;
}

void CaptionModel::build(bool photo_encoder) {
  decoder_config.vocab_size = vocab.size();
  decoder_config.feature_dim = encoder_config.feature_dim() + neighbour_words.count();
  decoder_config.grid_h = encoder_config.grid_h();
  decoder_config.grid_w = encoder_config.grid_w();
  decoder_config = DecoderConfig::from_json(decoder_config.to_json());  // validates the attention choice
  build_encoder(photo_encoder);
  decoder = std::make_unique<Decoder>(decoder_config);
}

Mat CaptionModel::decoder_grid(const Mat& F, int n, const std::vector<int>& leave_out) const {
  if (!neighbour_words.on()) return F;
  if (!memory) throw Error("the model reads its neighbours' words but holds no caption memory");
  return join_neighbour_words(F, n, *memory, neighbour_words, leave_out);
}

std::unique_ptr<CaptionModel> pretrained_encoder_model(const std::string& encoder_file, const std::string& cut,
                                                       int size, bool raw, bool build, float object_scale,
                                                       const std::string& object_form) {
  PretrainedNet net = load_pretrained_net(encoder_file);
  auto m = std::make_unique<CaptionModel>();
  // as sat caption runs it: bf16 where it is the faster arithmetic (a model trained from it stores the choice)
  m->encoder_precision = PrecisionChoice::auto_;
  try {
    m->encoder_config =
        EncoderConfig::make_pretrained(net.graph, cut, size > 0 ? size : net.input_size, net.mean, net.stdev, raw);
  } catch (const Error& e) {
    fail(encoder_file, e.what());
  }
  if (object_scale <= 0.f && object_form != "maps")
    fail(encoder_file, "object form '" + object_form + "' without object maps (--objects SCALE)");
  if (object_scale > 0.f) {
    if (!valid_object_form(object_form))
      fail(encoder_file, "object form '" + object_form + "' is not " + kObjectForms);
    m->encoder_config.object_channels =
        object_form_channels(object_form, (int)coco_class_names().size(), kCenternetTrunkChannels);
    m->encoder_config.object_scale = object_scale;
    m->encoder_config.object_form = object_form;
  }
  if (!net.external_file.empty()) m->encoder_weights_path = encoder_file;
  m->encoder_config.weights_file = net.external_file;
  m->encoder_config.weights_sha256 = net.external_sha256;
  m->encoder_weights =
      std::make_shared<const TensorFile>(select_tensors(m->encoder_config.graph, std::move(net.weights), encoder_file));
  if (build) m->build_encoder();
  return m;
}

void CaptionModel::build_encoder(bool photo_encoder) {
  photos_as_records.reset();
  if (encoder_config.pretrained()) {
    if (!encoder_weights) throw Error("a pretrained encoder's weights are not set");
    cnn.reset();
    tuned.reset();
    if (encoder_config.tuned())
      tuned = std::make_unique<TunableBlocks>(encoder_config.graph, *encoder_weights, encoder_config.tune_from,
                                              encoder_config.input_size, "encoder weights");
    if (photo_encoder || !tuned) build_photo_encoder();
  } else {
    pretrained.reset();
    tuned.reset();
    with_objects.reset();
    cnn = std::make_unique<CnnEncoder>(encoder_config);
  }
}

namespace {

// Photos as a cache's records go: the frozen part (with any object channels pooled onto its grid) gives the record a
// feature cache holds, and it goes on to the decoder as a cache's records do (records_to_features: the tuned blocks,
// the object channels' standardization). One path whatever the grids come from: captions from photos equal captions
// from a cache in any arithmetic the frozen part runs in.
class PhotosAsRecords : public ImageEncoder {
 public:
  PhotosAsRecords(ImageEncoder& frozen, CaptionModel& model) : frozen_(frozen), model_(model) {}
  void encode(const float* images, int n, std::vector<float>& grid) override {
    grid.clear();
    if (n <= 0) return;
    frozen_.encode(images, n, records_);
    model_.records_to_features(records_.data(), n, grid);
  }
  Precision precision() const override { return frozen_.precision(); }

 private:
  ImageEncoder& frozen_;
  CaptionModel& model_;
  std::vector<float> records_;
};

}  // namespace

void CaptionModel::build_photo_encoder() {
  // The network as far as it is frozen (all of it when nothing is tuned), in the chosen arithmetic; it shares the
  // imported weights (ResNet-101: 110 MB as float32, not copied). The tuned blocks hold their own weights.
  const EncoderConfig frozen = encoder_config.cache_config();
  const Precision precision = encoder_precision_in_use();
  if (precision == Precision::int8 && encoder_int8_ranges.empty())
    throw Error(
        "its encoder in int8 needs activation ranges calibrated on photos, and it has none (sat model "
        "calibrate writes a copy with them)");
  photos_as_records.reset();
  with_objects.reset();
  pretrained = std::make_unique<PretrainedEncoder>(frozen.graph, encoder_weights, frozen.input_size,
                                                   "encoder weights", precision,
                                                   precision == Precision::int8 ? encoder_int8_ranges : Int8Ranges());
  if (encoder_config.object_channels == 0) {
    detector.reset();
  } else {
    if (tuned && (tuned->input_h() % encoder_config.grid_h() || tuned->input_w() % encoder_config.grid_w()))
      throw Error("object maps on the " + std::to_string(tuned->input_h()) + "x" + std::to_string(tuned->input_w()) +
                  " grid of " + encoder_config.tune_from + " do not pool onto the tuned layers' " +
                  std::to_string(encoder_config.grid_h()) + "x" + std::to_string(encoder_config.grid_w()) + " grid");
    object_detector();
    if (object_form_channels(encoder_config.object_form, detector->classes(), detector->trunk_channels()) !=
        encoder_config.object_channels)
      throw Error(detector->path() + ": gives " + std::to_string(detector->classes()) + " classes and " +
                  std::to_string(detector->trunk_channels()) + " trunk channels, the model takes " +
                  std::to_string(encoder_config.object_channels) + " object channels (" +
                  encoder_config.object_form + ")");
    with_objects = std::make_unique<EncoderWithObjects>(*pretrained, *detector, frozen.grid_h(), frozen.grid_w(),
                                                        frozen.grid_channels(), frozen.mean, frozen.stdev,
                                                        frozen.object_scale, frozen.object_form);
  }
  if (tuned || with_objects) photos_as_records = std::make_unique<PhotosAsRecords>(*frozen_encoder(), *this);
}

void CaptionModel::apply_decoder_precision(bool as_asked) {
  // a model file's bf16 is a choice for speed: kept where bf16 is the faster arithmetic; asked for by name (a run's
  // --precision), it holds wherever the CPU computes bf16 natively
  const bool runs_bf16 = as_asked ? cpu_computes_bf16() : cpu_prefers_bf16_products();
  const ProductPrecision p =
      decoder_precision == ProductPrecision::bf16 && runs_bf16 ? ProductPrecision::bf16 : ProductPrecision::f32;
  for (Decoder* d : member_decoders()) d->set_precision(p);
}

Precision CaptionModel::encoder_precision_in_use() const {
  if (encoder_precision_override) return resolve(*encoder_precision_override);
  return resolve(encoder_precision_setting().value_or(encoder_precision));
}

Mat CaptionModel::features_from_cache(const float* grids, int n) {
  const int64_t rows = (int64_t)n * encoder_config.locations();
  if (!tuned && !object_standardization.on()) return Eigen::Map<const Mat>(grids, rows, encoder_config.feature_dim());
  std::vector<float> out;
  records_to_features(grids, n, out);
  return Eigen::Map<const Mat>(out.data(), rows, encoder_config.feature_dim());
}

void CaptionModel::records_to_features(const float* records, int n, std::vector<float>& grid) {
  if (tuned) return tuned_inference(records, n, grid);  // tuned_forward standardizes
  const size_t rows = (size_t)std::max(n, 0) * encoder_config.locations();
  grid.assign(records, records + rows * encoder_config.feature_dim());
  standardize_object_channels(grid.data(), rows);
}

void CaptionModel::standardize_object_channels(float* grid, size_t rows) const {
  const int D = encoder_config.feature_dim(), K = encoder_config.object_channels;
  object_standardization.apply(grid, rows, D, D - K);
}

void CaptionModel::tuned_inference(const float* cached, int n, std::vector<float>& grid) {
  // a few photos at a time: the tuned blocks' buffers stay small and warm (plans of at most 4 photos)
  constexpr int kPhotosPerPass = 4;
  const size_t record = (size_t)encoder_config.cache_config().locations() * encoder_config.cache_config().feature_dim(),
               out = (size_t)encoder_config.locations() * encoder_config.feature_dim();
  grid.resize(out * std::max(n, 0));
  std::vector<float> part;
  const bool bf16 = tuned_inference_in_bf16();
  for (int first = 0; first < n; first += kPhotosPerPass) {
    const int count = std::min(kPhotosPerPass, n - first);
    tuned_forward(cached + first * record, count, false, part, bf16);
    std::copy(part.begin(), part.end(), grid.begin() + first * out);
  }
}

namespace {

// rows x count values from columns [first, first + count) of a rows x from_width matrix into columns [to_first, ...)
// of a rows x to_width one
void copy_columns(const float* from, size_t rows, int from_width, int first, int count, float* to, int to_width,
                  int to_first) {
  for (size_t r = 0; r < rows; ++r)
    std::copy(from + r * from_width + first, from + r * from_width + first + count, to + r * to_width + to_first);
}

}  // namespace

bool CaptionModel::tuned_inference_in_bf16() const {
  return encoder_precision_in_use() == Precision::bf16 && cpu_has_native_bf16();
}

void CaptionModel::tuned_forward(const float* cached, int n, bool training, std::vector<float>& grid, bool bf16) {
  if (!tuned) throw Error("tuned_forward: the model's encoder has no tuned layers");
  const int K = encoder_config.object_channels;
  if (K == 0) return tuned->forward(cached, n, training, grid, bf16);
  // the records split: each location's raw channels, then its object channels
  const int raw_h = tuned->input_h(), raw_w = tuned->input_w(), raw_c = tuned->channels_in();
  const size_t raw_rows = (size_t)n * raw_h * raw_w;
  TunedScratch& t = tuned_scratch;
  t.raw.resize(raw_rows * raw_c);
  t.objects.resize(raw_rows * K);
  copy_columns(cached, raw_rows, raw_c + K, 0, raw_c, t.raw.data(), raw_c, 0);
  copy_columns(cached, raw_rows, raw_c + K, raw_c, K, t.objects.data(), K, 0);
  tuned->forward(t.raw.data(), n, training, t.out, bf16);
  const int L = encoder_config.locations(), C = tuned->channels_out(), D = C + K;
  t.pooled.resize((size_t)n * L * K);
  for (int b = 0; b < n; ++b)
    pool_class_maps(t.objects.data() + (size_t)b * raw_h * raw_w * K, raw_h, raw_w, K, encoder_config.grid_h(),
                    encoder_config.grid_w(), t.pooled.data() + (size_t)b * L * K);
  grid.resize((size_t)n * L * D);
  copy_columns(t.out.data(), (size_t)n * L, C, 0, C, grid.data(), D, 0);
  copy_columns(t.pooled.data(), (size_t)n * L, K, 0, K, grid.data(), D, C);
  standardize_object_channels(grid.data(), (size_t)n * L);
}

void CaptionModel::tuned_backward(const float* dgrid) {
  if (!tuned) throw Error("tuned_backward: the model's encoder has no tuned layers");
  const int K = encoder_config.object_channels;
  if (K == 0) return tuned->backward(dgrid);
  const int C = tuned->channels_out();
  const size_t rows = tuned_scratch.out.size() / C;  // N x L of the last forward
  tuned_scratch.dgrid.resize(rows * C);
  copy_columns(dgrid, rows, C + K, 0, C, tuned_scratch.dgrid.data(), C, 0);
  tuned->backward(tuned_scratch.dgrid.data());
}

std::string CaptionModel::encoder_id() const {
  const EncoderConfig cfg_used = encoder_config.cache_config();
  std::string cfg = cfg_used.to_json().dump();
  uint64_t h = fnv1a64(cfg.data(), cfg.size());
  auto* self = const_cast<CaptionModel*>(this);
  if (encoder_config.pretrained() && !encoder_config.weights_file.empty()) {
    // the config names the weights file by its sha256: hashing the config covers the weights
  } else if (encoder_config.pretrained()) {
    const TensorFile used =
        encoder_config.tuned() ? select_tensors(cfg_used.graph, *encoder_weights, "encoder weights") : TensorFile();
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
    for (auto& p : self->cnn->params()) h = fnv1a64(p.value.data(), p.value.size() * 4, h);
  }
  char buf[32];
  std::snprintf(buf, sizeof buf, "%016llx", (unsigned long long)h);
  return buf;
}

void CaptionModel::init(Rng& rng) {
  if (cnn) cnn->init(rng);
  decoder->init(rng);
}

std::vector<Param*> CaptionModel::params() {
  std::vector<Param*> out;
  if (cnn)
    for (auto& p : cnn->params()) out.push_back(&p);
  if (tuned)
    for (auto& p : tuned->params()) out.push_back(&p);
  for (auto* p : decoder->params()) out.push_back(p);
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

void CaptionModel::load_plane(const std::string& path, float* out, const DecodeOptions& decode) const {
  image_to_planes(load_image_bgr(path, decode), encoder_config.input_size, encoder_config.mean, encoder_config.stdev,
                  out);
}

ObjectDetector& CaptionModel::object_detector() {
  // the encoder's arithmetic, except int8 (the grid's alone): then bf16 where it is the faster one, else f32
  const Precision in_use = encoder_precision_in_use();
  const Precision for_objects = (in_use == Precision::bf16 && cpu_has_native_bf16()) ||
                                        (in_use == Precision::int8 && cpu_prefers_bf16())
                                    ? Precision::bf16
                                    : Precision::f32;
  if (encoder_config.input_size % 32)
    throw Error("object detection needs an input side that is a multiple of 32; this model takes " +
                std::to_string(encoder_config.input_size));
  // the trunk's features too when the grid holds them (the same pass)
  const bool with_trunk = encoder_config.object_channels > 0 && object_form_has_trunk(encoder_config.object_form);
  if (!detector || detector->precision() != for_objects || (detector->trunk_channels() > 0) != with_trunk)
    detector = load_object_detector(encoder_config.input_size, for_objects, "object detection", weights_dir, with_trunk);
  return *detector;
}

ImageEncoder* CaptionModel::image_encoder() const {
  if (photos_as_records) return photos_as_records.get();
  return frozen_encoder();
}

ImageEncoder* CaptionModel::frozen_encoder() const {
  if (with_objects) return with_objects.get();
  if (pretrained) return pretrained.get();
  return cnn.get();
}

Mat CaptionModel::encode(const float* planes, int n) {
  ImageEncoder* from = image_encoder();
  if (!from) throw Error("the model's encoder is not built");
  std::vector<float> grid;
  from->encode(planes, n, grid);
  return Eigen::Map<Mat>(grid.data(), (int64_t)n * encoder_config.locations(), encoder_config.feature_dim());
}

}  // namespace sat
