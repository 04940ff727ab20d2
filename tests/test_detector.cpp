// The object detector: the TF.js graph-model reader, the translation into layers (hard-swish, squeeze-and-excite,
// residual sums folded), the oneDNN network against a plain-loop reference (tests/detector_reference.hpp) on a small
// graph written here with every op the CenterNet model uses, TF's legacy resize and SAME padding checked by hand, bad
// files refused naming the file and the node; and, with ../shared beside the checkout, the shared CenterNet model
// against its README's cross-check figures.
#include <doctest/doctest.h>

#include <cmath>
#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>

#include "datasets/io.hpp"
#include "datasets/safetensors.hpp"
#include "tests/detector_reference.hpp"
#include "tests/reference_pixels.hpp"
#include "tests/scratch.hpp"
#include "vision/detector.hpp"
#include "vision/image.hpp"
#include "vision/objects_encoder.hpp"
#include "vision/pretrained.hpp"

using namespace sat;
using nlohmann::json;

namespace {

std::string base64(const std::string& bytes) {
  static const char* abc = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
  std::string out;
  size_t i = 0;
  for (; i + 2 < bytes.size(); i += 3) {
    const uint32_t v = (uint8_t)bytes[i] << 16 | (uint8_t)bytes[i + 1] << 8 | (uint8_t)bytes[i + 2];
    for (int s = 18; s >= 0; s -= 6) out += abc[(v >> s) & 63];
  }
  if (i < bytes.size()) {
    uint32_t v = (uint8_t)bytes[i] << 16;
    if (i + 1 < bytes.size()) v |= (uint8_t)bytes[i + 1] << 8;
    out += abc[(v >> 18) & 63];
    out += abc[(v >> 12) & 63];
    out += i + 1 < bytes.size() ? abc[(v >> 6) & 63] : '=';
    out += '=';
  }
  return out;
}

// A TF.js graph model under construction: nodes and float16 / int32 constants.
struct GraphWriter {
  json nodes = json::array();
  json manifest = json::array();
  std::string bin;
  std::mt19937 rng{7};

  void node(const std::string& name, const std::string& op, std::vector<std::string> inputs,
            json attr = json::object()) {
    nodes.push_back({{"name", name}, {"op", op}, {"input", inputs}, {"attr", attr}});
  }
  void floats(const std::string& name, std::vector<int64_t> shape, std::vector<float> values) {
    node(name, "Const", {}, {{"dtype", {{"type", "DT_FLOAT"}}}});
    manifest.push_back({{"name", name},
                        {"shape", shape},
                        {"dtype", "float32"},
                        {"quantization", {{"dtype", "float16"}, {"original_dtype", "float32"}}}});
    for (float v : values) {
      const uint16_t h = float_to_half(v);
      bin.append(reinterpret_cast<const char*>(&h), 2);
    }
  }
  void random(const std::string& name, std::vector<int64_t> shape, float scale) {
    std::normal_distribution<float> d(0.f, scale);
    std::vector<float> v(shape_size(shape));
    for (float& x : v) x = d(rng);
    floats(name, shape, v);
  }
  void ints(const std::string& name, std::vector<int32_t> values) {
    node(name, "Const", {}, {{"dtype", {{"type", "DT_INT32"}}}});
    manifest.push_back({{"name", name}, {"shape", {(int64_t)values.size()}}, {"dtype", "int32"}});
    bin.append(reinterpret_cast<const char*>(values.data()), values.size() * 4);
  }
  static json strides(int s) { return {{"list", {{"i", {"1", std::to_string(s), std::to_string(s), "1"}}}}}; }
  static json padding(const std::string& p) { return {{"s", base64(p)}}; }
  static json fused(std::vector<std::string> ops) {
    json s = json::array();
    for (auto& o : ops) s.push_back(base64(o));
    return {{"list", {{"s", s}}}};
  }
  void conv(const std::string& name, const std::string& in, int k, int ci, int co, int stride, const std::string& pad,
            std::vector<std::string> fused_ops) {
    random(name + "/w", {k, k, ci, co}, 1.f / std::sqrt((float)k * k * ci));
    std::vector<std::string> inputs{in, name + "/w"};
    if (!fused_ops.empty()) {
      random(name + "/b", {co}, 0.2f);
      inputs.push_back(name + "/b");
    }
    json attr = {{"strides", strides(stride)}, {"padding", padding(pad)}};
    if (!fused_ops.empty()) attr["fused_ops"] = fused(fused_ops);
    node(name, fused_ops.empty() ? "Conv2D" : "_FusedConv2D", inputs, attr);
  }
  void depthwise(const std::string& name, const std::string& in, int k, int c, int stride,
                 std::vector<std::string> fused_ops) {
    random(name + "/w", {k, k, c, 1}, 1.f / k);
    std::vector<std::string> inputs{in, name + "/w"};
    json attr = {{"strides", strides(stride)}, {"padding", padding("SAME")}};
    if (!fused_ops.empty()) {
      random(name + "/b", {c}, 0.2f);
      inputs.push_back(name + "/b");
      attr["fused_ops"] = fused(fused_ops);
    }
    node(name, fused_ops.empty() ? "DepthwiseConv2dNative" : "FusedDepthwiseConv2dNative", inputs, attr);
  }
  void hard_swish(const std::string& name, const std::string& x) {  // x * c * relu6(x + 3), as TF spells it
    floats(name + "/c", {}, {1.f / 6.f});
    floats(name + "/three", {}, {3.f});
    node(name + "/mul", "Mul", {name + "/c", x});
    node(name + "/add", "Add", {x, name + "/three"});
    node(name + "/relu6", "Relu6", {name + "/add"});
    node(name, "Mul", {name + "/mul", name + "/relu6"});
  }
  // Writes DIR/model.json and DIR/model.bin; returns the JSON's path.
  std::string write(const std::string& dir) const {
    json model = {{"format", "graph-model"},
                  {"generatedBy", "sat tests"},
                  {"modelTopology", {{"node", nodes}}},
                  {"weightsManifest", {{{"paths", {"model.bin"}}, {"weights", manifest}}}}};
    write_file_atomic(join_path(dir, "model.json"), model.dump());
    write_file_atomic(join_path(dir, "model.bin"), bin);
    return join_path(dir, "model.json");
  }
};

// Every op kind of the CenterNet graph, at export size 64: a stride-2 convolution with hard-swish, a 5x5 stride-2
// depthwise convolution with ReLU, squeeze-and-excite (mean, two 1x1 convolutions, hard-sigmoid, scale), a residual
// sum, a bias-free 3x3 convolution, a 2x legacy resize, a concatenation and ReLU, a VALID 1x1 convolution and a
// sigmoid; plus a branch the output does not need, holding an op sat does not run.
GraphWriter small_detector() {
  GraphWriter g;
  g.node("images", "Placeholder", {},
         {{"shape", {{"shape", {{"dim", {{{"size", "1"}}, {{"size", "64"}}, {{"size", "64"}}, {{"size", "3"}}}}}}}}});
  g.conv("c1", "images", 3, 3, 8, 2, "SAME", {"BiasAdd"});
  g.hard_swish("hs", "c1");
  g.depthwise("dw", "hs", 5, 8, 2, {"BiasAdd", "Relu"});
  g.ints("axes", {1, 2});
  g.node("se/mean", "Mean", {"dw", "axes"}, {{"keep_dims", {{"b", true}}}});
  g.conv("se/a", "se/mean", 1, 8, 4, 1, "SAME", {"BiasAdd", "Relu"});
  g.conv("se/b", "se/a", 1, 4, 8, 1, "SAME", {"BiasAdd"});
  g.floats("se/three", {}, {3.f});
  g.floats("se/sixth", {}, {1.f / 6.f});
  g.node("se/add", "Add", {"se/b", "se/three"});
  g.node("se/relu6", "Relu6", {"se/add"});
  g.node("se/gate", "Mul", {"se/sixth", "se/relu6"});
  g.node("se/mul", "Mul", {"se/gate", "dw"});
  g.conv("project", "se/mul", 1, 8, 8, 1, "SAME", {"BiasAdd"});
  g.node("residual", "Add", {"project", "dw"});
  g.conv("plain", "residual", 3, 8, 8, 1, "SAME", {});
  g.ints("up/size", {32, 32});
  g.node("up", "ResizeBilinear", {"plain", "up/size"},
         {{"align_corners", {{"b", false}}}, {"half_pixel_centers", {{"b", false}}}});
  g.ints("cat/axis", {3});
  g.node("cat", "ConcatV2", {"hs", "up", "cat/axis"});
  g.node("cat/relu", "Relu", {"cat"});
  g.conv("cls", "cat/relu", 1, 16, 5, 1, "VALID", {"BiasAdd"});
  g.node("cls/sigmoid", "Sigmoid", {"cls"});
  g.node("keypoints", "Identity", {"cls/sigmoid"});
  g.node("boxes", "TopKV2", {"keypoints"});
  return g;
}

std::vector<float> random_photo(int size, unsigned seed) {
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int> d(0, 255);
  std::vector<float> v((size_t)3 * size * size);
  for (float& x : v) x = (float)d(rng);
  return v;
}

// The reference's output (C x H x W) as the detector gives it (H x W x C).
std::vector<float> to_hwc(const std::vector<float>& chw, int c, int hw) {
  std::vector<float> out(chw.size());
  for (int k = 0; k < c; ++k)
    for (int p = 0; p < hw; ++p) out[(size_t)p * c + k] = chw[(size_t)k * hw + p];
  return out;
}

// What loading the detector from `weights_dir` (and nowhere else) throws; "" when it loads.
std::string error_of_loading(const std::string& weights_dir) {
  return test::error_of([&] { load_object_detector(64, Precision::f32, "test", weights_dir); });
}

float max_abs_diff(const std::vector<float>& a, const std::vector<float>& b) {
  REQUIRE(a.size() == b.size());
  float m = 0;
  for (size_t k = 0; k < a.size(); ++k) m = std::max(m, std::fabs(a[k] - b[k]));
  return m;
}

}  // namespace

TEST_CASE("detector: a graph model's ops folded into convolutions and their post-ops") {
  test::TempDir dir;
  const std::string path = small_detector().write(dir.path);
  const DetectorNet net = detector_net_from_graph(read_tfjs_graph(path, "keypoints"), "keypoints");
  CHECK(net.export_size == 64);
  // input, c1 (+hard-swish), dw (+relu), mean, se/a, se/b (+hard-sigmoid), scale, project (+residual sum), plain,
  // resize, concat, relu, cls (+sigmoid)
  REQUIRE(net.layers.size() == 13);
  const DetectorLayer& c1 = net.layers[1];
  REQUIRE(c1.post.size() == 1);
  CHECK(c1.post[0].kind == PostOpKind::hard_swish);
  CHECK(c1.post[0].scale == doctest::Approx(6.f * half_to_float(float_to_half(1.f / 6.f))));
  const DetectorLayer& gate = net.layers[5];
  // + 3 went into the bias, / 6 became the clip's scale
  REQUIRE(gate.post.size() == 1);
  CHECK(gate.post[0].kind == PostOpKind::relu6);
  CHECK(net.layers[6].kind == LayerKind::mul);
  const DetectorLayer& project = net.layers[7];
  REQUIRE(project.post.size() == 1);
  CHECK(project.post[0].kind == PostOpKind::sum);
  CHECK(project.post[0].sum_from == 2);
  CHECK(net.layers[net.output].post.back().kind == PostOpKind::logistic);
  const auto shapes = net.shapes(96);  // any multiple of 32: the resize scales with the input
  CHECK(shapes[net.output].h == 48);
  CHECK(shapes[9].h == 48);
}

TEST_CASE("detector: the oneDNN network matches the plain-loop reference, one image or several (more than a pass takes)") {
  test::TempDir dir;
  const std::string path = small_detector().write(dir.path);
  for (int size : {64, 96}) {
    auto detector = load_object_detector_from(path, "keypoints", size, Precision::f32);
    REQUIRE(detector->classes() == 5);
    REQUIRE(detector->map_size() == size / 2);
    const int hw = detector->map_size() * detector->map_size();
    std::vector<float> batch, heat;
    std::vector<std::vector<float>> expected;
    const int n = ObjectDetector::kMaxBatch + 2;  // a full pass and a shorter one
    for (int k = 0; k < n; ++k) {
      const std::vector<float> photo = random_photo(size, 11u + (unsigned)k);
      batch.insert(batch.end(), photo.begin(), photo.end());
      const DetectorNet net = detector_net_from_graph(read_tfjs_graph(path, "keypoints"), "keypoints");
      expected.push_back(to_hwc(test::reference_forward(net, photo.data(), size)[net.output], 5, hw));
    }
    detector->forward(batch.data(), n, heat);
    REQUIRE(heat.size() == (size_t)n * hw * 5);
    for (int k = 0; k < n; ++k) {
      std::vector<float> one(heat.begin() + (size_t)k * hw * 5, heat.begin() + (size_t)(k + 1) * hw * 5);
      CHECK(max_abs_diff(one, expected[k]) < 2e-5f);
    }
    std::vector<float> alone;
    detector->forward(batch.data() + (size_t)3 * size * size, 1, alone);  // the second photo by itself
    CHECK(max_abs_diff(alone, expected[1]) < 2e-5f);
  }
}

TEST_CASE("detector: a trunk layer's mean over the image, from the same pass as the heat, in f32 and bf16") {
  test::TempDir dir;
  const std::string path = small_detector().write(dir.path);
  // "hs" (c1 and its hard-swish, folded) is read by the depthwise convolution and by the concatenation
  const DetectorNet net = detector_net_from_graph(read_tfjs_graph(path, "keypoints"), "keypoints", "hs");
  REQUIRE(net.layers.size() == 13);  // the trunk folds as it did without it: nothing after it folds into it
  REQUIRE(net.trunk == 1);
  CHECK(net.layers[1].post.back().kind == PostOpKind::hard_swish);
  const int size = 96, n = ObjectDetector::kMaxBatch + 1;
  std::vector<float> batch, expected_heat, expected_trunk;
  const int hw = (size / 2) * (size / 2);
  for (int k = 0; k < n; ++k) {
    const std::vector<float> photo = random_photo(size, 70u + (unsigned)k);
    batch.insert(batch.end(), photo.begin(), photo.end());
    const auto layers = test::reference_forward(net, photo.data(), size);
    const std::vector<float> heat = to_hwc(layers[net.output], 5, hw);
    expected_heat.insert(expected_heat.end(), heat.begin(), heat.end());
    const std::vector<float>& hs = layers[net.trunk];  // 8 x 48 x 48
    const size_t positions = hs.size() / 8;
    for (int c = 0; c < 8; ++c) {
      double sum = 0;
      for (size_t p = 0; p < positions; ++p) sum += hs[c * positions + p];
      expected_trunk.push_back((float)(sum / (double)positions));
    }
  }
  auto with_trunk = load_object_detector_from(path, "keypoints", size, Precision::f32, "hs");
  CHECK(with_trunk->trunk_channels() == 8);
  std::vector<float> heat, trunk, heat_alone;
  with_trunk->forward(batch.data(), n, heat, &trunk);
  REQUIRE(trunk.size() == (size_t)n * 8);
  CHECK(max_abs_diff(heat, expected_heat) < 2e-5f);  // the heat is what it is without the trunk
  CHECK(max_abs_diff(trunk, expected_trunk) < 2e-4f);
  float spread = 0;  // the means differ between photos and channels: not a constant
  for (size_t k = 1; k < trunk.size(); ++k) spread = std::max(spread, std::fabs(trunk[k] - trunk[0]));
  CHECK(spread > 0.1f);
  with_trunk->forward(batch.data(), n, heat_alone);  // not asked for: the heat alone, the same
  CHECK(max_abs_diff(heat_alone, expected_heat) < 2e-5f);
  auto without = load_object_detector_from(path, "keypoints", size, Precision::f32);
  CHECK(without->trunk_channels() == 0);
  CHECK_THROWS_WITH_AS(without->forward(batch.data(), 1, heat, &trunk), doctest::Contains("has none"), Error);
  if (cpu_has_native_bf16()) {
    auto bf16 = load_object_detector_from(path, "keypoints", size, Precision::bf16, "hs");
    std::vector<float> heat16, trunk16;
    bf16->forward(batch.data(), n, heat16, &trunk16);
    float scale = 0;
    for (float v : expected_trunk) scale = std::max(scale, std::fabs(v));
    CHECK(max_abs_diff(trunk16, expected_trunk) < 0.02f * scale + 0.02f);
  }
  CHECK_THROWS_WITH_AS(detector_net_from_graph(read_tfjs_graph(path, "keypoints"), "keypoints", "nowhere"),
                       doctest::Contains("trunk output nowhere is not a tensor sat computes"), Error);
  CHECK_THROWS_WITH_AS(detector_net_from_graph(read_tfjs_graph(path, "keypoints"), "keypoints", "keypoints"),
                       doctest::Contains("is the graph's input or its output"), Error);
}

TEST_CASE("detector: TF's legacy bilinear resize and SAME padding, by hand") {
  DetectorNet net;
  net.path = "hand";
  net.layers.resize(2);
  net.layers[1].kind = LayerKind::resize;
  net.layers[1].inputs = {0};
  net.layers[1].resize_num = 2, net.layers[1].resize_den = 1;
  net.output = 1;
  // a 2x2 image (one channel shown) to 4x4: rows 0 and 2 are the source rows, row 1 halfway, row 3 the last row
  // again (the upper neighbour clamped); the same along columns. No half-pixel shift.
  std::vector<float> image(3 * 2 * 2, 0.f);
  image[0] = 0, image[1] = 4, image[2] = 8, image[3] = 12;
  const auto out = test::reference_forward(net, image.data(), 2)[1];
  const float expected[16] = {0, 2, 4, 4, 4, 6, 8, 8, 8, 10, 12, 12, 8, 10, 12, 12};
  for (int k = 0; k < 16; ++k) CHECK(out[k] == expected[k]);
  // SAME at stride 2 on an even size: the one padded row and column at the bottom and right
  DetectorNet conv;
  conv.path = "hand";
  conv.layers.resize(2);
  DetectorLayer& l = conv.layers[1];
  l.kind = LayerKind::conv, l.inputs = {0}, l.kh = l.kw = 3, l.stride = 2, l.same = true, l.out_channels = 1;
  l.weight.assign(27, 0.f), l.bias.assign(1, 0.f);
  conv.output = 1;
  const auto s = conv.shapes(32);
  CHECK(s[1].h == 16);
  CHECK(s[1].pad_t == 0);
  CHECK(s[1].pad_b == 1);
}

TEST_CASE("detector: bad graph files are refused naming the file and the node") {
  test::TempDir dir;
  GraphWriter g = small_detector();
  g.node("odd", "Softmax", {"cat/relu"});
  g.node("odd_out", "Identity", {"odd"});
  const std::string path = g.write(dir.path);
  CHECK_THROWS_WITH_AS(detector_net_from_graph(read_tfjs_graph(path, "odd_out"), "odd_out"),
                       doctest::Contains("model.json: node odd (Softmax): an op sat does not run"), Error);
  CHECK_THROWS_WITH_AS(read_tfjs_graph(path, "nothing"), doctest::Contains("has no node nothing"), Error);
  // a weights file cut short
  write_file_atomic(join_path(dir.path, "model.bin"), g.bin.substr(0, g.bin.size() / 2));
  CHECK_THROWS_WITH_AS(read_tfjs_graph(path, "keypoints"), doctest::Contains("model.bin: too short: weight"), Error);
  write_file_atomic(path, "{\"modelTopology\": 3}");
  CHECK_THROWS_WITH_AS(read_tfjs_graph(path, "keypoints"), doctest::Contains("is not a TF.js graph model"), Error);
  CHECK_THROWS_WITH_AS(read_tfjs_graph(join_path(dir.path, "absent.json"), "keypoints"),
                       doctest::Contains("absent.json: no such file"), Error);
  // an input size the resize cannot scale to
  const std::string good = small_detector().write(dir.path);
  CHECK_THROWS_WITH_AS(load_object_detector_from(good, "keypoints", 48, Precision::f32),
                       doctest::Contains("not a multiple of 32"), Error);
}

TEST_CASE("detector: class peaks and maps pooled onto a grid") {
  // 4x4 map, 2 classes
  std::vector<float> heat(4 * 4 * 2, 0.f);
  heat[(1 * 4 + 2) * 2 + 0] = 0.6f;  // class 0 peaks at row 1, column 2
  heat[(3 * 4 + 0) * 2 + 1] = 0.2f;
  const auto peaks = class_peaks(heat.data(), 4, 4, 2, 0.1f);
  REQUIRE(peaks.size() == 2);
  CHECK(peaks[0].cls == 0);
  CHECK(peaks[0].x == doctest::Approx(2.5 / 4));
  CHECK(peaks[0].y == doctest::Approx(1.5 / 4));
  CHECK(class_peaks(heat.data(), 4, 4, 2, 0.3f).size() == 1);
  std::vector<float> grid(2 * 2 * 2);
  pool_class_maps(heat.data(), 4, 4, 2, 2, 2, grid.data());
  CHECK(grid[(0 * 2 + 1) * 2 + 0] == 0.6f);
  CHECK(grid[(1 * 2 + 0) * 2 + 1] == 0.2f);
  CHECK(grid[0] == 0.f);
  // any sign (the detector's trunk channels pass through it too): each cell its largest value, not clipped at 0
  std::vector<float> below(4 * 4 * 2);
  for (size_t i = 0; i < below.size(); ++i) below[i] = -1.f - 0.1f * (float)i;
  pool_class_maps(below.data(), 4, 4, 2, 2, 2, grid.data());
  CHECK(grid[(0 * 2 + 0) * 2 + 0] == below[0]);                // cell (0,0): map cells (0..1, 0..1), the largest first
  CHECK(grid[(1 * 2 + 1) * 2 + 1] == below[(2 * 4 + 2) * 2 + 1]);  // cell (1,1), class 1: map cell (2,2)
  CHECK_THROWS_AS(pool_class_maps(heat.data(), 4, 4, 2, 3, 3, grid.data()), Error);
  CHECK_THROWS_AS(pool_class_maps(heat.data(), 0, 0, 2, 1, 1, grid.data()), Error);
}

TEST_CASE("detector: the shared CenterNet model gives its README's figures at 224 (skipped without ../shared)") {
  const std::string models = std::string(SAT_SHARED_DATA) + "/../models";
  const std::string photos = std::string(SAT_SHARED_DATA) + "/flickr8k/images/";
  if (!file_exists(models + "/centernet_mobilenetv3/centernet.json") || !file_exists(photos)) {
    MESSAGE("../shared/models/centernet_mobilenetv3 or the Flickr8k photos absent: skipped");
    return;
  }
  auto detector = load_object_detector(224, Precision::f32, "test", models);
  CHECK(detector->map_size() == 56);
  struct Expected {
    const char* photo;
    double sum;
    std::vector<std::pair<const char*, double>> peaks;
  };
  const Expected cases[] = {{"1001773457_577c3a7d70.jpg",
                             965.054,
                             {{"dog", .417}, {"person", .391}, {"horse", .386}, {"cow", .209}, {"elephant", .135}}},
                            {"1003163366_44323f5815.jpg",
                             1158.074,
                             {{"dog", .426}, {"person", .279}, {"bench", .174}, {"chair", .172}, {"bird", .157}}}};
  std::vector<float> both;
  for (const Expected& e : cases) {
    std::vector<float> planes(3 * 224 * 224);
    // decoded by libjpeg, as the README's figures were (tests/reference_pixels.hpp)
    image_to_rgb255_planes(test::load_reference_pixels(photos + e.photo), 224, planes.data());
    both.insert(both.end(), planes.begin(), planes.end());
  }
  std::vector<float> heat;
  detector->forward(both.data(), 2, heat);
  const size_t per = (size_t)56 * 56 * 80;
  for (int k = 0; k < 2; ++k) {
    double sum = 0;
    for (size_t j = 0; j < per; ++j) sum += heat[k * per + j];
    CHECK(std::fabs(sum - cases[k].sum) < 0.0006);
    const auto peaks = class_peaks(heat.data() + k * per, 56, 56, 80, 0.f);
    for (size_t j = 0; j < cases[k].peaks.size(); ++j) {
      CHECK(coco_class_names()[peaks[j].cls] == cases[k].peaks[j].first);
      CHECK(std::round(peaks[j].score * 1000) / 1000 == doctest::Approx(cases[k].peaks[j].second));
    }
  }
  // With the trunk's features (the same files, one pass): the heat unchanged, and each channel's mean over the 7 x 7
  // stride-32 positions equal to that node's output averaged by hand (a net that ends at it)
  auto with_trunk = load_object_detector(224, Precision::f32, "test", models, true);
  REQUIRE(with_trunk->trunk_channels() == kCenternetTrunkChannels);
  std::vector<float> heat_again, trunk;
  with_trunk->forward(both.data(), 2, heat_again, &trunk);
  CHECK(max_abs_diff(heat_again, heat) == 0.f);
  auto trunk_alone = load_object_detector_from(find_object_detector("test", models), kCenternetTrunk, 224,
                                               Precision::f32);
  std::vector<float> trunk_map;  // 2 x 7 x 7 x 480
  trunk_alone->forward(both.data(), 2, trunk_map);
  REQUIRE(trunk_map.size() == (size_t)2 * 49 * 480);
  std::vector<float> by_hand(2 * 480, 0.f);
  for (int k = 0; k < 2; ++k)
    for (int p = 0; p < 49; ++p)
      for (int c = 0; c < 480; ++c) by_hand[k * 480 + c] += trunk_map[((size_t)k * 49 + p) * 480 + c] / 49.f;
  CHECK(max_abs_diff(trunk, by_hand) < 1e-5f);
}

TEST_CASE("detector: object maps joined to a grid, max-pooled and scaled (EncoderWithObjects)") {
  test::TempDir dir;
  const std::string path = small_detector().write(dir.path);
  auto detector = load_object_detector_from(path, "keypoints", 64, Precision::f32);
  struct ConstantGrid : ImageEncoder {  // 4 x 4 locations of 3 features: location l, image b -> b * 100 + l
    void encode(const float*, int n, std::vector<float>& grid) override {
      grid.resize((size_t)n * 16 * 3);
      for (int b = 0; b < n; ++b)
        for (int l = 0; l < 16; ++l)
          for (int c = 0; c < 3; ++c) grid[((size_t)b * 16 + l) * 3 + c] = b * 100.f + l;
    }
    Precision precision() const override { return Precision::f32; }
  } base;
  const float mean[3] = {0.5f, 0.4f, 0.3f}, stdev[3] = {0.2f, 0.25f, 0.3f};
  EncoderWithObjects joined(base, *detector, 4, 4, 3, mean, stdev, 4.f);
  CHECK(joined.channels() == 8);
  // two photos, normalized as a model's planes are
  std::vector<float> rgb, planes;
  for (unsigned k = 0; k < 2; ++k) {
    const std::vector<float> photo = random_photo(64, 40 + k);
    rgb.insert(rgb.end(), photo.begin(), photo.end());
  }
  planes.resize(rgb.size());
  for (size_t i = 0; i < rgb.size(); ++i) {
    const int c = (int)(i / (64 * 64)) % 3;
    planes[i] = (rgb[i] / 255.f - mean[c]) / stdev[c];
  }
  std::vector<float> grid, heat, pooled(16 * 5);
  joined.encode(planes.data(), 2, grid);
  detector->forward(rgb.data(), 2, heat);
  REQUIRE(grid.size() == (size_t)2 * 16 * 8);
  float worst = 0;
  for (int b = 0; b < 2; ++b) {
    pool_class_maps(heat.data() + (size_t)b * 32 * 32 * 5, 32, 32, 5, 4, 4, pooled.data());
    for (int l = 0; l < 16; ++l) {
      const float* row = grid.data() + ((size_t)b * 16 + l) * 8;
      CHECK(row[0] == b * 100.f + l);
      CHECK(row[2] == b * 100.f + l);
      for (int k = 0; k < 5; ++k) worst = std::max(worst, std::fabs(row[3 + k] - 4.f * pooled[l * 5 + k]));
    }
  }
  CHECK(worst < 1e-4f);  // the planes' normalization undone to 0..255 within float rounding
  CHECK_THROWS_WITH_AS(EncoderWithObjects(base, *detector, 5, 5, 3, mean, stdev, 1.f),
                       doctest::Contains("do not pool onto the 5x5 grid"), Error);

  // the other forms: tags (each class's peak over the photo at every location), both (the maps, then the tags), on
  // a grid as fine as the maps (this detector's heat saturates, so 8 x 8 cells would all hold its peak of 1)
  struct FineGrid : ImageEncoder {  // 32 x 32 locations of 2 features: location l, image b -> b * 10000 + l
    void encode(const float*, int n, std::vector<float>& grid) override {
      grid.resize((size_t)n * 1024 * 2);
      for (int b = 0; b < n; ++b)
        for (int l = 0; l < 1024; ++l)
          grid[((size_t)b * 1024 + l) * 2] = grid[((size_t)b * 1024 + l) * 2 + 1] = b * 1e4f + l;
    }
    Precision precision() const override { return Precision::f32; }
  } fine;
  EncoderWithObjects maps(fine, *detector, 32, 32, 2, mean, stdev, 4.f, "maps");
  EncoderWithObjects tags(fine, *detector, 32, 32, 2, mean, stdev, 4.f, "tags");
  EncoderWithObjects both(fine, *detector, 32, 32, 2, mean, stdev, 4.f, "both");
  CHECK(tags.channels() == 7);
  CHECK(both.channels() == 12);
  std::vector<float> map_grid, tag_grid, both_grid;
  maps.encode(planes.data(), 2, map_grid);
  tags.encode(planes.data(), 2, tag_grid);
  both.encode(planes.data(), 2, both_grid);
  REQUIRE(tag_grid.size() == (size_t)2 * 1024 * 7);
  REQUIRE(both_grid.size() == (size_t)2 * 1024 * 12);
  int below_peak = 0;  // cells whose map value is under the class's peak: the tags are not the maps
  float worst_tag = 0;
  for (int b = 0; b < 2; ++b)
    for (int k = 0; k < 5; ++k) {
      const float* photo_heat = heat.data() + (size_t)b * 32 * 32 * 5;
      float peak = 0;
      for (int m = 0; m < 32 * 32; ++m) peak = std::max(peak, photo_heat[(size_t)m * 5 + k]);
      for (int l = 0; l < 1024; ++l) {
        const float* t = tag_grid.data() + ((size_t)b * 1024 + l) * 7;
        const float* j = both_grid.data() + ((size_t)b * 1024 + l) * 12;
        const float* m = map_grid.data() + ((size_t)b * 1024 + l) * 7;
        if (k == 0) CHECK((t[1] == b * 1e4f + l && j[0] == b * 1e4f + l));
        worst_tag = std::max(worst_tag, std::fabs(t[2 + k] - 4.f * peak));
        CHECK(j[2 + k] == m[2 + k]);  // the maps as the maps form has them
        CHECK(j[7 + k] == t[2 + k]);  // then the tags
        if (m[2 + k] < t[2 + k]) ++below_peak;
      }
    }
  CHECK(worst_tag < 1e-4f);
  CHECK(below_peak > 1000);
  // tags+trunk: the tags, then the trunk's mean over the photo, scaled alike, the same at every location
  auto detector_with_trunk = load_object_detector_from(path, "keypoints", 64, Precision::f32, "hs");
  EncoderWithObjects tags_trunk(fine, *detector_with_trunk, 32, 32, 2, mean, stdev, 4.f, "tags+trunk");
  CHECK(tags_trunk.channels() == 2 + 5 + 8);
  std::vector<float> trunk_grid, trunk_heat, trunk;
  tags_trunk.encode(planes.data(), 2, trunk_grid);
  detector_with_trunk->forward(rgb.data(), 2, trunk_heat, &trunk);
  REQUIRE(trunk_grid.size() == (size_t)2 * 1024 * 15);
  float worst_trunk = 0;
  for (int b = 0; b < 2; ++b)
    for (int l = 0; l < 1024; ++l) {
      const float* row = trunk_grid.data() + ((size_t)b * 1024 + l) * 15;
      const float* t = tag_grid.data() + ((size_t)b * 1024 + l) * 7;
      for (int c = 0; c < 7; ++c) CHECK(row[c] == t[c]);  // the grid and the tags as the tags form has them
      for (int c = 0; c < 8; ++c) worst_trunk = std::max(worst_trunk, std::fabs(row[7 + c] - 4.f * trunk[b * 8 + c]));
    }
  CHECK(worst_trunk < 1e-4f);
  CHECK_THROWS_WITH_AS(EncoderWithObjects(fine, *detector, 32, 32, 2, mean, stdev, 4.f, "tags+trunk"),
                       doctest::Contains("needs the detector's trunk output"), Error);
  CHECK_THROWS_WITH_AS(EncoderWithObjects(base, *detector, 4, 4, 3, mean, stdev, 1.f, "labels"),
                       doctest::Contains("object form 'labels' is not maps, tags, both or tags+trunk"), Error);
}

TEST_CASE("detector: the trunk's channels standardized over training rows, the tags as they are") {
  // rows of 5: 2 grid channels, then 3 object channels: a tag, a trunk channel, a trunk channel that never varies
  const std::vector<float> rows = {9, 9, 0.2f, 1.f, 7.f,  //
                                   9, 9, 0.9f, 3.f, 7.f,  //
                                   9, 9, 0.4f, 5.f, 7.f,  //
                                   9, 9, 0.0f, 7.f, 7.f};
  ObjectChannelStats stats(3);
  CHECK_THROWS_WITH_AS(stats.standardization(1, 0.5f), doctest::Contains("no rows"), Error);
  stats.add(rows.data(), 2, 5, 2);
  stats.add(rows.data() + 10, 2, 5, 2);
  CHECK(stats.rows() == 4);
  const ObjectStandardization st = stats.standardization(1, 0.5f);
  REQUIRE(st.on());
  CHECK(st.center == std::vector<float>{0.f, 4.f, 7.f});
  CHECK(st.gain[0] == 1.f);
  CHECK(st.gain[1] == doctest::Approx(0.5 / std::sqrt(5.0)));  // values 1, 3, 5, 7: mean 4, variance 5
  CHECK(st.gain[2] == 1.f);                                      // it never varies: centred, not blown up
  std::vector<float> out = rows;
  st.apply(out.data(), 4, 5, 2);
  double sum = 0, sum_sq = 0;
  for (int r = 0; r < 4; ++r) {
    CHECK(out[r * 5] == 9.f);
    CHECK(out[r * 5 + 1] == 9.f);
    CHECK(out[r * 5 + 2] == rows[r * 5 + 2]);  // the tag as it was
    CHECK(out[r * 5 + 4] == 0.f);
    sum += out[r * 5 + 3], sum_sq += out[r * 5 + 3] * out[r * 5 + 3];
  }
  CHECK(sum / 4 == doctest::Approx(0).epsilon(1e-6));
  CHECK(std::sqrt(sum_sq / 4) == doctest::Approx(0.5));
  CHECK_THROWS_WITH_AS(st.apply(out.data(), 4, 4, 2), doctest::Contains("does not fit rows of 4"), Error);
  CHECK_THROWS_WITH_AS(stats.add(rows.data(), 1, 4, 2), doctest::Contains("do not fit rows of 4"), Error);
  CHECK_THROWS_WITH_AS(stats.standardization(4, 0.5f), doctest::Contains("bad channel range"), Error);
  ObjectStandardization none;
  std::vector<float> same = rows;
  none.apply(same.data(), 4, 3, 7);  // off: nothing to fit, nothing changed
  CHECK(same == rows);
}

TEST_CASE("detector: its files found by name and sha256; missing or altered ones refused naming what was looked for") {
  const std::string shared = std::string(SAT_SHARED_DATA) + "/../models/centernet_mobilenetv3";
  test::TempDir dir;
  set_default_weights_dir("");  // only where this test says
  const std::string none = error_of_loading(dir.path);
  CHECK(none.find("test: needs the object detector's centernet.json (sha256 ") == 0);
  CHECK(none.find("looked in " + dir.path) != std::string::npos);
  CHECK(
      none.find("no such files found (get them with tools/fetch-weights.sh from sat's source, or pass --weights-dir") !=
      std::string::npos);
  if (file_exists(shared + "/centernet.json")) {
    make_dirs(join_path(dir.path, "centernet_mobilenetv3"));
    write_file_atomic(join_path(dir.path, "centernet_mobilenetv3/centernet.json"),
                      read_file(shared + "/centernet.json"));
    std::string bin = read_file(shared + "/centernet.bin");
    bin[1000] ^= 1;  // one bit flipped
    write_file_atomic(join_path(dir.path, "centernet_mobilenetv3/centernet.bin"), bin);
    const std::string altered = error_of_loading(dir.path);
    CHECK(altered.find("found only " + dir.path + "/centernet_mobilenetv3/centernet.bin (4030290 bytes, sha256 ") !=
          std::string::npos);
    CHECK(altered.find("truncated or a different file") != std::string::npos);
    bin[1000] ^= 1;
    write_file_atomic(join_path(dir.path, "centernet_mobilenetv3/centernet.bin"), bin);
    CHECK(error_of_loading(dir.path).empty());
  }
  set_default_weights_dir(std::string(SAT_SHARED_DATA) + "/../models");
}
