// The tfjs importer and the oneDNN network on a small Keras model written here, against a direct (loop) reference
// of Keras semantics: TensorFlow 'same' padding with the odd pixel at the end, average pooling over valid inputs
// only, batch norm with moving statistics, channel concatenation. Plus the JavaScript-literal and base64 readers.
#include <doctest/doctest.h>

#include <cmath>
#include <cstring>
#include <nlohmann/json.hpp>

#include "datasets/io.hpp"
#include "vision/pretrained.hpp"
#include "vision/tfjs.hpp"

using namespace sat;
using nlohmann::json;

TEST_CASE("JavaScript object literals as minifiers write them") {
  std::string js = "x={a:1,b:\"two\",'c':[!0,!1,null,.5,-2e-3],d:{e:void 0}}";
  size_t pos = 2;
  json j = parse_js_literal(js, pos, "t.js");
  CHECK(j["a"] == 1);
  CHECK(j["b"] == "two");
  CHECK(j["c"][0] == true);
  CHECK(j["c"][1] == false);
  CHECK(j["c"][2].is_null());
  CHECK(j["c"][3].get<double>() == doctest::Approx(0.5));
  CHECK(j["c"][4].get<double>() == doctest::Approx(-2e-3));
  CHECK(j["d"]["e"].is_null());
  size_t bad = 2;
  CHECK_THROWS_WITH_AS(parse_js_literal("x={a:1", bad, "t.js"), doctest::Contains("t.js"), Error);
  CHECK(decode_base64("aGVsbG8gd29ybGQ=", 0, 16, "b") == "hello world");
  CHECK_THROWS_AS(decode_base64("aGV*", 0, 4, "b"), Error);
}

namespace {

struct Tensor4 {  // N H W C, as Keras
  int h = 0, w = 0, c = 0;
  std::vector<float> v;
  float& at(int y, int x, int k) { return v[((size_t)y * w + x) * c + k]; }
  float at(int y, int x, int k) const { return v[((size_t)y * w + x) * c + k]; }
};

void same_pad(int in, int k, int s, int& out, int& before) {
  out = (in + s - 1) / s;
  int total = std::max((out - 1) * s + k - in, 0);
  before = total / 2;
}

Tensor4 ref_conv(const Tensor4& x, const std::vector<float>& kernel, int kh, int kw, int f, int stride, bool same,
                 const std::vector<float>& beta, const std::vector<float>& mean, const std::vector<float>& var) {
  Tensor4 y;
  int pt = 0, pl = 0;
  if (same)
    same_pad(x.h, kh, stride, y.h, pt), same_pad(x.w, kw, stride, y.w, pl);
  else
    y.h = (x.h - kh) / stride + 1, y.w = (x.w - kw) / stride + 1;
  y.c = f;
  y.v.assign((size_t)y.h * y.w * f, 0.f);
  for (int oy = 0; oy < y.h; ++oy)
    for (int ox = 0; ox < y.w; ++ox)
      for (int o = 0; o < f; ++o) {
        double acc = 0;
        for (int ky = 0; ky < kh; ++ky)
          for (int kx = 0; kx < kw; ++kx) {
            int iy = oy * stride + ky - pt, ix = ox * stride + kx - pl;
            if (iy < 0 || ix < 0 || iy >= x.h || ix >= x.w) continue;
            for (int c = 0; c < x.c; ++c)
              acc += (double)x.at(iy, ix, c) * kernel[(((size_t)ky * kw + kx) * x.c + c) * f + o];
          }
        double bn = (acc - mean[o]) / std::sqrt((double)var[o] + 1e-3) + beta[o];
        y.at(oy, ox, o) = (float)std::max(bn, 0.0);
      }
  return y;
}

Tensor4 ref_pool(const Tensor4& x, int k, int stride, bool same, bool avg) {
  Tensor4 y;
  int pt = 0, pl = 0;
  if (same)
    same_pad(x.h, k, stride, y.h, pt), same_pad(x.w, k, stride, y.w, pl);
  else
    y.h = (x.h - k) / stride + 1, y.w = (x.w - k) / stride + 1;
  y.c = x.c;
  y.v.assign((size_t)y.h * y.w * y.c, 0.f);
  for (int oy = 0; oy < y.h; ++oy)
    for (int ox = 0; ox < y.w; ++ox)
      for (int c = 0; c < x.c; ++c) {
        double acc = avg ? 0 : -1e30;
        int count = 0;
        for (int ky = 0; ky < k; ++ky)
          for (int kx = 0; kx < k; ++kx) {
            int iy = oy * stride + ky - pt, ix = ox * stride + kx - pl;
            if (iy < 0 || ix < 0 || iy >= x.h || ix >= x.w) continue;
            acc = avg ? acc + x.at(iy, ix, c) : std::max(acc, (double)x.at(iy, ix, c));
            ++count;
          }
        y.at(oy, ox, c) = (float)(avg ? acc / count : acc);
      }
  return y;
}

json conv_layer(const std::string& name, const std::string& input, int f, int k, int s, const std::string& pad) {
  return {{"name", name},
          {"class_name", "Conv2D"},
          {"config",
           {{"name", name},
            {"filters", f},
            {"kernel_size", {k, k}},
            {"strides", {s, s}},
            {"padding", pad},
            {"data_format", "channels_last"},
            {"dilation_rate", {1, 1}},
            {"activation", "linear"},
            {"use_bias", false}}},
          {"inbound_nodes", {{{input, 0, 0, json::object()}}}}};
}
json layer(const std::string& name, const std::string& cls, json cfg, std::vector<std::string> inputs) {
  json in = json::array();
  for (auto& i : inputs) in.push_back({i, 0, 0, json::object()});
  cfg["name"] = name;
  return {{"name", name},
          {"class_name", cls},
          {"config", cfg},
          {"inbound_nodes", inputs.empty() ? json::array() : json::array({in})}};
}

}  // namespace

TEST_CASE("a small Keras model imported from tfjs (model.json + .bin and UMD .min.js) matches Keras semantics") {
  // input 14x14x3 -> conv A 3x3 stride 2 'same' (8) -> [conv B 1x1 (8), conv C 3x3 'same' (16), avgpool 3x3 'same',
  // maxpool 3x3 stride 1 'valid' -> conv D 1x1 (8)] ... concat of B, C, avgpool(A).
  Rng rng(5);
  json layers = json::array();
  layers.push_back(
      layer("input_1", "InputLayer", {{"batch_input_shape", {nullptr, 14, 14, 3}}, {"dtype", "float32"}}, {}));
  struct ConvSpec {
    std::string name, input;
    int f, k, s;
    std::string pad;
  };
  std::vector<ConvSpec> convs = {{"conv_a", "input_1", 8, 3, 2, "same"},
                                 {"conv_b", "act_a", 8, 1, 1, "same"},
                                 {"conv_c", "act_a", 16, 3, 1, "same"}};
  json manifest = json::array();
  std::string bin;
  std::map<std::string, std::vector<float>> w;
  auto add_weight = [&](const std::string& name, std::vector<int64_t> shape, float lo, float hi) {
    std::vector<float> v((size_t)shape_size(shape));
    for (auto& x : v) x = (float)rng.uniform(lo, hi);
    w[name] = v;
    manifest.push_back({{"name", name}, {"shape", shape}, {"dtype", "float32"}});
    bin.append((const char*)v.data(), v.size() * 4);
  };
  std::map<std::string, int> channels = {{"input_1", 3}, {"act_a", 8}};
  for (auto& c : convs) {
    std::string bn = "bn" + c.name.substr(4), act = "act" + c.name.substr(4);
    layers.push_back(conv_layer(c.name, c.input, c.f, c.k, c.s, c.pad));
    layers.push_back(layer(bn, "BatchNormalization",
                           {{"axis", 3}, {"epsilon", 1e-3}, {"center", true}, {"scale", false}}, {c.name}));
    layers.push_back(layer(act, "Activation", {{"activation", "relu"}}, {bn}));
    add_weight(c.name + "/kernel", {c.k, c.k, channels.at(c.input), c.f}, -0.5f, 0.5f);
    add_weight(bn + "/beta", {c.f}, -0.2f, 0.2f);
    add_weight(bn + "/moving_mean", {c.f}, -0.2f, 0.2f);
    add_weight(bn + "/moving_variance", {c.f}, 0.5f, 1.5f);
  }
  layers.push_back(layer("pool_avg", "AveragePooling2D",
                         {{"pool_size", {3, 3}}, {"strides", {1, 1}}, {"padding", "same"}}, {"act_a"}));
  layers.push_back(layer("mixed0", "Concatenate", {{"axis", -1}}, {"act_b", "act_c", "pool_avg"}));
  layers.push_back(layer("pool_max", "MaxPooling2D", {{"pool_size", {3, 3}}, {"strides", {2, 2}}, {"padding", "valid"}},
                         {"mixed0"}));
  layers.push_back(layer("flatten", "Flatten", json::object(), {"pool_max"}));
  json model = {{"modelTopology", {{"class_name", "Model"}, {"config", {{"layers", layers}}}}},
                {"weightsManifest", {{{"paths", {"group1-shard1of1.bin"}}, {"weights", manifest}}}}};
  const std::string dir = "/tmp/sat_test_tfjs";
  make_dirs(dir);
  write_file_atomic(dir + "/model.json", model.dump());
  write_file_atomic(dir + "/group1-shard1of1.bin", bin);

  // Reference: the same network, written out with loops.
  Tensor4 x{14, 14, 3, {}};  // 14 -> 7 with a 3x3 stride-2 'same' conv: one pad pixel, at the end
  x.v.resize(14 * 14 * 3);
  for (auto& v : x.v) v = (float)rng.uniform();
  auto conv = [&](const std::string& name, const Tensor4& in, int f, int k, int s) {
    std::string bn = "bn" + name.substr(4);
    return ref_conv(in, w[name + "/kernel"], k, k, f, s, true, w[bn + "/beta"], w[bn + "/moving_mean"],
                    w[bn + "/moving_variance"]);
  };
  Tensor4 a = conv("conv_a", x, 8, 3, 2), b = conv("conv_b", a, 8, 1, 1), c = conv("conv_c", a, 16, 3, 1);
  Tensor4 p = ref_pool(a, 3, 1, true, true);
  Tensor4 cat{a.h, a.w, 32, {}};
  cat.v.resize((size_t)a.h * a.w * 32);
  for (int y = 0; y < a.h; ++y)
    for (int xx = 0; xx < a.w; ++xx)
      for (int k = 0; k < 32; ++k)
        cat.at(y, xx, k) = k < 8 ? b.at(y, xx, k) : k < 24 ? c.at(y, xx, k - 8) : p.at(y, xx, k - 24);
  Tensor4 expect = ref_pool(cat, 3, 2, false, false);

  auto check = [&](const ImportedNet& net) {
    CHECK(net.dropped.size() == 1);  // flatten
    CHECK(net.graph.cut_points() == std::vector<std::string>{"mixed0"});
    PretrainedEncoder enc(net.graph, net.weights, 14, "t");
    CHECK(enc.grid_h() == expect.h);
    CHECK(enc.channels() == 32);
    std::vector<float> planes(2 * 3 * 14 * 14), grid;
    for (int n = 0; n < 2; ++n)
      for (int ch = 0; ch < 3; ++ch)
        for (int i = 0; i < 14 * 14; ++i) planes[((size_t)n * 3 + ch) * 196 + i] = x.v[(size_t)i * 3 + ch];
    for (int batch : {1, 2}) {
      enc.forward(planes.data(), batch, grid);
      double worst = 0;
      for (int n = 0; n < batch; ++n)
        for (size_t i = 0; i < expect.v.size(); ++i)
          worst = std::max(worst, (double)std::fabs(grid[n * expect.v.size() + i] - expect.v[i]));
      CHECK(worst < 1e-4);
    }
    // bfloat16 (vision/onednn.hpp): the same concatenation (byte offsets into a shared buffer) at half the width.
    // Inputs, weights and each layer's output are rounded to 8 significant bits (relative error up to 2^-9), the
    // sums are float32: three layers deep, a few tenths of a percent of the largest value (measured: see MESSAGE).
    if (!cpu_has_native_bf16()) {
      MESSAGE("bf16 skipped: this CPU has no native bfloat16 (oneDNN: "
              << precision_name(resolve(PrecisionChoice::auto_)) << ")");
      return;
    }
    PretrainedEncoder half(net.graph, net.weights, 14, "t", Precision::bf16);
    CHECK(half.precision() == Precision::bf16);
    double largest = 0;
    for (float v : expect.v) largest = std::max(largest, (double)std::fabs(v));
    for (int batch : {1, 2}) {
      half.forward(planes.data(), batch, grid);
      REQUIRE(grid.size() == batch * expect.v.size());
      double worst = 0;
      for (int n = 0; n < batch; ++n)
        for (size_t i = 0; i < expect.v.size(); ++i)
          worst = std::max(worst, (double)std::fabs(grid[n * expect.v.size() + i] - expect.v[i]));
      MESSAGE("bf16 batch " << batch << ": max |bf16 - reference| " << worst << " of largest " << largest);
      CHECK(worst < 1e-2 * largest);
      CHECK(worst > 0);  // it did run in bfloat16
    }
  };
  check(import_tfjs(dir));

  // Which convolutions were trained last time (Keras's "trainable"; absent means trained): the importer reports
  // the deepest cut point whose every convolution was frozen and the first convolution that was not.
  {
    ImportedNet as_written = import_tfjs(dir);
    CHECK(as_written.first_trained == "act_a");
    CHECK(as_written.frozen_through.empty());
    json marked = model;
    for (auto& l : marked["modelTopology"]["config"]["layers"])
      l["config"]["trainable"] = l["name"] == "bn_c";  // only conv C's batch norm was trained
    write_file_atomic(dir + "/model.json", marked.dump());
    ImportedNet partly = import_tfjs(dir);
    CHECK(partly.first_trained == "act_c");
    CHECK(partly.frozen_through.empty());  // mixed0 holds conv C
    for (auto& l : marked["modelTopology"]["config"]["layers"]) l["config"]["trainable"] = false;
    write_file_atomic(dir + "/model.json", marked.dump());
    ImportedNet frozen = import_tfjs(dir);
    CHECK(frozen.first_trained.empty());
    CHECK(frozen.frozen_through == "mixed0");
    write_file_atomic(dir + "/model.json", model.dump());
  }

  // The same model as nsfwjs ships it: a UMD bundle exporting a JS object literal, and a base64 shard bundle.
  std::string js_model = model.dump();
  for (auto* from_to : {"\"class_name\"", "\"config\""}) {  // unquote some keys, as a minifier does
    std::string f = from_to, t = f.substr(1, f.size() - 2);
    for (size_t pos; (pos = js_model.find(f)) != std::string::npos;) js_model.replace(pos, f.size(), t);
  }
  for (size_t pos; (pos = js_model.find("true")) != std::string::npos;) js_model.replace(pos, 4, "!0");
  const std::string umd = "!function(a){module.exports=a()}(function(){return {1:[function(a,n,i){n.exports=";
  write_file_atomic(dir + "/model.json", "");  // so the directory lookup must find model.min.js
  std::remove((dir + "/model.json").c_str());
  std::remove((dir + "/group1-shard1of1.bin").c_str());
  write_file_atomic(dir + "/model.min.js", umd + js_model + "},{}]}});");
  static const char* b64 = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
  std::string enc64;
  for (size_t i = 0; i < bin.size(); i += 3) {
    uint32_t v = (uint8_t)bin[i] << 16 | (i + 1 < bin.size() ? (uint8_t)bin[i + 1] << 8 : 0) |
                 (i + 2 < bin.size() ? (uint8_t)bin[i + 2] : 0);
    enc64 += b64[v >> 18], enc64 += b64[(v >> 12) & 63];
    enc64 += i + 1 < bin.size() ? b64[(v >> 6) & 63] : '=';
    enc64 += i + 2 < bin.size() ? b64[v & 63] : '=';
  }
  write_file_atomic(dir + "/group1-shard1of1.bin.min.js", umd + "\"" + enc64 + "\"},{}]}});");
  check(import_tfjs(dir));

  // A shard cut short: the error names the model file and says what is missing.
  write_file_atomic(dir + "/group1-shard1of1.bin.min.js",
                    umd + "\"" + enc64.substr(0, enc64.size() / 2) + "\"},{}]}});");
  CHECK_THROWS_WITH_AS(import_tfjs(dir), doctest::Contains("truncated or missing shard"), Error);
  std::remove((dir + "/group1-shard1of1.bin.min.js").c_str());
  CHECK_THROWS_WITH_AS(import_tfjs(dir), doctest::Contains("shard not found"), Error);
}

TEST_CASE("a layer the importer cannot run is named with its class when the trunk reads it") {
  json layers = json::array();
  layers.push_back(
      layer("input_1", "InputLayer", {{"batch_input_shape", {nullptr, 16, 16, 3}}, {"dtype", "float32"}}, {}));
  layers.push_back(layer("Conv1_pad", "ZeroPadding2D", {{"padding", {{0, 1}, {0, 1}}}}, {"input_1"}));
  layers.push_back(conv_layer("Conv1", "Conv1_pad", 8, 3, 2, "valid"));
  json model = {{"modelTopology", {{"class_name", "Model"}, {"config", {{"layers", layers}}}}},
                {"weightsManifest", json::array()}};
  const std::string dir = "/tmp/sat_test_tfjs_pad";
  make_dirs(dir);
  write_file_atomic(dir + "/model.json", model.dump());
  CHECK_THROWS_WITH_AS(
      import_tfjs(dir),
      doctest::Contains("layer 'Conv1' (Conv2D) reads layer 'Conv1_pad' (ZeroPadding2D), which is not supported"),
      Error);
}
