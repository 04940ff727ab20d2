// train() (train/trainer.hpp): its options, the self-critical step, and the epochs of a run that
// train/trainer_setup.cpp set up: the steps, validation, early stopping and checkpoints.
#include "train/trainer.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <optional>
#include <set>

#include "datasets/io.hpp"
#include "seq/search.hpp"
#include "train/progress.hpp"
#include "train/trainer_steps.hpp"

namespace sat {

using nlohmann::json;

json TrainOptions::to_json() const {
  return {{"data", data},
          {"images", images},
          {"train_split", train_split},
          {"val_data", val_data},
          {"val_images", val_images},
          {"val_split", val_split},
          {"out", out},
          {"blocks", blocks},
          {"input_size", input_size},
          {"coord_channels", coord_channels},
          {"embed_dim", embed_dim},
          {"hidden_dim", hidden_dim},
          {"attn_dim", attn_dim},
          {"dropout", dropout},
          {"coverage", coverage},
          {"max_len", max_len},
          {"min_count", min_count},
          {"epochs", epochs},
          {"batch_images", batch_images},
          {"captions_per_image", captions_per_image},
          {"lr", lr},
          {"lr_decay", lr_decay},
          {"clip", clip},
          {"penalty", penalty},
          {"label_smoothing", label_smoothing},
          {"object_word_weight", object_word_weight},
          {"patience", patience},
          {"val_limit", val_limit},
          {"encoder", encoder},
          {"cut", cut},
          {"encoder_size", encoder_size},
          {"features", features},
          {"val_features", val_features},
          {"mirror_features", mirror_features},
          {"mirror_prob", mirror_prob},
          {"tune_from", tune_from},
          {"tune_lr", tune_lr},
          {"attention", attention},
          {"score", score},
          {"order", order},
          {"hard_window", hard_window},
          {"hard_samples", hard_samples},
          {"hard_soft_prob", hard_soft_prob},
          {"hard_soft_warmup", hard_soft_warmup},
          {"reinforce_weight", reinforce_weight},
          {"entropy_weight", entropy_weight},
          {"local_sigma", local_sigma},
          {"init_from", init_from},
          {"fresh_decoder", fresh_decoder},
          {"fresh_embed", fresh_embed},
          {"fresh_hidden", fresh_hidden},
          {"fresh_attn", fresh_attn},
          {"fresh_dropout", fresh_dropout},
          {"fresh_order", fresh_order},
          {"neighbour_words", neighbour_words},
          {"neighbour_count", neighbour_count},
          {"neighbour_scale", neighbour_scale},
          {"started_from", started_from},
          {"objective", objective},
          {"scst_samples", scst_samples},
          {"checkpoint_every", checkpoint_every},
          {"keep_epochs", keep_epochs},
          {"metric", metric},
          {"seed", seed},
          {"threads", threads},
          {"precision", precision},
          {"language_captions", language_captions},
          {"language_epochs", language_epochs},
          {"command", command}};
}

TrainOptions TrainOptions::from_json(const json& j) {
  TrainOptions o;
  try {
#define GET(k) o.k = j.at(#k).get<decltype(o.k)>()
    GET(data);
    GET(images);
    GET(train_split);
    GET(val_data);
    GET(val_images);
    GET(val_split);
    GET(out);
    GET(blocks);
    GET(input_size);
    GET(coord_channels);
    GET(embed_dim);
    GET(hidden_dim);
    GET(attn_dim);
    GET(dropout);
    GET(max_len);
    GET(min_count);
    GET(epochs);
    GET(batch_images);
    GET(captions_per_image);
    GET(lr);
    GET(lr_decay);
    GET(clip);
    GET(penalty);
    GET(patience);
    GET(val_limit);
    GET(checkpoint_every);
    GET(seed);
    GET(threads);
    GET(command);
#undef GET
    o.metric = j.value("metric", std::string("bleu4"));
    o.keep_epochs = j.value("keep_epochs", false);
    o.precision = j.value("precision", std::string("f32"));  // checkpoints before it trained in float32
    o.language_captions = j.value("language_captions", std::string());
    o.language_epochs = j.value("language_epochs", 0);
    o.coverage = j.value("coverage", false);
    o.encoder = j.value("encoder", std::string());
    o.cut = j.value("cut", std::string("mixed5"));
    o.encoder_size = j.value("encoder_size", 0);
    o.features = j.value("features", std::string());
    o.val_features = j.value("val_features", std::string());
    o.mirror_features = j.value("mirror_features", std::string());
    o.mirror_prob = j.value("mirror_prob", 0.5f);
    o.label_smoothing = j.value("label_smoothing", 0.f);
    o.object_word_weight = j.value("object_word_weight", 1.f);
    o.tune_from = j.value("tune_from", std::string());
    o.tune_lr = j.value("tune_lr", 1e-4f);
    o.attention = j.value("attention", std::string("soft"));
    o.score = j.value("score", std::string("additive"));
    o.order = j.value("order", std::string("bahdanau"));
    o.hard_window = j.value("hard_window", 1);
    o.hard_samples = j.value("hard_samples", 1);
    o.hard_soft_prob = j.value("hard_soft_prob", 0.5f);
    o.hard_soft_warmup = j.value("hard_soft_warmup", 0.f);
    o.reinforce_weight = j.value("reinforce_weight", 1.f);
    o.entropy_weight = j.value("entropy_weight", 0.002f);
    o.local_sigma = j.value("local_sigma", 0.f);
    o.init_from = j.value("init_from", std::string());
    o.fresh_decoder = j.value("fresh_decoder", false);
    o.fresh_embed = j.value("fresh_embed", 0), o.fresh_hidden = j.value("fresh_hidden", 0);
    o.fresh_attn = j.value("fresh_attn", 0), o.fresh_dropout = j.value("fresh_dropout", -1.f);
    o.fresh_order = j.value("fresh_order", std::string());
    o.neighbour_words = j.value("neighbour_words", 0), o.neighbour_count = j.value("neighbour_count", 30);
    o.neighbour_scale = j.value("neighbour_scale", 40.f);
    o.started_from = j.value("started_from", std::string());
    o.objective = j.value("objective", std::string("xe"));
    o.scst_samples = j.value("scst_samples", 5);
  } catch (const std::exception& e) {
    throw Error(std::string("training options are malformed (") + e.what() + ")");
  }
  return o;
}

SelfCriticalStep self_critical_step(CaptionModel& model, const float* grids, const std::vector<int>& images,
                                    const CiderDScorer& cider, int samples, uint64_t step_seed, int first,
                                    Collective& ranks, DecoderCache& cache) {
  const int n = (int)images.size(), K = samples, B = n * K;
  const int L = model.encoder_config.locations(), D = model.decoder_config.feature_dim;  // with any neighbour words
  const Mat F = n ? Mat(Eigen::Map<const Mat>(grids, (int64_t)n * L, D)) : Mat();  // an image's K samples read its grid
  SelfCriticalStep r;
  CaptionBatch cb;
  if (n > 0) {
    std::vector<uint64_t> seeds(B);
    for (int b = 0; b < B; ++b) seeds[b] = row_seed(step_seed, (uint64_t)first * K + b);
    std::vector<Hypothesis> drawn = sample_search(*model.decoder, F, n, model.max_len, seeds, K);
    std::vector<double> rewards(B);
#pragma omp parallel for schedule(dynamic, 8)
    for (int b = 0; b < B; ++b) rewards[b] = cider.score(model.vocab.decode(drawn[b].tokens), images[b / K]);
    std::vector<double> advantage = leave_one_out_advantages(rewards, K);
    std::vector<std::vector<int>> caps(B);
    for (int b = 0; b < B; ++b) caps[b] = drawn[b].tokens;
    cb = CaptionBatch::from_ids(caps, model.max_len);
    for (int b = 0; b < B; ++b)  // a sample cut at max_len drew no <end>: its log-probability has no <end> term
      if (drawn[b].alphas.size() == drawn[b].tokens.size()) cb.mask[(size_t)b * cb.T + drawn[b].tokens.size()] = 0.f;
    cb.row_weight.assign(advantage.begin(), advantage.end());
    for (int b = 0; b < B; ++b) cb.grid.push_back(b / K);
    r.captions = B;
    for (double x : rewards) r.reward_sum += x;
  }
  // The tokens the whole global batch sampled normalize every rank's loss.
  double tokens = n ? (double)cb.real_tokens() : 0.0;
  ranks.sum(&tokens, 1, "the sampled captions' token count");
  if (n > 0) {
    cb.norm_tokens = (int64_t)tokens;
    // No dropout: the gradient is of the log-probability of the distribution the samples came from.
    model.decoder->forward(F, cb, 0.f, false, nullptr, cache);
    model.decoder->backward(cache, nullptr);
  }
  return r;
}

namespace trainer {

json TrainState::to_json() const {
  return {{"epoch", epoch},           {"step_in_epoch", step_in_epoch},
          {"epoch_seed", epoch_seed}, {"global_step", global_step},
          {"best_score", best_score}, {"best_epoch", best_epoch},
          {"bad_epochs", bad_epochs}, {"history", history}};
}

TrainState TrainState::from_json(const json& j) {
  TrainState s;
  s.epoch = j.at("epoch");
  s.step_in_epoch = j.at("step_in_epoch");
  s.epoch_seed = j.at("epoch_seed");
  s.global_step = j.at("global_step");
  s.best_score = j.at("best_score");
  s.best_epoch = j.at("best_epoch");
  s.bad_epochs = j.at("bad_epochs");
  s.history = j.at("history");
  return s;
}

namespace {

// The checkpoint --resume continues: the model, Adam's moments and step, the options, the state st and the random
// generator (rank 0 writes it).
void save_checkpoint(const TrainRun& run, const TrainState& st) {
  CaptionModel& model = *run.model;
  const Adam& adam = run.adam;
  TensorFile tf = model.to_tensor_file();
  auto params = model.params();
  for (size_t k = 0; k < params.size(); ++k) {
    if (!params[k]->trainable) continue;
    Param m("adam.m/" + params[k]->name, params[k]->shape, false),
        v("adam.v/" + params[k]->name, params[k]->shape, false);
    m.value = adam.m[k];
    v.value = adam.v[k];
    tf.tensors.emplace(m.name, std::move(m));
    tf.tensors.emplace(v.name, std::move(v));
  }
  tf.metadata["checkpoint"] = json{
      {"options", run.opt.to_json()},
      {"state", st.to_json()},
      {"rng", run.rng.state()},
      {"adam_step", adam.step}}.dump();
  save_safetensors(run.ckpt_path, tf);
}

double metric_of(const CaptionScores& s, const std::string& metric) {
  return metric == "cider" ? s.cider_d : s.bleu[3];
}

CaptionScores run_validation(TrainRun& run) {
  return validate_across(*run.model, run.val_set, run.val_feats, run.val_planes, run.ranks);
}

// What a saved model records about its run and the epoch it ends.
json epoch_info(const TrainOptions& opt, int epoch, const json& val_scores) {
  return json{{"command", opt.command},
              {"data", opt.data},
              {"train_split", opt.train_split},
              {"val_data", opt.val_data.empty() ? opt.data : opt.val_data},
              {"val_split", opt.val_split},
              {"git_commit", build_commit()},
              {"epoch", epoch},
              {"val_scores", val_scores},
              {"options", opt.to_json()},
              {"started_from", opt.started_from}};
}

// --keep-epochs: each epoch's model as model-epochN.sat, beside the best one (rank 0 writes it).
void keep_epoch(TrainRun& run, int epoch, const json& val_scores) {
  if (!run.lead) return;
  CaptionModel& model = *run.model;
  json best_info = model.info;  // the checkpoint goes on recording the best epoch's provenance
  model.info = epoch_info(run.opt, epoch, val_scores);
  const std::string path = join_path(run.opt.out, "model-epoch" + std::to_string(epoch) + ".sat");
  model.save(path);
  model.info = best_info;
  note(run.lead, "kept epoch %d: %s\n", epoch, path.c_str());
}

// --epochs 0: the untrained baseline (or the decoder after language pretraining alone), scored once and saved.
TrainSummary save_untrained(TrainRun& run, TrainSummary summary) {
  const TrainOptions& opt = run.opt;
  CaptionScores sc = run_validation(run);
  run.model->info = {
      {"command", opt.command},     {"data", opt.data},         {"git_commit", build_commit()},    {"epoch", 0},
      {"val_scores", sc.to_json()}, {"options", opt.to_json()}, {"started_from", opt.started_from}};
  if (run.lead) run.model->save(run.best_path);
  note(run.lead, "%s (epochs 0): val BLEU-4 %.4f CIDEr-D %.4f -> %s\n",
       opt.language_epochs > 0 ? "model trained on text alone" : "untrained model", sc.bleu[3], sc.cider_d,
       run.best_path.c_str());
  summary.best_score = metric_of(sc, opt.metric);
  summary.metric = opt.metric;
  return summary;
}

// What a step exchanges besides gradients and buffers: sums over the ranks' shares, for the log and the NaN check.
enum Stat {
  kCrossEntropySum,
  kTokens,
  kPenaltySum,
  kRows,
  kAdvantageCount,
  kAdvantageSum,
  kAdvantageSquares,
  kRewardSum,
  kCaptions,
  kStats
};

// What the steps reuse from one to the next.
struct StepBuffers {
  explicit StepBuffers(const TrainRun& run) {
    if (run.parallel) exchange = std::make_unique<StepExchange>(run.params, kStats);
    for (Param* p : run.model->decoder->params()) decoder_params.insert(p);
  }
  std::vector<float> planes, grid, tuned_grid;
  Mat F, dF;
  DecoderCache cache;
  std::unique_ptr<StepExchange> exchange;  // parallel runs only (as large as the gradients)
  std::set<const Param*> decoder_params;   // a buffer's weight is its rank's share of the rows (decoder) or photos
};

// One step's photos: the global batch, and this rank's contiguous share of its photos (every rank draws the same
// numbers from rng, so the batch, the captions chosen and the step's seed are the same everywhere).
struct StepBatch {
  std::vector<int> batch;            // the global batch's photos
  Share mine;                        // this rank's share: its places in batch
  std::vector<int> idx;              // this rank's photos
  uint64_t seed = 0;                 // dropout masks, glimpses and samples: one stream per caption
  std::vector<char> batch_mirrored;  // --mirror-features: the global batch's photos read mirrored
  std::vector<char> step_mirrored;   // this step's photos (this rank's share) that read their mirrored grids
};

std::vector<int> global_batch(const TrainRun& run, const std::vector<int>& order, int step) {
  const int batch_images = run.opt.batch_images;
  return std::vector<int>(order.begin() + std::min<size_t>((size_t)step * batch_images, order.size()),
                          order.begin() + std::min<size_t>((size_t)(step + 1) * batch_images, order.size()));
}

std::vector<int> share_in(const Collective& ranks, const std::vector<int>& photos) {
  const Share sh = share_of((int)photos.size(), ranks.size(), ranks.rank());
  return std::vector<int>(photos.begin() + sh.begin, photos.begin() + sh.end);
}

// Starts the disk reads of these photos' grids (the step's, and the next step's while this one computes)
void prefetch_grids(const TrainRun& run, const std::vector<int>& idx) {
  for (int i : idx) {
    run.train_feats->prefetch(run.train_record[i]);
    if (run.mirror_feats) run.mirror_feats->prefetch(run.mirror_record[i]);
  }
}

// Step s of the epoch whose photos come in `order`: its photos (read ahead from the feature caches), its seed, and
// which photos read mirrored grids.
StepBatch batch_of_step(TrainRun& run, const std::vector<int>& order, int s) {
  StepBatch b;
  b.batch = global_batch(run, order, s);
  b.mine = share_of((int)b.batch.size(), run.ranks.size(), run.ranks.rank());
  b.idx = share_in(run.ranks, b.batch);
  if (run.from_features) {
    prefetch_grids(run, b.idx);
    // the next step's share of photos, read while this step computes
    if (s + 1 < run.steps_per_epoch) prefetch_grids(run, share_in(run.ranks, global_batch(run, order, s + 1)));
  }
  b.seed = run.rng.engine();  // dropout masks, glimpses and samples: one stream per caption
  // --mirror-features: which photos of the global batch are read mirrored (from the step's seed, so every rank
  // and a resumed run choose alike; the run's other random numbers are those of a run without it)
  b.batch_mirrored.assign(run.mirror_feats ? b.batch.size() : 0, 0);
  for (size_t k = 0; k < b.batch_mirrored.size(); ++k)
    b.batch_mirrored[k] = RowRng(row_seed(b.seed ^ 0x6d6972726f72ull, k)).uniform() < run.opt.mirror_prob;
  if (run.mirror_feats)
    b.step_mirrored.assign(b.batch_mirrored.begin() + b.mine.begin, b.batch_mirrored.begin() + b.mine.end);
  return b;
}

void read_grids(const TrainRun& run, const StepBatch& b, std::vector<float>& out) {
  const std::vector<int>& idx = b.idx;
  const int cache_L = run.cache_L, cache_D = run.cache_D;
  out.resize(idx.size() * cache_L * cache_D);
  for (size_t k = 0; k < idx.size(); ++k)
    if (k < b.step_mirrored.size() && b.step_mirrored[k])
      run.mirror_feats->read(run.mirror_record[idx[k]], out.data() + k * cache_L * cache_D);
    else
      run.train_feats->read(run.train_record[idx[k]], out.data() + k * cache_L * cache_D);
}

// The encoder's part of the decoder's gradient dF (rows of D_decoder values, the neighbour words' after the
// encoder's D): rows of D values, in place.
void strip_neighbour_words(Mat& dF, int D, int D_decoder) {
  if (dF.cols() != D_decoder) throw Error("train: the decoder's gradient has another width than its grid");
  Mat kept = dF.leftCols(D);
  dF.swap(kept);
}

// This rank's photos through the encoder (or the cache) into buf.grid.
void load_grids(TrainRun& run, StepBuffers& buf, const StepBatch& b, bool training) {
  const int n = (int)b.idx.size();
  if (run.from_features) {
    read_grids(run, b, buf.grid);
    if (run.tuned) {  // it standardizes the object channels too
      run.model->tuned_forward(buf.grid.data(), n, training && run.tail_learns, buf.tuned_grid);
      buf.grid.swap(buf.tuned_grid);
    } else {
      run.model->standardize_object_channels(buf.grid.data(), (size_t)n * run.cache_L);
    }
  } else {
    run.train_bank.planes(b.idx, run.model->encoder_config, buf.planes);
    run.model->cnn->forward(buf.planes.data(), n, training, buf.grid);
  }
  if (run.model->neighbour_words.on()) {  // the neighbours' words beside each grid, the photo's own memory photo out
    const int D = run.model->encoder_config.feature_dim();
    std::vector<int> own(n);
    for (int k = 0; k < n; ++k) own[k] = run.own_memory_photo[b.idx[k]];
    const Mat G = run.model->decoder_grid(Eigen::Map<const Mat>(buf.grid.data(), (int64_t)n * run.L, D), n, own);
    buf.grid.assign(G.data(), G.data() + G.size());
  }
}

// What this rank's share of a step computed (its gradients are in the parameters).
struct StepResult {
  std::vector<double> stats = std::vector<double>(kStats, 0.0);
  double my_rows = 0, all_rows = 0;  // decoder rows: this rank's and the global batch's
};

// --objective cider: this rank's photos' sampled captions, rewarded by CIDEr-D (self_critical_step).
StepResult self_critical_share(TrainRun& run, StepBuffers& buf, const StepBatch& b) {
  StepResult r;
  const int n = (int)b.idx.size();
  if (n > 0) load_grids(run, buf, b, false);  // the encoder stays as it is
  SelfCriticalStep sc = self_critical_step(*run.model, buf.grid.data(), b.idx, *run.cider, run.opt.scst_samples, b.seed,
                                           b.mine.begin, run.ranks, buf.cache);
  r.stats[kRewardSum] = sc.reward_sum;
  r.stats[kCaptions] = sc.captions;
  r.my_rows = n, r.all_rows = (double)b.batch.size();
  return r;
}

// Cross-entropy (and the attention penalty; hard attention's REINFORCE terms) on this rank's photos' captions, the
// encoder trained along when it learns. Step s of the epoch; nothing when the global batch has no captions (alike on
// every rank).
std::optional<StepResult> cross_entropy_share(TrainRun& run, StepBuffers& buf, const StepBatch& b, int s) {
  const TrainOptions& opt = run.opt;
  CaptionModel& model = *run.model;
  const std::vector<int>& batch = b.batch;
  const Share mine = b.mine;
  const int n = (int)b.idx.size();
  const int samples = model.decoder_config.hard() ? opt.hard_samples : 1;  // decoder rows per caption
  StepResult result;
  std::vector<double>& stats = result.stats;
  // The global batch's captions (hard attention: several glimpse samples of each), in photo order; this rank's
  // rows are those of its photos. Each row's random stream is seeded by its place in the global batch.
  std::vector<std::vector<int>> caps;
  std::vector<int> cap_image;  // the row's photo, its place in the global batch
  for (int k = 0; k < (int)batch.size(); ++k) {
    std::vector<int> ci = run.train_set.images[batch[k]].caption_indices;
    if (opt.captions_per_image > 0 && (int)ci.size() > opt.captions_per_image) {
      shuffle(ci, run.rng);
      ci.resize(opt.captions_per_image);
    }
    const bool mirrored = !b.batch_mirrored.empty() && b.batch_mirrored[k];
    for (int c : ci)
      for (int r = 0; r < samples; ++r)
        caps.push_back(mirrored ? run.mirrored_caption_ids[c] : run.caption_ids[c]), cap_image.push_back(k);
  }
  if (caps.empty()) return std::nullopt;  // alike on every rank
  int64_t global_tokens = 0;              // as CaptionBatch::from_ids masks them: the words kept, and <end>
  for (auto& c : caps) global_tokens += std::min((int)c.size(), opt.max_len) + 1;
  const int first = (int)(std::lower_bound(cap_image.begin(), cap_image.end(), mine.begin) - cap_image.begin());
  const int last = (int)(std::lower_bound(cap_image.begin(), cap_image.end(), mine.end) - cap_image.begin());
  const int B = last - first;
  if (B > 0) {
    load_grids(run, buf, b, true);
    buf.F = Eigen::Map<Mat>(buf.grid.data(), (int64_t)n * run.L, run.D);
    CaptionBatch cb = CaptionBatch::from_ids({caps.begin() + first, caps.begin() + last}, opt.max_len);
    for (int r = first; r < last; ++r) {
      cb.grid.push_back(cap_image[r] - mine.begin);  // the captions of an image read its grid once
      cb.row_seed.push_back(row_seed(b.seed, r));
    }
    cb.label_smoothing = opt.label_smoothing;
    cb.word_weight = run.word_weight;
    cb.norm_tokens = global_tokens;
    cb.norm_rows = (int)caps.size();
    if (model.decoder_config.hard()) {
      cb.samples = samples;
      const double progress =
          opt.hard_soft_warmup > 0 ? (run.st.epoch + (double)s / run.steps_per_epoch) / opt.hard_soft_warmup : 1.0;
      model.decoder->set_hard_soft_prob(
          (float)(opt.hard_soft_prob + (1.0 - opt.hard_soft_prob) * std::max(0.0, 1.0 - progress)));
    }
    DecoderLoss loss = model.decoder->forward(buf.F, cb, opt.penalty, true, nullptr, buf.cache);
    const bool encoder_learns = !run.from_features || run.tail_learns;
    model.decoder->backward(buf.cache, encoder_learns ? &buf.dF : nullptr);
    if (encoder_learns) {
      // dF: one block per image, summed over its captions by the decoder
      if (model.neighbour_words.on()) strip_neighbour_words(buf.dF, model.encoder_config.feature_dim(), run.D);
      if (run.tuned)
        run.model->tuned_backward(buf.dF.data());
      else
        model.cnn->backward(buf.dF.data());
    }
    stats[kCrossEntropySum] = loss.cross_entropy * loss.tokens;
    stats[kTokens] = (double)loss.tokens;
    stats[kPenaltySum] = loss.penalty * B;
    stats[kAdvantageCount] = (double)loss.advantage_count;
    stats[kAdvantageSum] = loss.advantage_mean * loss.advantage_count;
    stats[kAdvantageSquares] = (loss.advantage_var + loss.advantage_mean * loss.advantage_mean) * loss.advantage_count;
  }
  stats[kRows] = B;
  stats[kCaptions] = B;
  result.my_rows = B, result.all_rows = (double)caps.size();
  return result;
}

// The step's update: the global batch's gradient (a parallel run sums the ranks' with the buffers and statistics),
// clipped, one Adam step at lr.
void apply_step(TrainRun& run, StepBuffers& buf, const StepBatch& b, StepResult& r, float lr) {
  std::vector<Param*>& params = run.params;
  if (run.parallel) {  // the global batch's gradient, buffers and statistics, alike on every rank
    const int n = (int)b.idx.size();
    std::vector<float> buffer_weight(params.size());
    for (size_t k = 0; k < params.size(); ++k)
      buffer_weight[k] =
          (float)(buf.decoder_params.count(params[k]) ? r.my_rows / r.all_rows : (double)n / b.batch.size());
    buf.exchange->pack(params, buffer_weight, r.stats);
    run.ranks.sum(buf.exchange->data(), buf.exchange->size(),
                  "the gradients of step " + std::to_string(run.st.global_step + 1));
    buf.exchange->unpack(params, r.stats);
  }
  Adam::clip_grad_norm(params, run.opt.clip);
  run.adam.update(params, lr, &run.lr_scale);
  for (auto* p : params) p->zero_grad();
}

// An epoch's running sums, for its progress line and its history entry.
struct EpochTally {
  double loss_sum = 0, pen_sum = 0, adv_var_sum = 0;  // self-critical training: loss_sum sums the rewards
  int loss_count = 0;
  int64_t captions_done = 0;
  std::chrono::steady_clock::time_point t0;
  double sum_seconds_before = 0;  // the ranks' time in sums before the epoch
  double seconds() const { return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(); }
};

// The step's global statistics added to the epoch's (a non-finite loss ends the run).
void tally_step(const TrainRun& run, const std::vector<double>& stats, EpochTally& tally) {
  if (run.self_critical) {
    tally.loss_sum += stats[kRewardSum] / std::max(stats[kCaptions], 1.0);
  } else {
    const double cross_entropy = stats[kTokens] > 0 ? stats[kCrossEntropySum] / stats[kTokens] : 0.0;
    const double penalty = stats[kRows] > 0 ? stats[kPenaltySum] / stats[kRows] : 0.0;
    if (!std::isfinite(cross_entropy + penalty))
      throw Error("train: loss became " + std::to_string(cross_entropy + penalty) + " at step " +
                  std::to_string(run.st.global_step) + " (try a lower --lr)");
    tally.loss_sum += cross_entropy;
    tally.pen_sum += penalty;
    if (stats[kAdvantageCount] > 0) {
      const double mean = stats[kAdvantageSum] / stats[kAdvantageCount];
      tally.adv_var_sum += std::max(0.0, stats[kAdvantageSquares] / stats[kAdvantageCount] - mean * mean);
    }
  }
  ++tally.loss_count;
  tally.captions_done += (int64_t)stats[kCaptions];
}

// The progress line's statistics. Hard attention also shows the spread of the REINFORCE weights: the estimator's
// variance.
std::string epoch_stats(const TrainRun& run, const EpochTally& tally) {
  const double captions_per_second = tally.captions_done / std::max(tally.seconds(), 1e-9);
  char stats[200];
  const int n = std::max(tally.loss_count, 1);
  if (run.self_critical)
    std::snprintf(stats, sizeof stats, "reward %.3f (samples' CIDEr-D)  %.0f cap/s", tally.loss_sum / n,
                  captions_per_second);
  else if (run.model->decoder_config.hard())
    std::snprintf(stats, sizeof stats, "loss %.3f  penalty %.3f  reinforce var %.3g  %.0f cap/s", tally.loss_sum / n,
                  tally.pen_sum / n, tally.adv_var_sum / n, captions_per_second);
  else
    std::snprintf(stats, sizeof stats, "loss %.3f  penalty %.3f  %.0f cap/s", tally.loss_sum / n, tally.pen_sum / n,
                  captions_per_second);
  std::string line = stats;
  if (run.parallel) {
    std::snprintf(stats, sizeof stats, "  allreduce %.0f%%",
                  100 * (run.ranks.sum_seconds - tally.sum_seconds_before) / tally.seconds());
    line += stats;
  }
  return line;
}

bool requested(const std::atomic<bool>* stop) {
  return stop && stop->load(std::memory_order_relaxed);
}

void note_interrupted(const TrainRun& run, const char* where) {
  note(run.lead, "\ninterrupted %s: checkpoint written; continue with: sat train --resume %s\n", where,
       run.ckpt_path.c_str());
}

// The steps of epoch st.epoch from st.step_in_epoch on. False when the run stops before the epoch's end, with a
// checkpoint to resume from: after stop_after_steps steps (the count in steps_this_run), or when stop is set.
bool run_epoch_steps(TrainRun& run, StepBuffers& buf, EpochTally& tally, int64_t stop_after_steps,
                     int64_t& steps_this_run, const std::atomic<bool>* stop) {
  const TrainOptions& opt = run.opt;
  TrainState& st = run.st;
  const int steps_per_epoch = run.steps_per_epoch;
  if (st.step_in_epoch == 0) st.epoch_seed = run.rng.engine();
  Rng order_rng(st.epoch_seed);
  std::vector<int> order(run.n_images);
  for (int i = 0; i < run.n_images; ++i) order[i] = i;
  shuffle(order, order_rng);
  const float lr = opt.lr * std::pow(opt.lr_decay, (float)st.epoch);
  char label[64];
  std::snprintf(label, sizeof label, "epoch %d/%d", st.epoch + 1, opt.epochs);
  Progress bar(label, steps_per_epoch);
  tally.t0 = std::chrono::steady_clock::now();
  tally.sum_seconds_before = run.ranks.sum_seconds;
  for (int s = st.step_in_epoch; s < steps_per_epoch; ++s) {
    const StepBatch b = batch_of_step(run, order, s);
    std::optional<StepResult> r;
    if (run.self_critical)
      r = self_critical_share(run, buf, b);
    else
      r = cross_entropy_share(run, buf, b, s);
    if (!r) continue;  // no captions in the global batch
    apply_step(run, buf, b, *r, lr);
    tally_step(run, r->stats, tally);
    ++st.global_step;
    st.step_in_epoch = s + 1;
    if (run.lead) bar.update(s + 1, epoch_stats(run, tally));
    if (run.lead && opt.checkpoint_every > 0 && st.global_step % opt.checkpoint_every == 0 && s + 1 < steps_per_epoch)
      save_checkpoint(run, st);
    const bool counted_out = stop_after_steps > 0 && ++steps_this_run == stop_after_steps;
    if ((counted_out || requested(stop)) && s + 1 < steps_per_epoch) {
      if (run.lead) save_checkpoint(run, st);
      if (counted_out) {
        note(run.lead, "\nstopped after %lld steps (epoch %d, step %d); continue with --resume %s\n",
             (long long)stop_after_steps, st.epoch + 1, st.step_in_epoch, run.ckpt_path.c_str());
      } else {
        const std::string where = "at epoch " + std::to_string(st.epoch + 1) + ", step " +
                                  std::to_string(st.step_in_epoch) + " of " + std::to_string(steps_per_epoch);
        note_interrupted(run, where.c_str());
      }
      return false;
    }
  }
  if (run.lead) bar.finish(epoch_stats(run, tally));
  // Every rank stepped alike from the same sums: a rank whose weights drifted would go on training another model.
  if (run.parallel && !run.ranks.same_everywhere(parameter_checksum(run.params),
                                                 "the weights after epoch " + std::to_string(st.epoch + 1)))
    throw Error("train: the ranks' weights differ after epoch " + std::to_string(st.epoch + 1) +
                " (their sums of the gradients differed)");
  return true;
}

// The end of epoch st.epoch: validation, its scores in the history, the best model saved (--keep-epochs: every
// epoch's), early stopping counted, and the checkpoint of the next epoch's start. True when the run stops early.
bool end_epoch(TrainRun& run, const EpochTally& tally) {
  const TrainOptions& opt = run.opt;
  TrainState& st = run.st;
  CaptionScores sc = run_validation(run);
  const double score = metric_of(sc, opt.metric);
  bool improved = score > st.best_score;
  const double mean_loss = tally.loss_count ? tally.loss_sum / tally.loss_count : 0.0;  // self-critical: reward
  st.history.push_back(
      {{"epoch", st.epoch + 1}, {run.self_critical ? "reward" : "loss", mean_loss}, {"val", sc.to_json()}});
  note(run.lead, "epoch %d: val BLEU-4 %.4f  CIDEr-D %.4f  ROUGE-L %.4f%s\n", st.epoch + 1, sc.bleu[3], sc.cider_d,
       sc.rouge_l, improved ? "  (best so far, saved)" : "");
  if (improved) {
    st.best_score = score;
    st.best_epoch = st.epoch + 1;
    st.bad_epochs = 0;
    run.model->info = epoch_info(opt, st.epoch + 1, sc.to_json());
    if (run.lead) run.model->save(run.best_path);
  } else {
    st.bad_epochs++;
  }
  if (opt.keep_epochs) keep_epoch(run, st.epoch + 1, sc.to_json());
  bool stop = st.bad_epochs >= opt.patience;
  // The checkpoint describes the start of the next epoch.
  TrainState next = st;
  next.epoch = st.epoch + 1;
  next.step_in_epoch = 0;
  if (stop) next.epoch = opt.epochs;
  if (run.lead) save_checkpoint(run, next);
  return stop;
}

// The summary of a run that ends here: its best score and epoch.
TrainSummary with_best_scores(const TrainRun& run, TrainSummary summary) {
  summary.best_score = run.st.best_score;
  summary.best_epoch = run.st.best_epoch;
  summary.metric = run.opt.metric;
  return summary;
}

}  // namespace
}  // namespace trainer

TrainSummary train(TrainOptions opt, const std::string& resume_path, const ResumeOverrides& more,
                   int64_t stop_after_steps, Collective* ranks_given, const std::atomic<bool>* stop) {
  using namespace trainer;
  Collective alone;
  Collective& ranks = ranks_given ? *ranks_given : alone;
  TrainRun run = set_up_run(std::move(opt), resume_path, more, ranks);
  TrainSummary summary;
  summary.model_path = run.best_path;
  if (run.opt.epochs == 0 && resume_path.empty()) return save_untrained(run, summary);
  const TrainState& st = run.st;
  // A run resumed at an epoch's end with --keep-epochs newly asked: the checkpoint holds that epoch's model.
  if (run.opt.keep_epochs && !resume_path.empty() && st.step_in_epoch == 0 && !st.history.empty() &&
      st.history.back().value("epoch", 0) == st.epoch &&
      !file_exists(join_path(run.opt.out, "model-epoch" + std::to_string(st.epoch) + ".sat")))
    keep_epoch(run, st.epoch, st.history.back().at("val"));

  StepBuffers buf(run);
  int64_t steps_this_run = 0;
  for (; run.st.epoch < run.opt.epochs; ++run.st.epoch, run.st.step_in_epoch = 0) {
    EpochTally tally;
    if (!run_epoch_steps(run, buf, tally, stop_after_steps, steps_this_run, stop)) {
      summary.interrupted = requested(stop);
      return with_best_scores(run, summary);
    }
    const bool early = end_epoch(run, tally);
    summary.epochs_run++;
    if (!early && requested(stop) && run.st.epoch + 1 < run.opt.epochs) {
      note_interrupted(run, ("after epoch " + std::to_string(run.st.epoch + 1)).c_str());
      summary.interrupted = true;
      return with_best_scores(run, summary);
    }
    if (early) {
      note(run.lead, "early stop: no improvement for %d epochs\n", run.opt.patience);
      break;
    }
  }
  return with_best_scores(run, summary);
}

}  // namespace sat
