#include "train/captioning.hpp"

#include <algorithm>
#include <chrono>

#include "datasets/vocab.hpp"

namespace sat {

using nlohmann::json;

// Images encoded together when captioning a set (eval) and in validation during training.
constexpr int kSetBatch = 32, kValidationBatch = 32;

// The cached grids of the set's images first..first+m-1, in order, into out (m records of `record` floats).
static void read_cached_grids(const FeatureCache& cache, const CaptionSet& set, int first, int m, size_t record,
                              float* out) {
  std::vector<int> idx(m);
  for (int k = 0; k < m; ++k) {
    const std::string& name = set.images[first + k].file_name;
    idx[k] = cache.index_of(name);
    if (idx[k] < 0) fail(cache.path(), "feature cache has no features for image '" + name + "'");
    cache.prefetch(idx[k]);  // every record's read in flight before the first is needed
  }
  for (int k = 0; k < m; ++k) cache.read(idx[k], out + (size_t)k * record);
}

// Cached grids (n records of the model's cache_config) -> the decoder's features, through any tuned blocks.
static Mat decoder_features(CaptionModel& model, const float* grids, int n) {
  if (model.tuned) return model.features_from_cache(grids, n);
  const EncoderConfig& c = model.encoder_config;
  return Eigen::Map<const Mat>(grids, (int64_t)n * c.locations(), c.feature_dim());
}

std::vector<CandidateList> caption_planes(CaptionModel& model, const float* planes, int n, const SearchSettings& search,
                                          int batch, InferenceTiming* timing) {
  using clock = std::chrono::steady_clock;
  const size_t plane = (size_t)3 * model.encoder_config.input_size * model.encoder_config.input_size;
  std::vector<CandidateList> out;
  out.reserve(n);
  batch = std::max(1, batch);
  for (int start = 0; start < n; start += batch) {
    const int m = std::min(batch, n - start);
    const auto t0 = clock::now();
    const Mat F = model.encode(planes + start * plane, m);
    const auto t1 = clock::now();
    for (auto& list : model.search(F, m, search)) out.push_back(std::move(list));
    if (timing) {
      timing->encode_seconds += std::chrono::duration<double>(t1 - t0).count();
      timing->search_seconds += std::chrono::duration<double>(clock::now() - t1).count();
    }
  }
  return out;
}

std::vector<CandidateList> caption_cached(CaptionModel& model, const float* grids, int n,
                                          const SearchSettings& search) {
  return model.search(decoder_features(model, grids, n), n, search);
}

std::vector<std::vector<DetectedObject>> detect_planes(CaptionModel& model, const float* planes, int n,
                                                       float threshold) {
  ObjectDetector& detector = model.object_detector();
  const EncoderConfig& e = model.encoder_config;
  const size_t pixels = (size_t)e.input_size * e.input_size;
  std::vector<float> rgb((size_t)n * 3 * pixels), heat;
  planes_to_rgb255(planes, n, pixels, e.mean, e.stdev, rgb.data());
  detector.forward(rgb.data(), n, heat);
  const int side = detector.map_size(), K = detector.classes();
  std::vector<std::vector<DetectedObject>> out;
  for (int b = 0; b < n; ++b)
    out.push_back(class_peaks(heat.data() + (size_t)b * side * side * K, side, side, K, threshold));
  return out;
}

std::vector<std::vector<std::string>> kept_words(const CaptionModel& model, const std::vector<CandidateList>& lists) {
  std::vector<std::vector<std::string>> out;
  out.reserve(lists.size());
  for (const CandidateList& list : lists) out.push_back(model.vocab.decode(list.kept().tokens));
  return out;
}

CaptionScores validate_features(CaptionModel& model, const CaptionSet& set, const FeatureCache& cache,
                                const SearchSettings& search, json* results) {
  const EncoderConfig cached = model.encoder_config.cache_config();  // a tuned model reads its frozen part's grids
  const int n = (int)set.images.size(), L = cached.locations(), D = cached.feature_dim();
  const int chunk = 32;
  std::vector<float> grids((size_t)chunk * L * D);
  std::vector<std::string> hyps;
  std::vector<std::vector<std::string>> refs;
  if (results) *results = json::array();
  for (int s = 0; s < n; s += chunk) {
    const int m = std::min(chunk, n - s);
    read_cached_grids(cache, set, s, m, (size_t)L * D, grids.data());
    auto caps = kept_words(model, caption_cached(model, grids.data(), m, search));
    for (int k = 0; k < m; ++k) {
      hyps.push_back(join_words(caps[k]));
      refs.push_back(set.references(s + k));
      if (results) results->push_back({{"image_id", set.images[s + k].id}, {"caption", hyps.back()}});
    }
  }
  return score_captions(hyps, refs);
}

CaptionScores validate_across(CaptionModel& model, const CaptionSet& set, const FeatureCache* cache,
                              const std::vector<float>& planes, Collective& ranks) {
  const int n = (int)set.images.size();
  const Share mine = share_of(n, ranks.size(), ranks.rank());
  const SearchSettings greedy = stored_search(model, 1);
  std::vector<std::vector<std::string>> words;
  if (cache) {
    const EncoderConfig cached = model.encoder_config.cache_config();  // a tuned model reads its frozen part's grids
    const int L = cached.locations(), D = cached.feature_dim(), chunk = 32;
    std::vector<float> grids((size_t)chunk * L * D);
    for (int s = mine.begin; s < mine.end; s += chunk) {
      const int m = std::min(chunk, mine.end - s);
      read_cached_grids(*cache, set, s, m, (size_t)L * D, grids.data());
      for (auto& w : kept_words(model, caption_cached(model, grids.data(), m, greedy))) words.push_back(std::move(w));
    }
  } else if (mine.size() == n) {
    words = kept_words(model, caption_planes(model, planes.data(), n, greedy, kValidationBatch));
  } else {
    const size_t plane = 3 * (size_t)model.encoder_config.input_size * model.encoder_config.input_size;
    words = kept_words(
        model, caption_planes(model, planes.data() + mine.begin * plane, mine.size(), greedy, kValidationBatch));
  }
  json captions = json::array();
  for (auto& w : words) captions.push_back(join_words(w));
  std::vector<std::string> parts = ranks.gather(captions.dump(), "the validation captions");
  std::string scores;
  if (ranks.leads()) {
    std::vector<std::string> hyps;
    for (auto& part : parts)
      for (auto& h : json::parse(part)) hyps.push_back(h.get<std::string>());
    std::vector<std::vector<std::string>> refs;
    for (int i = 0; i < n; ++i) refs.push_back(set.references(i));
    scores = score_captions(hyps, refs).to_json().dump();
  }
  ranks.broadcast(scores, "the validation scores");
  return CaptionScores::from_json(json::parse(scores));
}

CaptionScores caption_and_score(CaptionModel& model, const CaptionSet& set, const SearchSettings& search,
                                json* results) {
  std::vector<std::string> hyps;
  std::vector<std::vector<std::string>> refs;
  if (results) *results = json::array();
  const size_t chunk = 64;
  for (size_t s = 0; s < set.images.size(); s += chunk) {
    std::vector<std::string> paths;
    for (size_t i = s; i < std::min(set.images.size(), s + chunk); ++i) paths.push_back(set.image_path(set.images[i]));
    auto planes = model.load_planes(paths);
    auto caps = kept_words(model, caption_planes(model, planes.data(), (int)paths.size(), search, kSetBatch));
    for (size_t k = 0; k < caps.size(); ++k) {
      const ImageEntry& img = set.images[s + k];
      hyps.push_back(join_words(caps[k]));
      refs.push_back(set.references((int)(s + k)));
      if (results) results->push_back({{"image_id", img.id}, {"caption", hyps.back()}});
    }
  }
  return score_captions(hyps, refs);
}

std::shared_ptr<CaptionMemory> build_caption_memory(CaptionModel& model, const CaptionSet& set,
                                                    const FeatureCache* cache, KeyPooling pooling,
                                                    float object_weight, const KeyProjectionOptions* projection) {
  const int n = (int)set.images.size();
  if (n == 0) throw Error("caption memory: the set has no photos");
  if (object_weight != 1.f && model.encoder_config.object_channels == 0)
    throw Error("caption memory: the model has no object channels to weight in its keys");
  if (!(object_weight >= 0 && object_weight <= kMaxKeyObjectWeight))
    throw Error("caption memory: the object weight must be in [0, " + std::to_string((int)kMaxKeyObjectWeight) + "]");
  auto memory = std::make_shared<CaptionMemory>();
  memory->pooling = pooling;
  memory->object_channels = model.encoder_config.object_channels;
  memory->object_weight = object_weight;
  memory->keys.resize(n, model.encoder_config.feature_dim());
  memory->captions.resize(n);
  const EncoderConfig cached = model.encoder_config.cache_config();
  const int chunk = 32;
  std::vector<float> grids;
  for (int s = 0; s < n; s += chunk) {
    const int m = std::min(chunk, n - s);
    Mat F;
    if (cache) {
      const int L = cached.locations(), D = cached.feature_dim();
      grids.resize((size_t)m * L * D);
      read_cached_grids(*cache, set, s, m, (size_t)L * D, grids.data());
      F = decoder_features(model, grids.data(), m);
    } else {
      std::vector<std::string> paths;
      for (int k = 0; k < m; ++k) paths.push_back(set.image_path(set.images[s + k]));
      F = model.encode(model.load_planes(paths), m);
    }
    memory->keys.middleRows(s, m) = memory->key_vectors(F, m);
    for (int k = 0; k < m; ++k)
      for (auto& r : set.references(s + k)) memory->captions[s + k].push_back(memory_caption(r));
  }
  // Each key of unit length; a photo whose key is zero has no neighbours to find.
  const auto unit_keys = [&](const char* what) {
    for (int i = 0; i < n; ++i) {
      const float norm = memory->keys.row(i).norm();
      if (!(norm > 0)) throw Error("caption memory: photo '" + set.images[i].file_name + "' has an all-zero " + what);
      memory->keys.row(i) /= norm;
    }
  };
  unit_keys("key");
  if (projection) {  // learned from the unit-length keys above, which key_vectors makes the same way at search
    memory->projection = learn_key_projection(memory->keys, memory->captions, *projection);
    memory->projection_options = *projection;
    memory->keys = memory->projected_keys(memory->keys);
    unit_keys("projected key");
  }
  return memory;
}

}  // namespace sat
