#include "vision/pretrained.hpp"

#include <cmath>
#include <cstring>
#include <oneapi/dnnl/dnnl.hpp>

#include "vision/onednn.hpp"

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
      out[n.kernel] = {n.kh, n.kw, cin, f};
      if (!n.bias.empty()) out[n.bias] = {f};
      if (!n.bn.empty()) {
        for (const char* s : {"/beta", "/moving_mean", "/moving_variance"}) out[n.bn + s] = {f};
        if (n.bn_scale) out[n.bn + "/gamma"] = {f};
      }
      channels[n.name] = f;
    } else {
      channels[n.name] = channels.at(n.inputs[0]);
    }
  }
  return out;
}

static FloatBuffer tensor_values(const TensorFile& tf, const std::string& name, const std::vector<int64_t>& shape,
                                 const std::string& where) {
  auto q = tf.quantized.find(name);
  if (q != tf.quantized.end()) {
    if (q->second.shape != shape)
      fail(where, "tensor '" + name + "' has shape " + shape_str(q->second.shape) + ", expected " + shape_str(shape));
    return q->second.dequantize();
  }
  const Param& p = tf.get(name, where);
  if (p.shape != shape) fail(where, "tensor '" + name + "' has shape " + shape_str(p.shape) + ", expected " + shape_str(shape));
  return p.value;
}

FoldedConv fold_conv(const NetNode& n, const TensorFile& weights,
                     const std::map<std::string, std::vector<int64_t>>& expected, const std::string& where) {
  // Fold batch norm (inference statistics) into the convolution:
  //   y = gamma * (conv(x) + b - mean) / sqrt(var + eps) + beta  =  conv'(x) + b'
  auto kshape = expected.at(n.kernel);
  const int KH = (int)kshape[0], KW = (int)kshape[1], CI = (int)kshape[2], CO = (int)kshape[3];
  FloatBuffer k = tensor_values(weights, n.kernel, kshape, where);
  std::vector<double> factor(CO, 1.0), bias(CO, 0.0);
  if (!n.bias.empty()) {
    FloatBuffer b = tensor_values(weights, n.bias, {CO}, where);
    for (int o = 0; o < CO; ++o) bias[o] = b[o];
  }
  if (!n.bn.empty()) {
    FloatBuffer beta = tensor_values(weights, n.bn + "/beta", {CO}, where);
    FloatBuffer mean = tensor_values(weights, n.bn + "/moving_mean", {CO}, where);
    FloatBuffer var = tensor_values(weights, n.bn + "/moving_variance", {CO}, where);
    FloatBuffer gamma = n.bn_scale ? tensor_values(weights, n.bn + "/gamma", {CO}, where) : FloatBuffer(CO, 1.f);
    for (int o = 0; o < CO; ++o) {
      factor[o] = gamma[o] / std::sqrt((double)var[o] + n.bn_epsilon);
      bias[o] = (bias[o] - mean[o]) * factor[o] + beta[o];
    }
  }
  FoldedConv f;
  f.out = CO, f.in = CI, f.kh = KH, f.kw = KW;
  f.weight.resize((size_t)CO * CI * KH * KW);
  f.bias.resize(CO);
  for (int o = 0; o < CO; ++o) {
    f.bias[o] = (float)bias[o];
    for (int c = 0; c < CI; ++c)
      for (int y = 0; y < KH; ++y)
        for (int x = 0; x < KW; ++x)  // HWIO -> OIHW
          f.weight[(((size_t)o * CI + c) * KH + y) * KW + x] = (float)(k[(((size_t)y * KW + x) * CI + c) * CO + o] * factor[o]);
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

TensorFile select_tensors(const NetGraph& graph, const TensorFile& all, const std::string& where) {
  TensorFile out;
  for (auto& [name, shape] : pretrained_tensor_shapes(graph)) {
    auto q = all.quantized.find(name);
    if (q != all.quantized.end()) {
      if (q->second.shape != shape)
        fail(where, "tensor '" + name + "' has shape " + shape_str(q->second.shape) + ", expected " + shape_str(shape));
      out.quantized[name] = q->second;
      continue;
    }
    const Param& p = all.get(name, where);
    if (p.shape != shape) fail(where, "tensor '" + name + "' has shape " + shape_str(p.shape) + ", expected " + shape_str(shape));
    Param copy(name, p.shape, false);
    copy.value = p.value;
    out.tensors.emplace(name, std::move(copy));
  }
  return out;
}

PretrainedNet load_pretrained_net(const std::string& path) {
  TensorFile tf = load_safetensors(path);
  auto it = tf.metadata.find("format");
  if (it == tf.metadata.end() || it->second != kEncoderFormat)
    fail(path, "not a sat encoder file (no \"format\": \"" + std::string(kEncoderFormat) +
                   "\"; import one with sat import-tfjs)");
  if (tf.meta("version", path) != "1") fail(path, "encoder file version " + tf.meta("version", path) + " is not supported");
  PretrainedNet net;
  try {
    net.graph = NetGraph::from_json(nlohmann::json::parse(tf.meta("graph", path)));
    auto in = nlohmann::json::parse(tf.meta("input", path));
    net.input_size = in.at("size").get<int>();
    auto m = in.at("mean").get<std::vector<float>>(), s = in.at("std").get<std::vector<float>>();
    if (m.size() != 3 || s.size() != 3) throw Error("input mean/std need 3 values");
    for (int i = 0; i < 3; ++i) net.mean[i] = m[i], net.stdev[i] = s[i];
    net.info = nlohmann::json::parse(tf.meta("info", path));
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

PretrainedEncoder::PretrainedEncoder(const NetGraph& graph, const TensorFile& weights, int input_size,
                                     const std::string& where)
    : graph_(graph), input_size_(input_size) {
  try {
    shapes_ = graph_.shapes(input_size, input_size);
  } catch (const Error& e) {
    fail(where, e.what());
  }
  grid_h_ = shapes_.back().h, grid_w_ = shapes_.back().w, channels_ = shapes_.back().c;
  macs_ = graph_.conv_macs(input_size, input_size);
  auto expected = pretrained_tensor_shapes(graph_);
  for (size_t i = 0; i < graph_.nodes.size(); ++i) {
    if (graph_.nodes[i].op != "conv") continue;
    FoldedConv f = fold_conv(graph_.nodes[i], weights, expected, where);
    conv_w_[(int)i] = std::move(f.weight);
    conv_b_[(int)i] = std::move(f.bias);
  }
}

PretrainedEncoder::~PretrainedEncoder() = default;

struct PretrainedEncoder::Plan {
  memory image, grid;
  std::vector<memory> out;  // per node: its output (a view into a concatenation's buffer when placed in place)
  std::vector<memory> conv_w, conv_b;
  std::vector<std::pair<primitive, std::unordered_map<int, memory>>> steps;
};

PretrainedEncoder::Plan& PretrainedEncoder::plan_for(int n) {
  auto it = plans_.find(n);
  if (it != plans_.end()) return *it->second;
  auto plan = std::make_unique<Plan>();
  Plan& P = *plan;
  auto& eng = cpu_engine();
  const auto& nodes = graph_.nodes;
  const int count = (int)nodes.size();
  std::map<std::string, int> at;
  std::vector<int> consumers(count, 0);
  for (int i = 0; i < count; ++i) {
    at[nodes[i].name] = i;
    for (auto& in : nodes[i].inputs) consumers[at.at(in)]++;
  }
  auto blocked = [&](int i) {
    return memory::desc({n, shapes_[i].c, shapes_[i].h, shapes_[i].w}, dt::f32, tag::nChw8c);
  };

  // In-place concatenation: in the 8-channel blocked layout at batch 1, channels [off, off + C) of a tensor are
  // one contiguous run, laid out exactly like a dense C-channel tensor. So an input that only feeds the
  // concatenation (and whose offset is a multiple of 8) can be produced directly at that address.
  // owner[i] = node whose buffer holds node i's output; offset[i] = its first channel there.
  std::vector<int> owner(count), offset(count, 0);
  for (int i = 0; i < count; ++i) owner[i] = i;
  for (int i = count - 1; i >= 0; --i) {
    if (nodes[i].op != "concat" || n != 1) continue;
    bool eligible = offset[i] % 8 == 0;
    for (auto& in : nodes[i].inputs) {
      int k = at.at(in);
      eligible = eligible && consumers[k] == 1 && nodes[k].op != "input" && shapes_[k].c % 8 == 0;
    }
    if (!eligible) continue;  // then a concat primitive copies every input
    int off = 0;
    for (auto& in : nodes[i].inputs) {
      int k = at.at(in);
      owner[k] = owner[i];
      offset[k] = offset[i] + off;
      off += shapes_[k].c;
    }
  }

  const int S = input_size_;
  P.image = memory({{n, 3, S, S}, dt::f32, tag::nchw}, eng, nullptr);
  P.out.resize(count);
  for (int i = 0; i < count; ++i) {
    if (nodes[i].op == "input") {
      P.out[i] = P.image;
    } else if (owner[i] == i) {
      P.out[i] = memory(blocked(i), eng);
    }
  }
  for (int i = 0; i < count; ++i) {
    if (owner[i] == i || nodes[i].op == "input") continue;
    const size_t hw = (size_t)shapes_[i].h * shapes_[i].w;
    float* base = static_cast<float*>(P.out[owner[i]].get_data_handle());
    P.out[i] = memory(blocked(i), eng, base + (size_t)offset[i] * hw);
  }

  P.conv_w.resize(count);
  P.conv_b.resize(count);
  for (int i = 0; i < count; ++i) {
    const NetNode& node = nodes[i];
    const NodeShape& s = shapes_[i];
    if (node.op == "input") continue;
    const int src = node.inputs.empty() ? -1 : at.at(node.inputs[0]);
    memory::desc dst_md = P.out[i].get_desc();
    if (node.op == "conv") {
      const int CI = shapes_[src].c;
      memory::desc w_md({s.c, CI, node.kh, node.kw}, dt::f32, tag::any), b_md({s.c}, dt::f32, tag::x);
      primitive_attr attr;
      if (node.relu) {
        post_ops po;
        po.append_eltwise(1.f, algorithm::eltwise_relu, 0.f, 0.f);
        attr.set_post_ops(po);
      }
      convolution_forward::desc d(prop_kind::forward_inference, algorithm::convolution_direct, P.out[src].get_desc(),
                                  w_md, b_md, dst_md, {node.sh, node.sw}, {s.pad_t, s.pad_l}, {s.pad_b, s.pad_r});
      convolution_forward::primitive_desc pd(d, attr, eng);
      memory user_w({{s.c, CI, node.kh, node.kw}, dt::f32, tag::oihw}, eng, conv_w_.at(i).data());
      P.conv_w[i] = memory(pd.weights_desc(), eng);
      reorder(user_w, P.conv_w[i]).execute(cpu_stream(), user_w, P.conv_w[i]);
      P.conv_b[i] = memory(b_md, eng, conv_b_.at(i).data());
      P.steps.push_back({convolution_forward(pd), {{DNNL_ARG_SRC, P.out[src]},
                                                   {DNNL_ARG_WEIGHTS, P.conv_w[i]},
                                                   {DNNL_ARG_BIAS, P.conv_b[i]},
                                                   {DNNL_ARG_DST, P.out[i]}}});
    } else if (node.op == "maxpool" || node.op == "avgpool") {
      // Keras averages over the valid (unpadded) inputs only; max pooling never picks padding.
      auto alg = node.op == "maxpool" ? algorithm::pooling_max : algorithm::pooling_avg_exclude_padding;
      pooling_forward::desc d(prop_kind::forward_inference, alg, P.out[src].get_desc(), dst_md, {node.sh, node.sw},
                              {node.kh, node.kw}, {s.pad_t, s.pad_l}, {s.pad_b, s.pad_r});
      pooling_forward::primitive_desc pd(d, eng);
      P.steps.push_back({pooling_forward(pd), {{DNNL_ARG_SRC, P.out[src]}, {DNNL_ARG_DST, P.out[i]}}});
    } else if (node.op == "concat") {
      std::vector<memory::desc> srcs;
      std::unordered_map<int, memory> args;
      if (owner[at.at(node.inputs[0])] == owner[i]) continue;  // its inputs already wrote their slices
      for (size_t k = 0; k < node.inputs.size(); ++k) {
        int j = at.at(node.inputs[k]);
        srcs.push_back(P.out[j].get_desc());
        args[DNNL_ARG_MULTIPLE_SRC + (int)k] = P.out[j];
      }
      concat::primitive_desc pd(dst_md, 1, srcs, eng);
      args[DNNL_ARG_DST] = P.out[i];
      P.steps.push_back({concat(pd), args});
    }
  }
  const int last = count - 1;
  P.grid = memory({{n, channels_, grid_h_, grid_w_}, dt::f32, tag::nhwc}, eng, nullptr);
  P.steps.push_back({reorder(P.out[last], P.grid), {{DNNL_ARG_FROM, P.out[last]}, {DNNL_ARG_TO, P.grid}}});
  return *(plans_[n] = std::move(plan));
}

void PretrainedEncoder::forward(const float* images, int n, std::vector<float>& grid) {
  Plan& P = plan_for(n);
  grid.resize((size_t)n * grid_h_ * grid_w_ * channels_);
  P.image.set_data_handle(const_cast<float*>(images));
  P.grid.set_data_handle(grid.data());
  for (auto& [prim, args] : P.steps) prim.execute(cpu_stream(), args);
  cpu_stream().wait();
}

}  // namespace sat
