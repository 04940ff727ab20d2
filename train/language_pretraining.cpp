// sat train --language-captions FILE: the new decoder trained as a language model on text alone before its first
// step on photos (train/trainer_steps.hpp: pretrain_language).
#include <algorithm>
#include <chrono>
#include <cmath>
#include <numeric>

#include "train/progress.hpp"
#include "train/trainer_steps.hpp"

namespace sat {
namespace trainer {
namespace {

constexpr int kCaptionsPerStep = 64;
constexpr int kMeanGridPhotos = 1000;

// The mean of up to kMeanGridPhotos training photos' grids, evenly spaced through the set: L x D. A text caption
// reads it, so the context the decoder learns language with is the one the photos share, no photo's own.
Mat mean_training_grid(const TrainRun& run) {
  const int n = (int)run.train_set.images.size();
  const int count = std::min(n, kMeanGridPhotos);
  Eigen::MatrixXd sum = Eigen::MatrixXd::Zero(run.cache_L, run.cache_D);
  Mat one(run.cache_L, run.cache_D);
  for (int k = 0; k < count; ++k) {
    run.train_feats->read(run.train_record[(int64_t)k * n / count], one.data());
    sum += one.cast<double>();
  }
  Mat mean = (sum / std::max(count, 1)).cast<float>();
  run.model->standardize_object_channels(mean.data(), run.cache_L);  // an affine map: the mean of the standardized
  return mean;
}

// Captions slice [first, last) of `order` as a teacher-forced batch reading grid 0.
CaptionBatch text_batch(const std::vector<std::vector<int>>& caps, const std::vector<int>& order, size_t first,
                        size_t last, int max_len) {
  std::vector<std::vector<int>> slice;
  for (size_t k = first; k < last; ++k) slice.push_back(caps[order[k]]);
  CaptionBatch cb = CaptionBatch::from_ids(slice, max_len);
  cb.grid.assign(cb.B, 0);
  return cb;
}

// The decoder's mean cross-entropy per word (<end> included) on these captions, teacher-forced, without dropout.
double language_cross_entropy(Decoder& decoder, const Mat& grid, const std::vector<std::vector<int>>& caps,
                              int max_len, DecoderCache& cache) {
  std::vector<int> order(caps.size());
  std::iota(order.begin(), order.end(), 0);
  double sum = 0;
  int64_t tokens = 0;
  for (size_t first = 0; first < caps.size(); first += kCaptionsPerStep) {
    const CaptionBatch cb = text_batch(caps, order, first, std::min(caps.size(), first + kCaptionsPerStep), max_len);
    const DecoderLoss loss = decoder.forward(grid, cb, 0.f, false, nullptr, cache);
    sum += loss.cross_entropy * loss.tokens;
    tokens += loss.tokens;
  }
  return tokens > 0 ? sum / tokens : 0;
}

}  // namespace

void pretrain_language(TrainRun& run) {
  const TrainOptions& opt = run.opt;
  CaptionModel& model = *run.model;
  Decoder& decoder = *model.decoder;
  std::vector<std::vector<int>> caps, val_caps;
  int64_t words = 0, unknown = 0;
  for (const auto& t : run.language_texts) {
    caps.push_back(model.vocab.encode(t));
    words += (int64_t)caps.back().size();
    unknown += std::count(caps.back().begin(), caps.back().end(), (int)Vocab::kUnk);
  }
  for (const Caption& c : run.val_set.captions) val_caps.push_back(model.vocab.encode(c.tokens));
  note(run.lead,
       "language pretraining: %zu captions of %s, %.1f%% of their words outside the vocabulary (read as <unk>); "
       "%d epochs of %d captions a step, each reading the mean grid of %d training photos\n",
       caps.size(), opt.language_captions.c_str(), 100.0 * unknown / std::max<int64_t>(words, 1), opt.language_epochs,
       kCaptionsPerStep, std::min((int)run.train_set.images.size(), kMeanGridPhotos));
  const Mat grid = mean_training_grid(run);
  DecoderCache cache;
  note(run.lead, "language pretraining: validation captions' cross-entropy %.3f per word before\n",
       language_cross_entropy(decoder, grid, val_caps, opt.max_len, cache));
  if (model.decoder_config.hard()) decoder.set_hard_soft_prob(1.f);  // the expected context: no glimpses to learn
  std::vector<Param*> params = decoder.params();
  Adam adam;  // its own moments: the run's Adam starts afresh on the photos
  adam.attach(params);
  Rng rng(opt.seed ^ 0x6c616e6775616765ull);
  std::vector<int> order(caps.size());
  std::iota(order.begin(), order.end(), 0);
  const int64_t steps = ((int64_t)caps.size() + kCaptionsPerStep - 1) / kCaptionsPerStep;
  float lr = opt.lr;
  for (int epoch = 0; epoch < opt.language_epochs; ++epoch, lr *= opt.lr_decay) {
    shuffle(order, rng);
    Progress progress("language epoch " + std::to_string(epoch + 1) + "/" + std::to_string(opt.language_epochs),
                      steps);
    const auto t0 = std::chrono::steady_clock::now();
    double loss_sum = 0;
    int64_t tokens = 0;
    std::string stats;
    for (int64_t s = 0; s < steps; ++s) {
      const size_t first = (size_t)s * kCaptionsPerStep, last = std::min(caps.size(), first + kCaptionsPerStep);
      CaptionBatch cb = text_batch(caps, order, first, last, opt.max_len);
      const uint64_t step_seed = rng.engine();
      for (int r = 0; r < cb.B; ++r) cb.row_seed.push_back(row_seed(step_seed, r));
      cb.label_smoothing = opt.label_smoothing;
      const DecoderLoss loss = decoder.forward(grid, cb, 0.f, true, nullptr, cache);
      decoder.backward(cache, nullptr);
      Adam::clip_grad_norm(params, opt.clip);
      adam.update(params, lr);
      for (Param* p : params) p->zero_grad();
      loss_sum += loss.cross_entropy * loss.tokens;
      tokens += loss.tokens;
      const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      char line[96];
      std::snprintf(line, sizeof line, "loss %.3f  %.0f cap/s", loss_sum / std::max<int64_t>(tokens, 1),
                    (double)last / std::max(seconds, 1e-9));
      stats = line;
      if (run.lead) progress.update(s + 1, stats);
    }
    if (run.lead) progress.finish(stats);
    note(run.lead, "language epoch %d: validation captions' cross-entropy %.3f per word\n", epoch + 1,
         language_cross_entropy(decoder, grid, val_caps, opt.max_len, cache));
  }
  decoder.weights_changed();
  run.language_texts.clear();
  run.language_texts.shrink_to_fit();
}

}  // namespace trainer
}  // namespace sat
