// sat bench cnn / encoder / tune: the encoder benches. The trainable CNN (forward and backward), a pretrained encoder
// on oneDNN (in f32, bf16 or int8), and fine-tuning a pretrained encoder's top blocks.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <map>
#include <oneapi/dnnl/dnnl.h>

#include "tools/bench/cmd_bench.hpp"
#include "tools/cli/commands.hpp"
#include "vision/cnn.hpp"
#include "vision/onednn.hpp"
#include "vision/detector.hpp"
#include "vision/pretrained.hpp"
#include "vision/tunable.hpp"

namespace sat {

namespace {

struct CnnBenchArgs {
  std::string blocks = "16,32,64,128";
  int size = 128, batch = 16, iters = 5;
};

void bench_cnn(const CnnBenchArgs& e) {
  EncoderConfig cfg;
  cfg.input_size = e.size;
  cfg.blocks = EncoderConfig::parse_blocks(e.blocks);
  CnnEncoder model(cfg);
  Rng rng(1);
  model.init(rng);
  std::vector<float> img((size_t)e.batch * 3 * e.size * e.size), grid;
  for (auto& v : img) v = (float)rng.normal();
  double fwd = 0, bwd = 0, inf = 0;
  for (int it = 0; it <= e.iters; ++it) {
    auto t0 = std::chrono::steady_clock::now();
    model.forward(img.data(), e.batch, true, grid);
    double f = seconds_since(t0);
    t0 = std::chrono::steady_clock::now();
    model.backward(grid.data());
    double b = seconds_since(t0);
    t0 = std::chrono::steady_clock::now();
    model.forward(img.data(), e.batch, false, grid);
    double i = seconds_since(t0);
    if (it > 0) fwd += f, bwd += b, inf += i;
  }
  fwd /= e.iters, bwd /= e.iters, inf /= e.iters;
  std::printf(
      "cnn %s at %d, batch %d: train forward %.1f ms, backward %.1f ms (%.0f images/s); inference %.1f ms "
      "(%.0f images/s)\n",
      e.blocks.c_str(), e.size, e.batch, fwd * 1e3, bwd * 1e3, e.batch / (fwd + bwd), inf * 1e3, e.batch / inf);
}

struct EncoderBenchArgs {
  std::string encoder, cut = "mixed5", batches = "1,8";
  int size = 299;
  double seconds = 20;
  bool json = false, peak = false;
};

// The machine's peaks that --peak measures: FP32, and bf16 or int8 when the encoder computes in it (0: not measured).
struct MachinePeaks {
  double fp32 = 0, bf16 = 0, int8 = 0;  // GFLOPS (int8: GOP/s)
};

// int8 needs activation ranges; for timing, those of the float32 network on the benchmark's own (random) input
// do (the time does not depend on them; a model's come from photos: sat model calibrate)
Int8Ranges ranges_for_timing(const PretrainedNet& net, const std::string& grid_node, int size,
                             const std::string& path) {
  PretrainedEncoder f32(net.graph.cut(grid_node), net.weights, size, path, Precision::f32);
  Rng rng(5);
  std::vector<float> img((size_t)3 * size * size);
  for (auto& v : img) v = (float)rng.uniform();
  std::map<std::string, std::vector<float>> samples;
  f32.sample_activations(img.data(), 1, samples, 65536);
  return choose_int8_ranges(samples);
}

// The text report's first lines: the network, its shapes and arithmetic, and the peaks measured.
void print_encoder_header(const EncoderBenchArgs& pa, const PretrainedNet& net, const PretrainedEncoder& enc,
                          Precision precision, const MachinePeaks& peaks) {
  const double gmac = enc.macs_per_image() / 1e9;
  const std::string name = net.external_file.empty() ? "InceptionV3" : "ResNet v2 (" + net.external_file + ")";
  std::printf("%s -> %s at %dx%d: grid %dx%dx%d, %.2f GMAC per image (oneDNN %s, %s %s activations%s)\n", name.c_str(),
              pa.cut.c_str(), pa.size, pa.size, enc.grid_h(), enc.grid_w(), enc.channels(), gmac,
              dnnl_version()->cpu_runtime == DNNL_RUNTIME_OMP ? "OpenMP" : "threads", precision_name(precision),
              activation_layout_name(precision),
              precision == Precision::bf16   ? (cpu_has_amx()           ? ", AMX"
                                                : cpu_has_native_bf16() ? ", AVX512-BF16"
                                                                        : ", emulated")
              : precision == Precision::int8 ? (cpu_has_vnni() ? ", AVX512-VNNI" : ", no VNNI")
                                             : "");
  if (peaks.fp32 > 0) std::printf("  machine FP32 peak, measured: %.1f GFLOPS (%s)\n", peaks.fp32, kPeakMethod);
  if (peaks.bf16 > 0) std::printf("  machine bf16 peak, measured: %.1f GFLOPS (%s)\n", peaks.bf16, kBf16PeakMethod);
  if (peaks.int8 > 0) std::printf("  machine int8 peak, measured: %.1f GOP/s (%s)\n", peaks.int8, kInt8PeakMethod);
}

// Seconds per batch: the mean and the best.
struct BatchTimes {
  double mean = 0, best = 0;
};

// Batches of n random images through the encoder for `seconds` (at least 3, after a warm-up).
BatchTimes time_encoder_batches(PretrainedEncoder& enc, int n, int size, double seconds) {
  Rng rng(3);
  std::vector<float> img((size_t)n * 3 * size * size), grid;
  for (auto& v : img) v = (float)rng.uniform();
  enc.forward(img.data(), n, grid);  // warm-up: builds the plan, reorders weights
  int batches = 0;
  double best = 1e30;
  auto t0 = std::chrono::steady_clock::now();
  while (seconds_since(t0) < seconds || batches < 3) {
    auto t1 = std::chrono::steady_clock::now();
    enc.forward(img.data(), n, grid);
    best = std::min(best, seconds_since(t1));
    ++batches;
  }
  return {seconds_since(t0) / batches, best};
}

// One batch size's line: JSON, or text with the shares of the peaks measured.
void print_encoder_batch(bool json, int n, const BatchTimes& t, double gmac, Precision precision,
                         const MachinePeaks& peaks) {
  const double mean = t.mean, best = t.best, ips = n / mean;
  if (json)
    std::printf(
        "{\"peer\": \"sat\", \"batch\": %d, \"images_per_s\": %.3f, \"best_images_per_s\": %.3f, "
        "\"gflops\": %.2f, \"gmac_per_image\": %.4f, \"peak_gflops\": %.2f, \"bf16_peak_gflops\": %.2f, "
        "\"int8_peak_gops\": %.2f, \"precision\": \"%s\"}\n",
        n, ips, n / best, 2 * gmac * ips, gmac, peaks.fp32, peaks.bf16, peaks.int8, precision_name(precision));
  else if (peaks.fp32 > 0)
    std::printf(
        "  batch %d: %.1f ms per batch, %.2f images/s (best %.2f), %.1f GFLOPS, %.0f%% of the FP32 peak%s\n", n,
        mean * 1e3, ips, n / best, 2 * gmac * ips, 100 * 2 * gmac * ips / peaks.fp32,
        peaks.bf16 > 0
            ? (", " + std::to_string((int)std::lround(100 * 2 * gmac * ips / peaks.bf16)) + "% of the bf16 peak")
                  .c_str()
        : peaks.int8 > 0
            ? (", " + std::to_string((int)std::lround(100 * 2 * gmac * ips / peaks.int8)) + "% of the int8 peak")
                  .c_str()
            : "");
  else
    std::printf("  batch %d: %.1f ms per batch, %.2f images/s (best %.2f), %.1f GFLOPS\n", n, mean * 1e3, ips, n / best,
                2 * gmac * ips);
}

void bench_encoder(const EncoderBenchArgs& pa) {
  const std::vector<int> batches = parse_batches(pa.batches, "--batches");
  std::string path = pa.encoder.empty() ? default_encoder_path() : pa.encoder;
  PretrainedNet net = load_pretrained_net(path);
  std::string grid_node;
  try {
    grid_node = net.graph.grid_node(pa.cut);
  } catch (const Error& e) {
    fail(path, e.what());
  }
  // --encoder-precision (a global flag) chooses the arithmetic; f32 when not given
  const Precision precision = resolve(encoder_precision_setting().value_or(PrecisionChoice::f32));
  Int8Ranges ranges;
  if (precision == Precision::int8) ranges = ranges_for_timing(net, grid_node, pa.size, path);
  PretrainedEncoder enc(net.graph.cut(grid_node), net.weights, pa.size, path, precision, ranges);
  const double gmac = enc.macs_per_image() / 1e9;
  MachinePeaks peaks;
  peaks.fp32 = pa.peak ? measure_peak_gflops() : 0;
  peaks.bf16 = pa.peak && precision == Precision::bf16 ? measure_bf16_peak_gflops() : 0;
  peaks.int8 = pa.peak && precision == Precision::int8 ? measure_int8_peak_gops() : 0;
  if (!pa.json) print_encoder_header(pa, net, enc, precision, peaks);
  for (const int n : batches) {
    const BatchTimes times = time_encoder_batches(enc, n, pa.size, pa.seconds);
    print_encoder_batch(pa.json, n, times, gmac, precision, peaks);
    std::fflush(stdout);
  }
}

struct DetectorBenchArgs {
  int size = 448;
  std::string batches = "1,8";
  double seconds = 3;
  bool json = false, trunk = false;
};

// The object detector (vision/detector.hpp) on random photos, batch by batch, like bench_encoder.
void bench_detector(const DetectorBenchArgs& da) {
  const std::vector<int> batches = parse_batches(da.batches, "--batches");
  const Precision precision = resolve(encoder_precision_setting().value_or(PrecisionChoice::f32));
  auto detector = load_object_detector(da.size, precision, "sat bench detector", "", da.trunk);
  const double gmac = detector->macs_per_image() / 1e9;
  if (!da.json)
    std::printf("CenterNet MobileNetV3 (%s) at %dx%d: %d classes on a %dx%d map%s, %.2f GMAC per image (%s, %s)\n",
                kCenternetJson, da.size, da.size, detector->classes(), detector->map_size(), detector->map_size(),
                da.trunk ? " and its trunk's mean" : "", gmac, precision_name(detector->precision()),
                activation_layout_name(detector->precision()));
  for (const int n : batches) {
    Rng rng(3);
    std::vector<float> img((size_t)n * 3 * da.size * da.size), heat, trunk;
    std::vector<float>* with_trunk = da.trunk ? &trunk : nullptr;
    for (auto& v : img) v = (float)(255 * rng.uniform());
    detector->forward(img.data(), n, heat, with_trunk);  // warm-up: builds the plan, reorders weights
    int count = 0;
    double best = 1e30;
    auto t0 = std::chrono::steady_clock::now();
    while (seconds_since(t0) < da.seconds || count < 3) {
      auto t1 = std::chrono::steady_clock::now();
      detector->forward(img.data(), n, heat, with_trunk);
      best = std::min(best, seconds_since(t1));
      ++count;
    }
    print_encoder_batch(da.json, n, {seconds_since(t0) / count, best}, gmac, detector->precision(), MachinePeaks());
    std::fflush(stdout);
  }
}

struct TuneBenchArgs {
  std::string encoder, from = "mixed5", to = "mixed7";
  int size = 299, batch = 16, iters = 5;
  bool json = false;
};

void bench_tune(const TuneBenchArgs& ta) {
  std::string path = ta.encoder.empty() ? default_encoder_path() : ta.encoder;
  PretrainedNet net = load_pretrained_net(path);
  TunableBlocks blocks(net.graph.cut(ta.to), net.weights, ta.from, ta.size, path);
  const int n = ta.batch;
  Rng rng(5);
  std::vector<float> in((size_t)n * blocks.channels_in() * blocks.grid_h() * blocks.grid_w()), out;
  for (auto& v : in) v = (float)std::max(0.0, rng.normal());  // like ReLU outputs
  double fwd = 0, bwd = 0;
  for (int it = 0; it <= ta.iters; ++it) {
    auto t0 = std::chrono::steady_clock::now();
    blocks.forward(in.data(), n, true, out);
    double f = seconds_since(t0);
    t0 = std::chrono::steady_clock::now();
    blocks.backward(out.data());
    double b = seconds_since(t0);
    if (it > 0) fwd += f, bwd += b;
  }
  fwd /= ta.iters, bwd /= ta.iters;
  const double gmac = blocks.macs_per_image() / 1e9;
  // Backward is two convolutions per forward one (data and weights; none into the cached input for the first).
  const double gflops = 2 * 3 * gmac * n / (fwd + bwd);
  size_t weights = 0;
  for (auto& p : blocks.params()) weights += p.value.size();
  if (ta.json)
    std::printf(
        "{\"peer\": \"sat\", \"batch\": %d, \"forward_ms\": %.2f, \"backward_ms\": %.2f, "
        "\"images_per_s\": %.3f}\n",
        n, fwd * 1e3, bwd * 1e3, n / (fwd + bwd));
  else
    std::printf(
        "%s..%s after %s at %dx%d (%.2f GMAC per image, %zu weights), batch %d: forward %.1f ms, backward "
        "%.1f ms -> %.1f images/s (about %.0f GFLOPS)\n",
        net.graph.nodes[net.graph.index_of(ta.from) + 1].name.c_str(), ta.to.c_str(), ta.from.c_str(), ta.size, ta.size,
        gmac, weights, n, fwd * 1e3, bwd * 1e3, n / (fwd + bwd), gflops);
}

}  // namespace

void add_bench_cnn(CLI::App& bench) {
  auto e = std::make_shared<CnnBenchArgs>();
  auto* enc = bench.add_subcommand("cnn", "Time the trainable CNN encoder (forward and backward)");
  enc->add_option("--blocks", e->blocks, "Conv blocks")->capture_default_str();
  enc->add_option("--size", e->size, "Input side")->capture_default_str();
  enc->add_option("--batch", e->batch, "Images per batch")->capture_default_str();
  enc->add_option("--iters", e->iters, "Timed iterations")->capture_default_str();
  enc->callback([e] { bench_cnn(*e); });
}

void add_bench_encoder(CLI::App& bench) {
  auto pa = std::make_shared<EncoderBenchArgs>();
  auto* pre = bench.add_subcommand("encoder",
                                   "Time a pretrained encoder (InceptionV3, ResNet v2) on oneDNN at batch 1 "
                                   "and 8");
  pre->add_option("--encoder", pa->encoder,
                  "Encoder file: a sat encoder or a ResNet v2 safetensors (default: the "
                  "bundled InceptionV3)");
  pre->add_option("--cut", pa->cut, "Layer that gives the grid")->capture_default_str();
  pre->add_option("--size", pa->size, "Input side")->capture_default_str();
  pre->add_option("--batches", pa->batches, "Comma-separated batch sizes")->capture_default_str();
  pre->add_option("--seconds", pa->seconds, "Time spent per batch size (after one warm-up batch)")
      ->capture_default_str();
  pre->add_flag("--json", pa->json, "One JSON line per batch size");
  pre->add_flag("--peak", pa->peak, "Also measure the machine's FP32 peak (oneDNN sgemm) and print the share of it");
  pre->callback([pa] { bench_encoder(*pa); });
}

void add_bench_detector(CLI::App& bench) {
  auto da = std::make_shared<DetectorBenchArgs>();
  auto* det = bench.add_subcommand("detector",
                                   "Time the COCO object detector (CenterNet MobileNetV3, sat detect) on oneDNN at "
                                   "batch 1 and 8 (--encoder-precision chooses f32 or bf16; default f32)");
  det->add_option("--size", da->size, "Input side, a multiple of 32")->capture_default_str();
  det->add_option("--batches", da->batches, "Comma-separated batch sizes (one above 4 runs in passes of 4 photos)")
      ->capture_default_str();
  det->add_option("--seconds", da->seconds, "Time spent per batch size (after one warm-up batch)")
      ->capture_default_str();
  det->add_flag("--json", da->json, "One JSON line per batch size");
  det->add_flag("--trunk", da->trunk,
                "Give the trunk's features too (the mean of its stride-32 output, as --objects-as tags+trunk reads)");
  det->callback([da] { bench_detector(*da); });
}

void add_bench_tune(CLI::App& bench) {
  auto ta = std::make_shared<TuneBenchArgs>();
  auto* tune = bench.add_subcommand(
      "tune", "Time fine-tuning the pretrained encoder's top blocks (forward and backward from cached grids)");
  tune->add_option("--encoder", ta->encoder, "Encoder file (default: the bundled InceptionV3)");
  tune->add_option("--from", ta->from, "Cut whose grids are cached (the blocks start after it)")->capture_default_str();
  tune->add_option("--to", ta->to, "Last layer of the blocks")->capture_default_str();
  tune->add_option("--size", ta->size, "Image side")->capture_default_str();
  tune->add_option("--batch", ta->batch, "Images per batch")->capture_default_str();
  tune->add_option("--iters", ta->iters, "Timed iterations (after one warm-up)")->capture_default_str();
  tune->add_flag("--json", ta->json, "One JSON line");
  tune->callback([ta] { bench_tune(*ta); });
}

}  // namespace sat
