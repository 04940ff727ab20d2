#include "vision/tunable.hpp"

#include <cstring>
#include <oneapi/dnnl/dnnl.hpp>

#include "vision/onednn.hpp"
#include "vision/pretrained.hpp"

namespace sat {

using namespace dnnl;
using tag = memory::format_tag;
using dt = memory::data_type;

TunableBlocks::TunableBlocks(const NetGraph& graph, const TensorFile& weights, const std::string& from, int input_size,
                             const std::string& where)
    : from_(from) {
  const int start = graph.index_of(from);
  if (start < 0) fail(where, "the network has no layer '" + from + "' to tune from");
  if (start + 1 >= (int)graph.nodes.size()) fail(where, "no layers after '" + from + "' to tune");
  std::vector<NodeShape> all;
  try {
    all = graph.shapes(input_size, input_size);
  } catch (const Error& e) {
    fail(where, e.what());
  }
  NetNode input;
  input.name = graph.nodes[start].name;  // `from` may be an alias ("block3" for "block3/unit_23")
  input.op = "input";
  graph_.nodes.push_back(input);
  shapes_.push_back(all[start]);
  for (int i = start + 1; i < (int)graph.nodes.size(); ++i) {
    const NetNode& n = graph.nodes[i];
    for (auto& in : n.inputs)
      if (graph_.index_of(in) < 0)
        fail(where, "layer '" + n.name + "' after '" + from + "' reads '" + in +
                        "' from before it (tune from a layer " +
                        "that all later layers build on, such as a mixedN concatenation)");
    graph_.nodes.push_back(n);
    shapes_.push_back(all[i]);
  }
  inputs_.resize(graph_.nodes.size());
  for (size_t i = 1; i < graph_.nodes.size(); ++i)
    for (auto& in : graph_.nodes[i].inputs) inputs_[i].push_back(graph_.index_of(in));
  h_ = shapes_.back().h, w_ = shapes_.back().w, c_out_ = shapes_.back().c, c_in_ = shapes_[0].c;
  const int block = activation_block();
  for (size_t i = 0; i < graph_.nodes.size(); ++i)
    if (graph_.nodes[i].op == "concat")
      for (int j : inputs_[i])
        if (shapes_[j].c % block != 0)
          fail(where, "layer '" + graph_.nodes[j].name + "' has " + std::to_string(shapes_[j].c) + " channels: a " +
                          "concatenation's inputs need channel counts divisible by " + std::to_string(block));

  auto expected = pretrained_tensor_shapes(graph);
  param_of_.assign(graph_.nodes.size(), -1);
  for (size_t i = 1; i < graph_.nodes.size(); ++i) {
    const NetNode& n = graph_.nodes[i];
    if (n.op == "affine") {
      param_of_[i] = (int)params_.size();
      Param scale("encoder." + n.name + ".scale", {shapes_[i].c}),
          offset("encoder." + n.name + ".offset", {shapes_[i].c});
      scale.value = pretrained_tensor(weights, n.scale, expected.at(n.scale), where);
      offset.value = pretrained_tensor(weights, n.offset, expected.at(n.offset), where);
      params_.push_back(std::move(scale));
      params_.push_back(std::move(offset));
      if ((int)zeros_.size() < shapes_[i].c) zeros_.assign(shapes_[i].c, 0.f), ones_.assign(shapes_[i].c, 1.f);
      continue;
    }
    if (n.op != "conv") continue;
    FoldedConv f = fold_conv(n, weights, expected, where);
    param_of_[i] = (int)params_.size();
    Param w("encoder." + n.name + ".weight", {f.out, f.in, f.kh, f.kw});
    w.value = std::move(f.weight);
    Param b("encoder." + n.name + ".bias", {f.out});
    b.value = std::move(f.bias);
    params_.push_back(std::move(w));
    params_.push_back(std::move(b));
    macs_ += (double)shapes_[i].h * shapes_[i].w * f.out * f.in * f.kh * f.kw;
  }
}

TunableBlocks::~TunableBlocks() = default;

struct TunableBlocks::Plan {
  struct Node {
    memory out, diff, scratch;  // scratch: a second diff buffer when several layers read this one
    primitive fwd;
    std::unordered_map<int, memory> fwd_args;
    // conv
    memory w_user, w, bias, bwd_data_w, diff_pre, diff_w, diff_w_user, diff_b;
    reorder w_reorder, bwd_data_w_reorder, diff_w_reorder;
    bool separate_bwd_data_w = false;
    eltwise_backward relu_bwd;
    convolution_backward_weights bwd_w;
    convolution_backward_data bwd_data;
    // pooling
    memory workspace;
    pooling_backward pool_bwd;
    // concat: per input, its channel slice of this layer's gradient and the reorder that copies it out
    std::vector<memory> diff_slices;
    std::vector<reorder> slice_reorders;
    // affine (batch norm with fixed statistics): scale, shift, the statistics, their gradients, the ReLU mask
    memory scale, shift, mean, variance, diff_scale, diff_shift, diff_src_scratch;
    batch_normalization_backward affine_bwd;
    // add: the gradient passes to both inputs unchanged
    reorder copy_diff;
  };
  int n = 0;
  bool training = false;
  memory in_user, in, out_user, diff_out_user;
  reorder in_reorder, out_reorder, diff_out_reorder;
  std::vector<Node> nodes;
  std::vector<int> consumers, received;  // per node: how many layers read it; diffs received this backward
};

TunableBlocks::Plan& TunableBlocks::plan_for(int n, bool training, bool bf16) {
  if (training && bf16) throw Error("tuned layers: training runs in float32 (bf16 is for inference)");
  auto key = std::make_tuple(n, training, bf16);
  auto it = plans_.find(key);
  if (it != plans_.end()) return *it->second;
  auto plan = std::make_unique<Plan>();
  Plan& P = *plan;
  P.n = n;
  P.training = training;
  auto& eng = cpu_engine();
  const auto prop = training ? prop_kind::forward_training : prop_kind::forward_inference;
  const auto& nodes = graph_.nodes;
  const int count = (int)nodes.size();
  P.nodes.resize(count);
  P.consumers.assign(count, 0);
  P.received.assign(count, 0);
  const tag act = activation_tag();
  const dt adt = bf16 ? dt::bf16 : dt::f32;  // activations and weights; biases, scales and the caller's grids: f32
  auto blocked = [&](int i) { return memory::desc({n, shapes_[i].c, shapes_[i].h, shapes_[i].w}, adt, act); };
  auto plain_nhwc = [&](int i) {
    return memory::desc({n, shapes_[i].c, shapes_[i].h, shapes_[i].w}, dt::f32, tag::nhwc);
  };
  for (int i = 0; i < count; ++i) {
    P.nodes[i].out = memory(blocked(i), eng);
    for (int j : inputs_[i]) P.consumers[j]++;
  }
  if (training)
    for (int i = 1; i < count; ++i) {
      P.nodes[i].diff = memory(blocked(i), eng);
      if (P.consumers[i] > 1) P.nodes[i].scratch = memory(blocked(i), eng);
    }
  P.in_user = memory(plain_nhwc(0), eng, nullptr);
  P.in = P.nodes[0].out;
  P.in_reorder = reorder(P.in_user, P.in);
  P.out_user = memory(plain_nhwc(count - 1), eng, nullptr);
  P.out_reorder = reorder(P.nodes[count - 1].out, P.out_user);
  if (training) {
    P.diff_out_user = memory(plain_nhwc(count - 1), eng, nullptr);
    P.diff_out_reorder = reorder(P.diff_out_user, P.nodes[count - 1].diff);
  }

  for (int i = 1; i < count; ++i) {
    const NetNode& node = nodes[i];
    const NodeShape& s = shapes_[i];
    Plan::Node& N = P.nodes[i];
    const int src = inputs_[i][0];
    const memory::desc src_md = blocked(src), dst_md = blocked(i);
    const memory::dims strides{node.sh, node.sw}, pad_l{s.pad_t, s.pad_l}, pad_r{s.pad_b, s.pad_r};
    if (node.op == "conv") {
      Param& W = params_[param_of_[i]];
      Param& B = params_[param_of_[i] + 1];
      const memory::dims wdims{W.shape[0], W.shape[1], W.shape[2], W.shape[3]};
      memory::desc w_any(wdims, adt, tag::any), b_md({s.c}, dt::f32, tag::x);
      primitive_attr attr;
      if (node.relu) {
        post_ops po;
        po.append_eltwise(1.f, algorithm::eltwise_relu, 0.f, 0.f);
        attr.set_post_ops(po);
      }
      convolution_forward::desc d(prop, algorithm::convolution_direct, src_md, w_any, b_md, dst_md, strides, pad_l,
                                  pad_r);
      convolution_forward::primitive_desc pd(d, attr, eng);
      N.w_user = memory({wdims, dt::f32, tag::oihw}, eng, W.value.data());
      N.w = memory(pd.weights_desc(), eng);
      N.w_reorder = reorder(N.w_user, N.w);
      N.bias = memory(b_md, eng, B.value.data());
      N.fwd = convolution_forward(pd);
      N.fwd_args = {
          {DNNL_ARG_SRC, P.nodes[src].out}, {DNNL_ARG_WEIGHTS, N.w}, {DNNL_ARG_BIAS, N.bias}, {DNNL_ARG_DST, N.out}};
      if (!training) continue;
      if (node.relu) {
        eltwise_forward::primitive_desc hint(
            eltwise_forward::desc(prop_kind::forward_training, algorithm::eltwise_relu_use_dst_for_bwd, dst_md, 0.f),
            eng);
        eltwise_backward::primitive_desc bpd(
            eltwise_backward::desc(algorithm::eltwise_relu_use_dst_for_bwd, dst_md, dst_md, 0.f), eng, hint);
        N.relu_bwd = eltwise_backward(bpd);
        N.diff_pre = memory(dst_md, eng);
      } else {
        N.diff_pre = N.diff;
      }
      convolution_backward_weights::primitive_desc bw_pd(
          convolution_backward_weights::desc(algorithm::convolution_direct, src_md, w_any, b_md, dst_md, strides, pad_l,
                                             pad_r),
          eng, pd);
      N.bwd_w = convolution_backward_weights(bw_pd);
      N.diff_w = memory(bw_pd.diff_weights_desc(), eng);
      N.diff_w_user = memory({wdims, dt::f32, tag::oihw}, eng);
      N.diff_w_reorder = reorder(N.diff_w, N.diff_w_user);
      N.diff_b = memory(b_md, eng);
      if (src != 0) {  // no gradient for the cached input
        convolution_backward_data::primitive_desc bd_pd(
            convolution_backward_data::desc(algorithm::convolution_direct, src_md, w_any, dst_md, strides, pad_l,
                                            pad_r),
            eng, pd);
        N.bwd_data = convolution_backward_data(bd_pd);
        N.separate_bwd_data_w = bd_pd.weights_desc() != pd.weights_desc();
        N.bwd_data_w = N.separate_bwd_data_w ? memory(bd_pd.weights_desc(), eng) : N.w;
        if (N.separate_bwd_data_w) N.bwd_data_w_reorder = reorder(N.w_user, N.bwd_data_w);
      }
    } else if (node.op == "maxpool" || node.op == "avgpool") {
      // Keras averages over the valid (unpadded) inputs only; max pooling never picks padding.
      auto alg = node.op == "maxpool" ? algorithm::pooling_max : algorithm::pooling_avg_exclude_padding;
      const memory::dims kernel{node.kh, node.kw};
      pooling_forward::primitive_desc pd(
          pooling_forward::desc(prop, alg, src_md, dst_md, strides, kernel, pad_l, pad_r), eng);
      N.fwd = pooling_forward(pd);
      N.fwd_args = {{DNNL_ARG_SRC, P.nodes[src].out}, {DNNL_ARG_DST, N.out}};
      if (training && alg == algorithm::pooling_max) {
        N.workspace = memory(pd.workspace_desc(), eng);
        N.fwd_args[DNNL_ARG_WORKSPACE] = N.workspace;
      }
      if (training && src != 0)
        N.pool_bwd = pooling_backward(pooling_backward::primitive_desc(
            pooling_backward::desc(alg, src_md, dst_md, strides, kernel, pad_l, pad_r), eng, pd));
    } else if (node.op == "concat") {
      std::vector<memory::desc> srcs;
      int offset = 0;
      for (size_t k = 0; k < inputs_[i].size(); ++k) {
        const int j = inputs_[i][k];
        srcs.push_back(P.nodes[j].out.get_desc());
        N.fwd_args[DNNL_ARG_MULTIPLE_SRC + (int)k] = P.nodes[j].out;
        if (training) {  // backward: the input's gradient is its channel slice of this layer's (any input's
          // diff and scratch buffers share one layout, so one reorder serves both)
          memory::desc slice =
              N.diff.get_desc().submemory_desc({n, shapes_[j].c, shapes_[j].h, shapes_[j].w}, {0, offset, 0, 0});
          N.diff_slices.emplace_back(slice, eng, N.diff.get_data_handle());
          N.slice_reorders.push_back(j != 0 ? reorder(N.diff_slices.back(), P.nodes[j].diff) : reorder());
        }
        offset += shapes_[j].c;
      }
      N.fwd = concat(concat::primitive_desc(dst_md, 1, srcs, eng));
      N.fwd_args[DNNL_ARG_DST] = N.out;
    } else if (node.op == "affine") {
      // x * scale + offset (then ReLU) as batch norm with fixed statistics: mean 0, variance 1, epsilon 0
      Param& scale = params_[param_of_[i]];
      Param& offset = params_[param_of_[i] + 1];
      memory::desc c_md({s.c}, dt::f32, tag::x);
      auto flags =
          normalization_flags::use_global_stats | normalization_flags::use_scale | normalization_flags::use_shift;
      if (node.relu) flags |= normalization_flags::fuse_norm_relu;
      batch_normalization_forward::primitive_desc pd(batch_normalization_forward::desc(prop, src_md, 0.f, flags), eng);
      N.scale = memory(c_md, eng, scale.value.data());
      N.shift = memory(c_md, eng, offset.value.data());
      N.mean = memory(c_md, eng, zeros_.data());
      N.variance = memory(c_md, eng, ones_.data());
      N.fwd = batch_normalization_forward(pd);
      N.fwd_args = {{DNNL_ARG_SRC, P.nodes[src].out}, {DNNL_ARG_MEAN, N.mean},   {DNNL_ARG_VARIANCE, N.variance},
                    {DNNL_ARG_SCALE, N.scale},        {DNNL_ARG_SHIFT, N.shift}, {DNNL_ARG_DST, N.out}};
      if (!training) continue;
      if (node.relu) {
        N.workspace = memory(pd.workspace_desc(), eng);
        N.fwd_args[DNNL_ARG_WORKSPACE] = N.workspace;
      }
      batch_normalization_backward::primitive_desc bpd(
          batch_normalization_backward::desc(prop_kind::backward, dst_md, src_md, 0.f, flags), eng, pd);
      N.affine_bwd = batch_normalization_backward(bpd);
      N.diff_scale = memory(c_md, eng);
      N.diff_shift = memory(c_md, eng);
      if (src == 0) N.diff_src_scratch = memory(src_md, eng);  // no gradient for the cached input
    } else if (node.op == "add") {
      const int other = inputs_[i][1];
      N.fwd = binary(binary::primitive_desc(binary::desc(algorithm::binary_add, src_md, blocked(other), dst_md), eng));
      N.fwd_args = {{DNNL_ARG_SRC_0, P.nodes[src].out}, {DNNL_ARG_SRC_1, P.nodes[other].out}, {DNNL_ARG_DST, N.out}};
      if (training) N.copy_diff = reorder(N.diff, N.diff);
    } else {
      throw Error("layer '" + node.name + "': operation '" + node.op + "' cannot be tuned");
    }
  }
  return *(plans_[key] = std::move(plan));
}

void TunableBlocks::forward(const float* grid_in, int n, bool training, std::vector<float>& grid_out, bool bf16) {
  Plan& P = plan_for(n, training, bf16);
  auto& s = cpu_stream();
  P.in_user.set_data_handle(const_cast<float*>(grid_in));
  P.in_reorder.execute(s, P.in_user, P.in);
  for (size_t i = 1; i < P.nodes.size(); ++i) {
    auto& N = P.nodes[i];
    if (graph_.nodes[i].op == "conv") N.w_reorder.execute(s, N.w_user, N.w);
    N.fwd.execute(s, N.fwd_args);
  }
  grid_out.resize((size_t)n * h_ * w_ * c_out_);
  P.out_user.set_data_handle(grid_out.data());
  P.out_reorder.execute(s, P.nodes.back().out, P.out_user);
  s.wait();
  last_training_ = training ? &P : nullptr;
}

void TunableBlocks::backward(const float* dgrid_out) {
  if (!last_training_) throw Error("TunableBlocks::backward without a training forward");
  Plan& P = *last_training_;
  auto& s = cpu_stream();
  const auto& nodes = graph_.nodes;
  const int count = (int)nodes.size();
  std::fill(P.received.begin(), P.received.end(), 0);
  P.diff_out_user.set_data_handle(const_cast<float*>(dgrid_out));
  P.diff_out_reorder.execute(s, P.diff_out_user, P.nodes[count - 1].diff);
  // Where a layer's input gradient goes: straight into the input's diff the first time, else into its scratch
  // buffer, added afterwards (then `add` is true).
  auto target = [&](int j, bool& add) -> memory& {
    add = P.received[j]++ > 0;
    return add ? P.nodes[j].scratch : P.nodes[j].diff;
  };
  auto accumulate = [&](int j) {
    s.wait();
    float* dst = static_cast<float*>(P.nodes[j].diff.get_data_handle());
    const float* src = static_cast<const float*>(P.nodes[j].scratch.get_data_handle());
    const size_t size = P.nodes[j].diff.get_desc().get_size() / sizeof(float);
    for (size_t k = 0; k < size; ++k) dst[k] += src[k];
  };
  for (int i = count - 1; i >= 1; --i) {
    const NetNode& node = nodes[i];
    Plan::Node& N = P.nodes[i];
    const int src = inputs_[i][0];
    if (node.op == "conv") {
      Param& W = params_[param_of_[i]];
      Param& B = params_[param_of_[i] + 1];
      if (node.relu)
        N.relu_bwd.execute(s, {{DNNL_ARG_DST, N.out}, {DNNL_ARG_DIFF_DST, N.diff}, {DNNL_ARG_DIFF_SRC, N.diff_pre}});
      N.bwd_w.execute(s, {{DNNL_ARG_SRC, P.nodes[src].out},
                          {DNNL_ARG_DIFF_DST, N.diff_pre},
                          {DNNL_ARG_DIFF_WEIGHTS, N.diff_w},
                          {DNNL_ARG_DIFF_BIAS, N.diff_b}});
      N.diff_w_reorder.execute(s, N.diff_w, N.diff_w_user);
      if (src != 0) {
        if (N.separate_bwd_data_w) N.bwd_data_w_reorder.execute(s, N.w_user, N.bwd_data_w);
        bool add;
        memory& dst = target(src, add);
        N.bwd_data.execute(
            s, {{DNNL_ARG_DIFF_DST, N.diff_pre}, {DNNL_ARG_WEIGHTS, N.bwd_data_w}, {DNNL_ARG_DIFF_SRC, dst}});
        if (add) accumulate(src);
      }
      s.wait();
      const float* dw = static_cast<const float*>(N.diff_w_user.get_data_handle());
      const float* db = static_cast<const float*>(N.diff_b.get_data_handle());
      W.ensure_grad(), B.ensure_grad();
      for (size_t k = 0; k < W.grad.size(); ++k) W.grad[k] += dw[k];
      for (size_t k = 0; k < B.grad.size(); ++k) B.grad[k] += db[k];
    } else if (node.op == "maxpool" || node.op == "avgpool") {
      if (src == 0) continue;
      bool add;
      memory& dst = target(src, add);
      std::unordered_map<int, memory> args{{DNNL_ARG_DIFF_DST, N.diff}, {DNNL_ARG_DIFF_SRC, dst}};
      if (node.op == "maxpool") args[DNNL_ARG_WORKSPACE] = N.workspace;
      N.pool_bwd.execute(s, args);
      if (add) accumulate(src);
    } else if (node.op == "affine") {
      Param& scale = params_[param_of_[i]];
      Param& offset = params_[param_of_[i] + 1];
      bool add = false;
      memory& dst = src != 0 ? target(src, add) : N.diff_src_scratch;
      std::unordered_map<int, memory> args{{DNNL_ARG_SRC, P.nodes[src].out},   {DNNL_ARG_MEAN, N.mean},
                                           {DNNL_ARG_VARIANCE, N.variance},    {DNNL_ARG_SCALE, N.scale},
                                           {DNNL_ARG_SHIFT, N.shift},          {DNNL_ARG_DIFF_DST, N.diff},
                                           {DNNL_ARG_DIFF_SRC, dst},           {DNNL_ARG_DIFF_SCALE, N.diff_scale},
                                           {DNNL_ARG_DIFF_SHIFT, N.diff_shift}};
      if (node.relu) args[DNNL_ARG_WORKSPACE] = N.workspace;
      N.affine_bwd.execute(s, args);
      if (add) accumulate(src);
      s.wait();
      const float* ds = static_cast<const float*>(N.diff_scale.get_data_handle());
      const float* dh = static_cast<const float*>(N.diff_shift.get_data_handle());
      scale.ensure_grad(), offset.ensure_grad();
      for (size_t k = 0; k < scale.grad.size(); ++k) scale.grad[k] += ds[k];
      for (size_t k = 0; k < offset.grad.size(); ++k) offset.grad[k] += dh[k];
    } else if (node.op == "add") {
      for (int j : inputs_[i]) {
        if (j == 0) continue;
        bool add;
        memory& dst = target(j, add);
        N.copy_diff.execute(s, N.diff, dst);
        if (add) accumulate(j);
      }
    } else {  // concat: each input's gradient is its channel slice of the output's
      for (size_t k = 0; k < inputs_[i].size(); ++k) {
        const int j = inputs_[i][k];
        if (j == 0) continue;
        bool add;
        memory& dst = target(j, add);
        N.slice_reorders[k].execute(s, N.diff_slices[k], dst);
        if (add) accumulate(j);
      }
    }
  }
  s.wait();
}

}  // namespace sat
