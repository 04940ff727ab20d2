#include "vision/pretrained.hpp"

#include <algorithm>
#include <cmath>
#include <climits>
#include <list>
#include <memory>
#include <thread>
#include <atomic>
#include <exception>
#include <omp.h>
#include <type_traits>
#include <cstring>
#include <future>
#include <oneapi/dnnl/dnnl.hpp>

#include "datasets/json_checks.hpp"
#include "datasets/sha256.hpp"
#include "datasets/shipped.hpp"
#include "vision/onednn.hpp"
#include "vision/resnet.hpp"

namespace sat {

using namespace dnnl;
using tag = memory::format_tag;
using dt = memory::data_type;

std::map<std::string, std::vector<int64_t>> pretrained_tensor_shapes(const NetGraph& g) {
  std::map<std::string, int> channels;
  std::map<std::string, std::vector<int64_t>> out;
  for (auto& n : g.nodes) {
    if (n.op == "input") {
      channels[n.name] = 3;
    } else if (n.op == "concat") {
      int c = 0;
      for (auto& in : n.inputs) c += channels.at(in);
      channels[n.name] = c;
    } else if (n.op == "conv") {
      int cin = channels.at(n.inputs[0]), f = n.filters;
      out[n.kernel] =
          n.kernel_ohwi ? std::vector<int64_t>{f, n.kh, n.kw, cin} : std::vector<int64_t>{n.kh, n.kw, cin, f};
      if (!n.bias.empty()) out[n.bias] = {f};
      if (!n.bn.empty()) {
        for (const char* s : {"/beta", "/moving_mean", "/moving_variance"}) out[n.bn + s] = {f};
        if (n.bn_scale) out[n.bn + "/gamma"] = {f};
      }
      channels[n.name] = f;
    } else if (n.op == "affine") {
      const int c = channels.at(n.inputs[0]);
      out[n.scale] = {c};
      out[n.offset] = {c};
      channels[n.name] = c;
    } else {
      channels[n.name] = channels.at(n.inputs[0]);
    }
  }
  return out;
}

FloatBuffer pretrained_tensor(const TensorFile& tf, const std::string& name, const std::vector<int64_t>& shape,
                              const std::string& where) {
  auto q = tf.quantized.find(name);
  if (q != tf.quantized.end()) {
    if (q->second.shape != shape)
      fail(where, "tensor '" + name + "' has shape " + shape_str(q->second.shape) + ", expected " + shape_str(shape));
    return q->second.dequantize();
  }
  auto h = tf.mapped_half.find(name);
  if (h != tf.mapped_half.end()) {
    if (h->second.shape != shape)
      fail(where, "tensor '" + name + "' has shape " + shape_str(h->second.shape) + ", expected " + shape_str(shape));
    return h->second.to_floats();
  }
  const Param& p = tf.get(name, where);
  if (p.shape != shape)
    fail(where, "tensor '" + name + "' has shape " + shape_str(p.shape) + ", expected " + shape_str(shape));
  return p.value;
}

FoldedConv fold_conv(const NetNode& n, const TensorFile& weights,
                     const std::map<std::string, std::vector<int64_t>>& expected, const std::string& where) {
  // Fold batch norm (inference statistics) into the convolution:
  //   y = gamma * (conv(x) + b - mean) / sqrt(var + eps) + beta  =  conv'(x) + b'
  auto kshape = expected.at(n.kernel);
  const int KH = (int)kshape[n.kernel_ohwi ? 1 : 0], KW = (int)kshape[n.kernel_ohwi ? 2 : 1],
            CI = (int)kshape[n.kernel_ohwi ? 3 : 2], CO = (int)kshape[n.kernel_ohwi ? 0 : 3];
  FloatBuffer k = pretrained_tensor(weights, n.kernel, kshape, where);
  std::vector<double> factor(CO, 1.0), bias(CO, 0.0);
  if (!n.bias.empty()) {
    FloatBuffer b = pretrained_tensor(weights, n.bias, {CO}, where);
    for (int o = 0; o < CO; ++o) bias[o] = b[o];
  }
  if (!n.bn.empty()) {
    FloatBuffer beta = pretrained_tensor(weights, n.bn + "/beta", {CO}, where);
    FloatBuffer mean = pretrained_tensor(weights, n.bn + "/moving_mean", {CO}, where);
    FloatBuffer var = pretrained_tensor(weights, n.bn + "/moving_variance", {CO}, where);
    FloatBuffer gamma = n.bn_scale ? pretrained_tensor(weights, n.bn + "/gamma", {CO}, where) : FloatBuffer(CO, 1.f);
    for (int o = 0; o < CO; ++o) {
      factor[o] = gamma[o] / std::sqrt((double)var[o] + n.bn_epsilon);
      bias[o] = (bias[o] - mean[o]) * factor[o] + beta[o];
    }
  }
  FoldedConv f;
  f.out = CO, f.in = CI, f.kh = KH, f.kw = KW;
  if (n.bn.empty() && n.kernel_ohwi) {  // nothing to fold (TF-slim's ResNet): OHWI -> OIHW alone
    f.bias.resize(CO);
    for (int o = 0; o < CO; ++o) f.bias[o] = (float)bias[o];
    if (KH == 1 && KW == 1) {  // the same layout
      f.weight = std::move(k);
      return f;
    }
    f.weight.resize((size_t)CO * CI * KH * KW);
    for (int o = 0; o < CO; ++o)
      for (int y = 0; y < KH; ++y)
        for (int x = 0; x < KW; ++x)
          for (int c = 0; c < CI; ++c)  // read in order
            f.weight[(((size_t)o * CI + c) * KH + y) * KW + x] = k[(((size_t)o * KH + y) * KW + x) * CI + c];
    return f;
  }
  f.weight.resize((size_t)CO * CI * KH * KW);
  f.bias.resize(CO);
  for (int o = 0; o < CO; ++o) {
    f.bias[o] = (float)bias[o];
    for (int c = 0; c < CI; ++c)
      for (int y = 0; y < KH; ++y)
        for (int x = 0; x < KW; ++x) {  // HWIO or OHWI -> OIHW
          const size_t from =
              n.kernel_ohwi ? (((size_t)o * KH + y) * KW + x) * CI + c : (((size_t)y * KW + x) * CI + c) * CO + o;
          f.weight[(((size_t)o * CI + c) * KH + y) * KW + x] = (float)(k[from] * factor[o]);
        }
  }
  return f;
}

static const char* kEncoderFormat = "sat-encoder";

void save_pretrained_net(const std::string& path, const PretrainedNet& net) {
  TensorFile tf = net.weights;
  tf.metadata["format"] = kEncoderFormat;
  tf.metadata["version"] = "1";
  tf.metadata["graph"] = net.graph.to_json().dump();
  tf.metadata["input"] = nlohmann::json{{"size", net.input_size},
                                        {"mean", {net.mean[0], net.mean[1], net.mean[2]}},
                                        {"std", {net.stdev[0], net.stdev[1], net.stdev[2]}}}
                             .dump();
  tf.metadata["info"] = net.info.dump();
  save_safetensors(path, tf);
}

// Source: const TensorFile (the tensors are copied) or TensorFile (they are moved out).
template <typename Source>
static TensorFile select_from(const NetGraph& graph, Source& all, const std::string& where) {
  constexpr bool take = !std::is_const_v<Source>;
  TensorFile out;
  for (auto& [name, shape] : pretrained_tensor_shapes(graph)) {
    auto check = [&, &name = name, &shape = shape](const std::vector<int64_t>& got) {
      if (got != shape)
        fail(where, "tensor '" + name + "' has shape " + shape_str(got) + ", expected " + shape_str(shape));
    };
    auto q = all.quantized.find(name);
    if (q != all.quantized.end()) {
      check(q->second.shape);
      if constexpr (take)
        out.quantized[name] = std::move(q->second);
      else
        out.quantized[name] = q->second;
      continue;
    }
    auto h = all.mapped_half.find(name);
    if (h != all.mapped_half.end()) {  // a view: copying it copies no values
      check(h->second.shape);
      out.mapped_half[name] = h->second;
      continue;
    }
    auto t = all.tensors.find(name);
    if (t == all.tensors.end()) fail(where, "missing tensor '" + name + "'");
    check(t->second.shape);
    Param p;  // the values only: no gradient
    p.name = name, p.shape = t->second.shape, p.trainable = false;
    if constexpr (take)
      p.value = std::move(t->second.value);
    else
      p.value = t->second.value;
    out.tensors.emplace(name, std::move(p));
  }
  if constexpr (take) all = TensorFile();
  return out;
}

TensorFile select_tensors(const NetGraph& graph, TensorFile&& all, const std::string& where) {
  return select_from(graph, all, where);
}

TensorFile select_tensors(const NetGraph& graph, const TensorFile& all, const std::string& where) {
  return select_from(graph, all, where);
}

static std::string base_name(const std::string& path) {
  const size_t slash = path.find_last_of('/');
  return slash == std::string::npos ? path : path.substr(slash + 1);
}

static PretrainedNet resnet_v2_net(TensorFile&& tf, const std::string& path, const std::string& sha256) {
  PretrainedNet net;
  const auto metadata = tf.metadata;
  net.graph = resnet_v2_graph(tf, path);
  net.weights = select_tensors(net.graph, std::move(tf), path);
  net.input_size = 299;                                                 // what TF-slim's ResNet v2 was trained at
  for (int i = 0; i < 3; ++i) net.mean[i] = 0.5f, net.stdev[i] = 0.5f;  // x / 127.5 - 1
  net.info = nlohmann::json::object();
  for (auto& [k, v] : metadata) net.info[k] = v;
  net.info["weights_file"] = base_name(path);
  net.info["sha256"] = sha256;
  net.external_file = base_name(path);
  net.external_sha256 = sha256;
  return net;
}

PretrainedNet load_pretrained_net(const std::string& path) {
  TensorFile tf;
  std::string sha256;
  {
    auto file = std::make_shared<const MappedFile>(path);
    tf = decode_mapped_safetensors(file);
    if (is_resnet_v2(tf)) sha256 = sha256_hex(file->data(), file->size());
  }
  // An imported ResNet's float16 kernels stay in the mapped file until the encoder reorders them; every other
  // network's tensors are float32 in memory, as its code expects.
  if (!sha256.empty()) return resnet_v2_net(std::move(tf), path, sha256);
  tf.convert_mapped_half();
  auto it = tf.metadata.find("format");
  if (it == tf.metadata.end() || it->second != kEncoderFormat)
    fail(path, "not a sat encoder file (no \"format\": \"" + std::string(kEncoderFormat) +
                   "\"; import one with sat import-tfjs)");
  if (tf.meta("version", path) != "1")
    fail(path, "encoder file version " + tf.meta("version", path) + " is not supported");
  PretrainedNet net;
  try {
    net.graph = NetGraph::from_json(parse_json_checked(tf.meta("graph", path), path, "encoder header is malformed"));
    auto in = parse_json_checked(tf.meta("input", path), path, "encoder header is malformed");
    net.input_size = in.at("size").get<int>();
    auto m = in.at("mean").get<std::vector<float>>(), s = in.at("std").get<std::vector<float>>();
    if (m.size() != 3 || s.size() != 3) throw Error("input mean/std need 3 values");
    for (int i = 0; i < 3; ++i) net.mean[i] = m[i], net.stdev[i] = s[i];
    net.info = parse_json_checked(tf.meta("info", path), path, "encoder header is malformed");
  } catch (const Error& e) {
    std::string msg = e.what();
    if (msg.rfind(path, 0) == 0) throw;
    fail(path, msg);
  } catch (const std::exception& e) {
    fail(path, std::string("encoder header is malformed (") + e.what() + ")");
  }
  net.weights = select_tensors(net.graph, tf, path);  // checks every tensor is present with its shape
  return net;
}

static std::string& weights_dir_flag() {
  static std::string dir;
  return dir;
}
std::string weights_cache_dir() {
  if (const char* cache = std::getenv("XDG_CACHE_HOME"); cache && *cache) return join_path(cache, "sat/weights");
  if (const char* home = std::getenv("HOME"); home && *home) return join_path(home, ".cache/sat/weights");
  return "";
}
// The shipped folder, then where tools/fetch-weights.sh puts what it fetches: both found with no flag.
static std::vector<std::string>& default_weights_dirs() {
  static std::vector<std::string> dirs = [] {
    std::vector<std::string> d{shipped_weights_dir()};
    if (std::string cache = weights_cache_dir(); !cache.empty()) d.push_back(cache);
    return d;
  }();
  return dirs;
}
void set_weights_dir(const std::string& dir) {
  weights_dir_flag() = dir;
}
void set_default_weights_dir(const std::string& dir) {
  default_weights_dirs() = dir.empty() ? std::vector<std::string>{} : std::vector<std::string>{dir};
}

std::vector<std::string> weights_search_dirs(const std::string& weights_dir) {
  std::vector<std::string> dirs;
  const std::string& first = weights_dir.empty() ? weights_dir_flag() : weights_dir;
  if (!first.empty()) dirs.push_back(first);
  if (const char* env = std::getenv("SAT_WEIGHTS"); env && *env) dirs.push_back(env);
  for (const std::string& dir : default_weights_dirs())
    if (!dir.empty()) dirs.push_back(dir);
  return dirs;
}

static std::vector<std::string> weights_candidates(const std::string& file, const std::string& weights_dir) {
  const std::string stem = file.substr(0, file.find('.'));
  std::vector<std::string> out;
  for (const std::string& dir : weights_search_dirs(weights_dir))
    for (const std::string& candidate : {join_path(dir, file), join_path(join_path(dir, stem), file)})
      out.push_back(candidate);
  return out;
}

static std::future<std::string> sha256_on_a_thread(std::shared_ptr<const MappedFile> file) {
  return std::async(std::launch::async, [file] { return sha256_hex(file->data(), file->size()); });
}

struct WeightsHashHeadStart {
  std::string path;
  std::shared_ptr<const MappedFile> file;
  std::future<std::string> sha256;
};

std::shared_ptr<WeightsHashHeadStart> start_weights_hash(const std::string& file, const std::string& weights_dir) {
  for (const std::string& candidate : weights_candidates(file, weights_dir)) {
    if (!file_exists(candidate)) continue;
    auto out = std::make_shared<WeightsHashHeadStart>();
    out->path = candidate;
    try {
      out->file = std::make_shared<const MappedFile>(candidate);
    } catch (const Error&) {
      return nullptr;  // load_external_weights names it as unreadable
    }
    out->sha256 = sha256_on_a_thread(out->file);
    return out;
  }
  return nullptr;
}

TensorFile load_external_weights(const std::string& file, const std::string& sha256, const std::string& model_path,
                                 std::string* found, const std::string& weights_dir,
                                 const std::shared_ptr<WeightsHashHeadStart>& head_start) {
  const std::vector<std::string> dirs = weights_search_dirs(weights_dir);
  std::string looked;
  for (const std::string& candidate : weights_candidates(file, weights_dir)) {
    if (!file_exists(candidate)) continue;
    std::shared_ptr<const MappedFile> file;
    std::future<std::string> hashing;
    if (head_start && head_start->path == candidate && head_start->sha256.valid()) {
      file = head_start->file;
      hashing = std::move(head_start->sha256);
    } else {
      try {
        file = std::make_shared<const MappedFile>(candidate);
      } catch (const Error& e) {
        looked += (looked.empty() ? "" : "; ") + candidate + " (unreadable)";
        continue;
      }
      hashing = sha256_on_a_thread(file);
    }
    // The hash runs beside the decoding (two cores); a wrong file is refused before anything uses it.
    TensorFile tf;
    std::string decode_error;
    try {
      tf = decode_mapped_safetensors(file);  // its float16 kernels stay mapped (MappedHalfTensor)
    } catch (const Error& e) {
      decode_error = e.what();
    }
    const std::string got = hashing.get();
    if (got != sha256) {
      looked += (looked.empty() ? "" : "; ") + candidate + " (" + std::to_string(file->size()) + " bytes, sha256 " +
                got + ": truncated or a different file)";
      continue;
    }
    if (!decode_error.empty()) throw Error(decode_error);  // the right bytes, yet unreadable: cannot happen
    if (found) *found = candidate;
    return tf;
  }
  std::string where;
  if (weights_dir.empty() && weights_dir_flag().empty()) where += "--weights-dir not given; ";
  if (!std::getenv("SAT_WEIGHTS") || !*std::getenv("SAT_WEIGHTS")) where += "$SAT_WEIGHTS not set; ";
  for (const std::string& dir : dirs) where += "looked in " + dir + "; ";
  fail(model_path, "needs the encoder weights " + file + " (sha256 " + sha256 + "): " + where +
                       (looked.empty() ? "no such file found" : "found only " + looked) + " (" + kFetchHint +
                       ", or pass --weights-dir DIR or set SAT_WEIGHTS to the folder that holds it)");
}

std::vector<int> int8_activation_nodes(const NetGraph& g) {
  const int count = (int)g.nodes.size();
  std::map<std::string, int> at;
  std::vector<std::vector<int>> readers(count);
  for (int i = 0; i < count; ++i) {
    at[g.nodes[i].name] = i;
    for (auto& in : g.nodes[i].inputs) readers[at.at(in)].push_back(i);
  }
  std::vector<int> out;
  for (int i = 0; i < count; ++i) {
    const NetNode& node = g.nodes[i];
    if ((node.op != "conv" && node.op != "affine") || !node.relu || readers[i].empty()) continue;
    bool convs_only = true;
    for (int r : readers[i]) convs_only = convs_only && g.nodes[r].op == "conv";
    if (convs_only) out.push_back(i);
  }
  return out;
}

Int8Ranges choose_int8_ranges(const std::map<std::string, std::vector<float>>& samples) {
  Int8Ranges out;
  for (auto& [name, values] : samples) {
    float top = 0.f;
    for (float v : values) top = std::max(top, v);
    if (!(top > 0.f) || !std::isfinite(top)) {
      out[name] = 1.f;
      continue;
    }
    double best_err = -1, best = top;
    double clip = top;
    for (int k = 0; k < 80; ++k, clip *= 0.96) {
      const double step = clip / 255.0;
      double err = 0;
      for (float v : values) {
        const double x = std::max(0.0, (double)v);
        const double q = x >= clip ? clip : std::nearbyint(x / step) * step;
        err += (x - q) * (x - q);
      }
      if (best_err < 0 || err < best_err) best_err = err, best = clip;
    }
    out[name] = (float)best;
  }
  return out;
}

nlohmann::json int8_ranges_to_json(const Int8Ranges& r) {
  nlohmann::json j = nlohmann::json::object();
  for (auto& [name, v] : r) j[name] = v;
  return j;
}

Int8Ranges int8_ranges_from_json(const nlohmann::json& j) {
  if (!j.is_object()) throw Error("int8 ranges are not an object of node names");
  Int8Ranges r;
  for (auto& [name, v] : j.items()) {
    if (!v.is_number()) throw Error("int8 range of '" + name + "' is not a number");
    const float x = v.get<float>();
    if (!std::isfinite(x) || !(x > 0.f)) throw Error("int8 range of '" + name + "' is not finite and positive");
    r[name] = x;
  }
  return r;
}

PretrainedEncoder::PretrainedEncoder(const NetGraph& graph, TensorFile weights, int input_size,
                                     const std::string& where, Precision precision, Int8Ranges int8_ranges)
    : PretrainedEncoder(graph, std::make_shared<const TensorFile>(std::move(weights)), input_size, where,
                        precision, std::move(int8_ranges)) {}

PretrainedEncoder::PretrainedEncoder(const NetGraph& graph, std::shared_ptr<const TensorFile> shared, int input_size,
                                     const std::string& where, Precision precision,
                                     Int8Ranges int8_ranges)
    : graph_(graph),
      shared_(std::move(shared)),
      input_size_(input_size),
      precision_(precision),
      int8_ranges_(std::move(int8_ranges)),
      int8_nodes_(int8_activation_nodes(graph_)) {
  if (!shared_) shared_ = std::make_shared<const TensorFile>();
  if (precision_ == Precision::int8) {
    for (auto& node : graph_.nodes)
      if (node.op == "concat")
        fail(where, "int8 runs ResNet v2 trunks only (this network concatenates, at '" + node.name + "')");
    for (int i : int8_nodes_) {
      auto r = int8_ranges_.find(graph_.nodes[i].name);
      if (r == int8_ranges_.end())
        fail(where, "int8 needs the activation range of '" + graph_.nodes[i].name +
                        "' (calibrate the model on photos: sat model calibrate)");
      if (!std::isfinite(r->second) || !(r->second > 0.f))
        fail(where, "int8 activation range of '" + graph_.nodes[i].name + "' is not finite and positive");
    }
  }
  try {
    shapes_ = graph_.shapes(input_size, input_size);
  } catch (const Error& e) {
    fail(where, e.what());
  }
  grid_h_ = shapes_.back().h, grid_w_ = shapes_.back().w, channels_ = shapes_.back().c;
  macs_ = graph_.conv_macs(input_size, input_size);
  auto expected = pretrained_tensor_shapes(graph_);
  for (size_t i = 0; i < graph_.nodes.size(); ++i) {
    const NetNode& node = graph_.nodes[i];
    if (node.op == "conv") {
      const TensorFile& W = *shared_;
      const bool kernel_as_is = W.tensors.count(node.kernel) || W.mapped_half.count(node.kernel);
      auto b = W.tensors.find(node.bias);
      if (node.bn.empty() && node.kernel_ohwi && kernel_as_is && b != W.tensors.end()) {
        // Nothing to fold (TF-slim's export folded its batch norms): oneDNN reorders the OHWI kernel as it is
        // (float16 kernels left in the mapped file are converted there, one at a time).
        if (*W.shape_of(node.kernel) != expected.at(node.kernel) || b->second.shape != expected.at(node.bias))
          fold_conv(node, W, expected, where);  // names the tensor and the shapes
        continue;
      }
      FoldedConv f = fold_conv(node, W, expected, where);
      conv_w_[(int)i] = std::move(f.weight);
      conv_b_[(int)i] = std::move(f.bias);
    } else if (node.op == "affine") {
      const TensorFile& W = *shared_;
      scale_[(int)i] = pretrained_tensor(W, node.scale, expected.at(node.scale), where);
      shift_[(int)i] = pretrained_tensor(W, node.offset, expected.at(node.offset), where);
      if ((int)zeros_.size() < shapes_[i].c) zeros_.assign(shapes_[i].c, 0.f), ones_.assign(shapes_[i].c, 1.f);
    }
  }
}

PretrainedEncoder::~PretrainedEncoder() = default;

struct PretrainedEncoder::Plan {
  memory image, grid;
  std::vector<memory> out;  // per node: its output (a view into a pooled buffer, or into another node's buffer)
  std::vector<memory> conv_w, conv_b, scale, shift, mean, variance;
  std::vector<memory> image_copies;  // the image in the layout a first convolution prefers
  // int8 pre-activations' scale and offset in units of their output's step (a list: addresses stay put)
  std::list<FloatBuffer> weights;
  // per node: a convolution's weights as reordered (written whole by the reorder), and an int8 one's bias in units
  // of its accumulator
  std::vector<std::unique_ptr<UnwrittenFloats>> reordered;
  std::vector<FloatBuffer> int8_bias;
  std::vector<FloatBuffer> pool;  // activation buffers, each reused by layers whose lifetimes do not overlap
  std::vector<std::pair<primitive, std::unordered_map<int, memory>>> steps;
  std::vector<int> step_node;  // per step: the node whose output it writes, -1 for a reorder
  struct Builder;              // plan_for's steps
};

// Which buffer each node writes, and when each buffer is live, so that buffers are shared by layers whose
// lifetimes do not overlap (ResNet-101 has over 300 nodes; one buffer each would take gigabytes at batch 8).
//  - owner[i]: the node whose buffer holds node i's output (itself, a concatenation it is a slice of, or the
//    shortcut a residual sum accumulates into); offset[i]: its first channel there.
//  - fused[i]: for a residual sum i, the convolution that adds its result into the shortcut's buffer (oneDNN's sum
//    post-op) at i's place in the order, -1 when a binary primitive adds them; sum_of[r]: that sum (r runs there),
//    -1 for every other node.
struct BufferPlan {
  std::vector<int> owner, offset, fused, sum_of;
};

// The largest |x| of n floats, in 16 lanes so the loop vectorizes (a max reduction does not, without -ffast-math).
float max_abs(const float* x, size_t n) {
  float lanes[16] = {};
  size_t k = 0;
  for (; k + 16 <= n; k += 16)
    for (int j = 0; j < 16; ++j) lanes[j] = std::max(lanes[j], std::fabs(x[k + j]));
  for (; k < n; ++k) lanes[0] = std::max(lanes[0], std::fabs(x[k]));
  return *std::max_element(lanes, lanes + 16);
}

// to[k] = x[k] * inv rounded to the nearest integer, ties to even, as lrintf did (|x[k] * inv| <= 127 here). lrintf
// may set errno, so without -fno-math-errno it stays a libm call per weight; rintf never does, and compiles to a
// vector rounding instruction (SSE4.1 and later): 42 M weights are quantized when an int8 network is built.
void quantize_int8(const float* x, size_t n, float inv, int8_t* to) {
  for (size_t k = 0; k < n; ++k) to[k] = (int8_t)(int)std::rint(x[k] * inv);
}

static BufferPlan plan_buffers(const NetGraph& g, const std::vector<NodeShape>& shapes, int n, int block) {
  const auto& nodes = g.nodes;
  const int count = (int)nodes.size();
  std::map<std::string, int> at;
  std::vector<std::vector<int>> readers(count);
  for (int i = 0; i < count; ++i) {
    at[nodes[i].name] = i;
    for (auto& in : nodes[i].inputs) readers[at.at(in)].push_back(i);
  }
  BufferPlan b;
  b.owner.resize(count);
  b.offset.assign(count, 0);
  b.fused.assign(count, -1);
  b.sum_of.assign(count, -1);
  for (int i = 0; i < count; ++i) b.owner[i] = i;
  // In-place concatenation: in the blocked layout at batch 1, channels [off, off + C) of a tensor are one
  // contiguous run laid out exactly like a dense C-channel tensor, so an input that only feeds the concatenation
  // (at an offset that is a multiple of the block) can be produced directly at that address.
  for (int i = count - 1; i >= 0; --i) {
    if (nodes[i].op != "concat" || n != 1 || block <= 1) continue;
    bool eligible = b.offset[i] % block == 0;
    for (auto& in : nodes[i].inputs) {
      int k = at.at(in);
      eligible = eligible && readers[k].size() == 1 && nodes[k].op != "input" && nodes[k].op != "add" &&
                 shapes[k].c % block == 0;
    }
    if (!eligible) continue;  // then a concat primitive copies every input
    int off = 0;
    for (auto& in : nodes[i].inputs) {
      int k = at.at(in);
      b.owner[k] = b.owner[i];
      b.offset[k] = b.offset[i] + off;
      off += shapes[k].c;
    }
  }
  // Residual sums: out = a + r with r a convolution read by nothing else. r runs late, at the sum's place, with
  // a's buffer as its destination and the sum post-op, when nothing reads a after the sum (ResNet v2: the shortcut
  // x is read by the next unit's pre-activation first) and a has a buffer of its own.
  for (int i = 0; i < count; ++i) {
    if (nodes[i].op != "add") continue;
    for (int k : {1, 0}) {
      const int r = at.at(nodes[i].inputs[k]), a = at.at(nodes[i].inputs[1 - k]);
      if (nodes[r].op != "conv" || nodes[r].relu || readers[r].size() != 1 || b.sum_of[r] >= 0) continue;
      // a must own a whole buffer: not a slice of a concatenation (a residual sum shares its shortcut's whole one)
      const bool whole = b.owner[a] == a || nodes[a].op == "add";
      if (nodes[a].op == "input" || !whole || b.owner[i] != i || a == r) continue;
      bool last_reader = true;
      for (int j : readers[a]) last_reader = last_reader && (j == i || (j < i && b.sum_of[j] < 0));
      if (!last_reader) continue;
      b.fused[i] = r;
      b.sum_of[r] = i;
      b.owner[i] = a;
      b.owner[r] = a;  // r's output exists only as its part of the sum
      break;
    }
  }
  return b;
}

// Builds the plan of one batch size, in the order plan_for calls its steps: each node's data type and layout (at
// construction), the execution order, the activation buffers, each node's steps, the convolutions (two at a time)
// and the final reorder to the grid. A nested class of the plan, so it reads the encoder's weights and settings.
struct PretrainedEncoder::Plan::Builder {
  // A convolution's descriptor and attributes (the sum and ReLU post-ops; int8 adds its output scales later).
  struct ConvShape {
    convolution_forward::desc desc;
    primitive_attr attr;
  };
  struct ConvJob {
    int node, src;
    size_t step;  // its place in P.steps
    memory conv_src;
  };

  Builder(PretrainedEncoder& encoder, int n, Plan& plan);
  float quant_step(int i) const { return E.int8_ranges_.at(nodes[i].name) / 255.f; }  // value of one u8 step
  memory::desc blocked(int i) const {
    return memory::desc({n, E.shapes_[i].c, E.shapes_[i].h, E.shapes_[i].w}, node_type[i], act);
  }
  static size_t floats_for(size_t bytes) { return (bytes + sizeof(float) - 1) / sizeof(float); }
  int root(int i) const {  // the node that owns the buffer i writes into, following chains of owners
    while (B.owner[i] != i) i = B.owner[i];
    return i;
  }
  void order_execution();
  void assign_buffers();
  void place_outputs();
  ConvShape conv_shape(int i, int src) const;
  void add_steps();
  void label_steps();
  void add_conv_step(int i, int src);
  void add_pooling_step(int i, int src);
  void add_int8_affine_step(int i, int src);
  void add_affine_step(int i, int src);
  void add_sum_step(int i, int src);
  void add_concat_step(int i);
  float* kernel_floats(int i, const TensorFile& W, FloatBuffer& scratch) const;
  std::vector<float> int8_weight_steps(int i, size_t per_out, const float* w_data, float sx,
                                       primitive_attr& attr) const;
  void reorder_weights(int i, memory& user_w, const memory::desc& w_blocked, dnnl::stream& strm) const;
  void build_conv(const ConvJob& job, FloatBuffer& scratch, dnnl::stream& strm) const;
  void build_convs();
  void add_grid_reorder();

  PretrainedEncoder& E;
  const int n;  // images per batch
  Plan& P;
  engine& eng;
  const std::vector<NetNode>& nodes;
  const int count;
  const tag act;
  const bool int8;
  const dt type;
  const size_t value_bytes;
  std::vector<dt> node_type;
  const dt float_conv_type;
  const BufferPlan B;
  std::map<std::string, int> at;  // node index by name
  std::vector<int> order;         // execution order
  std::vector<int> slot_of;       // per buffer owner: its slot in P.pool
  std::vector<ConvJob> conv_jobs;
  int labelled_node = -1;
  size_t labelled_from = 0;
};

// int8: the nodes int8_activation_nodes lists are u8, every other one float32; a convolution reading float32
// (the root one, from the image) computes in bf16 where the CPU has it natively.
PretrainedEncoder::Plan::Builder::Builder(PretrainedEncoder& encoder, int n, Plan& plan)
    : E(encoder),
      n(n),
      P(plan),
      eng(cpu_engine()),
      nodes(encoder.graph_.nodes),
      count((int)nodes.size()),
      act(activation_tag(encoder.precision_)),
      int8(encoder.precision_ == Precision::int8),
      type(encoder.precision_ == Precision::bf16 ? dt::bf16 : dt::f32),
      value_bytes(encoder.precision_ == Precision::bf16 ? 2 : 4),  // (int8 has no concatenations to offset into)
      node_type(count, type),
      float_conv_type(int8 ? (cpu_prefers_bf16() ? dt::bf16 : dt::f32) : type),
      B(plan_buffers(encoder.graph_, encoder.shapes_, n, activation_block(encoder.precision_))) {
  if (int8)
    for (int i : E.int8_nodes_) node_type[i] = dt::u8;
  for (int i = 0; i < count; ++i) at[nodes[i].name] = i;
}

// Execution order: node order, with each deferred convolution moved to its residual sum.
void PretrainedEncoder::Plan::Builder::order_execution() {
  for (int i = 0; i < count; ++i) {
    if (B.sum_of[i] >= 0) continue;
    if (B.fused[i] >= 0) order.push_back(B.fused[i]);
    order.push_back(i);
  }
}

// The pooled activation buffers (P.pool) and which one each buffer owner writes (slot_of).
void PretrainedEncoder::Plan::Builder::assign_buffers() {
  std::vector<int> when(count);
  for (size_t p = 0; p < order.size(); ++p) when[order[p]] = (int)p;
  // Each owned buffer lives from its first write to its last read (the last node is read by the final reorder).
  std::vector<int> first(count, INT32_MAX), last(count, -1);
  for (int i = 1; i < count; ++i) {
    const int o = root(i);
    first[o] = std::min(first[o], when[i]);
    last[o] = std::max(last[o], when[i]);
    for (auto& in : nodes[i].inputs) {
      const int j = at.at(in), oj = root(j);
      if (j != 0) last[oj] = std::max(last[oj], when[i]);
    }
  }
  last[root(count - 1)] = (int)order.size();
  // Greedy assignment to pooled buffers: at each step, the buffers first written then take a free slot (the
  // smallest that fits, else a new one); slots whose buffer was read for the last time come free after it.
  slot_of.assign(count, -1);
  std::vector<size_t> slot_bytes;
  std::vector<bool> slot_free;
  for (size_t p = 0; p <= order.size(); ++p) {
    for (int o = 1; o < count; ++o) {
      if (root(o) != o || first[o] != (int)p) continue;
      const size_t bytes = blocked(o).get_size();
      int best = -1;
      for (size_t s = 0; s < slot_bytes.size(); ++s)
        if (slot_free[s] && slot_bytes[s] >= bytes && (best < 0 || slot_bytes[s] < slot_bytes[best])) best = (int)s;
      if (best < 0) {  // none fits: grow the largest free slot, or open a new one
        for (size_t s = 0; s < slot_bytes.size(); ++s)
          if (slot_free[s] && (best < 0 || slot_bytes[s] > slot_bytes[best])) best = (int)s;
        if (best < 0) best = (int)slot_bytes.size(), slot_bytes.push_back(0), slot_free.push_back(true);
        slot_bytes[best] = bytes;
      }
      slot_free[best] = false;
      slot_of[o] = best;
    }
    for (int o = 1; o < count; ++o)
      if (root(o) == o && last[o] == (int)p && slot_of[o] >= 0) slot_free[slot_of[o]] = true;
  }
  P.pool.resize(slot_bytes.size());
  for (size_t s = 0; s < slot_bytes.size(); ++s) P.pool[s].resize(floats_for(slot_bytes[s]));
}

// The image's memory (its data given at each forward), and each node's output as a view into its owner's slot.
void PretrainedEncoder::Plan::Builder::place_outputs() {
  const int S = E.input_size_;
  P.image = memory({{n, 3, S, S}, dt::f32, tag::nchw}, eng, nullptr);
  P.out.resize(count);
  for (int i = 0; i < count; ++i) {
    if (nodes[i].op == "input") {
      P.out[i] = P.image;
      continue;
    }
    const int o = root(i);
    // offset: channels into a concatenation's buffer (0 for a residual sum, which shares its shortcut's buffer)
    int off = 0;
    for (int k = i; k != o; k = B.owner[k]) off += B.offset[k];
    const size_t hw = (size_t)E.shapes_[i].h * E.shapes_[i].w;
    P.out[i] =
        memory(blocked(i), eng, reinterpret_cast<char*>(P.pool[slot_of[o]].data()) + (size_t)off * hw * value_bytes);
  }
}

PretrainedEncoder::Plan::Builder::ConvShape PretrainedEncoder::Plan::Builder::conv_shape(int i, int src) const {
  const NetNode& node = nodes[i];
  const NodeShape& s = E.shapes_[i];
  // A convolution deferred to a residual sum writes the sum's output, adding to the shortcut already there.
  const int dst_node = B.sum_of[i] >= 0 ? B.sum_of[i] : i;
  const dt compute = node_type[src] == dt::u8 ? dt::s8 : float_conv_type;
  memory::desc w_md({s.c, E.shapes_[src].c, node.kh, node.kw}, compute, tag::any), b_md({s.c}, dt::f32, tag::x);
  const memory::desc src_md =
      nodes[src].op == "input" ? memory::desc(P.image.get_desc().dims(), compute, tag::any) : P.out[src].get_desc();
  post_ops po;
  if (dst_node != i) po.append_sum(1.f);
  if (node.relu) po.append_eltwise(1.f, algorithm::eltwise_relu, 0.f, 0.f);
  primitive_attr attr;
  attr.set_post_ops(po);
  return ConvShape{
      convolution_forward::desc(prop_kind::forward_inference, algorithm::convolution_direct, src_md, w_md, b_md,
                                P.out[dst_node].get_desc(), {node.sh, node.sw}, {s.pad_t, s.pad_l}, {s.pad_b, s.pad_r}),
      attr};
}

// Every node's steps in execution order, each labelled with the node whose output it writes (P.step_node). A
// convolution's step is only reserved here: build_convs fills it in.
void PretrainedEncoder::Plan::Builder::add_steps() {
  P.conv_w.resize(count);
  P.conv_b.resize(count);
  P.reordered.resize(count);
  P.int8_bias.resize(count);
  P.scale.resize(count), P.shift.resize(count), P.mean.resize(count), P.variance.resize(count);
  for (int i : order) {
    label_steps();
    labelled_node = i;
    const NetNode& node = nodes[i];
    const int src = node.inputs.empty() ? -1 : at.at(node.inputs[0]);
    if (node.op == "conv")
      add_conv_step(i, src);
    else if (node.op == "maxpool" || node.op == "avgpool")
      add_pooling_step(i, src);
    else if (node.op == "affine" && node_type[i] == dt::u8)
      add_int8_affine_step(i, src);
    else if (node.op == "affine")
      add_affine_step(i, src);
    else if (node.op == "add")
      add_sum_step(i, src);
    else if (node.op == "concat")
      add_concat_step(i);
  }
  label_steps();
}

// The steps since the last call: the last writes labelled_node's output.
void PretrainedEncoder::Plan::Builder::label_steps() {
  for (size_t k = labelled_from; k < P.steps.size(); ++k)
    P.step_node.push_back(k + 1 == P.steps.size() ? labelled_node : -1);
  labelled_from = P.steps.size();
}

void PretrainedEncoder::Plan::Builder::add_conv_step(int i, int src) {
  // Its step is filled in later (build_convs), when the convolutions are built two at a time. One that reads the
  // image gets the image in the layout its kernel prefers (a reorder at the edge: oneDNN's fast first-layer kernels
  // do not all read planar input), which takes its primitive descriptor now.
  memory conv_src = P.out[src];
  if (nodes[src].op == "input") {
    const ConvShape cs = conv_shape(i, src);
    convolution_forward::primitive_desc pd(cs.desc, cs.attr, eng);
    if (pd.src_desc() != P.image.get_desc()) {
      P.image_copies.emplace_back(pd.src_desc(), eng);
      conv_src = P.image_copies.back();
      P.steps.push_back({reorder(P.image, conv_src), {{DNNL_ARG_FROM, P.image}, {DNNL_ARG_TO, conv_src}}});
    }
  }
  conv_jobs.push_back({i, src, P.steps.size(), conv_src});
  P.steps.push_back({primitive(), {}});
}

void PretrainedEncoder::Plan::Builder::add_pooling_step(int i, int src) {
  const NetNode& node = nodes[i];
  const NodeShape& s = E.shapes_[i];
  // Keras averages over the valid (unpadded) inputs only; max pooling never picks padding.
  auto alg = node.op == "maxpool" ? algorithm::pooling_max : algorithm::pooling_avg_exclude_padding;
  pooling_forward::desc d(prop_kind::forward_inference, alg, P.out[src].get_desc(), P.out[i].get_desc(),
                          {node.sh, node.sw}, {node.kh, node.kw}, {s.pad_t, s.pad_l}, {s.pad_b, s.pad_r});
  pooling_forward::primitive_desc pd(d, eng);
  P.steps.push_back({pooling_forward(pd), {{DNNL_ARG_SRC, P.out[src]}, {DNNL_ARG_DST, P.out[i]}}});
}

void PretrainedEncoder::Plan::Builder::add_int8_affine_step(int i, int src) {
  const NodeShape& s = E.shapes_[i];
  // int8: yq = relu(x * scale / sy + offset / sy), rounded and saturated to u8 by the binary primitive's
  // destination (a multiply by the per-channel scale, the offset added as a post-op).
  const memory::desc c_md({1, s.c, 1, 1}, dt::f32, tag::abcd);
  const float sy = quant_step(i);
  P.weights.emplace_back(s.c);
  for (int c = 0; c < s.c; ++c) P.weights.back()[c] = E.scale_.at(i)[c] / sy;
  P.scale[i] = memory(c_md, eng, P.weights.back().data());
  P.weights.emplace_back(s.c);
  for (int c = 0; c < s.c; ++c) P.weights.back()[c] = E.shift_.at(i)[c] / sy;
  P.shift[i] = memory(c_md, eng, P.weights.back().data());
  primitive_attr attr;
  post_ops po;
  po.append_binary(algorithm::binary_add, c_md);
  po.append_eltwise(1.f, algorithm::eltwise_relu, 0.f, 0.f);
  attr.set_post_ops(po);
  binary::primitive_desc pd(binary::desc(algorithm::binary_mul, P.out[src].get_desc(), c_md, P.out[i].get_desc()), attr,
                            eng);
  P.steps.push_back({binary(pd),
                     {{DNNL_ARG_SRC_0, P.out[src]},
                      {DNNL_ARG_SRC_1, P.scale[i]},
                      {DNNL_ARG_ATTR_MULTIPLE_POST_OP(0) | DNNL_ARG_SRC_1, P.shift[i]},
                      {DNNL_ARG_DST, P.out[i]}}});
}

void PretrainedEncoder::Plan::Builder::add_affine_step(int i, int src) {
  const NodeShape& s = E.shapes_[i];
  // Batch normalization with fixed statistics (mean 0, variance 1, epsilon 0) is exactly x * scale + offset,
  // with the ReLU fused.
  memory::desc c_md({s.c}, dt::f32, tag::x);
  auto flags = normalization_flags::use_global_stats | normalization_flags::use_scale | normalization_flags::use_shift;
  if (nodes[i].relu) flags |= normalization_flags::fuse_norm_relu;
  batch_normalization_forward::primitive_desc pd(
      batch_normalization_forward::desc(prop_kind::forward_inference, P.out[src].get_desc(), 0.f, flags), eng);
  P.scale[i] = memory(c_md, eng, E.scale_.at(i).data());
  P.shift[i] = memory(c_md, eng, E.shift_.at(i).data());
  P.mean[i] = memory(c_md, eng, E.zeros_.data());
  P.variance[i] = memory(c_md, eng, E.ones_.data());
  P.steps.push_back({batch_normalization_forward(pd),
                     {{DNNL_ARG_SRC, P.out[src]},
                      {DNNL_ARG_MEAN, P.mean[i]},
                      {DNNL_ARG_VARIANCE, P.variance[i]},
                      {DNNL_ARG_SCALE, P.scale[i]},
                      {DNNL_ARG_SHIFT, P.shift[i]},
                      {DNNL_ARG_DST, P.out[i]}}});
}

void PretrainedEncoder::Plan::Builder::add_sum_step(int i, int src) {
  if (B.fused[i] >= 0) return;  // the deferred convolution added itself into the shortcut's buffer
  const int other = at.at(nodes[i].inputs[1]);
  binary::primitive_desc pd(
      binary::desc(algorithm::binary_add, P.out[src].get_desc(), P.out[other].get_desc(), P.out[i].get_desc()), eng);
  P.steps.push_back(
      {binary(pd), {{DNNL_ARG_SRC_0, P.out[src]}, {DNNL_ARG_SRC_1, P.out[other]}, {DNNL_ARG_DST, P.out[i]}}});
}

void PretrainedEncoder::Plan::Builder::add_concat_step(int i) {
  const NetNode& node = nodes[i];
  if (root(at.at(node.inputs[0])) == root(i)) return;  // its inputs already wrote their slices
  std::vector<memory::desc> srcs;
  std::unordered_map<int, memory> args;
  for (size_t k = 0; k < node.inputs.size(); ++k) {
    int j = at.at(node.inputs[k]);
    srcs.push_back(P.out[j].get_desc());
    args[DNNL_ARG_MULTIPLE_SRC + (int)k] = P.out[j];
  }
  concat::primitive_desc pd(P.out[i].get_desc(), 1, srcs, eng);
  args[DNNL_ARG_DST] = P.out[i];
  P.steps.push_back({concat(pd), args});
}

// The kernel as float32: folded here, in the weights, or converted from the mapped file into the scratch.
float* PretrainedEncoder::Plan::Builder::kernel_floats(int i, const TensorFile& W, FloatBuffer& scratch) const {
  const NetNode& node = nodes[i];
  if (E.conv_w_.count(i) > 0) return E.conv_w_.at(i).data();
  if (auto h = W.mapped_half.find(node.kernel); h != W.mapped_half.end()) {
    if ((int64_t)scratch.size() < h->second.size()) scratch = FloatBuffer((size_t)h->second.size());
    h->second.to_floats(scratch.data());
    return scratch.data();
  }
  // oneDNN only reads it (the reorder's source): the shared weights stay as they are.
  return const_cast<float*>(W.tensors.at(node.kernel).value.data());
}

// int8: x = sx * xq, w[o] = sw[o] * wq[o] (sw[o] = max |w[o]| / 127), y = sy * yq (sy = 1 for float32).
// oneDNN computes yq = scale[o] * (sum xq wq + bias'[o]): scale[o] = sx sw[o] / sy, bias' = bias / (sx sw[o]).
// Returns the weights' steps sw (per output channel, over its per_out weights); sets the output scales in attr.
std::vector<float> PretrainedEncoder::Plan::Builder::int8_weight_steps(int i, size_t per_out, const float* w_data,
                                                                       float sx, primitive_attr& attr) const {
  const NodeShape& s = E.shapes_[i];
  const int dst_node = B.sum_of[i] >= 0 ? B.sum_of[i] : i;
  std::vector<float> w_step(s.c);
  for (int o = 0; o < s.c; ++o) {
    const float top = max_abs(w_data + (size_t)o * per_out, per_out);
    w_step[o] = top > 0.f ? top / 127.f : 1.f;
  }
  const float sy = node_type[dst_node] == dt::u8 ? quant_step(dst_node) : 1.f;
  std::vector<float> scales(s.c);
  for (int o = 0; o < s.c; ++o) scales[o] = sx * w_step[o] / sy;
  attr.set_output_scales(1 << 1, scales);
  return w_step;
}

// The weights reordered from the user's layout into the kernel's (w_blocked), in a buffer of ours: allocated mapped in
// and left unwritten for the reorder to fill; a blocked layout that pads the channels (a first convolution's 3
// inputs) gets zeros first, so the padding is zero whatever the reorder does.
void PretrainedEncoder::Plan::Builder::reorder_weights(int i, memory& user_w, const memory::desc& w_blocked,
                                                       dnnl::stream& strm) const {
  P.reordered[i] = std::make_unique<UnwrittenFloats>(floats_for(w_blocked.get_size()));
  if (!std::equal(w_blocked.data.dims, w_blocked.data.dims + w_blocked.data.ndims, w_blocked.data.padded_dims))
    std::memset(P.reordered[i]->data(), 0, w_blocked.get_size());
  P.conv_w[i] = memory(w_blocked, eng, P.reordered[i]->data());
  // The reorder runs on this thread alone (the other builds its own convolution meanwhile); the setting is put
  // back however the function ends.
  struct OneThread {
    const int team = omp_get_max_threads();
    OneThread() { omp_set_num_threads(1); }
    ~OneThread() { omp_set_num_threads(team); }
  } one_thread;
  reorder(user_w, P.conv_w[i]).execute(strm, user_w, P.conv_w[i]);
  strm.wait();  // before the caller's quantized weights go, and before the scratch takes the next kernel
}

// Builds one convolution: its weights converted (float16 from the mapped file), quantized (int8), reordered into
// the layout its kernel wants, and its kernel compiled, into its step. Writes only this node's slots of the plan,
// so two threads build two convolutions at once. `scratch` holds a converted kernel until it is reordered.
void PretrainedEncoder::Plan::Builder::build_conv(const ConvJob& job, FloatBuffer& scratch, dnnl::stream& strm) const {
  const int i = job.node, src = job.src;
  const NetNode& node = nodes[i];
  const NodeShape& s = E.shapes_[i];
  const int dst_node = B.sum_of[i] >= 0 ? B.sum_of[i] : i;
  const int CI = E.shapes_[src].c;
  const bool int8_conv = node_type[src] == dt::u8;
  ConvShape cs = conv_shape(i, src);
  const bool folded = E.conv_w_.count(i) > 0;
  const TensorFile& W = *E.shared_;
  float* w_data = kernel_floats(i, W, scratch);
  float* b_data = folded ? E.conv_b_.at(i).data() : const_cast<float*>(W.tensors.at(node.bias).value.data());
  const size_t per_out = (size_t)CI * node.kh * node.kw;
  std::vector<float> w_step;
  float sx = 1.f;
  if (int8_conv) {
    sx = quant_step(src);
    w_step = int8_weight_steps(i, per_out, w_data, sx, cs.attr);
  }
  // The kernel is compiled for the threads the encoder runs on: this thread's OpenMP setting, left as it is.
  convolution_forward::primitive_desc pd(cs.desc, cs.attr, eng);
  convolution_forward conv(pd);
  memory user_w({{s.c, CI, node.kh, node.kw}, dt::f32, folded ? tag::oihw : tag::ohwi}, eng, w_data);
  FloatBuffer q;    // int8: the quantized weights in the user's layout, until reordered
  if (int8_conv) {  // quantized here, in the user's layout (O outermost in both), then reordered like floats
    q.resize(floats_for((size_t)s.c * per_out));
    auto* wq = reinterpret_cast<int8_t*>(q.data());
    for (int o = 0; o < s.c; ++o) {  // |w| / w_step <= 127 by the choice of w_step: no clamping
      quantize_int8(w_data + (size_t)o * per_out, per_out, 1.f / w_step[o], wq + (size_t)o * per_out);
    }
    user_w = memory({{s.c, CI, node.kh, node.kw}, dt::s8, folded ? tag::oihw : tag::ohwi}, eng, q.data());
    P.int8_bias[i].resize(s.c);
    for (int o = 0; o < s.c; ++o) P.int8_bias[i][o] = b_data[o] / (sx * w_step[o]);
    b_data = P.int8_bias[i].data();
  }
  reorder_weights(i, user_w, pd.weights_desc(), strm);
  P.conv_b[i] = memory(pd.bias_desc(), eng, b_data);
  P.steps[job.step] = {conv,
                       {{DNNL_ARG_SRC, job.conv_src},
                        {DNNL_ARG_WEIGHTS, P.conv_w[i]},
                        {DNNL_ARG_BIAS, P.conv_b[i]},
                        {DNNL_ARG_DST, P.out[dst_node]}}};
}

// The convolutions, two threads taking the next one in turn: a fresh process's first encode with the default
// model (ResNet-101 at 448, bf16) 202 -> 159 ms, medians of ten, the same weights and kernels bit for bit.
void PretrainedEncoder::Plan::Builder::build_convs() {
  std::atomic<size_t> next{0};
  std::atomic<bool> failed{false};
  std::exception_ptr error[2];
  auto worker = [&](int w) {
    try {
      FloatBuffer scratch;
      dnnl::stream strm(eng);
      for (size_t j = next++; j < conv_jobs.size() && !failed; j = next++) build_conv(conv_jobs[j], scratch, strm);
    } catch (...) {
      error[w] = std::current_exception();
      failed = true;
    }
  };
  std::thread other(worker, 1);
  worker(0);
  other.join();
  for (auto& e : error)
    if (e) std::rethrow_exception(e);
}

void PretrainedEncoder::Plan::Builder::add_grid_reorder() {
  const int last_node = count - 1;
  P.grid = memory({{n, E.channels_, E.grid_h_, E.grid_w_}, dt::f32, tag::nhwc}, eng, nullptr);
  P.steps.push_back({reorder(P.out[last_node], P.grid), {{DNNL_ARG_FROM, P.out[last_node]}, {DNNL_ARG_TO, P.grid}}});
  P.step_node.push_back(-1);
}

PretrainedEncoder::Plan& PretrainedEncoder::plan_for(int n) {
  auto it = plans_.find(n);
  if (it != plans_.end()) return *it->second;
  auto plan = std::make_unique<Plan>();
  Plan::Builder build(*this, n, *plan);
  build.order_execution();
  build.assign_buffers();
  build.place_outputs();
  build.add_steps();
  build.build_convs();
  build.add_grid_reorder();
  return *(plans_[n] = std::move(plan));
}

int PretrainedEncoder::images_per_pass(int n) const {
  if (precision_ != Precision::int8) return std::max(1, n);
  constexpr int64_t kPassPixels = 4 * 224 * 224;
  return (int)std::clamp<int64_t>(kPassPixels / ((int64_t)input_size_ * input_size_), 1, std::max(1, n));
}

void PretrainedEncoder::forward(const float* images, int n, std::vector<float>& grid) {
  const size_t image_floats = (size_t)3 * input_size_ * input_size_,
               grid_floats = (size_t)grid_h_ * grid_w_ * channels_;
  grid.resize((size_t)n * grid_floats);
  const int pass = images_per_pass(n);
  for (int first = 0; first < n; first += pass) {
    const int m = std::min(pass, n - first);
    Plan& P = plan_for(m);
    P.image.set_data_handle(const_cast<float*>(images + first * image_floats));
    P.grid.set_data_handle(grid.data() + first * grid_floats);
    for (auto& [prim, args] : P.steps) prim.execute(cpu_stream(), args);
    cpu_stream().wait();
  }
}

}  // namespace sat

namespace sat {

void PretrainedEncoder::sample_activations(const float* images, int n,
                                           std::map<std::string, std::vector<float>>& samples, size_t per_node) {
  if (precision_ != Precision::f32) throw Error("activations are sampled from a float32 encoder only");
  Plan& P = plan_for(n);
  std::vector<bool> wanted(graph_.nodes.size(), false);
  for (int i : int8_nodes_) wanted[i] = true;
  std::vector<float> grid((size_t)n * grid_h_ * grid_w_ * channels_);
  P.image.set_data_handle(const_cast<float*>(images));
  P.grid.set_data_handle(grid.data());
  for (size_t k = 0; k < P.steps.size(); ++k) {
    P.steps[k].first.execute(cpu_stream(), P.steps[k].second);
    const int node = P.step_node[k];
    if (node < 0 || !wanted[node]) continue;
    cpu_stream().wait();
    const memory& out = P.out[node];
    const size_t values = out.get_desc().get_size() / sizeof(float);
    const float* v = static_cast<const float*>(out.get_data_handle());
    const size_t stride = std::max<size_t>(1, values / std::max<size_t>(1, per_node));
    auto& dst = samples[graph_.nodes[node].name];
    for (size_t j = 0; j < values; j += stride) dst.push_back(v[j]);
  }
  cpu_stream().wait();
}

}  // namespace sat
