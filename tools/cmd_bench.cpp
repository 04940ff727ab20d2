#include <chrono>
#include <cmath>
#include <cstdio>
#include <omp.h>
#include <oneapi/dnnl/dnnl.h>

#include <sys/resource.h>

#include "datasets/features.hpp"
#include "seq/decoder.hpp"
#include "seq/search.hpp"
#include "tools/bench_products.hpp"
#include "tools/commands.hpp"
#include "train/evaluate.hpp"
#include "train/model.hpp"
#include "train/meteor.hpp"
#include "train/ptb_tokenizer.hpp"
#include "train/data_parallel.hpp"
#include "train/trainer.hpp"
#include "train/optimizer.hpp"
#include "vision/cnn.hpp"
#include "vision/pretrained.hpp"
#include "vision/onednn.hpp"
#include "vision/tunable.hpp"

namespace sat {

namespace {
double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// A comma-separated list of batch sizes ("1,8"), each 1 to 4096; errors name the flag.
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

}  // namespace

void add_bench_commands(CLI::App& app) {
  auto* bench = app.add_subcommand("bench", "Benchmarks of the hot paths (figures, not assertions)");
  bench->require_subcommand(1);

  struct DecArgs {
    int batch = 64, grid = 14, features = 512, embed = 512, hidden = 512, attn = 512, vocab = 3000, steps = 16;
    float dropout = 0.5f;
    int iters = 5, warmup = 1;
    std::string attention = "soft", score = "additive", order = "bahdanau";
    bool coverage = false;
    int hard_window = 1, hard_samples = 1;
    int per_image = 1;
    bool json = false, peak = false, products = false;
  };
  auto d = std::make_shared<DecArgs>();
  auto* dec = bench->add_subcommand("decoder", "Time a decoder training step (forward, backward, Adam) of any attention "
                                               "kind; under mpirun, each rank's share of the batch and the gradients' sum");
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
      ->capture_default_str()->check(CLI::PositiveNumber);
  dec->add_option("--per-image", d->per_image, "Captions per image: that many consecutive captions read one feature "
                  "grid (sat train's 5 captions per photo); 1 = every caption its own grid, as in the PyTorch peer")
      ->capture_default_str()->check(CLI::PositiveNumber);
  dec->add_flag("--json", d->json, "One JSON line (tools/mpi-scaling.sh reads it)");
  dec->add_flag("--peak", d->peak, "Also count the step's matrix-product FLOPs and print their rate as a share of the "
                "machine's FP32 peak (oneDNN sgemm, measured first)");
  dec->add_flag("--products", d->products, "Also time the step's matrix products alone (same shapes, Eigen calls and "
                "threads, no elementwise work): the floor of the step's time");
  dec->callback([d] {
    // Under mpirun each rank steps on its contiguous share of the batch's captions (as sat train shares photos) and
    // the ranks sum the packed gradients; alone, the step is timed with the bytes that sum would move.
    std::unique_ptr<Collective> ranks = join_ranks(300);
    const bool parallel = ranks->size() > 1;
    DecoderConfig cfg;
    cfg.vocab_size = d->vocab;
    cfg.embed_dim = d->embed;
    cfg.hidden_dim = d->hidden;
    cfg.attn_dim = d->attn;
    cfg.feature_dim = d->features;
    cfg.grid_h = cfg.grid_w = d->grid;
    cfg.dropout = d->dropout;
    cfg.attention = d->attention, cfg.score = d->score, cfg.order = d->order;
    cfg.coverage = d->coverage, cfg.hard_window = d->hard_window;
    cfg = DecoderConfig::from_json(cfg.to_json());  // the same checks as a model file's config
    Decoder model(cfg);
    Rng rng(1);
    model.init(rng);
    auto params = model.params();
    Adam adam;
    adam.attach(params);
    const int L = cfg.locations(), K = cfg.hard() ? d->hard_samples : 1;  // hard: K rows per caption
    const Share mine = share_of(d->batch, ranks->size(), ranks->rank());  // this rank's captions of the batch
    const int first_grid = mine.size() ? mine.begin / d->per_image : 0;
    const int grids = mine.size() ? (mine.end - 1) / d->per_image + 1 - first_grid : 0;
    Mat F((int64_t)grids * L, cfg.feature_dim);
    for (int64_t i = 0; i < F.size(); ++i) F.data()[i] = (float)rng.uniform();
    std::vector<std::vector<int>> caps;
    std::vector<int> grid;
    for (int b = mine.begin; b < mine.end; ++b) {
      std::vector<int> c;
      for (int t = 0; t < d->steps - 1; ++t) c.push_back(4 + (int)rng.integer(0, d->vocab - 5));
      for (int k = 0; k < K; ++k) caps.push_back(c), grid.push_back(b / d->per_image - first_grid);
    }
    CaptionBatch cb = CaptionBatch::from_ids(caps, d->steps);
    cb.samples = K;
    cb.grid = grid;
    cb.norm_tokens = (int64_t)d->batch * K * d->steps;  // every caption has steps - 1 words and <end>
    cb.norm_rows = d->batch * K;
    StepExchange exchange(params, 0);  // what a data-parallel step sums: the gradients (and the baseline's value)
    const int64_t bytes = exchange.size() * (int64_t)sizeof(float);
    DecoderCache cache;
    double compute_best = 1e30, compute_total = 0, wait_total = 0, sum_total = 0;
    for (int it = 0; it < d->warmup + d->iters; ++it) {
      auto t0 = std::chrono::steady_clock::now();
      if (!caps.empty()) {
        model.forward(F, cb, 1.f, true, &rng, cache);
        model.backward(cache, nullptr);  // features come from a cache: no encoder gradient
      }
      const double compute = seconds_since(t0);
      double wait = 0, sum = 0;
      if (parallel) {
        // The wait for the slowest rank first, then the sum alone: the transfer, not the imbalance.
        auto t1 = std::chrono::steady_clock::now();
        double nothing = 0;
        ranks->sum(&nothing, 1, "the benchmark's barrier");
        wait = seconds_since(t1);
        t1 = std::chrono::steady_clock::now();
        exchange.pack(params, std::vector<float>(params.size(), 1.f / ranks->size()), {});
        ranks->sum(exchange.data(), exchange.size(), "the benchmark's gradients");
        std::vector<double> no_stats;
        exchange.unpack(params, no_stats);
        sum = seconds_since(t1);
      }
      auto t2 = std::chrono::steady_clock::now();
      Adam::clip_grad_norm(params, 5.0);
      adam.update(params, 1e-4f);
      for (auto* p : params) p->zero_grad();
      const double step_compute = compute + seconds_since(t2);
      if (it >= d->warmup)
        compute_best = std::min(compute_best, step_compute), compute_total += step_compute, wait_total += wait,
        sum_total += sum;
    }
    const double compute = compute_total / d->iters, wait = wait_total / d->iters, sum = sum_total / d->iters;
    const double step = compute + wait + sum, best_step = compute_best + wait + sum;
    if (!ranks->leads()) return;
    // Whole-batch figures: this rank's share of the products times the ranks (equal shares up to one caption).
    const double flops = decoder_step_flops(cfg, d->batch * K, d->steps, (d->batch + d->per_image - 1) / d->per_image);
    const int threads = omp_get_max_threads();
    if (d->json) {
      std::printf("{\"ranks\": %d, \"threads\": %d, \"batch\": %d, \"compute_ms\": %.3f, \"compute_best_ms\": %.3f, "
                  "\"wait_ms\": %.3f, \"allreduce_ms\": %.3f, \"allreduce_bytes\": %lld, \"gradient_floats\": %lld, "
                  "\"captions_per_s\": %.3f, \"flops_per_step\": %.0f}\n",
                  ranks->size(), threads, d->batch, compute * 1e3, compute_best * 1e3, wait * 1e3, sum * 1e3,
                  (long long)bytes, (long long)exchange.gradient_floats(), d->batch / step, flops);
      return;
    }
    std::printf("decoder train step (%s attention, %s score, %s order%s%s): B=%d L=%d D=%d E=%d H=%d A=%d V=%d T=%d "
                "dropout=%.2f\n", cfg.attention.c_str(), cfg.score.c_str(), cfg.order.c_str(),
                K > 1 ? (", " + std::to_string(K) + " glimpse samples per caption").c_str() : "",
                d->per_image > 1 ? (", " + std::to_string(d->per_image) + " captions per image").c_str() : "", d->batch, L,
                cfg.feature_dim, d->embed, d->hidden, d->attn, d->vocab, d->steps, d->dropout);
    if (parallel) {
      std::printf("  %d ranks x %d threads, %d captions each (rank 0)\n", ranks->size(), threads, mine.size());
      std::printf("  compute %.1f ms (best %.1f)  wait for the slowest rank %.1f ms  allreduce %.1f ms for %.2f MB "
                  "(%.2f GB/s)\n", compute * 1e3, compute_best * 1e3, wait * 1e3, sum * 1e3, bytes / 1e6,
                  bytes / 1e9 / std::max(sum, 1e-9));
      std::printf("  step %.1f ms  ->  %.1f captions/s\n", step * 1e3, d->batch / step);
    } else {
      std::printf("  1 process x %d threads: compute mean %.1f ms  best %.1f ms  ->  %.1f captions/s (mean), %.1f "
                  "captions/s (best)\n", threads, compute * 1e3, compute_best * 1e3, d->batch / compute,
                  d->batch / compute_best);
      std::printf("  allreduce: none in one process; a data-parallel step sums %.2f MB (%lld gradient floats)\n",
                  bytes / 1e6, (long long)exchange.gradient_floats());
    }
    if (flops > 0)
      std::printf("  matrix products: %.2f GFLOP per step (2*M*N*K, elementwise work not counted) -> %.1f GFLOPS "
                  "(mean), %.1f (best)\n", flops / 1e9, flops / step / 1e9, flops / best_step / 1e9);
    if (d->products && flops > 0 && !parallel) {
      const ProductTimes pt = time_decoder_products(cfg, d->batch, d->steps, grids, d->iters);
      const double floor = pt.whole + pt.recurrent;
      std::printf("  the matrix products alone (best of %d): %.1f ms = %.1f ms over all T*B rows + %.1f ms in the time "
                  "loop -> at most %.1f captions/s, %.1f GFLOPS; the rest of the step takes %.1f ms (%.0f%%)\n",
                  d->iters, floor * 1e3, pt.whole * 1e3, pt.recurrent * 1e3, d->batch / floor, flops / floor / 1e9,
                  (compute_best - floor) * 1e3, 100 * (compute_best - floor) / compute_best);
    }
    if (d->peak) {
      const double peak = measure_peak_gflops();
      std::printf("  machine FP32 peak, measured: %.1f GFLOPS (%s)\n", peak, kPeakMethod);
      if (flops > 0)
        std::printf("  share of the peak: %.0f%% (mean), %.0f%% (best)\n", 100 * flops / step / 1e9 / peak,
                    100 * flops / best_step / 1e9 / peak);
      else
        std::printf("  share of the peak: not counted for this attention kind (the count covers the additive score "
                    "in Bahdanau order)\n");
    }
  });

  struct SearchArgs {
    std::string model, batches = "1,10";
    int beam = 0;
    double seconds = 3;
    bool json = false;
  };
  auto sa = std::make_shared<SearchArgs>();
  auto* search = bench->add_subcommand(
      "search", "Time caption search (the decoder's inference step and beam search) with a model's decoder on random "
                "grids of its shape");
  search->add_option("--model", sa->model, "Model file (default: the default model)");
  search->add_option("--batches", sa->batches, "Comma-separated numbers of images searched together")
      ->capture_default_str();
  search->add_option("--beam", sa->beam, "Beam size (default: the model's)")->check(CLI::Range(2, 100));
  search->add_option("--seconds", sa->seconds, "Time spent per measurement (after one warm-up)")->capture_default_str();
  search->add_flag("--json", sa->json, "One JSON line per batch");
  search->callback([sa] {
    const std::vector<int> batches = parse_batches(sa->batches, "--batches");
    const std::string path = sa->model.empty() ? default_model_path() : sa->model;
    std::unique_ptr<CaptionModel> model = CaptionModel::load(path);
    Decoder& dec = *model->decoder;
    const DecoderConfig& c = dec.config();
    const int beam = sa->beam > 0 ? sa->beam : std::max(2, model->beam), L = c.locations();
    if (!sa->json)
      std::printf("caption search with %s's decoder (%s attention, %s score): L=%d D=%d E=%d H=%d A=%d V=%d, beam %d, "
                  "max %d words, %d threads\n", path.c_str(), c.attention.c_str(), c.score.c_str(), L, c.feature_dim,
                  c.embed_dim, c.hidden_dim, c.attn_dim, c.vocab_size, beam, model->max_len, omp_get_max_threads());
    for (const int n : batches) {
      Rng rng(5);
      Mat F((int64_t)n * L, c.feature_dim);  // non-negative, as the grids after the last ReLU
      for (int64_t i = 0; i < F.size(); ++i) F.data()[i] = (float)std::abs(rng.normal());
      // The step alone at the beam's row count: n images x beam rows, `steps` steps.
      const int steps = 16;
      auto time_steps = [&] {
        Decoder::State st;
        dec.begin(F, n, st, beam);
        // Every row a random word at every step: the decoder computes the words' part of the gates once per word
        // (Decoder::State::word_gates), and random words over the whole vocabulary are nearly all new to it, so
        // the step is timed with all of its arithmetic (a real search's rows repeat words: its time is below).
        Rng draws(7);
        std::vector<std::vector<int>> tokens(steps, std::vector<int>(n * beam));
        for (auto& row : tokens)
          for (int& w : row) w = (int)(draws.uniform() * c.vocab_size) % c.vocab_size;
        Mat logp, alpha;
        auto t0 = std::chrono::steady_clock::now();
        for (int t = 0; t < steps; ++t) dec.step(tokens[t], st, logp, alpha);
        return seconds_since(t0) / steps;
      };
      time_steps();
      double step_best = 1e30, step_total = 0;
      int step_runs = 0;
      for (auto t0 = std::chrono::steady_clock::now(); seconds_since(t0) < sa->seconds / 2 || step_runs < 3; ++step_runs) {
        const double s = time_steps();
        step_best = std::min(step_best, s), step_total += s;
      }
      const double step_mean = step_total / step_runs;
      // Whole searches: beam search's candidate lists as the model's settings make them (no reranking).
      std::vector<std::vector<Hypothesis>> found = beam_search_nbest(dec, F, n, beam, model->max_len, model->length_norm,
                                                                     model->no_repeat_ngram);
      double words = 0;
      for (auto& f : found) words += (double)f.front().tokens.size() / n;
      double search_best = 1e30, search_total = 0;
      int searches = 0;
      for (auto t0 = std::chrono::steady_clock::now(); seconds_since(t0) < sa->seconds / 2 || searches < 3; ++searches) {
        auto t1 = std::chrono::steady_clock::now();
        beam_search_nbest(dec, F, n, beam, model->max_len, model->length_norm, model->no_repeat_ngram);
        const double s = seconds_since(t1);
        search_best = std::min(search_best, s), search_total += s;
      }
      const double search_mean = search_total / searches, flops = 2.0 * n * beam * decoder_row_step_macs(c);  // 0 but for additive, Bahdanau
      if (sa->json) {
        std::printf("{\"images\": %d, \"beam\": %d, \"rows\": %d, \"step_ms\": %.4f, \"step_best_ms\": %.4f, "
                    "\"step_gflops\": %.2f, \"search_ms\": %.3f, \"search_best_ms\": %.3f, \"images_per_s\": %.2f, "
                    "\"words\": %.2f, \"flops_per_step\": %.0f, \"L\": %d, \"D\": %d, \"E\": %d, \"H\": %d, \"A\": %d, \"V\": %d, "
                    "\"attention\": \"%s\", \"score\": \"%s\", \"order\": \"%s\"}\n",
                    n, beam, n * beam, step_mean * 1e3, step_best * 1e3, flops / step_mean / 1e9, search_mean * 1e3,
                    search_best * 1e3, n / search_mean, words, flops, L, c.feature_dim, c.embed_dim, c.hidden_dim,
                    c.attn_dim, c.vocab_size, c.attention.c_str(), c.score.c_str(), c.order.c_str());
      } else {
        std::printf("  %d image%s (%d rows): decoder step %.3f ms (best %.3f)", n, n == 1 ? "" : "s", n * beam,
                    step_mean * 1e3, step_best * 1e3);
        if (flops > 0) std::printf(", %.2f GFLOP -> %.1f GFLOPS", flops / 1e9, flops / step_mean / 1e9);
        std::printf("; beam search %.1f ms (best %.1f) -> %.1f images/s, captions of %.1f words\n", search_mean * 1e3,
                    search_best * 1e3, n / search_mean, words);
      }
      std::fflush(stdout);
    }
  });

  struct EncArgs {
    std::string blocks = "16,32,64,128";
    int size = 128, batch = 16, iters = 5;
    bool train = true;
  };
  auto e = std::make_shared<EncArgs>();
  auto* enc = bench->add_subcommand("cnn", "Time the trainable CNN encoder (forward and backward)");
  enc->add_option("--blocks", e->blocks, "Conv blocks")->capture_default_str();
  enc->add_option("--size", e->size, "Input side")->capture_default_str();
  enc->add_option("--batch", e->batch, "Images per batch")->capture_default_str();
  enc->add_option("--iters", e->iters, "Timed iterations")->capture_default_str();
  enc->callback([e] {
    EncoderConfig cfg;
    cfg.input_size = e->size;
    cfg.blocks = EncoderConfig::parse_blocks(e->blocks);
    CnnEncoder model(cfg);
    Rng rng(1);
    model.init(rng);
    std::vector<float> img((size_t)e->batch * 3 * e->size * e->size), grid;
    for (auto& v : img) v = (float)rng.normal();
    double fwd = 0, bwd = 0, inf = 0;
    for (int it = 0; it <= e->iters; ++it) {
      auto t0 = std::chrono::steady_clock::now();
      model.forward(img.data(), e->batch, true, grid);
      double f = seconds_since(t0);
      t0 = std::chrono::steady_clock::now();
      model.backward(grid.data());
      double b = seconds_since(t0);
      t0 = std::chrono::steady_clock::now();
      model.forward(img.data(), e->batch, false, grid);
      double i = seconds_since(t0);
      if (it > 0) fwd += f, bwd += b, inf += i;
    }
    fwd /= e->iters, bwd /= e->iters, inf /= e->iters;
    std::printf("cnn %s at %d, batch %d: train forward %.1f ms, backward %.1f ms (%.0f images/s); inference %.1f ms (%.0f images/s)\n",
                e->blocks.c_str(), e->size, e->batch, fwd * 1e3, bwd * 1e3, e->batch / (fwd + bwd), inf * 1e3,
                e->batch / inf);
  });

  struct PreArgs {
    std::string encoder, cut = "mixed5", batches = "1,8";
    int size = 299;
    double seconds = 20;
    bool json = false, peak = false;
  };
  auto pa = std::make_shared<PreArgs>();
  auto* pre = bench->add_subcommand("encoder", "Time a pretrained encoder (InceptionV3, ResNet v2) on oneDNN at batch 1 and 8");
  pre->add_option("--encoder", pa->encoder, "Encoder file: a sat encoder or a ResNet v2 safetensors (default: the bundled InceptionV3)");
  pre->add_option("--cut", pa->cut, "Layer that gives the grid")->capture_default_str();
  pre->add_option("--size", pa->size, "Input side")->capture_default_str();
  pre->add_option("--batches", pa->batches, "Comma-separated batch sizes")->capture_default_str();
  pre->add_option("--seconds", pa->seconds, "Time spent per batch size (after one warm-up batch)")->capture_default_str();
  pre->add_flag("--json", pa->json, "One JSON line per batch size");
  pre->add_flag("--peak", pa->peak, "Also measure the machine's FP32 peak (oneDNN sgemm) and print the share of it");
  pre->callback([pa] {
    const std::vector<int> batches = parse_batches(pa->batches, "--batches");
    std::string path = pa->encoder.empty() ? default_encoder_path() : pa->encoder;
    PretrainedNet net = load_pretrained_net(path);
    std::string grid_node;
    try {
      grid_node = net.graph.grid_node(pa->cut);
    } catch (const Error& e) {
      fail(path, e.what());
    }
    // --encoder-precision (a global flag) chooses the arithmetic; f32 when not given
    const Precision precision = resolve(encoder_precision_setting().value_or(PrecisionChoice::f32));
    // int8 needs activation ranges; for timing, those of the float32 network on the benchmark's own (random) input
    // do (the time does not depend on them; a model's come from photos: sat model calibrate)
    Int8Ranges ranges;
    if (precision == Precision::int8) {
      PretrainedEncoder f32(net.graph.cut(grid_node), net.weights, pa->size, path, Precision::f32);
      Rng rng(5);
      std::vector<float> img((size_t)3 * pa->size * pa->size);
      for (auto& v : img) v = (float)rng.uniform();
      std::map<std::string, std::vector<float>> samples;
      f32.sample_activations(img.data(), 1, samples, 65536);
      ranges = choose_int8_ranges(samples);
    }
    PretrainedEncoder enc(net.graph.cut(grid_node), net.weights, pa->size, path, precision, ranges);
    const double gmac = enc.macs_per_image() / 1e9;
    const double peak = pa->peak ? measure_peak_gflops() : 0;
    const double bf16_peak = pa->peak && precision == Precision::bf16 ? measure_bf16_peak_gflops() : 0;
    const double int8_peak = pa->peak && precision == Precision::int8 ? measure_int8_peak_gops() : 0;
    const std::string name = net.external_file.empty() ? "InceptionV3" : "ResNet v2 (" + net.external_file + ")";
    if (!pa->json)
      std::printf("%s -> %s at %dx%d: grid %dx%dx%d, %.2f GMAC per image (oneDNN %s, %s %s activations%s)\n",
                  name.c_str(), pa->cut.c_str(), pa->size, pa->size, enc.grid_h(),
                  enc.grid_w(), enc.channels(), gmac,
                  dnnl_version()->cpu_runtime == DNNL_RUNTIME_OMP ? "OpenMP" : "threads", precision_name(precision),
                  activation_layout_name(precision),
                  precision == Precision::bf16   ? (cpu_has_amx() ? ", AMX" : cpu_has_native_bf16() ? ", AVX512-BF16" : ", emulated")
                  : precision == Precision::int8 ? (cpu_has_vnni() ? ", AVX512-VNNI" : ", no VNNI")
                                                 : "");
    if (peak > 0 && !pa->json) std::printf("  machine FP32 peak, measured: %.1f GFLOPS (%s)\n", peak, kPeakMethod);
    if (bf16_peak > 0 && !pa->json)
      std::printf("  machine bf16 peak, measured: %.1f GFLOPS (%s)\n", bf16_peak, kBf16PeakMethod);
    if (int8_peak > 0 && !pa->json)
      std::printf("  machine int8 peak, measured: %.1f GOP/s (%s)\n", int8_peak, kInt8PeakMethod);
    for (const int n : batches) {
      Rng rng(3);
      std::vector<float> img((size_t)n * 3 * pa->size * pa->size), grid;
      for (auto& v : img) v = (float)rng.uniform();
      enc.forward(img.data(), n, grid);  // warm-up: builds the plan, reorders weights
      int batches = 0;
      double best = 1e30;
      auto t0 = std::chrono::steady_clock::now();
      while (seconds_since(t0) < pa->seconds || batches < 3) {
        auto t1 = std::chrono::steady_clock::now();
        enc.forward(img.data(), n, grid);
        best = std::min(best, seconds_since(t1));
        ++batches;
      }
      double mean = seconds_since(t0) / batches, ips = n / mean;
      if (pa->json)
        std::printf("{\"peer\": \"sat\", \"batch\": %d, \"images_per_s\": %.3f, \"best_images_per_s\": %.3f, "
                    "\"gflops\": %.2f, \"gmac_per_image\": %.4f, \"peak_gflops\": %.2f, \"bf16_peak_gflops\": %.2f, "
                    "\"int8_peak_gops\": %.2f, \"precision\": \"%s\"}\n",
                    n, ips, n / best, 2 * gmac * ips, gmac, peak, bf16_peak, int8_peak, precision_name(precision));
      else if (peak > 0)
        std::printf("  batch %d: %.1f ms per batch, %.2f images/s (best %.2f), %.1f GFLOPS, %.0f%% of the FP32 peak%s\n",
                    n, mean * 1e3, ips, n / best, 2 * gmac * ips, 100 * 2 * gmac * ips / peak,
                    bf16_peak > 0   ? (", " + std::to_string((int)std::lround(100 * 2 * gmac * ips / bf16_peak)) +
                                       "% of the bf16 peak").c_str()
                    : int8_peak > 0 ? (", " + std::to_string((int)std::lround(100 * 2 * gmac * ips / int8_peak)) +
                                       "% of the int8 peak").c_str()
                                    : "");
      else
        std::printf("  batch %d: %.1f ms per batch, %.2f images/s (best %.2f), %.1f GFLOPS\n", n, mean * 1e3, ips,
                    n / best, 2 * gmac * ips);
      std::fflush(stdout);
    }
  });

  struct TuneArgs {
    std::string encoder, from = "mixed5", to = "mixed7";
    int size = 299, batch = 16, iters = 5;
    bool json = false;
  };
  auto ta = std::make_shared<TuneArgs>();
  auto* tune = bench->add_subcommand(
      "tune", "Time fine-tuning the pretrained encoder's top blocks (forward and backward from cached grids)");
  tune->add_option("--encoder", ta->encoder, "Encoder file (default: the bundled InceptionV3)");
  tune->add_option("--from", ta->from, "Cut whose grids are cached (the blocks start after it)")->capture_default_str();
  tune->add_option("--to", ta->to, "Last layer of the blocks")->capture_default_str();
  tune->add_option("--size", ta->size, "Image side")->capture_default_str();
  tune->add_option("--batch", ta->batch, "Images per batch")->capture_default_str();
  tune->add_option("--iters", ta->iters, "Timed iterations (after one warm-up)")->capture_default_str();
  tune->add_flag("--json", ta->json, "One JSON line");
  tune->callback([ta] {
    std::string path = ta->encoder.empty() ? default_encoder_path() : ta->encoder;
    PretrainedNet net = load_pretrained_net(path);
    TunableBlocks blocks(net.graph.cut(ta->to), net.weights, ta->from, ta->size, path);
    const int n = ta->batch;
    Rng rng(5);
    std::vector<float> in((size_t)n * blocks.channels_in() * blocks.grid_h() * blocks.grid_w()), out;
    for (auto& v : in) v = (float)std::max(0.0, rng.normal());  // like ReLU outputs
    double fwd = 0, bwd = 0;
    for (int it = 0; it <= ta->iters; ++it) {
      auto t0 = std::chrono::steady_clock::now();
      blocks.forward(in.data(), n, true, out);
      double f = seconds_since(t0);
      t0 = std::chrono::steady_clock::now();
      blocks.backward(out.data());
      double b = seconds_since(t0);
      if (it > 0) fwd += f, bwd += b;
    }
    fwd /= ta->iters, bwd /= ta->iters;
    const double gmac = blocks.macs_per_image() / 1e9;
    // Backward is two convolutions per forward one (data and weights; none into the cached input for the first).
    const double gflops = 2 * 3 * gmac * n / (fwd + bwd);
    size_t weights = 0;
    for (auto& p : blocks.params()) weights += p.value.size();
    if (ta->json)
      std::printf("{\"peer\": \"sat\", \"batch\": %d, \"forward_ms\": %.2f, \"backward_ms\": %.2f, "
                  "\"images_per_s\": %.3f}\n", n, fwd * 1e3, bwd * 1e3, n / (fwd + bwd));
    else
      std::printf("%s..%s after %s at %dx%d (%.2f GMAC per image, %zu weights), batch %d: forward %.1f ms, backward "
                  "%.1f ms -> %.1f images/s (about %.0f GFLOPS)\n",
                  net.graph.nodes[net.graph.index_of(ta->from) + 1].name.c_str(), ta->to.c_str(), ta->from.c_str(),
                  ta->size, ta->size, gmac, weights,
                  n, fwd * 1e3, bwd * 1e3, n / (fwd + bwd), gflops);
  });

  struct CacheArgs {
    int images = 120000, grid = 14, channels = 512, batch = 64, steps = 40;
    std::string path = "/tmp/sat-bench-cache.feat";
    bool keep = false, no_prefetch = false;
  };
  auto ca = std::make_shared<CacheArgs>();
  auto* cache_cmd = bench->add_subcommand(
      "cache", "Train the decoder from a memory-mapped feature cache larger than RAM (COCO size by default): "
               "captions/s and peak resident memory");
  cache_cmd->add_option("--images", ca->images, "Feature grids in the generated cache")->capture_default_str();
  cache_cmd->add_option("--grid", ca->grid, "Grid side")->capture_default_str();
  cache_cmd->add_option("--channels", ca->channels, "Feature channels")->capture_default_str();
  cache_cmd->add_option("--batch", ca->batch, "Images (one caption each) per step")->capture_default_str();
  cache_cmd->add_option("--steps", ca->steps, "Timed training steps")->capture_default_str();
  cache_cmd->add_option("--path", ca->path, "Where the cache is generated (reused if it is already there)")->capture_default_str();
  cache_cmd->add_flag("--keep", ca->keep, "Keep the generated cache (a cache that was already there is always kept)");
  cache_cmd->add_flag("--no-prefetch", ca->no_prefetch,
                      "Read each step's grids only when it needs them, as before the trainer prefetched them");
  cache_cmd->callback([ca] {
    auto peak_mb = [] {
      struct rusage ru;
      getrusage(RUSAGE_SELF, &ru);
      return ru.ru_maxrss / 1024.0;
    };
    const int L = ca->grid * ca->grid, D = ca->channels;
    Rng rng(11);
    auto t0 = std::chrono::steady_clock::now();
    const bool generated = !file_exists(ca->path);
    if (generated) {
      FeatureHeader h;
      h.encoder = {{"kind", "random"}};
      h.encoder_id = "random";
      h.grid_h = h.grid_w = ca->grid;
      h.channels = D;
      for (int i = 0; i < ca->images; ++i) h.images.push_back("random_" + std::to_string(i) + ".jpg");
      std::vector<float> pool((size_t)L * D * 2);
      for (auto& v : pool) v = (float)rng.uniform();
      FeatureWriter w(ca->path, h);
      for (int i = w.done(); i < ca->images; ++i)
        w.append(pool.data() + (size_t)rng.integer(0, (int64_t)L * D - 1), 1);  // a different window per image
      w.finish();
      std::printf("generated %s: %d grids of %dx%d, %.1f GB, in %.0f s\n", ca->path.c_str(), ca->images, L, D,
                  (double)h.record_bytes() * ca->images / 1e9, seconds_since(t0));
    }
    FeatureCache cache(ca->path);
    if (cache.header().grid_h != ca->grid || cache.header().grid_w != ca->grid || cache.header().channels != D)
      fail(ca->path, "holds " + std::to_string(cache.header().grid_h) + "x" + std::to_string(cache.header().grid_w) +
                         "x" + std::to_string(cache.header().channels) + " grids, not the " + std::to_string(ca->grid) +
                         "x" + std::to_string(ca->grid) + "x" + std::to_string(D) + " asked (--grid, --channels)");
    DecoderConfig cfg;
    cfg.vocab_size = 3000;
    cfg.embed_dim = cfg.hidden_dim = cfg.attn_dim = 512;
    cfg.feature_dim = D;
    cfg.grid_h = cfg.grid_w = ca->grid;
    cfg.dropout = 0.5f;
    Decoder model(cfg);
    model.init(rng);
    auto params = model.params();
    Adam adam;
    adam.attach(params);
    const double rss_before = peak_mb();
    Mat F((int64_t)ca->batch * L, D);
    DecoderCache dc;
    double read_s = 0;
    t0 = std::chrono::steady_clock::now();
    // random images: every step touches new parts of the file. As the trainer does, a step starts the reads of
    // its grids and of the next step's (FeatureCache::prefetch), then reads its own.
    auto draw = [&] {
      std::vector<int> idx(ca->batch);
      for (int& i : idx) i = (int)rng.integer(0, cache.size() - 1);
      return idx;
    };
    std::vector<int> next = draw();
    for (int s = 0; s < ca->steps; ++s) {
      auto t1 = std::chrono::steady_clock::now();
      const std::vector<int> idx = next;
      next = draw();
      if (!ca->no_prefetch) {
        for (int i : idx) cache.prefetch(i);
        if (s + 1 < ca->steps)
          for (int i : next) cache.prefetch(i);
      }
      for (int b = 0; b < ca->batch; ++b) cache.read(idx[b], F.data() + (size_t)b * L * D);
      read_s += seconds_since(t1);
      std::vector<std::vector<int>> caps(ca->batch);
      for (auto& c : caps)
        for (int t = 0; t < 15; ++t) c.push_back(4 + (int)rng.integer(0, cfg.vocab_size - 5));
      CaptionBatch cb = CaptionBatch::from_ids(caps, 16);
      model.forward(F, cb, 1.f, true, &rng, dc);
      model.backward(dc, nullptr);
      Adam::clip_grad_norm(params, 5.0);
      adam.update(params, 1e-4f);
      for (auto* p : params) p->zero_grad();
    }
    double secs = seconds_since(t0);
    std::printf("cache %s: %d images, %.1f GB on disk; %d steps of %d captions: %.1f captions/s (reading features "
                "%.1f%% of the time); peak RSS %.0f MB (%.0f MB before training)\n",
                ca->path.c_str(), cache.size(), (double)cache.header().record_bytes() * cache.size() / 1e9, ca->steps,
                ca->batch, ca->steps * ca->batch / secs, 100 * read_s / secs, peak_mb(), rss_before);
    if (generated && !ca->keep) std::remove(ca->path.c_str());
  });

  struct MetricArgs {
    int images = 5000, refs = 5, words = 1000;
    std::string captions;
  };
  auto m = std::make_shared<MetricArgs>();
  auto* met = bench->add_subcommand("metrics", "Time corpus scoring (PTB tokenization, BLEU, ROUGE-L, CIDEr-D)");
  met->add_option("--images", m->images, "Images")->capture_default_str();
  met->add_option("--refs", m->refs, "References per image")->capture_default_str();
  met->add_option("--words", m->words, "Vocabulary of the random captions")->capture_default_str();
  met->add_option("--captions", m->captions,
                  "Real captions instead (COCO JSON, captions.csv or data dir): each image's references are its "
                  "captions, its hypothesis is a caption of the next image");
  met->callback([m] {
    Rng rng(7);
    auto sentence = [&] {
      std::string s;
      int len = (int)rng.integer(8, 14);
      for (int k = 0; k < len; ++k) {
        // Zipf-like word choice so n-grams repeat as in real captions
        int w = (int)(std::pow(rng.uniform(), 3.0) * m->words);
        s += (k ? " " : "") + std::string("w") + std::to_string(w);
      }
      return s + ".";
    };
    std::vector<std::string> hyps;
    std::vector<std::vector<std::string>> refs(m->images);
    if (!m->captions.empty()) {
      CaptionSet set = load_caption_set(m->captions, "", "");
      if ((int)set.images.size() < m->images + 1) throw Error(m->captions + ": fewer images than --images");
      for (int i = 0; i < m->images; ++i) {
        for (int ci : set.images[i].caption_indices)
          if ((int)refs[i].size() < m->refs) refs[i].push_back(set.captions[ci].raw);
        hyps.push_back(set.captions[set.images[i + 1].caption_indices[0]].raw);
      }
    } else {
      for (int i = 0; i < m->images; ++i) {
        hyps.push_back(sentence());
        for (int r = 0; r < m->refs; ++r) refs[i].push_back(sentence());
      }
    }
    std::string why;
    auto t0 = std::chrono::steady_clock::now();
    bool have_meteor = meteor_available(&why);  // loads WordNet once per process
    double load = seconds_since(t0);
    t0 = std::chrono::steady_clock::now();
    CaptionScores sc = score_captions(hyps, refs);
    double total = seconds_since(t0);
    // The same corpus again, metric by metric.
    std::vector<Tokens> h(hyps.size());
    std::vector<std::vector<Tokens>> r(hyps.size());
    t0 = std::chrono::steady_clock::now();
    for (size_t i = 0; i < hyps.size(); ++i) {
      h[i] = ptb_tokenize(hyps[i]);
      for (auto& x : refs[i]) r[i].push_back(ptb_tokenize(x));
    }
    double tok = seconds_since(t0);
    t0 = std::chrono::steady_clock::now();
    corpus_bleu(h, r);
    double bleu = seconds_since(t0);
    t0 = std::chrono::steady_clock::now();
    corpus_rouge_l(h, r);
    double rouge = seconds_since(t0);
    t0 = std::chrono::steady_clock::now();
    corpus_cider_d(h, r);
    double cider = seconds_since(t0);
    t0 = std::chrono::steady_clock::now();
    if (have_meteor) corpus_meteor(h, r);
    double meteor = seconds_since(t0);
    std::printf("scored %d images x %d references, all metrics: %.3f s (CIDEr %.3f)\n", m->images, m->refs, total, sc.cider_d);
    std::printf("  tokenize %.3f s (1 thread)  BLEU %.3f s  ROUGE-L %.3f s  CIDEr-D %.3f s  METEOR %.3f s%s; WordNet load %.3f s (once)\n",
                tok, bleu, rouge, cider, meteor, have_meteor ? "" : (" (unavailable: " + why + ")").c_str(), load);
    // A caption memory's CIDEr-D table (consensus reranking builds it at every model load, on a thread of its
    // own): from the references as words joined by spaces, as the memory keeps them; best of 5.
    std::vector<std::vector<std::string>> joined(r.size());
    for (size_t i = 0; i < r.size(); ++i)
      for (auto& t : r[i]) joined[i].push_back(join_words(t));
    double table = 1e9;
    for (int rep = 0; rep < 5; ++rep) {
      t0 = std::chrono::steady_clock::now();
      CiderDScorer built(CiderDScorer::SpaceJoined{joined}, 6.0, CiderDScorer::ReferenceVectors::on_demand);
      table = std::min(table, seconds_since(t0));
    }
    double from_tokens = 1e9;  // the same from Tokens already split (the memory split its captions first before)
    for (int rep = 0; rep < 5; ++rep) {
      t0 = std::chrono::steady_clock::now();
      CiderDScorer built(r, 6.0, CiderDScorer::ReferenceVectors::on_demand);
      from_tokens = std::min(from_tokens, seconds_since(t0));
    }
    std::printf("  caption memory's CIDEr-D table (document frequencies of %d images' references): %.1f ms from "
                "space-joined captions, %.1f ms from split words (1 thread, best of 5)\n",
                m->images, 1000 * table, 1000 * from_tokens);
  });
}

}  // namespace sat
