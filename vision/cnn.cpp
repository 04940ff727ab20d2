#include "vision/cnn.hpp"

#include <cmath>
#include <cstring>
#include <oneapi/dnnl/dnnl.hpp>

#include "vision/detector.hpp"
#include "vision/onednn.hpp"

namespace sat {

using namespace dnnl;
using tag = memory::format_tag;
using dt = memory::data_type;

// Parameters of one block, in order. The conv has no bias: batch norm right after it would cancel it.
enum { kConvW, kScale, kShift, kMean, kVar, kPerBlock };

EncoderConfig EncoderConfig::make_pretrained(const NetGraph& full, const std::string& cut, int input_size,
                                             const float mean[3], const float stdev[3], bool raw) {
  EncoderConfig c;
  c.kind = "pretrained";
  c.blocks.clear();
  c.coord_channels = false;
  c.graph = full.cut(raw ? cut : full.grid_node(cut));
  c.cut = cut;
  c.input_size = input_size;
  for (int i = 0; i < 3; ++i) c.mean[i] = mean[i], c.stdev[i] = stdev[i];
  auto shapes = c.graph.shapes(input_size, input_size);
  c.pretrained_grid_h = shapes.back().h, c.pretrained_grid_w = shapes.back().w;
  c.pretrained_channels = shapes.back().c;
  return c;
}

const char* const kObjectForms = "maps, tags, both or tags+trunk";

bool valid_object_form(const std::string& form) {
  return form == "maps" || form == "tags" || form == "both" || form == "tags+trunk";
}

bool object_form_has_trunk(const std::string& form) {
  return form == "tags+trunk";
}

int object_form_channels(const std::string& form, int classes, int trunk_channels) {
  return form == "both" ? 2 * classes : object_form_has_trunk(form) ? classes + trunk_channels : classes;
}

int EncoderConfig::grid_w() const {
  return pretrained() ? pretrained_grid_w : grid_h();
}

int EncoderConfig::grid_h() const {
  if (pretrained()) return pretrained_grid_h;
  int h = input_size;
  for (auto& b : blocks) h = (b.pool > 1) ? (h < b.pool ? 0 : (h - b.pool) / b.pool + 1) : h;
  return h;
}

EncoderConfig EncoderConfig::cache_config() const {
  if (!tuned()) return *this;
  // the frozen part's raw output: the tuned layers may read it unnormalized (a ResNet unit's identity shortcut)
  EncoderConfig c = make_pretrained(graph, tune_from, input_size, mean, stdev, true);
  c.weights_file = weights_file, c.weights_sha256 = weights_sha256;
  // object channels pooled onto that layer's grid (max-pooled on to the tuned layers' grid when read)
  c.object_channels = object_channels, c.object_scale = object_scale, c.object_form = object_form;
  return c;
}

nlohmann::json EncoderConfig::to_json() const {
  if (pretrained()) {
    nlohmann::json j = {{"kind", "pretrained"},
                        {"input_size", input_size},
                        {"cut", cut},
                        {"mean", {mean[0], mean[1], mean[2]}},
                        {"std", {stdev[0], stdev[1], stdev[2]}},
                        {"graph", graph.to_json()}};
    if (!tune_from.empty()) j["tune_from"] = tune_from;  // absent when frozen: older files and caches keep their ids
    if (!weights_file.empty()) j["weights"] = {{"file", weights_file}, {"sha256", weights_sha256}};
    if (object_channels > 0) {  // else absent; "form" absent for maps, so the files and caches before it keep their ids
      j["objects"] = {{"channels", object_channels}, {"scale", object_scale}};
      if (object_form != "maps") j["objects"]["form"] = object_form;
    }
    return j;
  }
  nlohmann::json bl = nlohmann::json::array();
  for (auto& b : blocks) bl.push_back({{"out_channels", b.out_channels}, {"kernel", b.kernel}, {"pool", b.pool}});
  return {{"kind", "cnn"},
          {"input_size", input_size},
          {"blocks", bl},
          {"coord_channels", coord_channels},
          {"mean", {mean[0], mean[1], mean[2]}},
          {"std", {stdev[0], stdev[1], stdev[2]}},
          {"bn_momentum", bn_momentum}};
}

EncoderConfig EncoderConfig::from_json(const nlohmann::json& j) {
  EncoderConfig c;
  if (j.is_object() && j.value("kind", "cnn") == "pretrained") {
    try {
      auto m = j.at("mean").get<std::vector<float>>(), s = j.at("std").get<std::vector<float>>();
      if (m.size() != 3 || s.size() != 3) throw Error("mean/std need 3 values");
      int size = j.at("input_size").get<int>();
      if (size < 8 || size > 2048) throw Error("encoder input_size out of range");
      EncoderConfig p =
          make_pretrained(NetGraph::from_json(j.at("graph")), j.at("cut").get<std::string>(), size, m.data(), s.data());
      p.tune_from = j.value("tune_from", std::string());
      if (j.contains("weights")) {
        p.weights_file = j.at("weights").at("file").get<std::string>();
        p.weights_sha256 = j.at("weights").at("sha256").get<std::string>();
        if (p.weights_file.empty() || p.weights_file.find('/') != std::string::npos || p.weights_sha256.size() != 64)
          throw Error("encoder weights need a plain file name and a 64-digit sha256");
      }
      if (!p.tune_from.empty() && p.graph.index_of(p.tune_from) < 0)
        throw Error("encoder tune_from '" + p.tune_from + "' is not a layer of the encoder");
      if (j.contains("objects")) {
        p.object_channels = j.at("objects").at("channels").get<int>();
        p.object_scale = j.at("objects").at("scale").get<float>();
        p.object_form = j.at("objects").value("form", std::string("maps"));
        if (!valid_object_form(p.object_form))
          throw Error("encoder objects form '" + p.object_form + "' is not " + kObjectForms);
        if (p.object_channels != object_form_channels(p.object_form, 80, kCenternetTrunkChannels) ||
            !(p.object_scale > 0.f && p.object_scale <= 1000.f))
          throw Error("encoder objects need 80 channels (160 for both forms, 560 for tags+trunk) and a scale in (0, 1000]");
      }
      return p;
    } catch (const Error&) {
      throw;
    } catch (const std::exception& e) {
      throw Error(std::string("encoder config is malformed (") + e.what() + ")");
    }
  }
  try {
    c.input_size = j.at("input_size").get<int>();
    c.blocks.clear();
    for (auto& b : j.at("blocks"))
      c.blocks.push_back({b.at("out_channels").get<int>(), b.at("kernel").get<int>(), b.at("pool").get<int>()});
    c.coord_channels = j.at("coord_channels").get<bool>();
    auto m = j.at("mean").get<std::vector<float>>(), s = j.at("std").get<std::vector<float>>();
    if (m.size() != 3 || s.size() != 3) throw Error("mean/std need 3 values");
    for (int i = 0; i < 3; ++i) c.mean[i] = m[i], c.stdev[i] = s[i];
    c.bn_momentum = j.value("bn_momentum", 0.9f);
  } catch (const Error&) {
    throw;
  } catch (const std::exception& e) {
    throw Error(std::string("encoder config is malformed (") + e.what() + ")");
  }
  if (c.blocks.empty()) throw Error("encoder config has no blocks");
  if (c.input_size < 8 || c.input_size > 2048) throw Error("encoder input_size out of range");
  for (auto& b : c.blocks)
    if (b.out_channels < 1 || b.out_channels > 4096 || b.kernel < 1 || b.kernel % 2 == 0 || b.pool < 1)
      throw Error("encoder block is malformed (channels, odd kernel, pool >= 1)");
  if (c.grid_h() < 1) throw Error("encoder blocks pool the image away (grid is empty)");
  return c;
}

std::vector<ConvBlockConfig> EncoderConfig::parse_blocks(const std::string& spec) {
  std::vector<ConvBlockConfig> out;
  size_t pos = 0;
  while (pos <= spec.size()) {
    size_t comma = spec.find(',', pos);
    std::string item = spec.substr(pos, comma == std::string::npos ? std::string::npos : comma - pos);
    int ch = 0;
    try {
      size_t used = 0;
      ch = std::stoi(item, &used);
      if (used != item.size()) ch = 0;
    } catch (const std::exception&) {
    }
    if (ch <= 0) throw Error("--blocks: '" + spec + "' is not a comma-separated list of channel counts");
    out.push_back({ch, 3, 2});
    if (comma == std::string::npos) break;
    pos = comma + 1;
  }
  return out;
}

// Everything for one batch size: memory descriptors chosen by the primitives (blocked layouts),
// primitives created once, memories reused. Reorders happen only at the edges: image in, grid out,
// and weights (which change every step).
struct CnnEncoder::Plan {
  struct Layer {
    memory src, conv_dst, bn_dst, pool_dst;  // pool_dst empty when there is no pooling
    memory conv_w_user, conv_w, scale, shift, mean, var, bn_ws, pool_ws;
    convolution_forward conv;
    batch_normalization_forward bn;
    pooling_forward pool;
    reorder w_reorder;
    // training only
    memory diff_conv_dst, diff_bn_dst, diff_src;  // diff_bn_dst only when pooling
    memory bwd_w, diff_w, diff_w_user, diff_scale, diff_shift;
    convolution_backward_data conv_bwd_data;
    convolution_backward_weights conv_bwd_w;
    batch_normalization_backward bn_bwd;
    pooling_backward pool_bwd;
    reorder bwd_w_reorder, diff_w_reorder;
    bool has_pool = false, need_bwd_w_reorder = false, need_diff_w_reorder = false;
  };
  int n = 0;
  bool training = false;
  memory image_user, grid_user, diff_grid_user, diff_out;
  reorder image_reorder, grid_reorder, diff_grid_reorder;
  bool need_image_reorder = false;
  std::vector<Layer> layers;
  memory out() const { return layers.back().has_pool ? layers.back().pool_dst : layers.back().bn_dst; }
};

CnnEncoder::CnnEncoder(const EncoderConfig& cfg) : cfg_(cfg) {
  int in_ch = 3;
  for (size_t i = 0; i < cfg_.blocks.size(); ++i) {
    auto& b = cfg_.blocks[i];
    std::string p = "encoder.block" + std::to_string(i) + ".";
    params_.emplace_back(p + "conv.weight", std::vector<int64_t>{b.out_channels, in_ch, b.kernel, b.kernel});
    params_.emplace_back(p + "bn.scale", std::vector<int64_t>{b.out_channels});
    params_.emplace_back(p + "bn.shift", std::vector<int64_t>{b.out_channels});
    params_.emplace_back(p + "bn.running_mean", std::vector<int64_t>{b.out_channels}, false);
    params_.emplace_back(p + "bn.running_var", std::vector<int64_t>{b.out_channels}, false);
    std::fill(params_[params_.size() - 4].value.begin(), params_[params_.size() - 4].value.end(), 1.f);  // scale
    std::fill(params_.back().value.begin(), params_.back().value.end(), 1.f);
    in_ch = b.out_channels;
  }
}

CnnEncoder::~CnnEncoder() = default;

void CnnEncoder::init(Rng& rng) {
  for (size_t i = 0; i < cfg_.blocks.size(); ++i) {
    Param& w = params_[i * kPerBlock + kConvW];
    double fan_in = (double)w.shape[1] * w.shape[2] * w.shape[3];
    double sd = std::sqrt(2.0 / fan_in);
    for (auto& v : w.value) v = (float)(sd * rng.normal());
    auto set = [&](int k, float v) {
      std::fill(params_[i * kPerBlock + k].value.begin(), params_[i * kPerBlock + k].value.end(), v);
    };
    set(kScale, 1.f);
    set(kShift, 0.f);
    set(kMean, 0.f);
    set(kVar, 1.f);
  }
}

CnnEncoder::Plan& CnnEncoder::plan_for(int n, bool training) {
  auto key = std::make_pair(n, training);
  auto it = plans_.find(key);
  if (it != plans_.end()) return *it->second;
  auto plan = std::make_unique<Plan>();
  Plan& P = *plan;
  P.n = n;
  P.training = training;
  auto& eng = cpu_engine();
  const auto prop = training ? prop_kind::forward_training : prop_kind::forward_inference;

  int h = cfg_.input_size, in_ch = 3;
  memory::desc src_md({n, 3, h, h}, dt::f32, tag::nchw);
  P.image_user = memory(src_md, eng, nullptr);
  for (size_t i = 0; i < cfg_.blocks.size(); ++i) {
    auto& b = cfg_.blocks[i];
    Plan::Layer L;
    const int pad = (b.kernel - 1) / 2;
    memory::dims strides{1, 1}, padding{pad, pad};
    // The first conv picks its own input layout (the image is reordered into it); later convs take the
    // previous block's output layout as is, so no reorder happens inside the network.
    memory::desc conv_src_md = (i == 0) ? memory::desc({n, 3, h, h}, dt::f32, tag::any) : src_md;
    memory::desc w_md({b.out_channels, in_ch, b.kernel, b.kernel}, dt::f32, tag::any);
    memory::desc dst_md({n, b.out_channels, h, h}, dt::f32, tag::any);
    convolution_forward::desc conv_d(prop, algorithm::convolution_direct, conv_src_md, w_md, dst_md, strides, padding,
                                     padding);
    convolution_forward::primitive_desc conv_pd(conv_d, eng);
    if (i == 0) {
      P.need_image_reorder = conv_pd.src_desc() != P.image_user.get_desc();
      L.src = P.need_image_reorder ? memory(conv_pd.src_desc(), eng) : P.image_user;
      if (P.need_image_reorder) P.image_reorder = reorder(P.image_user, L.src);
    } else {
      L.src = P.layers.back().has_pool ? P.layers.back().pool_dst : P.layers.back().bn_dst;
    }
    Param& W = params_[i * kPerBlock + kConvW];
    L.conv_w_user = memory({{b.out_channels, in_ch, b.kernel, b.kernel}, dt::f32, tag::oihw}, eng, W.value.data());
    L.conv_w = memory(conv_pd.weights_desc(), eng);
    L.w_reorder = reorder(L.conv_w_user, L.conv_w);
    L.conv_dst = memory(conv_pd.dst_desc(), eng);
    L.conv = convolution_forward(conv_pd);

    auto flags = normalization_flags::use_scale | normalization_flags::use_shift | normalization_flags::fuse_norm_relu;
    if (!training) flags = flags | normalization_flags::use_global_stats;
    batch_normalization_forward::desc bn_d(prop, conv_pd.dst_desc(), kBnEpsilon, flags);
    batch_normalization_forward::primitive_desc bn_pd(bn_d, eng);
    memory::desc c_md({b.out_channels}, dt::f32, tag::x);
    L.scale = memory(c_md, eng, params_[i * kPerBlock + kScale].value.data());
    L.shift = memory(c_md, eng, params_[i * kPerBlock + kShift].value.data());
    if (training) {
      L.mean = memory(bn_pd.mean_desc(), eng);
      L.var = memory(bn_pd.variance_desc(), eng);
      L.bn_ws = memory(bn_pd.workspace_desc(), eng);
    } else {
      L.mean = memory(c_md, eng, params_[i * kPerBlock + kMean].value.data());
      L.var = memory(c_md, eng, params_[i * kPerBlock + kVar].value.data());
    }
    L.bn_dst = memory(bn_pd.dst_desc(), eng);
    L.bn = batch_normalization_forward(bn_pd);

    int oh = h;
    pooling_forward::primitive_desc pool_pd;
    if (b.pool > 1) {
      L.has_pool = true;
      oh = (h - b.pool) / b.pool + 1;
      memory::desc pdst_md({n, b.out_channels, oh, oh}, dt::f32, tag::any);
      pooling_forward::desc pool_d(prop, algorithm::pooling_max, bn_pd.dst_desc(), pdst_md, {b.pool, b.pool},
                                   {b.pool, b.pool}, {0, 0}, {0, 0});
      pool_pd = pooling_forward::primitive_desc(pool_d, eng);
      L.pool_dst = memory(pool_pd.dst_desc(), eng);
      if (training) L.pool_ws = memory(pool_pd.workspace_desc(), eng);
      L.pool = pooling_forward(pool_pd);
    }

    if (training) {
      memory::desc ddst_md = conv_pd.dst_desc();
      if (i > 0) {
        convolution_backward_data::desc bd_d(
            algorithm::convolution_direct, conv_pd.src_desc(),
            memory::desc({b.out_channels, in_ch, b.kernel, b.kernel}, dt::f32, tag::any), ddst_md, strides, padding,
            padding);
        convolution_backward_data::primitive_desc bd_pd(bd_d, eng, conv_pd);
        L.need_bwd_w_reorder = bd_pd.weights_desc() != conv_pd.weights_desc();
        L.bwd_w = L.need_bwd_w_reorder ? memory(bd_pd.weights_desc(), eng) : L.conv_w;
        if (L.need_bwd_w_reorder) L.bwd_w_reorder = reorder(L.conv_w_user, L.bwd_w);
        L.diff_src = memory(bd_pd.diff_src_desc(), eng);
        L.conv_bwd_data = convolution_backward_data(bd_pd);
      }
      convolution_backward_weights::desc bw_d(
          algorithm::convolution_direct, conv_pd.src_desc(),
          memory::desc({b.out_channels, in_ch, b.kernel, b.kernel}, dt::f32, tag::any), ddst_md, strides, padding,
          padding);
      convolution_backward_weights::primitive_desc bw_pd(bw_d, eng, conv_pd);
      L.diff_w = memory(bw_pd.diff_weights_desc(), eng);
      L.diff_w_user = memory({{b.out_channels, in_ch, b.kernel, b.kernel}, dt::f32, tag::oihw}, eng);
      L.need_diff_w_reorder = bw_pd.diff_weights_desc() != L.diff_w_user.get_desc();
      if (L.need_diff_w_reorder) L.diff_w_reorder = reorder(L.diff_w, L.diff_w_user);
      L.conv_bwd_w = convolution_backward_weights(bw_pd);
      L.diff_conv_dst = memory(ddst_md, eng);

      batch_normalization_backward::desc bnb_d(prop_kind::backward, bn_pd.dst_desc(), conv_pd.dst_desc(), kBnEpsilon,
                                               flags);
      batch_normalization_backward::primitive_desc bnb_pd(bnb_d, eng, bn_pd);
      if (b.pool > 1) L.diff_bn_dst = memory(bn_pd.dst_desc(), eng);
      L.diff_scale = memory(c_md, eng);
      L.diff_shift = memory(c_md, eng);
      L.bn_bwd = batch_normalization_backward(bnb_pd);
      if (L.has_pool) {
        pooling_backward::desc pb_d(algorithm::pooling_max, bn_pd.dst_desc(), pool_pd.dst_desc(), {b.pool, b.pool},
                                    {b.pool, b.pool}, {0, 0}, {0, 0});
        pooling_backward::primitive_desc pb_pd(pb_d, eng, pool_pd);
        L.pool_bwd = pooling_backward(pb_pd);
      }
    }
    src_md = L.has_pool ? pool_pd.dst_desc() : bn_pd.dst_desc();
    h = oh;
    in_ch = b.out_channels;
    P.layers.push_back(std::move(L));
  }
  const int C = cfg_.blocks.back().out_channels;
  P.grid_user = memory({{n, C, h, h}, dt::f32, tag::nhwc}, eng);
  P.grid_reorder = reorder(P.out(), P.grid_user);
  if (training) {
    P.diff_grid_user = memory({{n, C, h, h}, dt::f32, tag::nhwc}, eng);
    P.diff_out = memory(P.out().get_desc(), eng);
    P.diff_grid_reorder = reorder(P.diff_grid_user, P.diff_out);
  }
  plans_[key] = std::move(plan);
  return *plans_[key];
}

void CnnEncoder::forward(const float* images, int n, bool training, std::vector<float>& grid) {
  Plan& P = plan_for(n, training);
  auto& s = cpu_stream();
  P.image_user.set_data_handle(const_cast<float*>(images));
  if (P.need_image_reorder) P.image_reorder.execute(s, P.image_user, P.layers[0].src);
  for (size_t i = 0; i < P.layers.size(); ++i) {
    auto& L = P.layers[i];
    L.w_reorder.execute(s, L.conv_w_user, L.conv_w);
    L.conv.execute(s, {{DNNL_ARG_SRC, L.src}, {DNNL_ARG_WEIGHTS, L.conv_w}, {DNNL_ARG_DST, L.conv_dst}});
    std::unordered_map<int, memory> bn_args{{DNNL_ARG_SRC, L.conv_dst}, {DNNL_ARG_DST, L.bn_dst},
                                            {DNNL_ARG_SCALE, L.scale},  {DNNL_ARG_SHIFT, L.shift},
                                            {DNNL_ARG_MEAN, L.mean},    {DNNL_ARG_VARIANCE, L.var}};
    if (training) bn_args[DNNL_ARG_WORKSPACE] = L.bn_ws;
    L.bn.execute(s, bn_args);
    if (L.has_pool) {
      std::unordered_map<int, memory> pool_args{{DNNL_ARG_SRC, L.bn_dst}, {DNNL_ARG_DST, L.pool_dst}};
      if (training) pool_args[DNNL_ARG_WORKSPACE] = L.pool_ws;
      L.pool.execute(s, pool_args);
    }
  }
  memory out = P.out();
  P.grid_reorder.execute(s, out, P.grid_user);
  s.wait();

  if (training) {  // running statistics, as in PyTorch: running = m * running + (1 - m) * batch (unbiased var)
    const float m = cfg_.bn_momentum;
    int h = cfg_.input_size;
    for (size_t i = 0; i < P.layers.size(); ++i) {
      const float* bm = (const float*)P.layers[i].mean.get_data_handle();
      const float* bv = (const float*)P.layers[i].var.get_data_handle();
      auto& rm = params_[i * kPerBlock + kMean].value;
      auto& rv = params_[i * kPerBlock + kVar].value;
      double count = (double)n * h * h, unbias = count > 1 ? count / (count - 1) : 1.0;
      for (size_t c = 0; c < rm.size(); ++c) {
        rm[c] = m * rm[c] + (1 - m) * bm[c];
        rv[c] = m * rv[c] + (1 - m) * (float)(bv[c] * unbias);
      }
      if (cfg_.blocks[i].pool > 1) h = (h - cfg_.blocks[i].pool) / cfg_.blocks[i].pool + 1;
    }
    last_training_ = &P;
  }

  const int L = cfg_.locations(), C = cfg_.blocks.back().out_channels, D = cfg_.feature_dim();
  grid.resize((size_t)n * L * D);
  const float* g = (const float*)P.grid_user.get_data_handle();
  const int gh = cfg_.grid_h(), gw = cfg_.grid_w();
  for (int b = 0; b < n; ++b)
    for (int l = 0; l < L; ++l) {
      float* dst = grid.data() + ((size_t)b * L + l) * D;
      std::memcpy(dst, g + ((size_t)b * L + l) * C, C * sizeof(float));
      if (cfg_.coord_channels) {
        int r = l / gw, c = l % gw;
        dst[C] = gh > 1 ? -1.f + 2.f * r / (gh - 1) : 0.f;
        dst[C + 1] = gw > 1 ? -1.f + 2.f * c / (gw - 1) : 0.f;
      }
    }
}

void CnnEncoder::backward(const float* dgrid) {
  if (!last_training_) throw Error("encoder backward called without a training forward");
  Plan& P = *last_training_;
  auto& s = cpu_stream();
  const int n = P.n, L = cfg_.locations(), C = cfg_.blocks.back().out_channels, D = cfg_.feature_dim();
  float* dg = (float*)P.diff_grid_user.get_data_handle();
  for (int b = 0; b < n; ++b)
    for (int l = 0; l < L; ++l)
      std::memcpy(dg + ((size_t)b * L + l) * C, dgrid + ((size_t)b * L + l) * D, C * sizeof(float));

  // dout: gradient w.r.t. the current block's output (pooled output if it pools), already in the
  // layout that block produced, so nothing is reordered inside the network.
  P.diff_grid_reorder.execute(s, P.diff_grid_user, P.diff_out);
  memory dout = P.diff_out;
  for (int i = (int)P.layers.size() - 1; i >= 0; --i) {
    auto& Lr = P.layers[i];
    memory diff_bn_dst = dout;
    if (Lr.has_pool) {
      Lr.pool_bwd.execute(
          s, {{DNNL_ARG_DIFF_DST, dout}, {DNNL_ARG_WORKSPACE, Lr.pool_ws}, {DNNL_ARG_DIFF_SRC, Lr.diff_bn_dst}});
      diff_bn_dst = Lr.diff_bn_dst;
    }
    Lr.bn_bwd.execute(s, {{DNNL_ARG_SRC, Lr.conv_dst},
                          {DNNL_ARG_MEAN, Lr.mean},
                          {DNNL_ARG_VARIANCE, Lr.var},
                          {DNNL_ARG_DIFF_DST, diff_bn_dst},
                          {DNNL_ARG_SCALE, Lr.scale},
                          {DNNL_ARG_SHIFT, Lr.shift},  // oneDNN 2.6 rejects the call without it
                          {DNNL_ARG_WORKSPACE, Lr.bn_ws},
                          {DNNL_ARG_DIFF_SRC, Lr.diff_conv_dst},
                          {DNNL_ARG_DIFF_SCALE, Lr.diff_scale},
                          {DNNL_ARG_DIFF_SHIFT, Lr.diff_shift}});
    Lr.conv_bwd_w.execute(
        s, {{DNNL_ARG_SRC, Lr.src}, {DNNL_ARG_DIFF_DST, Lr.diff_conv_dst}, {DNNL_ARG_DIFF_WEIGHTS, Lr.diff_w}});
    if (Lr.need_diff_w_reorder) Lr.diff_w_reorder.execute(s, Lr.diff_w, Lr.diff_w_user);
    if (i > 0) {
      if (Lr.need_bwd_w_reorder) Lr.bwd_w_reorder.execute(s, Lr.conv_w_user, Lr.bwd_w);
      Lr.conv_bwd_data.execute(
          s, {{DNNL_ARG_DIFF_DST, Lr.diff_conv_dst}, {DNNL_ARG_WEIGHTS, Lr.bwd_w}, {DNNL_ARG_DIFF_SRC, Lr.diff_src}});
      dout = Lr.diff_src;
    }
    s.wait();
    auto add = [](Param& p, const memory& m) {
      p.ensure_grad();
      const float* src = (const float*)m.get_data_handle();
      for (size_t k = 0; k < p.grad.size(); ++k) p.grad[k] += src[k];
    };
    add(params_[i * kPerBlock + kConvW], Lr.need_diff_w_reorder ? Lr.diff_w_user : Lr.diff_w);
    add(params_[i * kPerBlock + kScale], Lr.diff_scale);
    add(params_[i * kPerBlock + kShift], Lr.diff_shift);
  }
}

}  // namespace sat
