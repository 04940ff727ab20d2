// The pieces train() (train/trainer.hpp) is made of, shared by its files: train/trainer_setup.cpp sets a run up
// (options, data, vocabulary, model, optimizer, caches), train/language_pretraining.cpp trains a new decoder on text
// first (--language-captions) and train/trainer.cpp runs its epochs (steps, validation, early stopping, checkpoints).
// Internal to the trainer: nothing else includes this.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "train/metrics.hpp"
#include "train/optimizer.hpp"
#include "train/trainer.hpp"

namespace sat {
namespace trainer {

// Every image of a set decoded and resized once, kept as 8-bit RGB.
struct ImageBank {
  int size = 0;
  std::vector<uint8_t> rgb;  // N x S x S x 3
  void load(const CaptionSet& set, int S, const std::string& label, bool show);
  void planes(const std::vector<int>& idx, const EncoderConfig& cfg, std::vector<float>& out) const;
};

struct TrainState {
  int epoch = 0;          // current epoch (0-based)
  int step_in_epoch = 0;  // batches already done in this epoch
  uint64_t epoch_seed = 0;
  int64_t global_step = 0;
  double best_score = -1;
  int best_epoch = -1;
  int bad_epochs = 0;
  nlohmann::json history = nlohmann::json::array();
  nlohmann::json to_json() const;
  static TrainState from_json(const nlohmann::json& j);
};

// A run from its setup to its end: the options (as resumed, completed by setup), the model and its optimizer, the
// data and what the steps read of it. set_up_run makes it; the epochs go on changing st, rng, adam and the model.
struct TrainRun {
  explicit TrainRun(Collective& ranks) : ranks(ranks), lead(ranks.leads()), parallel(ranks.size() > 1) {}

  TrainOptions opt;
  std::string resume_path;  // the checkpoint the run continues (empty: a fresh run)
  Collective& ranks;
  const bool lead, parallel;
  bool self_critical = false;  // --objective cider
  std::unique_ptr<CaptionModel> model;
  TrainState st;
  Rng rng;
  Adam adam;
  std::vector<Param*> params;   // the model's, in Adam's order
  std::vector<float> lr_scale;  // per parameter: tuned blocks step at tune_lr, the rest at lr

  // The grids the decoder reads: L locations of D features each. A pretrained encoder's come from feature caches
  // (from_features); those hold the encoder's output, or for a tuned encoder its frozen part's (cache_L x cache_D:
  // the tuned blocks run on them at every step).
  bool from_features = false;
  int L = 0, D = 0, cache_L = 0, cache_D = 0;
  TunableBlocks* tuned = nullptr;  // the model's fine-tuned encoder blocks (null: none)
  bool tail_learns = false;        // the tuned blocks train (--tune-lr 0: they run forward only)

  CaptionSet train_set, val_set;
  ImageBank train_bank, val_bank;  // the small CNN's photos (trained end to end)
  std::vector<float> val_planes;   // the validation photos as the small CNN reads them
  std::unique_ptr<FeatureCache> train_feats, val_feats_own, mirror_feats;
  const FeatureCache* val_feats = nullptr;  // train_feats, or val_feats_own
  std::vector<int> train_record;            // each training photo's record in train_feats
  std::vector<int> own_memory_photo;        // neighbour words: each training photo's memory photo (-1: none), left out
  std::vector<std::vector<int>> caption_ids;
  std::vector<int> mirror_record;  // --mirror-features: each training photo's record there, and its captions mirrored
  std::vector<std::vector<int>> mirrored_caption_ids;
  std::vector<std::vector<std::string>> language_texts;  // --language-captions, read before the photos' set-up
  std::unique_ptr<CiderDScorer> cider;  // self-critical reward: CIDEr-D with the training split's document frequencies
  std::vector<float> word_weight;  // per vocabulary word, its tokens' weight in the cross-entropy (empty: all 1)

  std::string ckpt_path, best_path;
  int n_images = 0, steps_per_epoch = 0;
};

// Starts the run train() was asked for (train/trainer.hpp): a fresh one in opt.out, or the checkpoint at
// resume_path continued; every check of the options, the model built or loaded and the data read.
TrainRun set_up_run(TrainOptions options, const std::string& resume_path, const ResumeOverrides& more,
                    Collective& ranks);

// The cross-entropy's weight of each word of `vocab` (CaptionBatch::word_weight): `object_weight` for the single
// words of the rarer object groups (object_groups(), ObjectGroup::rare), 1 for the rest; empty when object_weight
// is 1.
std::vector<float> object_word_weights(const Vocab& vocab, float object_weight);

// sat train --language-captions (train/language_pretraining.cpp): a fresh run's new decoder trained as a language
// model for opt.language_epochs epochs on the file's captions (text only; words outside the vocabulary read as <unk>),
// 64 captions a step, each reading the mean grid of up to 1000 training photos, so its context is the one the photos
// share and no photo's own. Its own Adam at opt.lr (decaying by opt.lr_decay per epoch); the attention penalty off;
// the validation captions' cross-entropy printed before and after each epoch. The run's steps on photos follow, their
// Adam starting afresh. Not resumable midway: a checkpoint is first written by the steps on photos.
void pretrain_language(TrainRun& run);

// A message on stderr from the leading rank (the others stay quiet).
__attribute__((format(printf, 2, 3))) void note(bool lead, const char* format, ...);

}  // namespace trainer
}  // namespace sat
