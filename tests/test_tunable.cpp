// Fine-tuning the top blocks of an imported network (vision/tunable.cpp): forward against PretrainedEncoder on the
// same graph, gradients against finite differences, and the trained weights written back into the graph.
#include <doctest/doctest.h>

#include <cmath>
#include <cstdio>

#include "tests/gradcheck.hpp"
#include "vision/pretrained.hpp"
#include "vision/tunable.hpp"
#include "train/model.hpp"
#include "train/optimizer.hpp"

using namespace sat;
using test::max_abs_diff;
using test::randoms;

namespace {

NetNode conv(const std::string& name, const std::string& input, int filters, int kh, int kw, int stride, bool same,
             bool relu) {
  NetNode n;
  n.name = name;
  n.op = "conv";
  n.inputs = {input};
  n.kh = kh, n.kw = kw, n.sh = n.sw = stride;
  n.same = same;
  n.filters = filters;
  n.kernel = name + "_conv/kernel";
  n.bn = name + "_bn";
  n.relu = relu;
  return n;
}

NetNode pool(const std::string& name, const std::string& op, const std::string& input, int k, int stride, bool same) {
  NetNode n;
  n.name = name;
  n.op = op;
  n.inputs = {input};
  n.kh = n.kw = k, n.sh = n.sw = stride;
  n.same = same;
  return n;
}

NetNode concat(const std::string& name, std::vector<std::string> inputs) {
  NetNode n;
  n.name = name;
  n.op = "concat";
  n.inputs = std::move(inputs);
  return n;
}

// An Inception-like stack: c0 (the cached cut) -> [1x1 -> (3x1, 1x3)], [avg pool -> 1x1] -> concat m1 ->
// [3x3 stride-2 'valid' conv without ReLU, 3x3 stride-2 max pool] -> concat m2. b1 feeds two layers, so its
// gradient is the sum of two; every batch norm is random, so folding matters.
struct Stack {
  NetGraph graph;
  TensorFile weights;
  explicit Stack(uint64_t seed) {
    NetNode in;
    in.name = "input_1";
    in.op = "input";
    graph.nodes = {in,
                   conv("c0", "input_1", 16, 1, 1, 1, true, true),
                   conv("b1", "c0", 8, 1, 1, 1, true, true),
                   conv("b2", "b1", 8, 3, 1, 1, true, true),
                   conv("b3", "b1", 8, 1, 3, 1, true, true),
                   pool("p", "avgpool", "c0", 3, 1, true),
                   conv("b4", "p", 8, 1, 1, 1, true, true),
                   concat("m1", {"b2", "b3", "b4"}),
                   conv("b5", "m1", 8, 3, 3, 2, false, false),
                   pool("mp", "maxpool", "m1", 3, 2, false),
                   concat("m2", {"b5", "mp"})};
    Rng rng(seed);
    for (auto& [name, shape] : pretrained_tensor_shapes(graph)) {
      Param p(name, shape, false);
      const bool var = name.find("variance") != std::string::npos, beta = name.find("beta") != std::string::npos;
      // Positive shifts keep most ReLUs on: all-zero max-pool windows would be ties, kinks at the very point
      // finite differences probe.
      for (auto& v : p.value)
        v = var ? (float)rng.uniform(0.5, 1.5) : beta ? (float)rng.uniform(0.5, 1.0) : (float)rng.uniform(-0.5, 0.5);
      weights.tensors.emplace(name, std::move(p));
    }
  }
};

}  // namespace

TEST_CASE("tunable blocks: forward equals the imported network, trained weights write back") {
  Stack st(3);
  const int S = 9, n = 2;
  Rng rng(4);
  std::vector<float> images = randoms((size_t)n * 3 * S * S, rng), cut_grid, whole, tuned;
  PretrainedEncoder bottom(st.graph.cut("c0"), st.weights, S, "t");
  PretrainedEncoder full(st.graph, st.weights, S, "t");
  bottom.forward(images.data(), n, cut_grid);
  full.forward(images.data(), n, whole);

  TunableBlocks blocks(st.graph, st.weights, "c0", S, "t");
  CHECK(blocks.channels_in() == 16);
  CHECK(blocks.channels_out() == 32);
  CHECK(blocks.grid_h() == 4);
  CHECK(blocks.params().size() == 2 * 5);  // b1..b5: weight and bias each
  for (bool training : {false, true}) {
    blocks.forward(cut_grid.data(), n, training, tuned);
    CHECK(max_abs_diff(tuned, whole) < 1e-4);
  }
  if (cpu_has_native_bf16()) {
    // inference in bf16: within bf16's rounding (2^-9 relative per input, sums in float32) of float32, and not equal
    std::vector<float> tuned_bf16;
    blocks.forward(cut_grid.data(), n, false, tuned_bf16, true);
    float largest = 0;
    for (float v : whole) largest = std::max(largest, std::abs(v));
    CHECK(max_abs_diff(tuned_bf16, whole) < 2e-2f * largest);
    CHECK(max_abs_diff(tuned_bf16, whole) > 0.f);
    CHECK_THROWS_WITH_AS(blocks.forward(cut_grid.data(), n, true, tuned_bf16, true),
                         doctest::Contains("training runs in float32"), Error);
  }

  // Change the weights as training would: the blocks compute something else.
  for (auto& p : blocks.params())
    for (auto& v : p.value) v += 0.1f * (float)rng.normal();
  blocks.forward(cut_grid.data(), n, false, tuned);
  CHECK(max_abs_diff(tuned, whole) > 1e-2);

  CHECK_THROWS_WITH_AS(TunableBlocks(st.graph, st.weights, "b1", S, "model.sat"),
                       doctest::Contains("model.sat: layer 'p' after 'b1' reads 'c0' from before it"), Error);
  CHECK_THROWS_WITH_AS(TunableBlocks(st.graph, st.weights, "nope", S, "model.sat"),
                       doctest::Contains("no layer 'nope'"), Error);
}

TEST_CASE("tunable blocks: weight and bias gradients match finite differences") {
  Stack st(7);
  const int S = 9, n = 2;
  Rng rng(8);
  std::vector<float> images = randoms((size_t)n * 3 * S * S, rng), cut_grid, out;
  PretrainedEncoder(st.graph.cut("c0"), st.weights, S, "t").forward(images.data(), n, cut_grid);
  TunableBlocks blocks(st.graph, st.weights, "c0", S, "t");
  const std::vector<float> R = randoms((size_t)n * 4 * 4 * 32, rng);  // loss = sum(out * R)
  auto loss = [&] {
    blocks.forward(cut_grid.data(), n, true, out);
    double s = 0;
    for (size_t i = 0; i < out.size(); ++i) s += (double)out[i] * R[i];
    return s;
  };
  loss();
  for (auto& p : blocks.params()) p.zero_grad();
  blocks.backward(R.data());
  for (auto& p : blocks.params()) {
    CAPTURE(p.name);
    FloatBuffer analytic = p.grad;
    double gmax = 0;
    for (float g : analytic) gmax = std::max(gmax, (double)std::fabs(g));
    CHECK(gmax > 0);
    // ReLU and max-pool kinks: a small step; entries whose quotient changes with the step are skipped.
    auto r = test::check_gradient(p.value, analytic, loss, 24, 1e-3, 0.02 * gmax + 1e-4, 0.05);
    if (getenv("SAT_GRADCHECK_VERBOSE"))
      MESSAGE(p.name << " worst " << r.worst << " within " << r.fraction_within(3e-2) << " skipped " << r.skipped);
    // Max-pool switches near the probed point leave a few entries off by up to ~0.1; a wrong backward (a lost
    // gradient path, a wrong slice) is off on most entries (checked by breaking the accumulation).
    CHECK(r.fraction_within(3e-2) >= 0.85);
    CHECK(r.worst < 0.2);
    CHECK(r.skipped * 2 < r.checked + r.skipped);
  }
  // A second backward adds to the gradients (the trainer zeroes them per step).
  for (auto& p : blocks.params()) p.zero_grad();
  loss();
  blocks.backward(R.data());
  FloatBuffer once = blocks.params()[0].grad;
  loss();
  blocks.backward(R.data());
  CHECK(std::fabs(blocks.params()[0].grad[3] - 2 * once[3]) <= 1e-5 * (1 + std::fabs(once[3])));
}

TEST_CASE("a caption model with tuned encoder blocks: saved, loaded, and run from images or from its frozen part") {
  Stack st(11);
  const int S = 9;
  const float mean[3] = {0.f, 0.f, 0.f}, stdev[3] = {1.f, 1.f, 1.f};
  CaptionModel m;
  m.encoder_config = EncoderConfig::make_pretrained(st.graph, "m2", S, mean, stdev);
  m.encoder_config.tune_from = "c0";
  m.encoder_weights = std::make_shared<const TensorFile>(st.weights);
  m.vocab = Vocab::build({{"a", "dog"}, {"a", "cat"}}, 1);
  m.decoder_config.embed_dim = m.decoder_config.hidden_dim = m.decoder_config.attn_dim = 8;
  m.build();
  Rng rng(12);
  m.init(rng);
  REQUIRE(m.tuned);
  size_t tuned_params = 0;
  for (auto* p : m.params()) tuned_params += p->name.rfind("encoder.", 0) == 0;
  CHECK(tuned_params == 10);
  for (auto& p : m.tuned->params())
    for (auto& v : p.value) v += 0.1f * (float)rng.normal();  // as training changes them: photos see it at once

  // The id caches are checked against is the frozen part's: the same as a model cut at c0.
  CaptionModel bottom;
  bottom.encoder_config = EncoderConfig::make_pretrained(st.graph, "c0", S, mean, stdev);
  bottom.encoder_weights =
      std::make_shared<const TensorFile>(select_tensors(bottom.encoder_config.graph, st.weights, "t"));
  bottom.build_encoder();
  CHECK(m.encoder_id() == bottom.encoder_id());

  std::vector<float> planes = randoms((size_t)2 * 3 * S * S, rng), cut_grid;
  bottom.pretrained->forward(planes.data(), 2, cut_grid);
  Mat from_images = m.encode(planes, 2), from_cache = m.features_from_cache(cut_grid.data(), 2);
  CHECK((from_images - from_cache).cwiseAbs().maxCoeff() == 0.f);  // one path: the same arithmetic
  if (cpu_computes_bf16()) {
    // In bf16 too: the frozen part in bf16 either way, then the same tuned blocks (in bf16) on its output. (Before,
    // photos ran the tuned blocks in bf16 inside one network, a cache's grids in float32, and captions could differ.)
    m.encoder_precision_override = bottom.encoder_precision_override = PrecisionChoice::bf16;
    m.build_photo_encoder();
    bottom.build_photo_encoder();
    std::vector<float> cut_bf16;
    bottom.pretrained->forward(planes.data(), 2, cut_bf16);
    CHECK(max_abs_diff(cut_bf16, cut_grid) > 0.f);  // it did run in bf16
    const Mat bf16_images = m.encode(planes, 2);
    CHECK((bf16_images - m.features_from_cache(cut_bf16.data(), 2)).cwiseAbs().maxCoeff() == 0.f);
    CHECK((bf16_images - from_images).cwiseAbs().maxCoeff() > 0.f);
    CHECK(m.tuned_inference_in_bf16());
    std::vector<float> tuned_f32;  // the tuned blocks did run in bf16: float32 ones on the same input differ
    m.tuned_forward(cut_bf16.data(), 2, false, tuned_f32);
    CHECK((bf16_images - Eigen::Map<const Mat>(tuned_f32.data(), bf16_images.rows(), bf16_images.cols()))
              .cwiseAbs()
              .maxCoeff() > 0.f);
    m.encoder_precision_override = bottom.encoder_precision_override = PrecisionChoice::f32;
    m.build_photo_encoder();
  }

  const std::string path = "/tmp/sat_test_tuned_model.sat";
  m.save(path);
  auto loaded = CaptionModel::load(path);
  REQUIRE(loaded->tuned);
  CHECK(loaded->encoder_config.tune_from == "c0");
  CHECK(loaded->encoder_id() == m.encoder_id());
  CHECK((loaded->encode(planes, 2) - from_images).cwiseAbs().maxCoeff() < 1e-5);
  std::remove(path.c_str());
}

TEST_CASE("Adam with per-parameter learning-rate scales (tuned encoder blocks step at their own rate)") {
  Param a("a", {3}), b("b", {3}), c("c", {3});
  std::vector<Param*> params = {&a, &b, &c};
  Adam adam;
  adam.attach(params);
  for (auto* p : params) p->zero_grad(), std::fill(p->grad.begin(), p->grad.end(), 1.f);
  const std::vector<float> scale = {1.f, 0.2f, 0.f};
  adam.update(params, 0.1f, &scale);
  // The first Adam step moves every entry by lr * scale (m / sqrt(v) = 1 after bias correction).
  CHECK(a.value[0] == doctest::Approx(-0.1).epsilon(1e-4));
  CHECK(b.value[1] == doctest::Approx(-0.02).epsilon(1e-4));
  CHECK(c.value[2] == 0.f);
  const std::vector<float> wrong = {1.f};
  CHECK_THROWS_AS(adam.update(params, 0.1f, &wrong), Error);
}

TEST_CASE("a tuned encoder with object channels: the cached ones max-pooled on to the tuned grid (negative ones too), no gradient") {
  // c0 (the cached cut, 8 x 8) -> b1 (3x3 stride 2: 4 x 4), so each tuned location covers 2 x 2 cached ones
  NetGraph graph;
  NetNode in;
  in.name = "input_1", in.op = "input";
  graph.nodes = {in, conv("c0", "input_1", 6, 1, 1, 1, true, true), conv("b1", "c0", 5, 3, 3, 2, true, true)};
  TensorFile weights;
  Rng rng(21);
  for (auto& [name, shape] : pretrained_tensor_shapes(graph)) {
    Param p(name, shape, false);
    const bool var = name.find("variance") != std::string::npos;
    for (auto& v : p.value) v = var ? (float)rng.uniform(0.5, 1.5) : (float)rng.uniform(-0.5, 0.5);
    weights.tensors.emplace(name, std::move(p));
  }
  const int S = 8, n = 2, K = 3, raw_l = 64, raw_c = 6, L = 16, C = 5;
  const float mean[3] = {0.f, 0.f, 0.f}, stdev[3] = {1.f, 1.f, 1.f};
  CaptionModel m;
  m.encoder_config = EncoderConfig::make_pretrained(graph, "b1", S, mean, stdev);
  m.encoder_config.tune_from = "c0";
  const std::string plain_id_config = m.encoder_config.cache_config().to_json().dump();
  m.encoder_config.object_channels = K, m.encoder_config.object_scale = 2.f, m.encoder_config.object_form = "maps";
  m.encoder_weights = std::make_shared<const TensorFile>(weights);
  m.vocab = Vocab::build({{"a", "dog"}}, 1);
  m.decoder_config.embed_dim = m.decoder_config.hidden_dim = m.decoder_config.attn_dim = 8;
  m.build(false);  // the tuned blocks only: the frozen network with the detector is what photos go through
  REQUIRE(m.tuned);
  CHECK(m.encoder_config.feature_dim() == C + K);
  CHECK(m.decoder_config.feature_dim == C + K);
  // the cache it reads: the frozen part's raw output with the object channels beside it, on a config of its own
  const EncoderConfig cached = m.encoder_config.cache_config();
  CHECK(cached.locations() == raw_l);
  CHECK(cached.feature_dim() == raw_c + K);
  CHECK(cached.to_json().dump() != plain_id_config);

  std::vector<float> records = randoms((size_t)n * raw_l * (raw_c + K), rng), raw((size_t)n * raw_l * raw_c), grid,
                     tuned_only;
  for (int r = 0; r < n * raw_l; ++r) {
    std::copy(records.begin() + r * (raw_c + K), records.begin() + r * (raw_c + K) + raw_c, raw.begin() + r * raw_c);
    // the first channels like the heat (not negative), the last like one of the detector's trunk (any sign)
    for (int k = 0; k + 1 < K; ++k) records[(size_t)r * (raw_c + K) + raw_c + k] *= records[(size_t)r * (raw_c + K) + raw_c + k];
  }
  m.tuned_forward(records.data(), n, true, grid);
  REQUIRE(grid.size() == (size_t)n * L * (C + K));
  TunableBlocks alone(graph, weights, "c0", S, "t");
  alone.forward(raw.data(), n, true, tuned_only);
  float worst_grid = 0, worst_pool = 0;
  for (int b = 0; b < n; ++b)
    for (int y = 0; y < 4; ++y)
      for (int x = 0; x < 4; ++x) {
        const float* row = grid.data() + ((size_t)b * L + y * 4 + x) * (C + K);
        for (int c = 0; c < C; ++c)
          worst_grid = std::max(worst_grid, std::fabs(row[c] - tuned_only[((size_t)b * L + y * 4 + x) * C + c]));
        for (int k = 0; k < K; ++k) {
          float peak = -1e9f;
          for (int dy = 0; dy < 2; ++dy)
            for (int dx = 0; dx < 2; ++dx)
              peak = std::max(peak, records[((size_t)b * raw_l + (2 * y + dy) * 8 + 2 * x + dx) * (raw_c + K) + raw_c + k]);
          worst_pool = std::max(worst_pool, std::fabs(row[C + k] - peak));
        }
      }
  CHECK(worst_grid < 1e-5);
  CHECK(worst_pool == 0.f);
  CHECK(m.features_from_cache(records.data(), n).cols() == C + K);

  // The object channels standardized (sat train's, for the trunk's): after the pooling, in training and from a cache
  // alike; the tuned blocks' channels as they were.
  std::vector<float> plain, standardized;
  m.tuned_forward(records.data(), n, false, plain);
  ObjectStandardization st;
  for (int k = 0; k < K; ++k) st.center.push_back(k ? 0.3f * k : 0.f), st.gain.push_back(k ? 0.5f + k : 1.f);
  m.object_standardization = st;
  m.tuned_forward(records.data(), n, false, standardized);
  REQUIRE(standardized.size() == plain.size());
  // rows of `first` grid channels then K object channels: the grid's as they were, the largest object channel error
  auto standardization_error = [&](const std::vector<float>& got, const std::vector<float>& before, size_t rows,
                                   int first) {
    float worst = 0;
    for (size_t r = 0; r < rows; ++r) {
      const float *g = got.data() + r * (first + K), *b = before.data() + r * (first + K);
      for (int c = 0; c < first; ++c) CHECK(g[c] == b[c]);
      for (int k = 0; k < K; ++k)
        worst = std::max(worst, std::fabs(g[first + k] - (b[first + k] - st.center[k]) * st.gain[k]));
    }
    return worst;
  };
  const float worst_standardized = standardization_error(standardized, plain, (size_t)n * L, C);
  CHECK(worst_standardized < 1e-5f);
  const Mat standardized_from_cache = m.features_from_cache(records.data(), n);
  CHECK((standardized_from_cache -
         Eigen::Map<const Mat>(standardized.data(), standardized_from_cache.rows(), standardized_from_cache.cols()))
            .cwiseAbs()
            .maxCoeff() == 0.f);
  m.object_standardization = {};
  // A frozen encoder's records (no tuned blocks): the same standardization, the grid's channels untouched.
  CaptionModel frozen;
  frozen.encoder_config = EncoderConfig::make_pretrained(graph, "c0", S, mean, stdev);
  frozen.encoder_config.object_channels = K, frozen.encoder_config.object_scale = 2.f;
  frozen.object_standardization = st;
  std::vector<float> frozen_grid;
  frozen.records_to_features(records.data(), n, frozen_grid);
  REQUIRE(frozen_grid.size() == records.size());
  const float worst_frozen = standardization_error(frozen_grid, records, (size_t)n * raw_l, raw_c);
  CHECK(worst_frozen < 1e-6f);
  CHECK((frozen.features_from_cache(records.data(), n) -
         Eigen::Map<const Mat>(frozen_grid.data(), (int64_t)n * raw_l, raw_c + K))
            .cwiseAbs()
            .maxCoeff() == 0.f);

  // backward: the tuned blocks get the gradient of their own channels; the object channels' is dropped
  const std::vector<float> dgrid = randoms(grid.size(), rng);
  std::vector<float> dtuned((size_t)n * L * C);
  for (int r = 0; r < n * L; ++r)
    std::copy(dgrid.begin() + r * (C + K), dgrid.begin() + r * (C + K) + C, dtuned.begin() + r * C);
  for (auto& p : m.tuned->params()) p.zero_grad();
  for (auto& p : alone.params()) p.zero_grad();
  m.tuned_forward(records.data(), n, true, grid);
  m.tuned_backward(dgrid.data());
  alone.backward(dtuned.data());
  REQUIRE(m.tuned->params().size() == alone.params().size());
  for (size_t k = 0; k < alone.params().size(); ++k) {
    CAPTURE(alone.params()[k].name);
    const FloatBuffer& a = m.tuned->params()[k].grad;
    const FloatBuffer& e = alone.params()[k].grad;
    float worst = 0, largest = 0;
    for (size_t i = 0; i < e.size(); ++i) worst = std::max(worst, std::fabs(a[i] - e[i])), largest = std::max(largest, std::fabs(e[i]));
    CHECK(largest > 0);
    CHECK(worst <= 1e-5f * (1 + largest));
  }

  // a raw grid that does not pool evenly on to the tuned one is refused when the encoder is built whole
  CaptionModel uneven;
  uneven.encoder_config = EncoderConfig::make_pretrained(graph, "b1", 9, mean, stdev);  // 9 x 9 -> 5 x 5
  uneven.encoder_config.tune_from = "c0";
  uneven.encoder_config.object_channels = 80;
  uneven.encoder_weights = std::make_shared<const TensorFile>(weights);
  uneven.vocab = m.vocab;
  uneven.decoder_config = m.decoder_config;
  CHECK_THROWS_WITH_AS(uneven.build(), doctest::Contains("object maps on the 9x9 grid of c0 do not pool onto the tuned layers' 5x5 grid"), Error);
}
