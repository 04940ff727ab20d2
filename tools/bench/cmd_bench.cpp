// sat bench, and its benches of decoder training: decoder / cache. A decoder training step (alone or under mpirun) and
// training from a feature cache larger than RAM. The others are in tools/bench/cmd_bench_eval.cpp (search, metrics) and
// tools/bench/cmd_bench_encoder.cpp (cnn, encoder, tune).
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <omp.h>

#include <sys/resource.h>

#include "datasets/features.hpp"
#include "seq/decoder.hpp"
#include "tools/bench/bench_products.hpp"
#include "tools/bench/cmd_bench.hpp"
#include "tools/cli/commands.hpp"
#include "train/data_parallel.hpp"
#include "train/optimizer.hpp"
#include "vision/onednn.hpp"

namespace sat {

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

std::vector<int> parse_batches(const std::string& text, const std::string& flag) {
  std::vector<int> out;
  size_t start = 0;
  while (start <= text.size()) {
    const size_t comma = std::min(text.find(',', start), text.size());
    const std::string item = text.substr(start, comma - start);
    char* end = nullptr;
    const long n = item.empty() ? 0 : std::strtol(item.c_str(), &end, 10);
    if (item.empty() || *end != '\0' || n < 1 || n > 4096)
      throw Error(flag + ": '" + text + "' is not a comma-separated list of batch sizes (each 1 to 4096)");
    out.push_back((int)n);
    start = comma + 1;
  }
  return out;
}

namespace {

struct DecoderBenchArgs {
  int batch = 64, grid = 14, features = 512, embed = 512, hidden = 512, attn = 512, vocab = 3000, steps = 16;
  float dropout = 0.5f;
  int iters = 5, warmup = 1;
  std::string attention = "soft", score = "additive", order = "bahdanau";
  bool coverage = false;
  int hard_window = 1, hard_samples = 1;
  int per_image = 1;
  bool json = false, peak = false, products = false;
  std::string precision = "auto";  // the products' (sat train --precision)
};

DecoderConfig decoder_config_of(const DecoderBenchArgs& d) {
  DecoderConfig cfg;
  cfg.vocab_size = d.vocab;
  cfg.embed_dim = d.embed;
  cfg.hidden_dim = d.hidden;
  cfg.attn_dim = d.attn;
  cfg.feature_dim = d.features;
  cfg.grid_h = cfg.grid_w = d.grid;
  cfg.dropout = d.dropout;
  cfg.attention = d.attention, cfg.score = d.score, cfg.order = d.order;
  cfg.coverage = d.coverage, cfg.hard_window = d.hard_window;
  return DecoderConfig::from_json(cfg.to_json());  // the same checks as a model file's config
}

// This rank's captions of the benchmark's batch (all of them in one process): random words, each caption in
// `samples` rows, reading random feature grids that per_image consecutive captions share.
struct RankShare {
  int captions = 0;  // this rank's captions of the batch
  int grids = 0;     // the grids they read
  Mat features;      // grids x L rows
  CaptionBatch batch;
};

RankShare rank_share(const DecoderBenchArgs& d, const DecoderConfig& cfg, const Collective& ranks, Rng& rng) {
  const int L = cfg.locations(), K = cfg.hard() ? d.hard_samples : 1;  // hard: K rows per caption
  const Share mine = share_of(d.batch, ranks.size(), ranks.rank());    // this rank's captions of the batch
  const int first_grid = mine.size() ? mine.begin / d.per_image : 0;
  RankShare share;
  share.captions = mine.size();
  share.grids = mine.size() ? (mine.end - 1) / d.per_image + 1 - first_grid : 0;
  share.features = Mat((int64_t)share.grids * L, cfg.feature_dim);
  for (int64_t i = 0; i < share.features.size(); ++i) share.features.data()[i] = (float)rng.uniform();
  std::vector<std::vector<int>> caps;
  std::vector<int> grid;
  for (int b = mine.begin; b < mine.end; ++b) {
    std::vector<int> c;
    for (int t = 0; t < d.steps - 1; ++t) c.push_back(4 + (int)rng.integer(0, d.vocab - 5));
    for (int k = 0; k < K; ++k) caps.push_back(c), grid.push_back(b / d.per_image - first_grid);
  }
  share.batch = CaptionBatch::from_ids(caps, d.steps);
  share.batch.samples = K;
  share.batch.grid = grid;
  share.batch.norm_tokens = (int64_t)d.batch * K * d.steps;  // every caption has steps - 1 words and <end>
  share.batch.norm_rows = d.batch * K;
  return share;
}

// A training step's seconds over the timed iterations: its own work (mean and best), the wait for the slowest rank
// and the gradients' sum (means; both 0 in one process).
struct StepTimes {
  double compute = 0, compute_best = 0, wait = 0, sum = 0;
};

// d.warmup untimed and d.iters timed training steps on this rank's share: forward and backward, under mpirun the
// gradients' sum, then clipping and Adam.
StepTimes time_training_steps(const DecoderBenchArgs& d, Decoder& model, const std::vector<Param*>& params,
                              const RankShare& share, StepExchange& exchange, Collective& ranks, Rng& rng) {
  const bool parallel = ranks.size() > 1;
  Adam adam;
  adam.attach(params);
  DecoderCache cache;
  double compute_best = 1e30, compute_total = 0, wait_total = 0, sum_total = 0;
  for (int it = 0; it < d.warmup + d.iters; ++it) {
    auto t0 = std::chrono::steady_clock::now();
    if (share.captions > 0) {
      model.forward(share.features, share.batch, 1.f, true, &rng, cache);
      model.backward(cache, nullptr);  // features come from a cache: no encoder gradient
    }
    const double compute = seconds_since(t0);
    double wait = 0, sum = 0;
    if (parallel) {
      // The wait for the slowest rank first, then the sum alone: the transfer, not the imbalance.
      auto t1 = std::chrono::steady_clock::now();
      double nothing = 0;
      ranks.sum(&nothing, 1, "the benchmark's barrier");
      wait = seconds_since(t1);
      t1 = std::chrono::steady_clock::now();
      exchange.pack(params, std::vector<float>(params.size(), 1.f / ranks.size()), {});
      ranks.sum(exchange.data(), exchange.size(), "the benchmark's gradients");
      std::vector<double> no_stats;
      exchange.unpack(params, no_stats);
      sum = seconds_since(t1);
    }
    auto t2 = std::chrono::steady_clock::now();
    Adam::clip_grad_norm(params, 5.0);
    adam.update(params, 1e-4f);
    for (auto* p : params) p->zero_grad();
    const double step_compute = compute + seconds_since(t2);
    if (it >= d.warmup)
      compute_best = std::min(compute_best, step_compute), compute_total += step_compute, wait_total += wait,
      sum_total += sum;
  }
  return {compute_total / d.iters, compute_best, wait_total / d.iters, sum_total / d.iters};
}

// Rank 0's report: one JSON line, or text, to which --products and --peak add what they time.
void report_decoder_bench(const DecoderBenchArgs& d, const DecoderConfig& cfg, ProductPrecision precision,
                          const RankShare& share, const StepExchange& exchange, const StepTimes& t,
                          const Collective& ranks) {
  const bool parallel = ranks.size() > 1;
  const int L = cfg.locations(), K = cfg.hard() ? d.hard_samples : 1;
  const int64_t bytes = exchange.size() * (int64_t)sizeof(float);
  const double step = t.compute + t.wait + t.sum, best_step = t.compute_best + t.wait + t.sum;
  // Whole-batch figures: this rank's share of the products times the ranks (equal shares up to one caption).
  const double flops = decoder_step_flops(cfg, d.batch * K, d.steps, (d.batch + d.per_image - 1) / d.per_image);
  const int threads = omp_get_max_threads();
  if (d.json) {
    std::printf(
        "{\"ranks\": %d, \"threads\": %d, \"batch\": %d, \"compute_ms\": %.3f, \"compute_best_ms\": %.3f, "
        "\"wait_ms\": %.3f, \"allreduce_ms\": %.3f, \"allreduce_bytes\": %lld, \"gradient_floats\": %lld, "
        "\"captions_per_s\": %.3f, \"flops_per_step\": %.0f, \"precision\": \"%s\"}\n",
        ranks.size(), threads, d.batch, t.compute * 1e3, t.compute_best * 1e3, t.wait * 1e3, t.sum * 1e3,
        (long long)bytes, (long long)exchange.gradient_floats(), d.batch / step, flops,
        product_precision_name(precision));
    return;
  }
  std::printf(
      "decoder train step (%s attention, %s score, %s order%s%s): B=%d L=%d D=%d E=%d H=%d A=%d V=%d T=%d "
      "dropout=%.2f, products in %s\n",
      cfg.attention.c_str(), cfg.score.c_str(), cfg.order.c_str(),
      K > 1 ? (", " + std::to_string(K) + " glimpse samples per caption").c_str() : "",
      d.per_image > 1 ? (", " + std::to_string(d.per_image) + " captions per image").c_str() : "", d.batch, L,
      cfg.feature_dim, d.embed, d.hidden, d.attn, d.vocab, d.steps, d.dropout, product_precision_name(precision));
  if (parallel) {
    std::printf("  %d ranks x %d threads, %d captions each (rank 0)\n", ranks.size(), threads, share.captions);
    std::printf(
        "  compute %.1f ms (best %.1f)  wait for the slowest rank %.1f ms  allreduce %.1f ms for %.2f MB "
        "(%.2f GB/s)\n",
        t.compute * 1e3, t.compute_best * 1e3, t.wait * 1e3, t.sum * 1e3, bytes / 1e6,
        bytes / 1e9 / std::max(t.sum, 1e-9));
    std::printf("  step %.1f ms  ->  %.1f captions/s\n", step * 1e3, d.batch / step);
  } else {
    std::printf(
        "  1 process x %d threads: compute mean %.1f ms  best %.1f ms  ->  %.1f captions/s (mean), %.1f "
        "captions/s (best)\n",
        threads, t.compute * 1e3, t.compute_best * 1e3, d.batch / t.compute, d.batch / t.compute_best);
    std::printf("  allreduce: none in one process; a data-parallel step sums %.2f MB (%lld gradient floats)\n",
                bytes / 1e6, (long long)exchange.gradient_floats());
  }
  if (flops > 0)
    std::printf(
        "  matrix products: %.2f GFLOP per step (2*M*N*K, elementwise work not counted) -> %.1f GFLOPS "
        "(mean), %.1f (best)\n",
        flops / 1e9, flops / step / 1e9, flops / best_step / 1e9);
  if (d.products && flops > 0 && !parallel) {
    const ProductTimes pt = time_decoder_products(cfg, d.batch, d.steps, share.grids, d.iters, precision);
    const double floor = pt.whole + pt.recurrent;
    std::printf(
        "  the matrix products alone (best of %d): %.1f ms = %.1f ms over all T*B rows + %.1f ms in the time "
        "loop -> at most %.1f captions/s, %.1f GFLOPS; the rest of the step takes %.1f ms (%.0f%%)\n",
        d.iters, floor * 1e3, pt.whole * 1e3, pt.recurrent * 1e3, d.batch / floor, flops / floor / 1e9,
        (t.compute_best - floor) * 1e3, 100 * (t.compute_best - floor) / t.compute_best);
  }
  if (d.peak) {
    // the peak of the arithmetic the products run in (measured as sat bench encoder --peak does)
    const bool bf16 = precision == ProductPrecision::bf16;
    const double peak = bf16 ? measure_bf16_peak_gflops() : measure_peak_gflops();
    std::printf("  machine %s peak, measured: %.1f GFLOPS (%s)\n", bf16 ? "bf16" : "FP32", peak,
                bf16 ? kBf16PeakMethod : kPeakMethod);
    if (flops > 0)
      std::printf("  share of the peak: %.0f%% (mean), %.0f%% (best)\n", 100 * flops / step / 1e9 / peak,
                  100 * flops / best_step / 1e9 / peak);
    else
      std::printf(
          "  share of the peak: not counted for this attention kind (the count covers the additive score "
          "in Bahdanau order)\n");
  }
}

void bench_decoder(const DecoderBenchArgs& d) {
  // Under mpirun each rank steps on its contiguous share of the batch's captions (as sat train shares photos) and
  // the ranks sum the packed gradients; alone, the step is timed with the bytes that sum would move.
  std::unique_ptr<Collective> ranks = join_ranks(300);
  const DecoderConfig cfg = decoder_config_of(d);
  Decoder model(cfg);
  model.set_precision(parse_product_precision(d.precision, "bench decoder: --precision"));
  Rng rng(1);
  model.init(rng);
  auto params = model.params();
  const RankShare share = rank_share(d, cfg, *ranks, rng);
  StepExchange exchange(params, 0);  // what a data-parallel step sums: the gradients (and the baseline's value)
  const StepTimes times = time_training_steps(d, model, params, share, exchange, *ranks, rng);
  if (ranks->leads()) report_decoder_bench(d, cfg, model.precision(), share, exchange, times, *ranks);
}

void add_bench_decoder(CLI::App& bench) {
  auto d = std::make_shared<DecoderBenchArgs>();
  auto* dec = bench.add_subcommand("decoder",
                                   "Time a decoder training step (forward, backward, Adam) of any attention "
                                   "kind; under mpirun, each rank's share of the batch and the gradients' "
                                   "sum");
  dec->add_option("--batch", d->batch, "Captions per step")->capture_default_str();
  dec->add_option("--grid", d->grid, "Grid side (locations = grid^2)")->capture_default_str();
  dec->add_option("--features", d->features, "Feature channels D")->capture_default_str();
  dec->add_option("--embed", d->embed, "Embedding size")->capture_default_str();
  dec->add_option("--hidden", d->hidden, "LSTM hidden size")->capture_default_str();
  dec->add_option("--attn", d->attn, "Attention size")->capture_default_str();
  dec->add_option("--vocab", d->vocab, "Vocabulary size")->capture_default_str();
  dec->add_option("--steps", d->steps, "Caption length in steps")->capture_default_str();
  dec->add_option("--dropout", d->dropout, "Dropout")->capture_default_str();
  dec->add_option("--iters", d->iters, "Timed iterations")->capture_default_str();
  dec->add_option("--attention", d->attention, "soft, hard, local or none")->capture_default_str();
  dec->add_option("--score", d->score, "additive, dot, general, cosine or location")->capture_default_str();
  dec->add_option("--order", d->order, "bahdanau, luong or updown")->capture_default_str();
  dec->add_option("--coverage", d->coverage, "Coverage-aware additive score")->capture_default_str();
  dec->add_option("--hard-window", d->hard_window, "Hard attention: glimpse window side")->capture_default_str();
  dec->add_option("--hard-samples", d->hard_samples, "Hard attention: glimpse samples per caption (rows per caption)")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  dec->add_option("--per-image", d->per_image,
                  "Captions per image: that many consecutive captions read one feature "
                  "grid (sat train's 5 captions per photo); 1 = every caption its own grid, as in the PyTorch peer")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  dec->add_option("--precision", d->precision,
                  "The products' arithmetic, as sat train --precision: f32, bf16 or auto (bf16 where it is "
                  "the faster arithmetic)")
      ->capture_default_str()
      ->check(CLI::IsMember({"auto", "f32", "bf16"}));
  dec->add_flag("--json", d->json, "One JSON line (tools/mpi-scaling.sh reads it)");
  dec->add_flag("--peak", d->peak,
                "Also count the step's matrix-product FLOPs and print their rate as a share of the "
                "machine's peak in the products' precision (oneDNN sgemm, or bf16 matmul, measured first)");
  dec->add_flag("--products", d->products,
                "Also time the step's matrix products alone (same shapes, product calls, precision and "
                "threads, no elementwise work): the floor of the step's time");
  dec->callback([d] { bench_decoder(*d); });
}

struct CacheBenchArgs {
  int images = 120000, grid = 14, channels = 512, batch = 64, steps = 40;
  std::string path = "/tmp/sat-bench-cache.feat";
  bool keep = false, no_prefetch = false;
};

double peak_resident_mb() {
  struct rusage ru;
  getrusage(RUSAGE_SELF, &ru);
  return ru.ru_maxrss / 1024.0;
}

// Writes ca.images random grids to ca.path, each a window of one random pool: a different window per image.
void generate_feature_cache(const CacheBenchArgs& ca, Rng& rng) {
  const int L = ca.grid * ca.grid, D = ca.channels;
  auto t0 = std::chrono::steady_clock::now();
  FeatureHeader h;
  h.encoder = {{"kind", "random"}};
  h.encoder_id = "random";
  h.grid_h = h.grid_w = ca.grid;
  h.channels = D;
  for (int i = 0; i < ca.images; ++i) h.images.push_back("random_" + std::to_string(i) + ".jpg");
  std::vector<float> pool((size_t)L * D * 2);
  for (auto& v : pool) v = (float)rng.uniform();
  FeatureWriter w(ca.path, h);
  for (int i = w.done(); i < ca.images; ++i)
    w.append(pool.data() + (size_t)rng.integer(0, (int64_t)L * D - 1), 1);  // a different window per image
  w.finish();
  std::printf("generated %s: %d grids of %dx%d, %.1f GB, in %.0f s\n", ca.path.c_str(), ca.images, L, D,
              (double)h.record_bytes() * ca.images / 1e9, seconds_since(t0));
}

struct CacheTraining {
  double seconds = 0, read_seconds = 0;  // all steps', and the part spent reading features
  double rss_before = 0;                 // peak resident MB before the first step
};

// ca.steps training steps of a 512-wide decoder, each on ca.batch random images of the cache (one caption each).
CacheTraining train_from_cache(const CacheBenchArgs& ca, FeatureCache& cache, Rng& rng) {
  const int L = ca.grid * ca.grid, D = ca.channels;
  DecoderConfig cfg;
  cfg.vocab_size = 3000;
  cfg.embed_dim = cfg.hidden_dim = cfg.attn_dim = 512;
  cfg.feature_dim = D;
  cfg.grid_h = cfg.grid_w = ca.grid;
  cfg.dropout = 0.5f;
  Decoder model(cfg);
  model.init(rng);
  auto params = model.params();
  Adam adam;
  adam.attach(params);
  CacheTraining run;
  run.rss_before = peak_resident_mb();
  Mat F((int64_t)ca.batch * L, D);
  DecoderCache dc;
  auto t0 = std::chrono::steady_clock::now();
  // random images: every step touches new parts of the file. As the trainer does, a step starts the reads of
  // its grids and of the next step's (FeatureCache::prefetch), then reads its own.
  auto draw = [&] {
    std::vector<int> idx(ca.batch);
    for (int& i : idx) i = (int)rng.integer(0, cache.size() - 1);
    return idx;
  };
  std::vector<int> next = draw();
  for (int s = 0; s < ca.steps; ++s) {
    auto t1 = std::chrono::steady_clock::now();
    const std::vector<int> idx = next;
    next = draw();
    if (!ca.no_prefetch) {
      for (int i : idx) cache.prefetch(i);
      if (s + 1 < ca.steps)
        for (int i : next) cache.prefetch(i);
    }
    for (int b = 0; b < ca.batch; ++b) cache.read(idx[b], F.data() + (size_t)b * L * D);
    run.read_seconds += seconds_since(t1);
    std::vector<std::vector<int>> caps(ca.batch);
    for (auto& c : caps)
      for (int t = 0; t < 15; ++t) c.push_back(4 + (int)rng.integer(0, cfg.vocab_size - 5));
    CaptionBatch cb = CaptionBatch::from_ids(caps, 16);
    model.forward(F, cb, 1.f, true, &rng, dc);
    model.backward(dc, nullptr);
    Adam::clip_grad_norm(params, 5.0);
    adam.update(params, 1e-4f);
    for (auto* p : params) p->zero_grad();
  }
  run.seconds = seconds_since(t0);
  return run;
}

void bench_cache(const CacheBenchArgs& ca) {
  Rng rng(11);
  const bool generated = !file_exists(ca.path);
  if (generated) generate_feature_cache(ca, rng);
  FeatureCache cache(ca.path);
  const FeatureHeader& h = cache.header();
  if (h.grid_h != ca.grid || h.grid_w != ca.grid || h.channels != ca.channels)
    fail(ca.path, "holds " + std::to_string(h.grid_h) + "x" + std::to_string(h.grid_w) + "x" +
                      std::to_string(h.channels) + " grids, not the " + std::to_string(ca.grid) + "x" +
                      std::to_string(ca.grid) + "x" + std::to_string(ca.channels) + " asked (--grid, --channels)");
  const CacheTraining run = train_from_cache(ca, cache, rng);
  std::printf(
      "cache %s: %d images, %.1f GB on disk; %d steps of %d captions: %.1f captions/s (reading features "
      "%.1f%% of the time); peak RSS %.0f MB (%.0f MB before training)\n",
      ca.path.c_str(), cache.size(), (double)h.record_bytes() * cache.size() / 1e9, ca.steps, ca.batch,
      ca.steps * ca.batch / run.seconds, 100 * run.read_seconds / run.seconds, peak_resident_mb(), run.rss_before);
  if (generated && !ca.keep) std::remove(ca.path.c_str());
}

void add_bench_cache(CLI::App& bench) {
  auto ca = std::make_shared<CacheBenchArgs>();
  auto* cache_cmd = bench.add_subcommand(
      "cache",
      "Train the decoder from a memory-mapped feature cache larger than RAM (COCO size by default): "
      "captions/s and peak resident memory");
  cache_cmd->add_option("--images", ca->images, "Feature grids in the generated cache")->capture_default_str();
  cache_cmd->add_option("--grid", ca->grid, "Grid side")->capture_default_str();
  cache_cmd->add_option("--channels", ca->channels, "Feature channels")->capture_default_str();
  cache_cmd->add_option("--batch", ca->batch, "Images (one caption each) per step")->capture_default_str();
  cache_cmd->add_option("--steps", ca->steps, "Timed training steps")->capture_default_str();
  cache_cmd->add_option("--path", ca->path, "Where the cache is generated (reused if it is already there)")
      ->capture_default_str();
  cache_cmd->add_flag("--keep", ca->keep, "Keep the generated cache (a cache that was already there is always kept)");
  cache_cmd->add_flag("--no-prefetch", ca->no_prefetch,
                      "Read each step's grids only when it needs them, as before the trainer prefetched them");
  cache_cmd->callback([ca] { bench_cache(*ca); });
}

}  // namespace

void add_bench_commands(CLI::App& app) {
  auto* bench = app.add_subcommand("bench", "Benchmarks of the hot paths (figures, not assertions)");
  bench->require_subcommand(1);
  // in this order in the help
  add_bench_decoder(*bench);
  add_bench_search(*bench);
  add_bench_cnn(*bench);
  add_bench_encoder(*bench);
  add_bench_detector(*bench);
  add_bench_tune(*bench);
  add_bench_cache(*bench);
  add_bench_metrics(*bench);
}

}  // namespace sat
