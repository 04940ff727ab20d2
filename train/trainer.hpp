// The training loop: cross-entropy + doubly stochastic attention penalty (or self-critical CIDEr-D training from a
// trained model), Adam, clipping, lr decay, per-epoch validation (BLEU-4 or CIDEr-D), best-model keeping, early
// stopping, atomic checkpoints and --resume.
#pragma once
#include <atomic>
#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "datasets/coco.hpp"
#include "datasets/features.hpp"
#include "train/evaluate.hpp"
#include "train/captioning.hpp"
#include "train/data_parallel.hpp"
#include "train/model.hpp"

namespace sat {

struct TrainOptions {
  // data
  std::string data;         // data dir (captions.json + images/) or a COCO captions JSON
  std::string images;       // image folder when data is a JSON file
  std::string train_split;  // optional list of training file names
  std::string val_data;     // validation data dir/JSON (default: same as data)
  std::string val_images;
  std::string val_split;  // optional list of validation file names
  std::string out = "runs/sat";
  // model
  std::string encoder;  // pretrained encoder file (empty: the small CNN below, trained end to end)
  std::string cut = "mixed5";
  int encoder_size = 0;      // pretrained input side (0: the encoder file's default)
  float objects = 0.f;       // > 0: the COCO detector's object maps join the grid, times this (sat extract --objects)
  std::string objects_as = "maps";  // in this form (EncoderConfig::object_form: maps, tags, both or tags+trunk)
  std::string features;      // feature cache for a pretrained encoder (default: <out>/features.feat, extracted)
  std::string val_features;  // validation feature cache (default: the same file)
  // Augmentation: a cache of the training photos mirrored left to right (sat extract --mirror). Each step reads a
  // photo's mirrored grid with probability mirror_prob, and its captions with "left" and "right" swapped.
  std::string mirror_features;
  float mirror_prob = 0.5f;
  // Fine-tune the encoder's layers after this one (e.g. mixed5, with --cut mixed7): the cache holds this layer's
  // grids, the layers up to --cut train with the decoder at tune_lr (decaying like lr). Empty: the encoder is frozen.
  // tune_lr 0: the tuned layers stay as they are (they run forward only, at every step).
  std::string tune_from;
  float tune_lr = 1e-4f;
  std::string blocks = "16,32,64,128";
  int input_size = 128;
  bool coord_channels = true;
  int embed_dim = 128, hidden_dim = 256, attn_dim = 128;
  float dropout = 0.3f;
  bool coverage = false;
  std::string attention = "soft";  // soft, hard, local, none
  std::string score = "additive";  // additive, dot, general, cosine, location
  std::string order = "bahdanau";
  int hard_window = 1, hard_samples = 1;
  // hard: probability that a step takes the expected context, reached after hard_soft_warmup epochs that start
  // fully soft (1) and decrease linearly
  float hard_soft_prob = 0.5f, hard_soft_warmup = 0;
  float reinforce_weight = 1.f, entropy_weight = 0.002f, local_sigma = 0;
  int max_len = 20, min_count = 1;
  // Start from a trained model file (its weights, vocabulary and sizes) instead of a fresh one.
  std::string init_from;
  // With init_from: keep its encoder (tuned blocks included), vocabulary and decoder sizes, but start the decoder's
  // weights afresh from seed: another member for an ensemble over the same encoder (sat model ensemble).
  bool fresh_decoder = false;
  // With fresh_decoder: the new decoder's sizes where these are set (0, or a negative dropout: the model's own), so a
  // larger or smaller decoder can train over a model's (fine-tuned) encoder. The CLI sets them from --embed, --hidden,
  // --attn and --dropout (and fresh_order from --order) when those are given with --fresh-decoder.
  int fresh_embed = 0, fresh_hidden = 0, fresh_attn = 0;
  float fresh_dropout = -1;
  std::string fresh_order;  // with fresh_decoder: the new decoder's ordering (empty: the model's own)
  // With init_from, a model with a caption memory that reads no neighbour words: its decoder reads, beside the grid,
  // the shares of the neighbour_words words most said in the memory's captions among the captions of each photo's
  // neighbour_count nearest memory photos, times neighbour_scale (train/neighbour_words.hpp; a training photo's own
  // memory photo left out). The memory is kept; the decoder's weights for the new inputs start at zero (with
  // fresh_decoder, from the seed like the rest). 0: off.
  int neighbour_words = 0, neighbour_count = 30;
  float neighbour_scale = 40;
  // Set by the trainer from --init-from's model: how that model was made (its command, recipe, epoch, and where it
  // started from in turn), recorded in every model the run writes.
  std::string started_from;
  // Training objective: "xe" (cross-entropy on the reference captions, teacher forcing) or "cider"
  // (self-critical: scst_samples captions sampled per image, reward CIDEr-D against the image's references with
  // the training split's document frequencies, baseline the mean reward of the image's other samples).
  std::string objective = "xe";
  int scst_samples = 5;
  // optimization
  int epochs = 15;
  int batch_images = 16;
  int captions_per_image = 0;  // 0: every caption of each image in the batch
  float lr = 1e-3f, lr_decay = 0.9f, clip = 5.f, penalty = 1.f;
  // Cross-entropy training: the target puts this much probability evenly over the vocabulary (0: off).
  float label_smoothing = 0;
  // Cross-entropy training: the tokens whose target is a word of the rarer object groups (the object table's groups
  // but person and dog, train/object_mentions.hpp) count this many times in the gradient (1: as any other).
  float object_word_weight = 1;
  int patience = 4;
  int val_limit = 0;  // validate on at most this many images (0: all)
  int checkpoint_every = 100;
  bool keep_epochs = false;      // also write each epoch's model as model-epochN.sat (to pick an epoch by other scores)
  std::string metric = "bleu4";  // validation score that picks the best model: bleu4 or cider
  uint64_t seed = 1;
  int threads = 0;
  // The decoder's products (seq/matmul.hpp): "f32", "bf16" (bfloat16 with float32 sums; float32 master weights,
  // Adam, softmaxes and loss) or "auto" (bf16 where it is the faster arithmetic). Resolved to f32 or bf16 when the
  // run starts, so the checkpoint records what ran and --resume keeps it; the model file records it for searches.
  // auto by default: trained both ways, bf16 learned the same as float32 within what two float32 seeds differ by
  // (the Flickr8k recipe's first stage, the synthetic scenes, self-critical training; docs/precision.md).
  std::string precision = "auto";
  // Language pretraining (train/language_pretraining.cpp): before a fresh run's first step, language_epochs epochs of
  // the new decoder as a language model over the captions of this file (text only; sat train --language-captions).
  std::string language_captions;
  int language_epochs = 0;
  std::string command;  // recorded in the model file

  nlohmann::json to_json() const;
  static TrainOptions from_json(const nlohmann::json& j);
};

// One self-critical step's gradient (added to the decoder's parameter gradients): `samples` captions drawn per
// image (grids: images.size() grids of L x D; images: their indices in the scorer's reference set), rewarded by
// CIDEr-D, each weighted by its reward minus the mean reward of the image's other samples. The images are this
// rank's share of a global batch, starting at its image `first`: each sample draws its words from its own stream
// (seeded by step_seed and the sample's place in the global batch), and the loss is normalized by the global batch's
// sampled tokens (summed across the ranks), so the ranks' gradients add up to the global batch's.
struct SelfCriticalStep {
  double reward_sum = 0;  // over this rank's samples
  int captions = 0;
};
SelfCriticalStep self_critical_step(CaptionModel& model, const float* grids, const std::vector<int>& images,
                                    const CiderDScorer& cider, int samples, uint64_t step_seed, int first,
                                    Collective& ranks, DecoderCache& cache);

struct TrainSummary {
  int epochs_run = 0;
  double best_score = 0;
  std::string metric;
  int best_epoch = 0;
  std::string model_path;
  bool interrupted = false;  // stopped by stop_requested, with a checkpoint to resume from
};

// What a resumed run may change: options that decide when to stop and what to write, never the training math.
struct ResumeOverrides {
  int epochs = 0;            // > 0: new maximum number of epochs
  int patience = 0;          // > 0: new early-stopping patience
  bool keep_epochs = false;  // true: keep each epoch's model from now on (and the epoch the checkpoint ends)
};

// Starts a fresh run in opt.out, or continues the checkpoint at resume_path (whose options win, but for `more`).
// stop_after_steps > 0 ends this run after that many optimizer steps with a checkpoint (as an interruption would),
// so --resume can pick it up. stop_requested, when set (by a signal handler: Ctrl-C), ends the run after the step
// (or the epoch's validation) under way, with a checkpoint, and train() returns with summary.interrupted.
// ranks (data-parallel training; null: this process alone): every rank runs this with the same options and data.
// Each global batch of opt.batch_images photos is split into the ranks' contiguous shares, their gradients are
// summed into the global batch's and every rank steps Adam alike; the ranks share validation, rank 0 prints and
// writes every file. The model is the one a single process makes, up to the order of floating-point sums.
TrainSummary train(TrainOptions opt, const std::string& resume_path = "", const ResumeOverrides& more = {},
                   int64_t stop_after_steps = 0, Collective* ranks = nullptr,
                   const std::atomic<bool>* stop_requested = nullptr);

// A caption as the photo mirrored left to right would be described: "left" and "right" swap, other words stay.
std::vector<std::string> mirror_caption(const std::vector<std::string>& tokens);

// Loads a caption set from a data dir or COCO JSON (+ image folder) and an optional split list.
CaptionSet load_caption_set(const std::string& data, const std::string& images, const std::string& split);

// The git commit this binary's sources were at when it was built ("+changes" when tracked files differed from it;
// "unknown" outside a git checkout): written by tools/build-commit.cmake on every build. Models record it.
const char* build_commit();

}  // namespace sat
