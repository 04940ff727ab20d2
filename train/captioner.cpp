// The public API (train/sat/captioner.hpp) over CaptionModel: images are decoded and resized in the calling thread,
// the network runs under one mutex per model.
#include "train/sat/captioner.hpp"

#include <algorithm>
#include <mutex>

#include <omp.h>
#include <opencv2/imgproc.hpp>

#include "datasets/shipped.hpp"
#include "train/captioning.hpp"
#include "train/model.hpp"
#include "vision/image.hpp"

namespace sat {

namespace {

// Images encoded together: bounds the encoder's memory and the number of batch sizes it keeps plans for.
constexpr int kMaxBatch = 16;

// The library's options as the one search-options type (train/search_policy.hpp).
SearchOptions search_options(const CaptionOptions& options) {
  SearchOptions o;
  o.beam = options.beam;
  o.length_norm = options.length_norm;
  o.no_repeat_ngram = options.no_repeat_ngram;
  o.consensus_weight = options.consensus_weight;
  o.memory_candidates = options.memory_candidates;
  o.object_evidence = options.object_evidence;
  o.evidence_threshold = options.evidence_threshold;
  o.neighbour_evidence = options.neighbour_evidence;
  o.beam_evidence = options.beam_evidence;
  o.relevance_weight = options.relevance_weight;
  o.beam_groups = options.beam_groups;
  o.diversity = options.diversity;
  o.include = options.include;
  o.candidates = options.candidates;
  return o;
}

// The encoder reads 8-bit BGR; a grey or BGRA image (cv::IMREAD_UNCHANGED) is converted rather than refused.
cv::Mat as_bgr(const cv::Mat& image, const std::string& name) {
  if (image.empty()) fail(name, "empty image");
  if (image.depth() != CV_8U || (image.channels() != 1 && image.channels() != 3 && image.channels() != 4))
    fail(name, "expected an 8-bit BGR image (as cv::imread gives), got " + cv::typeToString(image.type()));
  if (image.channels() == 3) return image;
  cv::Mat bgr;
  cv::cvtColor(image, bgr, image.channels() == 1 ? cv::COLOR_GRAY2BGR : cv::COLOR_BGRA2BGR);
  return bgr;
}

std::string batch_name(const char* what, size_t i) {
  return std::string(what) + "[" + std::to_string(i) + "]";
}

// Sets the calling thread's OpenMP team size for the scope of a call, and puts the caller's back after.
class ThreadCount {
 public:
  explicit ThreadCount(int threads) : saved_(omp_get_max_threads()), set_(threads > 0) {
    if (set_) omp_set_num_threads(threads);
  }
  ~ThreadCount() {
    if (set_) omp_set_num_threads(saved_);
  }
  ThreadCount(const ThreadCount&) = delete;
  ThreadCount& operator=(const ThreadCount&) = delete;

 private:
  int saved_;
  bool set_;
};

}  // namespace

// Hidden: a member of the exported class would be exported with it.
struct __attribute__((visibility("hidden"))) Captioner::Impl {
  std::unique_ptr<CaptionModel> model;
  std::string path;
  int threads = 0;
  // The encoder keeps its oneDNN plans and the decoder its step state between calls: one call runs at a time.
  std::mutex network;

  SearchSettings resolve(const CaptionOptions& options) const {
    if (!(options.object_threshold >= 0 && options.object_threshold <= 1))
      throw Error("object_threshold must be in [0, 1], got " + std::to_string(options.object_threshold));
    if (options.objects && model->encoder_config.input_size % 32)
      throw Error(path + ": objects need an input side that is a multiple of 32; this model takes " +
                  std::to_string(model->encoder_config.input_size));
    return resolve_search(*model, search_options(options), path);
  }
  // n images' planes (n x 3 x S x S, in the model's normalization) to captions, through the one inference path.
  std::vector<CaptionResult> caption_planes(const std::vector<float>& planes, int n, const SearchSettings& search,
                                            const CaptionOptions& options);
  CaptionResult to_caption(const Hypothesis& h, bool attention) const;
  // Decodes and resizes in the calling thread: `image(i, planes_i)` writes image i's planes.
  template <typename Image>
  std::vector<CaptionResult> caption_each(size_t n, const CaptionOptions& options, Image image) {
    const SearchSettings search = resolve(options);  // a bad option is refused before any work
    const int S = model->encoder_config.input_size;
    const size_t plane = (size_t)3 * S * S;
    std::vector<float> planes(n * plane);
    for (size_t i = 0; i < n; ++i) image(i, planes.data() + i * plane);
    return caption_planes(planes, (int)n, search, options);
  }
  // The same images' grids, encoded as caption_planes encodes them.
  template <typename Image>
  std::vector<FeatureGrid> encode_each(size_t n, Image image) {
    const int S = model->encoder_config.input_size;
    const size_t plane = (size_t)3 * S * S;
    std::vector<float> planes(n * plane);
    for (size_t i = 0; i < n; ++i) image(i, planes.data() + i * plane);
    const int rows = model->encoder_config.grid_h(), cols = model->encoder_config.grid_w();
    const size_t cells = (size_t)rows * cols;
    std::vector<FeatureGrid> out;
    out.reserve(n);
    std::lock_guard<std::mutex> lock(network);
    ThreadCount team(threads);
    for (size_t start = 0; start < n; start += kMaxBatch) {
      const int m = (int)std::min<size_t>(kMaxBatch, n - start);
      const Mat F = model->encode(planes.data() + start * plane, m);
      for (int b = 0; b < m; ++b) {
        FeatureGrid g{rows, cols, (int)F.cols(), {}};
        g.values.assign(F.data() + b * cells * F.cols(), F.data() + (b + 1) * cells * F.cols());
        out.push_back(std::move(g));
      }
    }
    return out;
  }
  void to_planes(const cv::Mat& bgr, float* out) const {
    image_to_planes(bgr, model->encoder_config.input_size, model->encoder_config.mean, model->encoder_config.stdev,
                    out);
  }
};

std::vector<CaptionResult> Captioner::Impl::caption_planes(const std::vector<float>& planes, int n,
                                                           const SearchSettings& search,
                                                           const CaptionOptions& options) {
  std::vector<CandidateList> lists;
  std::vector<std::vector<DetectedObject>> objects;
  {
    std::lock_guard<std::mutex> lock(network);
    ThreadCount team(threads);
    lists = sat::caption_planes(*model, planes.data(), n, search, kMaxBatch);
    if (options.objects) objects = detect_planes(*model, planes.data(), n, (float)options.object_threshold);
  }
  std::vector<CaptionResult> out;
  out.reserve(lists.size());
  for (const CandidateList& list : lists) {
    out.push_back(to_caption(list.kept(), options.attention));
    if (options.objects)
      for (const DetectedObject& d : objects[out.size() - 1])
        out.back().objects.push_back({coco_class_names()[d.cls], d.score, d.x, d.y});
    for (int k : search.candidates > 0 ? list.shown(search.candidates) : std::vector<int>{}) {
      const Candidate& c = list.candidates[k];
      CaptionCandidate one;
      one.text = join_words(model->vocab.decode(c.hypothesis.tokens));
      one.rank = k + 1;
      one.logprob = c.hypothesis.logprob;
      one.score = c.hypothesis.score;
      one.agreement = c.agreement;
      one.evidence = c.evidence;
      one.relevance = c.relevance;
      one.total = c.total;
      one.chosen = k == list.chosen;
      one.memory_photo = c.memory_photo;
      out.back().candidates.push_back(std::move(one));
    }
  }
  return out;
}

CaptionResult Captioner::Impl::to_caption(const Hypothesis& h, bool attention) const {
  CaptionResult c;
  c.words = model->vocab.decode(h.tokens);
  c.text = join_words(c.words);
  c.logprob = h.logprob;
  if (!attention || !model->decoder_config.attends()) return c;
  const int rows = model->encoder_config.grid_h(), cols = model->encoder_config.grid_w();
  // The search keeps one map per emitted token, the end included; the caption's words are the first ones.
  for (size_t w = 0; w < c.words.size() && w < h.alphas.size(); ++w)
    c.attention.push_back(AttentionGrid{rows, cols, h.alphas[w]});
  for (size_t w = 0; w < c.words.size() && w < h.locations.size(); ++w)
    c.glimpses.push_back(Glimpse{h.locations[w] / cols, h.locations[w] % cols});
  return c;
}

Captioner::Captioner(const std::string& model_path, const LoadOptions& options) : impl_(std::make_unique<Impl>()) {
  if (options.threads < 0) throw Error("threads must be 0 (all cores) or more");
  ThreadCount team(options.threads);
  std::optional<PrecisionChoice> precision;
  if (!options.encoder_precision.empty()) precision = parse_precision(options.encoder_precision);
  impl_->model = CaptionModel::load(model_path, options.weights_dir, precision);
  impl_->path = model_path;
  impl_->threads = options.threads;
}

Captioner::~Captioner() = default;
Captioner::Captioner(Captioner&&) noexcept = default;
Captioner& Captioner::operator=(Captioner&&) noexcept = default;

CaptionResult Captioner::caption(const cv::Mat& image, const CaptionOptions& options) const {
  return impl_->caption_each(1, options, [&](size_t, float* out) { impl_->to_planes(as_bgr(image, "image"), out); })[0];
}

CaptionResult Captioner::caption_file(const std::string& path, const CaptionOptions& options) const {
  return impl_->caption_each(1, options, [&](size_t, float* out) {
    impl_->to_planes(load_image_bgr(path, DecodeOptions{options.allow_damaged}), out);
  })[0];
}

CaptionResult Captioner::caption_bytes(const uint8_t* data, size_t size, const CaptionOptions& options) const {
  return impl_->caption_each(1, options, [&](size_t, float* out) {
    impl_->to_planes(decode_image_bgr(reinterpret_cast<const char*>(data), size, "image bytes",
                                      DecodeOptions{options.allow_damaged}),
                     out);
  })[0];
}

CaptionResult Captioner::caption_bytes(const std::vector<uint8_t>& bytes, const CaptionOptions& options) const {
  return caption_bytes(bytes.data(), bytes.size(), options);
}

std::vector<CaptionResult> Captioner::caption(const std::vector<cv::Mat>& images, const CaptionOptions& options) const {
  return impl_->caption_each(images.size(), options, [&](size_t i, float* out) {
    impl_->to_planes(as_bgr(images[i], batch_name("image", i)), out);
  });
}

std::vector<CaptionResult> Captioner::caption_files(const std::vector<std::string>& paths,
                                                    const CaptionOptions& options) const {
  return impl_->caption_each(paths.size(), options, [&](size_t i, float* out) {
    impl_->to_planes(load_image_bgr(paths[i], DecodeOptions{options.allow_damaged}), out);
  });
}

std::vector<CaptionResult> Captioner::caption_bytes(const std::vector<std::vector<uint8_t>>& images,
                                                    const CaptionOptions& options) const {
  return impl_->caption_each(images.size(), options, [&](size_t i, float* out) {
    const auto& bytes = images[i];
    impl_->to_planes(decode_image_bgr(reinterpret_cast<const char*>(bytes.data()), bytes.size(),
                                      batch_name("image bytes", i), DecodeOptions{options.allow_damaged}),
                     out);
  });
}

FeatureGrid Captioner::encode(const cv::Mat& image) const {
  return impl_->encode_each(1, [&](size_t, float* out) { impl_->to_planes(as_bgr(image, "image"), out); })[0];
}

FeatureGrid Captioner::encode_file(const std::string& path) const {
  return impl_->encode_each(1, [&](size_t, float* out) { impl_->to_planes(load_image_bgr(path), out); })[0];
}

std::vector<FeatureGrid> Captioner::encode(const std::vector<cv::Mat>& images) const {
  return impl_->encode_each(images.size(), [&](size_t i, float* out) {
    impl_->to_planes(as_bgr(images[i], batch_name("image", i)), out);
  });
}

std::vector<FeatureGrid> Captioner::encode_files(const std::vector<std::string>& paths) const {
  return impl_->encode_each(paths.size(),
                            [&](size_t i, float* out) { impl_->to_planes(load_image_bgr(paths[i]), out); });
}

void Captioner::check(const CaptionOptions& options) const {
  impl_->resolve(options);
}

ModelInfo Captioner::info() const {
  const CaptionModel& m = *impl_->model;
  ModelInfo info;
  info.path = impl_->path;
  info.encoder_weights = m.encoder_weights_path;
  info.input_size = m.encoder_config.input_size;
  info.grid_rows = m.encoder_config.grid_h();
  info.grid_cols = m.encoder_config.grid_w();
  info.vocabulary = m.vocab.size();
  info.beam = m.beam;
  info.length_norm = m.length_norm;
  info.no_repeat_ngram = m.no_repeat_ngram;
  info.memory_photos = m.memory_photos();
  info.consensus_weight = m.consensus.weight;
  info.memory_candidates = m.consensus.memory_candidates;
  info.object_evidence = m.consensus.object_evidence;
  info.evidence_threshold = m.consensus.evidence_threshold;
  info.neighbour_evidence = m.consensus.neighbour_evidence;
  info.beam_evidence = m.consensus.beam_evidence;
  info.relevance_weight = m.consensus.relevance_weight;
  info.beam_groups = m.beam_diversity.groups;
  info.diversity = m.beam_diversity.penalty;
  info.attention = m.decoder_config.attention;
  info.encoder_precision = precision_name(m.image_encoder()->precision());
  return info;
}

std::string Captioner::models_dir() {
  return shipped_models_dir();
}

}  // namespace sat
