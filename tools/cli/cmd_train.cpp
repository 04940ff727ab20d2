#include <atomic>
#include <csignal>
#include <cstdio>
#include <unistd.h>

#include "datasets/io.hpp"
#include "tools/cli/commands.hpp"
#include "train/data_parallel.hpp"
#include "train/trainer.hpp"

namespace sat {

namespace {

// Ctrl-C during training: the first ends the run after the step under way, with a checkpoint and the command that
// resumes it (a run killed outright loses everything since its last checkpoint, an epoch by default); a second one
// ends the process at once, as Ctrl-C does elsewhere.
std::atomic<bool> g_stop_requested{false};
static_assert(std::atomic<bool>::is_always_lock_free, "set from a signal handler");

extern "C" void on_train_interrupt(int) {
  static const char message[] =
      "\nsat: interrupted: stopping after this step with a checkpoint (Ctrl-C again to stop at once)\n";
  g_stop_requested.store(true);
  std::signal(SIGINT, SIG_DFL);
  [[maybe_unused]] const ssize_t n = ::write(STDERR_FILENO, message, sizeof message - 1);
}

// A fresh run never replaces an earlier one's files: its model and checkpoint would be gone, its features kept.
void refuse_earlier_run(const std::string& out) {
  const std::string checkpoint = join_path(out, "checkpoint.sat");
  if (file_exists(checkpoint))
    fail(out, "already holds a run (checkpoint.sat); continue it with --resume " + checkpoint +
                  ", or start over in it with --overwrite");
  if (file_exists(join_path(out, "model.sat")))
    fail(out, "already holds a model (model.sat); start over in it with --overwrite, or choose another --out");
}

// Checks on a number's sign, named in the error as the user thinks of them (CLI11's own checks name a range up to
// 1.8e308).
CLI::Validator number_check(bool zero_allowed) {
  return CLI::Validator(
      [zero_allowed](std::string& text) -> std::string {
        double v = 0;
        if (!CLI::detail::lexical_cast(text, v)) return "not a number: " + text;
        if (v > 0 || (zero_allowed && v == 0)) return "";
        return std::string(zero_allowed ? "must be 0 or more" : "must be more than 0") + ", got " + text;
      },
      zero_allowed ? "NUMBER >= 0" : "NUMBER > 0");
}
const CLI::Validator kAboveZero = number_check(false), kNotNegative = number_check(true);

// The command that started the run, recorded in its model, and the decoder sizes given on it, checked (with
// --fresh-decoder they size the new decoder, the others stay the model's).
void take_command_line(TrainOptions& o, CLI::App* cmd) {
  std::string command = "sat";
  for (auto& part : cmd->remaining_for_passthrough()) command += " " + part;
  if (o.command.empty()) {
    command = "sat train";
    for (auto* opt : cmd->get_options())
      if (opt->count() > 0 && opt->get_name() != "--help")
        command += " " + opt->get_name() + " " + opt->as<std::string>();
    o.command = command;
  }
  for (const char* size : {"--embed", "--hidden", "--attn"})
    if (cmd->get_option(size)->count() > 0 && cmd->get_option(size)->as<int>() < 1)
      throw Error(std::string("train: ") + size + " must be a positive size");
  if (cmd->get_option("--dropout")->count() > 0 && !(o.dropout >= 0 && o.dropout < 1))
    throw Error("train: --dropout must be in [0, 1)");
  if (o.fresh_decoder) {  // sizes given on the command line set the fresh decoder's; the others stay the model's
    if (cmd->get_option("--embed")->count() > 0) o.fresh_embed = o.embed_dim;
    if (cmd->get_option("--hidden")->count() > 0) o.fresh_hidden = o.hidden_dim;
    if (cmd->get_option("--attn")->count() > 0) o.fresh_attn = o.attn_dim;
    if (cmd->get_option("--dropout")->count() > 0) o.fresh_dropout = o.dropout;
    if (cmd->get_option("--order")->count() > 0) o.fresh_order = o.order;
  }
}

// Where the captions and photos come from.
void add_data_options(CLI::App* cmd, TrainOptions& o) {
  cmd->add_option("--data", o.data,
                  "Training data: a directory with captions.json and images/, or a COCO captions JSON");
  cmd->add_option("--images", o.images, "Image folder when --data is a JSON file (default: the JSON's folder)");
  cmd->add_option("--train-split", o.train_split, "File listing the training image file names, one per line");
  cmd->add_option("--val-data", o.val_data, "Validation data (directory or JSON; default: --data)");
  cmd->add_option("--val-images", o.val_images, "Image folder for --val-data when it is a JSON file");
  cmd->add_option("--val-split", o.val_split, "File listing the validation image file names");
}

// The attention kind and its settings (seq/attention.hpp): soft scores, hard glimpses, local windows.
void add_attention_options(CLI::App* cmd, TrainOptions& o) {
  cmd->add_option("--attention", o.attention,
                  "soft, hard (sampled glimpse, REINFORCE), local (window around a "
                  "predicted centre) or none (Show and Tell)")
      ->capture_default_str();
  cmd->add_option("--score", o.score, "Attention score: additive, dot, general, cosine or location")
      ->capture_default_str();
  cmd->add_option(
         "--order", o.order,
         "bahdanau (attend with the previous state, context into the LSTM) or luong (LSTM first, "
         "attend with the new state, h~ = tanh(W [context; h]) to the output and fed back) or updown (two LSTMs: the "
         "first attends with its new state, the second reads the context and speaks; Anderson et al. 2018)")
      ->capture_default_str();
  cmd->add_option("--hard-window", o.hard_window, "Hard attention: glimpse window side (1 = the one location, odd)")
      ->capture_default_str();
  cmd->add_option("--hard-samples", o.hard_samples, "Hard attention: glimpse samples per caption and step")
      ->capture_default_str()
      ->check(CLI::Range(1, 256));
  cmd->add_option("--hard-soft-prob", o.hard_soft_prob,
                  "Hard attention: probability that a training step takes the expected (soft) context")
      ->capture_default_str();
  cmd->add_option("--hard-soft-warmup", o.hard_soft_warmup,
                  "Hard attention: epochs over which that probability falls from 1 (all soft) to --hard-soft-prob")
      ->capture_default_str();
  cmd->add_option("--reinforce-weight", o.reinforce_weight, "Hard attention: lambda_r of the REINFORCE term")
      ->capture_default_str()
      ->check(kNotNegative);
  cmd->add_option("--entropy-weight", o.entropy_weight, "Hard attention: lambda_e of the entropy bonus")
      ->capture_default_str()
      ->check(kNotNegative);
  cmd->add_option("--local-sigma", o.local_sigma, "Local attention: window width in grid cells (0: grid / 4)")
      ->capture_default_str()
      ->check(kNotNegative);
}

}  // namespace

void add_train_command(CLI::App& app) {
  auto o = std::make_shared<TrainOptions>();
  auto resume = std::make_shared<std::string>();
  auto more_epochs = std::make_shared<int>(0);
  auto stop_after = std::make_shared<int64_t>(0);
  auto mpi_timeout = std::make_shared<double>(300);
  auto overwrite = std::make_shared<bool>(false);
  auto* cmd = app.add_subcommand("train", "Train a captioner (encoder and decoder end to end)");
  add_data_options(cmd, *o);
  cmd->add_option("--out", o->out,
                  "Output directory: model.sat (best) and checkpoint.sat (one that already holds a run is refused "
                  "but with --overwrite)")
      ->capture_default_str();
  cmd->add_flag("--overwrite", *overwrite, "Start a fresh run in an --out folder that already holds one, replacing it");
  cmd->add_option("--encoder", o->encoder,
                  "Pretrained encoder file (e.g. models/inception_v3.sat): frozen, features "
                  "cached once; without it a small CNN is trained end to end");
  cmd->add_option("--cut", o->cut, "With --encoder: layer that gives the grid")->capture_default_str();
  cmd->add_option(
      "--tune-from", o->tune_from,
      "With --encoder: fine-tune the layers after this one up to --cut (e.g. --cut mixed7 --tune-from "
      "mixed5); the feature cache holds this layer's grids. With --init-from a frozen ResNet model: its top units "
      "start fine-tuning; from one fine-tuned after a later layer: more units tune, the tuned ones kept");
  cmd->add_option("--tune-lr", o->tune_lr,
                  "Learning rate of the fine-tuned encoder layers (decays like --lr; 0: they stay as they are)")
      ->capture_default_str()
      ->check(kNotNegative);
  cmd->add_option("--objects", o->objects,
                  "With --encoder (or --init-from M --fresh-decoder): join the COCO detector's class maps (sat "
                  "detect) to the grid, times this, as 80 more features per location (0: no; the cache: sat extract "
                  "--objects with the same value, and --raw for a fine-tuned encoder)")
      ->check(CLI::Range(0.0, 1000.0));
  cmd->add_option("--objects-as", o->objects_as,
                  "With --objects: maps (each class's heat pooled onto the grid), tags (each class's peak over the "
                  "photo, the same at every location), both (160 features) or tags+trunk (the tags, then the detector's "
                  "trunk output averaged over the photo, each trunk channel standardized over the training photos and the "
                  "statistics stored in the model: 560); the cache: sat extract --objects-as")
      ->check(CLI::IsMember({"maps", "tags", "both", "tags+trunk"}))
      ->capture_default_str();
  cmd->add_option("--encoder-size", o->encoder_size, "With --encoder: input side (0: the file's default, 299)")
      ->capture_default_str()
      ->check(CLI::Range(0, 2048));
  cmd->add_option("--features", o->features,
                  "With --encoder: feature cache of the images (default: <out>/features.feat, "
                  "made if missing)");
  cmd->add_option("--val-features", o->val_features, "With --encoder: validation feature cache (default: --features)");
  cmd->add_option("--mirror-features", o->mirror_features,
                  "Augmentation: a cache of the training photos mirrored "
                  "(sat extract --mirror, same encoder and cut as --features); each step reads a photo's mirrored grid "
                  "with probability --mirror-prob, its captions with left and right swapped");
  cmd->add_option("--mirror-prob", o->mirror_prob, "With --mirror-features: the probability a photo is read mirrored")
      ->capture_default_str()
      ->check(CLI::Range(0.0, 1.0));
  cmd->add_option("--blocks", o->blocks, "Encoder conv blocks: output channels, each 3x3 conv+BN+ReLU+2x2 max pool")
      ->capture_default_str();
  cmd->add_option("--input-size", o->input_size, "Encoder input side in pixels")->capture_default_str();
  cmd->add_option("--coord-channels", o->coord_channels, "Append (row, column) channels to the feature grid")
      ->capture_default_str();
  cmd->add_option("--embed", o->embed_dim, "Word embedding size")->capture_default_str();
  cmd->add_option("--hidden", o->hidden_dim, "LSTM hidden size")->capture_default_str();
  cmd->add_option("--attn", o->attn_dim, "Attention projection size")->capture_default_str();
  cmd->add_option("--dropout", o->dropout, "Dropout on the LSTM output and the deep output layer")
      ->capture_default_str();
  cmd->add_option("--coverage", o->coverage,
                  "Coverage-aware attention: the score also sees how much each location was attended so far")
      ->capture_default_str();
  add_attention_options(cmd, *o);
  cmd->add_option("--init-from", o->init_from,
                  "Start from this trained model file (weights, vocabulary, sizes; "
                  "the model options above are then ignored, but for the sizes given with --fresh-decoder)");
  cmd->add_flag(
      "--fresh-decoder", o->fresh_decoder,
      "With --init-from: keep that model's encoder, vocabulary and "
      "sizes, but start the decoder from --seed: with a pretrained encoder and --tune-lr 0 (its fine-tuned "
      "layers stay as they are), another member for sat model ensemble (a small CNN encoder trains on, so "
      "its members differ in their encoders); from an ensemble, another member over its encoder, its "
      "first member's sizes; --embed, --hidden, --attn, --dropout and --order given with it set the new decoder's");
  cmd->add_option("--neighbour-words", o->neighbour_words,
                  "With --init-from a model with a caption memory (sat model memory): its decoder also reads, at "
                  "every location, the share of the nearest memory photos' captions that say each of this many words "
                  "(those most said in the memory; a training photo's own captions left out); their weights start at "
                  "zero, the memory is kept. 0: off")
      ->capture_default_str();
  cmd->add_option("--neighbour-count", o->neighbour_count, "With --neighbour-words: the memory photos counted")
      ->capture_default_str();
  cmd->add_option("--neighbour-scale", o->neighbour_scale,
                  "With --neighbour-words: what a share of 1 reads as (at 4, as the detector's tags, a decoder "
                  "trained on from Flickr8k's barely learned to read them: docs/objects.md)")
      ->capture_default_str();
  cmd->add_option("--objective", o->objective,
                  "xe: cross-entropy on the references; cider: self-critical training "
                  "(needs --init-from): sampled captions rewarded by CIDEr-D")
      ->capture_default_str()
      ->check(CLI::IsMember({"xe", "cider"}));
  cmd->add_option("--scst-samples", o->scst_samples,
                  "Self-critical: captions sampled per image (the baseline of each "
                  "is the mean reward of the others)")
      ->capture_default_str()
      ->check(CLI::Range(2, 256));
  cmd->add_option("--max-len", o->max_len, "Longest caption in words (longer ones are cut)")->capture_default_str();
  cmd->add_option("--min-count", o->min_count, "Words seen fewer times in training become <unk>")
      ->capture_default_str()
      ->check(kNotNegative);
  cmd->add_option("--epochs", o->epochs, "Maximum number of epochs (0: write the initialized, untrained model)")
      ->capture_default_str();
  cmd->add_option("--batch", o->batch_images, "Images per batch (each brings its captions)")->capture_default_str();
  cmd->add_option("--captions-per-image", o->captions_per_image, "Captions used per image and step (0 = all)")
      ->capture_default_str()
      ->check(kNotNegative);
  cmd->add_option("--lr", o->lr, "Adam learning rate")->capture_default_str()->check(kAboveZero);
  cmd->add_option("--lr-decay", o->lr_decay, "Learning rate factor per epoch")
      ->capture_default_str()
      ->check(kAboveZero);
  cmd->add_option("--clip", o->clip, "Gradient-norm clipping threshold (0 = off)")
      ->capture_default_str()
      ->check(kNotNegative);
  cmd->add_option("--label-smoothing", o->label_smoothing,
                  "Cross-entropy training: put this much of the target's "
                  "probability evenly over the vocabulary instead of on the reference word (0: off; 0.1 is usual)")
      ->capture_default_str();
  cmd->add_option("--object-word-weight", o->object_word_weight,
                  "Cross-entropy training: the words of the rarer object groups (the object table's, but person and "
                  "dog: ball, horse, boat, car, ...) count this many times in the loss (1: as any other word)")
      ->capture_default_str();
  cmd->add_option("--penalty", o->penalty, "Doubly stochastic attention penalty weight lambda")
      ->capture_default_str()
      ->check(kNotNegative);
  cmd->add_option("--patience", o->patience,
                  "Stop after this many epochs without a better validation score (--metric); with --resume, overrides "
                  "the checkpoint's")
      ->capture_default_str()
      ->check(kAboveZero);
  cmd->add_option("--val-limit", o->val_limit, "Validate on at most this many images (0 = all)")
      ->capture_default_str()
      ->check(kNotNegative);
  cmd->add_option("--metric", o->metric, "Validation score that picks the best model and stops early: bleu4 or cider")
      ->capture_default_str();
  cmd->add_option("--checkpoint-every", o->checkpoint_every, "Also checkpoint every N steps inside an epoch")
      ->capture_default_str()
      ->check(kNotNegative);
  cmd->add_option("--seed", o->seed, "Random seed (initialization, order, dropout)")->capture_default_str();
  cmd->add_option("--threads", o->threads,
                  "Worker threads (0 = all cores; under mpirun, the rank's share of its machine's "
                  "cores); with --resume, overrides the checkpoint's")
      ->capture_default_str()
      ->check(CLI::Range(0, 4096));
  cmd->add_option("--precision", o->precision,
                  "The decoder's matrix products: f32, bf16 (bfloat16 inputs, float32 sums; weights, Adam, softmaxes "
                  "and the loss stay float32) or auto (bf16 where it is faster: AMX, or AVX512-BF16 on AMD). "
                  "Recorded in the checkpoint (--resume keeps it) and in the model, whose searches use it")
      ->capture_default_str()
      ->check(CLI::IsMember({"auto", "f32", "bf16"}));
  cmd->add_option("--language-captions", o->language_captions,
                  "Before the first step on photos, train the new decoder as a language model on the captions of this "
                  "file (text only: COCO or Karpathy JSON, Flickr8k token or csv, or coco-caption's reference JSON such "
                  "as val2014_refs4_codalab.json); each reads the training photos' mean grid, words outside the "
                  "vocabulary read as <unk>. With --encoder (frozen) or --init-from M --fresh-decoder; not under mpirun");
  cmd->add_option("--language-epochs", o->language_epochs,
                  "With --language-captions: epochs over them (default 1), at --lr decaying by --lr-decay")
      ->check(CLI::Range(1, 1000));
  cmd->add_option("--resume", *resume, "Continue from a checkpoint.sat (its own options are used)");
  cmd->add_option("--more-epochs", *more_epochs, "With --resume: new maximum number of epochs")->check(kNotNegative);
  cmd->add_flag(
      "--keep-epochs", o->keep_epochs,
      "Also write each epoch's model as model-epochN.sat (to choose an epoch "
      "by other scores, such as beam search on all dev photos); with --resume at an epoch's end, that epoch's too");
  cmd->add_option("--stop-after", *stop_after, "End this run after N steps with a checkpoint (continue with --resume)")
      ->check(kNotNegative);
  cmd->add_option("--mpi-timeout", *mpi_timeout,
                  "Under mpirun: seconds a rank waits for the others in one exchange "
                  "before it gives up, naming the exchange (a rank that hangs; 0: wait forever)")
      ->capture_default_str()
      ->check(CLI::NonNegativeNumber);
  cmd->callback([o, resume, more_epochs, stop_after, mpi_timeout, overwrite, cmd] {
    if (resume->empty() && o->data.empty()) throw CLI::RequiredError("--data (or --resume)");
    take_command_line(*o, cmd);
    if (!o->language_captions.empty() && o->language_epochs == 0) o->language_epochs = 1;
    ResumeOverrides more;  // with --resume, the checkpoint's options hold but for these
    more.epochs = *more_epochs;
    more.keep_epochs = o->keep_epochs;
    if (cmd->get_option("--patience")->count() > 0) more.patience = o->patience;
    if (resume->empty() && !*overwrite) refuse_earlier_run(o->out);
    std::unique_ptr<Collective> ranks = join_ranks(*mpi_timeout);
    // Ranks would have to agree on the step to stop at; under mpirun, Ctrl-C keeps mpirun's meaning.
    if (ranks->size() == 1) std::signal(SIGINT, on_train_interrupt);
    auto summary = train(*o, *resume, more, *stop_after, ranks.get(), &g_stop_requested);
    std::signal(SIGINT, SIG_DFL);
    if (summary.interrupted) throw CLI::RuntimeError(130);  // as a shell reports a Ctrl-C
    if (!ranks->leads()) return;
    std::printf("best val %s %.4f (epoch %d), model %s\n", summary.metric == "cider" ? "CIDEr-D" : "BLEU-4",
                summary.best_score, summary.best_epoch, summary.model_path.c_str());
  });
}

}  // namespace sat
