// ResNet v2 (vision/resnet.cpp) on oneDNN: the real network against PyTorch's computation of the same file
// (tools/resnet-reference.py), a small random ResNet through both executors (the inference one fuses residual sums
// and reuses buffers; the trainable one does neither) with finite-difference gradients, and external weights found
// by name and sha256.
#include <doctest/doctest.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>

#include "datasets/sha256.hpp"
#include "tests/gradcheck.hpp"
#include "tests/reference_pixels.hpp"
#include "train/model.hpp"
#include "vision/image.hpp"
#include "vision/pretrained.hpp"
#include "vision/resnet.hpp"
#include "vision/tunable.hpp"

using namespace sat;
using test::max_abs_diff;
using test::randoms;

namespace {

const std::string kWeightsDir = std::string(SAT_SHARED_DATA) + "/../models/resnet_v2_101";
const std::string kWeights = kWeightsDir + "/resnet_v2_101.safetensors";
const std::string kSha256 = "27d907a7fc3af0eb5c8c68a66cc619f8179025938b7aeb72a67fa7f75b8b553c";

// A ResNet v2 in miniature, named as TF-slim names it: conv1 (3 -> 8), block1 with two units (the first projects
// 8 -> 16, the second strides by 2 and subsamples its identity shortcut), block2 with one projecting, striding unit
// (-> 24), and block3/unit_1's pre-activation normalizing block2's output. Random weights.
TensorFile tiny_resnet(uint64_t seed) {
  TensorFile tf;
  Rng rng(seed);
  auto add = [&](const std::string& name, std::vector<int64_t> shape, double lo, double hi) {
    Param p(name, shape, false);
    for (auto& v : p.value) v = (float)rng.uniform(lo, hi);
    tf.tensors.emplace(name, std::move(p));
  };
  auto conv = [&](const std::string& scope, int out, int k, int in) {
    const double r = 1.0 / std::sqrt((double)k * k * in);
    add(scope + "/weights", {out, k, k, in}, -r, r);
    add(scope + "/biases", {out}, 0.0, 0.2);  // positive: most ReLUs on, away from the kinks differences probe
  };
  auto unit = [&](const std::string& scope, int in, int depth, int out, bool projection) {
    add(scope + "/preact/scale", {in}, 0.5, 1.5);
    add(scope + "/preact/offset", {in}, 0.1, 0.5);
    if (projection) conv(scope + "/shortcut", out, 1, in);
    conv(scope + "/conv1", depth, 1, in);
    conv(scope + "/conv2", depth, 3, depth);
    conv(scope + "/conv3", out, 1, depth);
  };
  conv("conv1", 8, 7, 3);
  unit("block1/unit_1/bottleneck_v2", 8, 8, 16, true);
  unit("block1/unit_2/bottleneck_v2", 16, 8, 16, false);
  unit("block2/unit_1/bottleneck_v2", 16, 8, 24, true);
  add("block3/unit_1/bottleneck_v2/preact/scale", {24}, 0.5, 1.5);
  add("block3/unit_1/bottleneck_v2/preact/offset", {24}, 0.1, 0.5);
  return tf;
}

// The shared weights are data beside the checkout, like the Flickr8k photos: absent, their tests say so and skip.
bool have_weights() {
  if (file_exists(kWeights)) return true;
  MESSAGE("skipped: " << kWeights << " not present (the shared ResNet-101 v2 weights)");
  return false;
}

// The PyTorch reference's grids of examples/dog_and_man.jpg (tools/resnet-reference.py fixture), and that photo as
// the network's 224x224 input planes.
TensorFile load_fixture() {
  return load_safetensors(std::string(SAT_SOURCE_DIR) + "/tests/fixtures/dog_and_man_grids_pytorch.safetensors");
}
std::vector<float> fixture_photo(const PretrainedNet& net) {
  std::vector<float> planes(3 * 224 * 224);
  // decoded as the reference decoded it (tests/reference_pixels.hpp)
  image_to_planes(test::load_reference_pixels(std::string(SAT_SOURCE_DIR) + "/examples/dog_and_man.jpg"), 224, net.mean,
                  net.stdev, planes.data());
  return planes;
}

// A 7x7x1024 grid of the fixture's photo at block3 (224x224) against PyTorch's: relative RMS error over the
// fixture's sampled channels (every 4th) and over the mean-pooled features, the worst single difference, and the
// largest sampled activation.
struct FixtureError {
  double rel_rms = 0, pooled_rel_rms = 0, worst = 0, largest = 0;
};
FixtureError fixture_error(const float* grid, const TensorFile& fixture, const std::string& cut) {
  const int side = 7, D = 1024;
  const Param& pooled = fixture.get("grid.pooled." + cut, "fixture");
  const Param& sampled = fixture.get("grid.sampled." + cut, "fixture");
  FixtureError e;
  double err2 = 0, ref2 = 0, perr2 = 0, pref2 = 0;
  for (float v : sampled.value) e.largest = std::max(e.largest, (double)std::fabs(v));
  for (int l = 0; l < side * side; ++l)
    for (int c = 0; c < D / 4; ++c) {
      const double want = sampled.value[(size_t)l * (D / 4) + c], d = grid[(size_t)l * D + 4 * c] - want;
      err2 += d * d, ref2 += want * want;
      e.worst = std::max(e.worst, std::fabs(d));
    }
  for (int c = 0; c < D; ++c) {
    double mean = 0;
    for (int l = 0; l < side * side; ++l) mean += grid[(size_t)l * D + c];
    const double d = mean / (side * side) - pooled.value[c];
    perr2 += d * d, pref2 += (double)pooled.value[c] * pooled.value[c];
  }
  e.rel_rms = std::sqrt(err2 / ref2), e.pooled_rel_rms = std::sqrt(perr2 / pref2);
  return e;
}

}  // namespace

TEST_CASE("ResNet v2 graph: units, cut points, grids normalized by the next unit's pre-activation") {
  TensorFile tf = tiny_resnet(1);
  REQUIRE(is_resnet_v2(tf));
  NetGraph g = resnet_v2_graph(tf, "tiny.safetensors");
  // input, conv1, pool1; per unit preact, conv1-3, sum and a shortcut conv or subsampling; block3/unit_1's preact
  CHECK(g.nodes.size() == 3 + 6 + 6 + 6 + 1);
  CHECK(g.grid_node("block1/unit_1") == "block1/unit_2/bottleneck_v2/preact");
  CHECK(g.grid_node("block1") == "block2/unit_1/bottleneck_v2/preact");
  CHECK(g.grid_node("block2") == "block3/unit_1/bottleneck_v2/preact");
  auto cuts = g.cut_points();
  CHECK(std::find(cuts.begin(), cuts.end(), "block2") != cuts.end());
  CHECK(std::find(cuts.begin(), cuts.end(), "block1/unit_2") != cuts.end());
  CHECK_THROWS_WITH_AS(g.grid_node("block9"), doctest::Contains("no layer 'block9' (cut points: block1, block2"),
                       Error);
  // 32 -> conv1 16 -> pool1 8 -> block1 (strides in its last unit) 4 -> block2 2
  auto shapes = g.cut(g.grid_node("block2")).shapes(32, 32);
  CHECK(shapes.back().h == 2);
  CHECK(shapes.back().c == 24);
  CHECK(g.cut(g.grid_node("block1/unit_1")).shapes(32, 32).back().h == 8);
  // The graph survives its JSON form (model files hold it), a cut keeping the grid link only with its grid node.
  NetGraph back = NetGraph::from_json(g.to_json());
  CHECK(back.to_json() == g.to_json());
  CHECK(g.cut("block1/unit_1").nodes.back().grid.empty());
  // A unit without its convolutions is an error naming the file (only the last block may be a bare pre-activation).
  TensorFile broken = tf;
  broken.tensors.erase("block1/unit_2/bottleneck_v2/conv1/weights");
  CHECK_THROWS_WITH_AS(
      resnet_v2_graph(broken, "tiny.safetensors"),
      doctest::Contains("tiny.safetensors: missing tensor 'block1/unit_2/bottleneck_v2/conv1/weights'"), Error);
}

TEST_CASE("encoder config: object maps add 80 features, survive the JSON form, and only when on change it") {
  const NetGraph g = resnet_v2_graph(tiny_resnet(1), "tiny.safetensors");
  const float mean[3] = {0, 0, 0}, stdev[3] = {1, 1, 1};
  EncoderConfig plain = EncoderConfig::make_pretrained(g, "block2", 32, mean, stdev);
  EncoderConfig with = plain;
  with.object_channels = 80, with.object_scale = 4.f;
  CHECK(with.feature_dim() == plain.feature_dim() + 80);
  CHECK(with.grid_channels() == plain.feature_dim());
  CHECK(!plain.to_json().contains("objects"));  // models and caches without object maps keep their ids
  const EncoderConfig back = EncoderConfig::from_json(with.to_json());
  CHECK(back.object_channels == 80);
  CHECK(back.object_scale == 4.f);
  CHECK(back.to_json() == with.to_json());
  nlohmann::json tuned = with.to_json();  // a fine-tuned encoder's too: its caches hold them beside the frozen part
  tuned["tune_from"] = "block1";
  const EncoderConfig tuned_back = EncoderConfig::from_json(tuned);
  CHECK(tuned_back.object_channels == 80);
  CHECK(tuned_back.cache_config().object_channels == 80);
  CHECK(tuned_back.cache_config().feature_dim() == tuned_back.cache_config().pretrained_channels + 80);
  nlohmann::json odd = with.to_json();
  odd["objects"]["channels"] = 7;
  CHECK_THROWS_AS(EncoderConfig::from_json(odd), Error);
  CHECK(!with.to_json()["objects"].contains("form"));  // the maps form writes none: older files keep their ids
  EncoderConfig both = with;
  both.object_channels = 160, both.object_form = "both";
  const EncoderConfig both_back = EncoderConfig::from_json(both.to_json());
  CHECK(both_back.object_form == "both");
  CHECK(both_back.feature_dim() == plain.feature_dim() + 160);
  CHECK(both_back.to_json() == both.to_json());
  CHECK(both.to_json() != with.to_json());  // a cache of one form never feeds a model of another
  nlohmann::json short_both = both.to_json();
  short_both["objects"]["channels"] = 80;
  CHECK_THROWS_WITH_AS(EncoderConfig::from_json(short_both), doctest::Contains("160 for both"), Error);
  EncoderConfig trunk = with;  // the tags, then the detector's trunk averaged over the photo
  trunk.object_channels = 80 + 480, trunk.object_form = "tags+trunk";
  const EncoderConfig trunk_back = EncoderConfig::from_json(trunk.to_json());
  CHECK(trunk_back.object_form == "tags+trunk");
  CHECK(trunk_back.feature_dim() == plain.feature_dim() + 560);
  CHECK(trunk_back.grid_channels() == plain.feature_dim());
  nlohmann::json tags_only_width = trunk.to_json();
  tags_only_width["objects"]["channels"] = 80;
  CHECK_THROWS_WITH_AS(EncoderConfig::from_json(tags_only_width), doctest::Contains("560 for tags+trunk"), Error);
  nlohmann::json unknown = both.to_json();
  unknown["objects"]["form"] = "boxes";
  CHECK_THROWS_WITH_AS(EncoderConfig::from_json(unknown),
                       doctest::Contains("form 'boxes' is not maps, tags, both or tags+trunk"), Error);
}

TEST_CASE("ResNet v2: the fused inference network equals the trainable blocks, whose gradients match differences") {
  TensorFile tf = tiny_resnet(2);
  NetGraph g = resnet_v2_graph(tf, "tiny");
  const int S = 32;
  Rng rng(3);
  const NetGraph whole = g.cut(g.grid_node("block2"));
  for (int n : {1, 2}) {
    CAPTURE(n);
    std::vector<float> images = randoms((size_t)n * 3 * S * S, rng), pooled, fused, unfused;
    PretrainedEncoder(g.cut("pool1"), tf, S, "t").forward(images.data(), n, pooled);
    PretrainedEncoder(whole, tf, S, "t").forward(images.data(), n, fused);
    TunableBlocks blocks(whole, tf, "pool1", S, "t");
    for (bool training : {false, true}) {
      blocks.forward(pooled.data(), n, training, unfused);
      CHECK(max_abs_diff(fused, unfused) < 1e-4);
    }
  }

  // Gradients of every convolution and pre-activation from pool1 up, loss = sum(grid * R).
  const int n = 2;
  std::vector<float> images = randoms((size_t)n * 3 * S * S, rng), pooled, out;
  PretrainedEncoder(g.cut("pool1"), tf, S, "t").forward(images.data(), n, pooled);
  TunableBlocks blocks(whole, tf, "pool1", S, "t");
  CHECK(blocks.params().size() == 2 * (3 * 3 + 2 + 4));  // convs: 9 + 2 shortcuts; affines: 4
  const std::vector<float> R = randoms((size_t)n * 2 * 2 * 24, rng);
  auto loss = [&] {
    blocks.forward(pooled.data(), n, true, out);
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
    for (float v : analytic) gmax = std::max(gmax, (double)std::fabs(v));
    CHECK(gmax > 0);
    auto r = test::check_gradient(p.value, analytic, loss, 24, 1e-3, 0.02 * gmax + 1e-4, 0.05);
    CHECK(r.fraction_within(3e-2) >= 0.9);
    CHECK(r.worst < 0.2);
  }

  // The weights shared, not copied (what a model builds): the very same grid.
  std::vector<float> copied, shared;
  PretrainedEncoder(whole, tf, S, "t").forward(images.data(), n, copied);
  PretrainedEncoder(whole, std::make_shared<const TensorFile>(tf), S, "t").forward(images.data(), n, shared);
  CHECK(max_abs_diff(copied, shared) == 0);
}

TEST_CASE("int8 weights: the per-channel maximum and the rounding lrintf gives, ties to even, at any length") {
  Rng rng(5);
  for (size_t n : {1, 15, 16, 17, 33, 1152, 4609}) {
    std::vector<float> w(n);
    for (auto& x : w) x = (float)rng.normal() * 0.05f;
    const size_t peak = n / 2;
    w[peak] = -0.4f;  // the largest magnitude, negative, in the middle (after the last full 16 when n is 17 or 33)
    CHECK(max_abs(w.data(), n) == 0.4f);
    const float inv = 127.f / 0.4f;
    std::vector<int8_t> q(n);
    quantize_int8(w.data(), n, inv, q.data());
    for (size_t k = 0; k < n; ++k) REQUIRE((int)q[k] == (int)std::lrintf(w[k] * inv));
    CHECK((int)q[peak] == -127);
  }
  // Ties go to the even integer (lrintf's rounding in the default mode), with the product rounded to float first:
  // a multiply-add fused into the rounding trick once gave other integers at such products.
  const float ties[] = {0.5f, 1.5f, 2.5f, -0.5f, -1.5f, -2.5f, 126.5f, -126.5f, 3.4999998f, 0.49999997f};
  std::vector<int8_t> q(std::size(ties));
  quantize_int8(ties, std::size(ties), 1.f, q.data());
  const int expected[] = {0, 2, 2, 0, -2, -2, 126, -126, 3, 0};
  for (size_t k = 0; k < std::size(ties); ++k) CHECK((int)q[k] == expected[k]);
  std::vector<float> near_tie(64);
  for (size_t k = 0; k < near_tie.size(); ++k) near_tie[k] = (float)(k + 0.5) / 3.0f;  // products near ties
  std::vector<int8_t> q3(near_tie.size());
  quantize_int8(near_tie.data(), near_tie.size(), 3.0f, q3.data());
  for (size_t k = 0; k < near_tie.size(); ++k) CHECK((int)q3[k] == (int)std::lrintf(near_tie[k] * 3.0f));
}

TEST_CASE("int8 ResNet v2: calibrated ranges, the int8 network close to float32, ranges refused when missing or bad") {
  TensorFile tf = tiny_resnet(4);
  NetGraph g = resnet_v2_graph(tf, "tiny");
  const NetGraph whole = g.cut(g.grid_node("block2"));
  // 8-bit: every unit's pre-activation, conv1 and conv2 (ReLUs that convolutions read); not block3/unit_1's
  // pre-activation (the grid) nor conv1 (the residual stream)
  std::vector<std::string> names;
  for (int i : int8_activation_nodes(whole)) names.push_back(whole.nodes[i].name);
  CHECK(names.size() == 9);
  CHECK(std::count(names.begin(), names.end(), "block1/unit_1/bottleneck_v2/preact") == 1);
  CHECK(std::count(names.begin(), names.end(), "block2/unit_1/bottleneck_v2/conv2") == 1);
  CHECK(std::count(names.begin(), names.end(), "block3/unit_1/bottleneck_v2/preact") == 0);
  const int S = 32;
  Rng rng(5);
  std::vector<float> images = randoms((size_t)3 * 3 * S * S, rng);
  std::map<std::string, std::vector<float>> samples;
  PretrainedEncoder f32(whole, tf, S, "tiny", Precision::f32);
  f32.sample_activations(images.data(), 3, samples, 1 << 16);
  CHECK(samples.size() == 9);
  const Int8Ranges ranges = choose_int8_ranges(samples);
  for (auto& [node, values] : samples) {
    const std::string name = node;  // (clang: a lambda, CAPTURE's, cannot take a structured binding)
    CAPTURE(name);
    const float top = *std::max_element(values.begin(), values.end());
    CHECK(ranges.at(name) > 0.f);
    CHECK(ranges.at(name) <= top * 1.0001f);
    CHECK(ranges.at(name) >= top * 0.03f);
  }
  std::vector<float> want, got;
  f32.forward(images.data(), 3, want);
  PretrainedEncoder int8(whole, tf, S, "tiny", Precision::int8, ranges);
  int8.forward(images.data(), 3, got);
  REQUIRE(got.size() == want.size());
  double err2 = 0, ref2 = 0;
  for (size_t k = 0; k < want.size(); ++k) err2 += (got[k] - want[k]) * (got[k] - want[k]), ref2 += want[k] * want[k];
  MESSAGE("tiny ResNet v2 in int8: relative RMS error " << std::sqrt(err2 / ref2));
  CHECK(std::sqrt(err2 / ref2) < 0.03);  // measured in the MESSAGE; a wrong scale or bias gives errors of order 1
  // int8 passes of about 4 x 224^2 pixels: at 320 one image per pass, each image's grid where it belongs (the same
  // as encoding it alone, bit for bit: the same one-image network); float32 takes any batch in one pass
  CHECK(int8.images_per_pass(3) == 3);
  CHECK(f32.images_per_pass(16) == 16);
  {
    const int S2 = 320;
    std::vector<float> large = randoms((size_t)3 * 3 * S2 * S2, rng);
    PretrainedEncoder int8_large(whole, tf, S2, "tiny", Precision::int8, ranges);
    CHECK(int8_large.images_per_pass(3) == 1);
    CHECK(PretrainedEncoder(whole, tf, 224, "tiny", Precision::int8, ranges).images_per_pass(8) == 4);
    std::vector<float> together, alone;
    int8_large.forward(large.data(), 3, together);
    REQUIRE(together.size() % 3 == 0);
    const size_t per_image = together.size() / 3;
    for (int i = 0; i < 3; ++i) {
      CAPTURE(i);
      int8_large.forward(large.data() + (size_t)i * 3 * S2 * S2, 1, alone);
      REQUIRE(alone.size() == per_image);
      CHECK(std::equal(alone.begin(), alone.end(), together.begin() + i * per_image));
    }
  }
  // the ranges survive their JSON form (model files hold them); bad values and missing nodes are refused
  CHECK(int8_ranges_from_json(int8_ranges_to_json(ranges)) == ranges);
  CHECK_THROWS_WITH_AS(int8_ranges_from_json(nlohmann::json{{"a", -1.0}}),
                       doctest::Contains("'a' is not finite and positive"), Error);
  CHECK_THROWS_WITH_AS(int8_ranges_from_json(nlohmann::json{{"a", "x"}}), doctest::Contains("'a' is not a number"),
                       Error);
  CHECK_THROWS_AS(int8_ranges_from_json(nlohmann::json::array()), Error);
  Int8Ranges partial = ranges;
  partial.erase("block1/unit_2/bottleneck_v2/conv1");
  CHECK_THROWS_WITH_AS(
      PretrainedEncoder(whole, tf, S, "m.sat", Precision::int8, partial),
      doctest::Contains("m.sat: int8 needs the activation range of 'block1/unit_2/bottleneck_v2/conv1'"), Error);
  CHECK_THROWS_WITH_AS(int8.sample_activations(images.data(), 1, samples, 10),
                       doctest::Contains("float32 encoder only"), Error);
  // MSE-optimal clipping. 100 000 values evenly over [0, 1] and one at 1.2: clipping that one to 1 costs 0.04, less
  // than the rounding error a range of 1.2 adds over the rest (100 000 (1.2^2 - 1) / 255^2 / 12 = 0.056), so the
  // range is about 1; without the outlier, the maximum is kept.
  std::vector<float> spread(100000), outlier;
  for (size_t k = 0; k < spread.size(); ++k) spread[k] = (float)k / (spread.size() - 1);
  outlier = spread;
  outlier.push_back(1.2f);
  const Int8Ranges chosen =
      choose_int8_ranges({{"spread", spread}, {"outlier", outlier}, {"zeros", std::vector<float>(5, 0.f)}});
  CHECK(chosen.at("spread") == 1.f);
  CHECK(chosen.at("outlier") > 0.97f);
  CHECK(chosen.at("outlier") < 1.1f);
  CHECK(chosen.at("zeros") == 1.f);
}

TEST_CASE("ResNet-101 v2 on oneDNN matches the PyTorch reference on a photo at block3 and block3/unit_22") {
  // tests/fixtures/dog_and_man_grids_pytorch.safetensors: tools/resnet-reference.py fixture on examples/dog_and_man.jpg
  // at 224 (float32 PyTorch 1.13 on the same file's weights). Tolerance: 1e-5 of the largest activation. Both
  // compute in float32 from the same float16 kernels and the same OpenCV-decoded pixels; what differs is the order
  // of summation over 104 convolutions (oneDNN's kernels against PyTorch's), which here leaves ~1e-6 of the largest
  // activation (measured: 5.5e-6 of 6.0 at block3); the margin covers other CPUs' kernels.
  if (!have_weights()) return;
  PretrainedNet net = load_pretrained_net(kWeights);
  CHECK(net.external_file == "resnet_v2_101.safetensors");
  CHECK(net.external_sha256 == kSha256);
  CHECK(net.graph.conv_macs(224, 224) / 1e9 == doctest::Approx(6.46).epsilon(0.002));
  CHECK(net.graph.cut(net.graph.grid_node("block3")).conv_macs(299, 299) / 1e9 ==
        doctest::Approx(11.88).epsilon(0.002));
  CHECK(net.graph.cut(net.graph.grid_node("block3")).conv_macs(448, 448) / 1e9 ==
        doctest::Approx(25.84).epsilon(0.002));

  const TensorFile fixture = load_fixture();
  const std::vector<float> planes = fixture_photo(net);
  for (const std::string cut : {"block3", "block3/unit_22"}) {
    PretrainedEncoder enc(net.graph.cut(net.graph.grid_node(cut)), net.weights, 224, kWeights);
    const int side = cut == "block3" ? 7 : 14, step = side / 7, D = 1024;
    CHECK(enc.grid_h() == side);
    CHECK(enc.channels() == D);
    const Param& pooled = fixture.get("grid.pooled." + cut, "fixture");
    const Param& sampled = fixture.get("grid.sampled." + cut, "fixture");
    for (int n : {1, 2}) {  // batch 2: the same photo twice
      std::vector<float> images, grid;
      for (int k = 0; k < n; ++k) images.insert(images.end(), planes.begin(), planes.end());
      enc.forward(images.data(), n, grid);
      double largest = 0, worst = 0, worst_pooled = 0;
      for (float v : sampled.value) largest = std::max(largest, (double)std::fabs(v));
      for (int k = 0; k < n; ++k) {
        const float* g = grid.data() + (size_t)k * side * side * D;
        for (int y = 0; y < 7; ++y)
          for (int x = 0; x < 7; ++x)
            for (int c = 0; c < D / 4; ++c)
              worst = std::max(worst, (double)std::fabs(g[((size_t)(y * step) * side + x * step) * D + 4 * c] -
                                                        sampled.value[((size_t)y * 7 + x) * (D / 4) + c]));
        for (int c = 0; c < D; ++c) {
          double mean = 0;
          for (int l = 0; l < side * side; ++l) mean += g[(size_t)l * D + c];
          worst_pooled = std::max(worst_pooled, std::fabs(mean / (side * side) - pooled.value[c]));
        }
      }
      MESSAGE(cut << " batch " << n << ": max |sat - PyTorch| " << worst << " (largest activation " << largest
                  << "), pooled " << worst_pooled);
      CHECK(worst < 1e-5 * largest);
      CHECK(worst_pooled < 1e-6 * largest);
    }
  }
}

TEST_CASE("ResNet-101 v2 in bfloat16 stays close to the float32 PyTorch reference at block3") {
  // The same fixture as above, the encoder in bf16 (vision/onednn.hpp: activations and weights rounded to 8
  // significant bits, float32 sums). Each of ~100 layers adds a rounding of up to 2^-9 of its values; the errors
  // grow through the residual stream, so the tolerance is on the whole grid's relative RMS error and on the pooled
  // features (what the decoder's init MLP sees), with the worst single activation looser still (measured figures in
  // the MESSAGE; tolerances about 2x them).
  if (!have_weights()) return;
  if (!cpu_has_native_bf16()) {
    MESSAGE("skipped: this CPU has no native bfloat16");
    return;
  }
  PretrainedNet net = load_pretrained_net(kWeights);
  const TensorFile fixture = load_fixture();
  const std::vector<float> planes = fixture_photo(net);
  const std::string cut = "block3";
  PretrainedEncoder enc(net.graph.cut(net.graph.grid_node(cut)), net.weights, 224, kWeights, Precision::bf16);
  std::vector<float> grid;
  enc.forward(planes.data(), 1, grid);
  REQUIRE(grid.size() == (size_t)7 * 7 * 1024);
  const FixtureError e = fixture_error(grid.data(), fixture, cut);
  const double rel_rms = e.rel_rms, pooled_rel_rms = e.pooled_rel_rms, worst = e.worst, largest = e.largest;
  MESSAGE("bf16 " << cut << ": relative RMS error " << rel_rms << ", pooled " << pooled_rel_rms << ", worst " << worst
                  << " of largest " << largest);
  CHECK(rel_rms < 0.05);          // measured 0.026 (Zen 4, AVX512-BF16)
  CHECK(pooled_rel_rms < 0.02);   // measured 0.0093
  CHECK(worst < 0.05 * largest);  // measured 0.021
}

TEST_CASE("ResNet-101 v2 in int8 stays close to the float32 PyTorch reference at block3") {
  // The fixture's photo at 224, the encoder in int8 (vision/onednn.hpp): 8-bit activations after every ReLU that
  // convolutions read, 8-bit weights with one scale per output channel, 32-bit integer sums; the residual stream
  // and the grid stay float32. The activation ranges are calibrated on the same photo in float32 (what sat model
  // calibrate does on training photos). Each 8-bit tensor carries a rounding error of up to half a step of 1/255
  // of its range, so the grid's errors are several times bf16's (measured figures in the MESSAGE; tolerances
  // about 2x them). A wrong scale anywhere (the bias's, a channel's) gives errors of order 1.
  if (!have_weights()) return;
  PretrainedNet net = load_pretrained_net(kWeights);
  const TensorFile fixture = load_fixture();
  const std::vector<float> planes = fixture_photo(net);
  const std::string cut = "block3";
  const NetGraph graph = net.graph.cut(net.graph.grid_node(cut));
  std::map<std::string, std::vector<float>> samples;
  {
    PretrainedEncoder f32(graph, net.weights, 224, kWeights, Precision::f32);
    f32.sample_activations(planes.data(), 1, samples, 1 << 18);
  }
  const Int8Ranges ranges = choose_int8_ranges(samples);
  CHECK(ranges.size() == int8_activation_nodes(graph).size());
  CHECK(ranges.size() == 90);  // three per unit of blocks 1-3: its pre-activation, conv1, conv2
  CHECK_THROWS_WITH_AS(PretrainedEncoder(graph, net.weights, 224, "w.safetensors", Precision::int8),
                       doctest::Contains("w.safetensors: int8 needs the activation range of"), Error);
  PretrainedEncoder enc(graph, net.weights, 224, kWeights, Precision::int8, ranges);
  CHECK(enc.precision() == Precision::int8);
  for (int n : {1, 2}) {
    std::vector<float> batch;
    for (int k = 0; k < n; ++k) batch.insert(batch.end(), planes.begin(), planes.end());
    std::vector<float> grid;
    enc.forward(batch.data(), n, grid);
    REQUIRE(grid.size() == (size_t)n * 7 * 7 * 1024);
    const FixtureError e = fixture_error(grid.data() + (size_t)(n - 1) * 7 * 7 * 1024, fixture, cut);
    const double rel_rms = e.rel_rms, pooled_rel_rms = e.pooled_rel_rms, worst = e.worst, largest = e.largest;
    MESSAGE("int8 " << cut << " batch " << n << ": relative RMS error " << rel_rms << ", pooled " << pooled_rel_rms
                    << ", worst " << worst << " of largest " << largest);
    CHECK(rel_rms < 0.10);
    CHECK(pooled_rel_rms < 0.04);
    CHECK(worst < 0.15 * largest);
  }
}

TEST_CASE("float16 weights left in the mapped file: the same values and the same network as converted ones") {
  // A small ResNet stored with float16 kernels (as ../shared's ResNet-101 is), read both ways.
  TensorFile stored = tiny_resnet(7);
  for (auto& [name, p] : stored.tensors)
    if (p.shape.size() == 4) {
      stored.half.insert(name);
      for (auto& v : p.value) v = half_to_float(float_to_half(v));  // exactly representable
    }
  const std::string path = "/tmp/sat_test_mapped_half.safetensors";
  save_safetensors(path, stored);
  const TensorFile converted = load_safetensors(path);
  TensorFile mapped = decode_mapped_safetensors(std::make_shared<const MappedFile>(path));
  REQUIRE(mapped.mapped_half.size() == stored.half.size());
  for (auto& [name, h] : mapped.mapped_half) {
    CHECK(mapped.tensors.count(name) == 0);
    REQUIRE(mapped.shape_of(name) != nullptr);
    CHECK(*mapped.shape_of(name) == converted.get(name, "t").shape);
    const FloatBuffer values = h.to_floats();
    CHECK(std::equal(values.begin(), values.end(), converted.get(name, "t").value.begin()));
  }
  CHECK(mapped.tensors.count("conv1/biases") == 1);  // float32 tensors are read as before
  CHECK(mapped.shape_of("no/such/tensor") == nullptr);
  std::remove(path.c_str());  // the mapping keeps the bytes readable

  // Written back out, the mapped tensors are float16 again, with the same values.
  const TensorFile again = decode_safetensors(encode_safetensors(mapped), "again");
  for (auto& [name, h] : mapped.mapped_half) {
    CHECK(again.half.count(name) == 1);
    CHECK(again.get(name, "t").value == converted.get(name, "t").value);
  }
  TensorFile materialized = mapped;
  materialized.convert_mapped_half();
  CHECK(materialized.mapped_half.empty());
  CHECK(materialized.get("conv1/weights", "t").value == converted.get("conv1/weights", "t").value);

  // The same graph, and a network computing the very same grid, from either form.
  const NetGraph g = resnet_v2_graph(mapped, "mapped");
  CHECK(g.to_json() == resnet_v2_graph(converted, "converted").to_json());
  const NetGraph whole = g.cut(g.grid_node("block2"));
  const int S = 32, n = 2;
  Rng rng(3);
  std::vector<float> images = randoms((size_t)n * 3 * S * S, rng), from_mapped, from_converted;
  PretrainedEncoder(whole, select_tensors(whole, mapped, "mapped"), S, "mapped").forward(images.data(), n, from_mapped);
  PretrainedEncoder(whole, select_tensors(whole, converted, "converted"), S, "converted")
      .forward(images.data(), n, from_converted);
  CHECK(max_abs_diff(from_mapped, from_converted) == 0);
  // The trainable blocks read them too (values checked by the network equality of the fused-network test).
  TunableBlocks blocks(whole, mapped, "block1", S, "mapped");
  TunableBlocks blocks_converted(whole, converted, "block1", S, "converted");
  for (size_t k = 0; k < blocks.params().size(); ++k)
    CHECK(blocks.params()[k].value == blocks_converted.params()[k].value);
}

TEST_CASE("external encoder weights: found by name and sha256; missing, truncated or different files refused") {
  if (!have_weights()) return;
  const std::string dir = "/tmp/sat_test_weights";
  make_dirs(dir + "/resnet_v2_101");
  const std::string bytes = read_file(kWeights);
  set_default_weights_dir("");  // only where this test says
  set_weights_dir(dir);
  const std::string file = "resnet_v2_101.safetensors";
  auto expect_refused = [&](const std::string& what) {
    CHECK_THROWS_WITH_AS(
        load_external_weights(file, kSha256, "m.sat"),
        doctest::Contains(
            ("m.sat: needs the encoder weights resnet_v2_101.safetensors (sha256 " + kSha256 + "): ").c_str()),
        Error);
    CHECK_THROWS_WITH_AS(load_external_weights(file, kSha256, "m.sat"), doctest::Contains(what.c_str()), Error);
  };
  std::remove((dir + "/" + file).c_str());
  std::remove((dir + "/resnet_v2_101/" + file).c_str());
  expect_refused("looked in " + dir +
                 "; no such file found (get them with tools/fetch-weights.sh from sat's source, or "
                 "pass --weights-dir DIR or set SAT_WEIGHTS to the folder that holds it)");
  write_file_atomic(dir + "/resnet_v2_101/" + file, bytes.substr(0, bytes.size() / 3));
  expect_refused(dir + "/resnet_v2_101/" + file + " (" + std::to_string(bytes.size() / 3) + " bytes, sha256 " +
                 sha256_hex(bytes.substr(0, bytes.size() / 3)) + ": truncated or a different file)");
  std::string changed = bytes;
  changed[changed.size() - 5] ^= 1;  // one bit of one weight
  write_file_atomic(dir + "/" + file, changed);
  expect_refused("truncated or a different file");
  // Hashed ahead (a model's loader starts it as the header names the file): the different file is still refused.
  expect_refused("truncated or a different file");
  CHECK_THROWS_WITH_AS(load_external_weights(file, kSha256, "m.sat", nullptr, "", start_weights_hash(file)),
                       doctest::Contains("truncated or a different file"), Error);
  write_file_atomic(dir + "/resnet_v2_101/" + file, bytes);  // the right file, in the folder named after it
  std::string found;
  TensorFile tf = load_external_weights(file, kSha256, "m.sat", &found);
  CHECK(found == dir + "/resnet_v2_101/" + file);
  CHECK(is_resnet_v2(tf));
  // Its float16 kernels stay in the mapped file (94 of them); the float32 biases and scales are read.
  CHECK(tf.mapped_half.size() == 94);
  CHECK(tf.mapped_half.count("conv1/weights") == 1);
  CHECK(tf.tensors.count("conv1/biases") == 1);
  std::remove((dir + "/" + file).c_str());  // only the right one left: found with the hash started ahead
  found.clear();
  CHECK(is_resnet_v2(load_external_weights(file, kSha256, "m.sat", &found, "", start_weights_hash(file))));
  CHECK(found == dir + "/resnet_v2_101/" + file);
  write_file_atomic(dir + "/" + file, changed);
  set_weights_dir("");
  set_default_weights_dir(kWeightsDir + "/..");
  CHECK(is_resnet_v2(load_external_weights(file, kSha256, "m.sat", &found)));
  std::remove((dir + "/" + file).c_str());
  std::remove((dir + "/resnet_v2_101/" + file).c_str());
}

TEST_CASE("fetched weights: the user's cache folder is $XDG_CACHE_HOME/sat/weights, else ~/.cache/sat/weights") {
  const char* xdg = std::getenv("XDG_CACHE_HOME");
  const char* home = std::getenv("HOME");
  const std::string saved_xdg = xdg ? xdg : "", saved_home = home ? home : "";
  setenv("XDG_CACHE_HOME", "/tmp/xdg", 1);
  setenv("HOME", "/tmp/home", 1);
  CHECK(weights_cache_dir() == "/tmp/xdg/sat/weights");
  setenv("XDG_CACHE_HOME", "", 1);  // empty counts as unset (XDG base directory spec)
  CHECK(weights_cache_dir() == "/tmp/home/.cache/sat/weights");
  unsetenv("HOME");
  CHECK(weights_cache_dir().empty());
  xdg ? (void)setenv("XDG_CACHE_HOME", saved_xdg.c_str(), 1) : (void)unsetenv("XDG_CACHE_HOME");
  home ? (void)setenv("HOME", saved_home.c_str(), 1) : (void)unsetenv("HOME");
}

TEST_CASE("sha256: FIPS 180-4 vectors, the accelerated path equals the portable one") {
  CHECK(sha256_hex("abc") == "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
  CHECK(sha256_hex("") == "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
  CHECK(sha256_hex("abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq") ==
        "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1");
  CHECK(sha256_hex(std::string(1000000, 'a')) == "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0");
  Rng rng(5);
  for (size_t n : {0, 1, 55, 56, 63, 64, 65, 119, 120, 128, 1000, 4097}) {
    std::string s(n, '\0');
    for (auto& c : s) c = (char)rng.integer(0, 255);
    CHECK(sha256_hex(s) == sha256_hex_portable(s.data(), s.size()));
    Sha256 pieces;  // fed in uneven pieces
    for (size_t i = 0; i < n; i += 7) pieces.update(s.data() + i, std::min<size_t>(7, n - i));
    CHECK(pieces.hex_digest() == sha256_hex(s));
  }
  MESSAGE("sha256 with CPU SHA extensions: " << std::string(sha256_accelerated() ? "yes" : "no (portable code)"));
}
