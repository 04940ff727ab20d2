#include "vision/detector.hpp"

#include <omp.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <unordered_map>

#include "datasets/sha256.hpp"
#include "vision/pretrained.hpp"

namespace sat {

using namespace dnnl;
using tag = memory::format_tag;
using dt = memory::data_type;

const char* const kCenternetJson = "centernet.json";
const char* const kCenternetJsonSha256 = "bfb942eaacc5becf738d536663bc4580a0ae9e560722306e6d4dd7fe4a09de05";
const char* const kCenternetBin = "centernet.bin";
const char* const kCenternetBinSha256 = "1b635a15009071f506f9f2b3519b31c072c534888989f30d269ffd44734ef7ef";
const char* const kCenternetFolder = "centernet_mobilenetv3";
const char* const kCenternetOutput = "tower_0/keypoints";
const char* const kCenternetTrunk = "tower_0/extern1/hard_swish/mul_1";

const std::vector<std::string>& coco_class_names() {
  static const std::vector<std::string> names = {
      "person",         "bicycle",    "car",           "motorcycle",    "airplane",     "bus",           "train",
      "truck",          "boat",       "traffic light", "fire hydrant",  "stop sign",    "parking meter", "bench",
      "bird",           "cat",        "dog",           "horse",         "sheep",        "cow",           "elephant",
      "bear",           "zebra",      "giraffe",       "backpack",      "umbrella",     "handbag",       "tie",
      "suitcase",       "frisbee",    "skis",          "snowboard",     "sports ball",  "kite",          "baseball bat",
      "baseball glove", "skateboard", "surfboard",     "tennis racket", "bottle",       "wine glass",    "cup",
      "fork",           "knife",      "spoon",         "bowl",          "banana",       "apple",         "sandwich",
      "orange",         "broccoli",   "carrot",        "hot dog",       "pizza",        "donut",         "cake",
      "chair",          "couch",      "potted plant",  "bed",           "dining table", "toilet",        "tv",
      "laptop",         "mouse",      "remote",        "keyboard",      "cell phone",   "microwave",     "oven",
      "toaster",        "sink",       "refrigerator",  "book",          "clock",        "vase",          "scissors",
      "teddy bear",     "hair drier", "toothbrush"};
  return names;
}

struct ObjectDetector::Plan {
  memory image, heat;       // the caller's images (planar) and heat (NHWC); handles set at each forward
  memory trunk;             // the caller's trunk means (n x C), when the net has a trunk; set at each forward
  std::vector<memory> out;  // per layer: its output, a view into a pooled buffer
  std::vector<FloatBuffer> pool;
  std::vector<memory> owned;  // weights, biases, the image in the first convolution's layout, resize scratch
  struct Step {
    primitive prim;
    std::unordered_map<int, memory> args;
    std::function<void()> custom;  // TF's legacy resize, on NHWC float32 copies
  };
  std::vector<Step> steps;
};

ObjectDetector::ObjectDetector(DetectorNet net, int input_size, Precision precision)
    : net_(std::move(net)), input_size_(input_size), precision_(precision) {
  if (precision_ == Precision::int8) precision_ = cpu_prefers_bf16() ? Precision::bf16 : Precision::f32;
  if (input_size_ < 32 || input_size_ > 4096 || input_size_ % 32)
    fail(net_.path, "input size " + std::to_string(input_size_) + " is not a multiple of 32 in 32..4096");
  shapes_ = net_.shapes(input_size_);
  const NodeShape& o = shapes_[net_.output];
  map_size_ = o.h;
  classes_ = o.c;
  if (o.h != o.w) fail(net_.path, "its output is not square");
  macs_ = net_.conv_macs(input_size_);
}

ObjectDetector::~ObjectDetector() = default;

namespace {

// A post-op's oneDNN algorithm and parameters (the sum has none).
algorithm post_op_algorithm(const PostOp& p, float& alpha, float& beta) {
  alpha = beta = 0.f;
  switch (p.kind) {
    case PostOpKind::linear:
      alpha = p.alpha, beta = p.beta;
      return algorithm::eltwise_linear;
    case PostOpKind::relu:
      return algorithm::eltwise_relu;
    case PostOpKind::relu6:
      alpha = 6.f;
      return algorithm::eltwise_bounded_relu;
    case PostOpKind::hard_swish:
      return algorithm::eltwise_hardswish;
    case PostOpKind::logistic:
      return algorithm::eltwise_logistic;
    case PostOpKind::sum:
      break;
  }
  return algorithm::undef;
}

// How many of a convolution's post-ops one oneDNN 2.6 primitive computes right: up to the second use of an algorithm
// with other parameters (that one computes with the first one's); the rest run as eltwise primitives after it.
size_t fusable_post_ops(const std::vector<PostOp>& post) {
  for (size_t k = 0; k < post.size(); ++k)
    for (size_t j = 0; j < k; ++j) {
      float a1, b1, a2, b2;
      if (post[k].kind != PostOpKind::sum && post_op_algorithm(post[k], a1, b1) == post_op_algorithm(post[j], a2, b2) &&
          (a1 != a2 || b1 != b2 || post[k].scale != post[j].scale))
        return k;
    }
  return post.size();
}

void append_post_ops(const std::vector<PostOp>& post, size_t count, post_ops& po) {
  for (size_t k = 0; k < count; ++k) {
    const PostOp& p = post[k];
    float alpha, beta;
    const algorithm alg = post_op_algorithm(p, alpha, beta);
    if (p.kind == PostOpKind::sum)
      po.append_sum(1.f);
    else
      po.append_eltwise(p.scale, alg, alpha, beta);
  }
}

// TF's legacy bilinear resize (align_corners = half_pixel_centers = false): source coordinate = destination index x
// (input side / output side), in float as TF computes it; the upper neighbour clamped to the last row or column.
void legacy_resize_nhwc(const float* in, int n, int h, int w, int c, float* out, int oh, int ow) {
  const float sy = (float)h / (float)oh, sx = (float)w / (float)ow;
#pragma omp parallel for collapse(2)
  for (int b = 0; b < n; ++b)
    for (int y = 0; y < oh; ++y) {
      const float fy = (float)y * sy;
      const int y0 = std::min((int)std::floor(fy), h - 1), y1 = std::min(y0 + 1, h - 1);
      const float dy = fy - (float)y0;
      for (int x = 0; x < ow; ++x) {
        const float fx = (float)x * sx;
        const int x0 = std::min((int)std::floor(fx), w - 1), x1 = std::min(x0 + 1, w - 1);
        const float dx = fx - (float)x0;
        const float* p00 = in + (((size_t)b * h + y0) * w + x0) * c;
        const float* p01 = in + (((size_t)b * h + y0) * w + x1) * c;
        const float* p10 = in + (((size_t)b * h + y1) * w + x0) * c;
        const float* p11 = in + (((size_t)b * h + y1) * w + x1) * c;
        float* q = out + (((size_t)b * oh + y) * ow + x) * c;
        for (int k = 0; k < c; ++k) {
          const float top = p00[k] + (p01[k] - p00[k]) * dx;
          const float bottom = p10[k] + (p11[k] - p10[k]) * dx;
          q[k] = top + (bottom - top) * dy;
        }
      }
    }
}

// Builds one batch size's plan: descriptors, buffers (shared by layers whose lifetimes do not overlap), steps.
struct PlanBuilder {
  const DetectorNet& net;
  const std::vector<NodeShape>& shapes;
  const int n, count;
  const dt type;
  const tag act;
  engine& eng;
  ObjectDetector::Plan& P;

  memory::desc desc(int i) const {
    const NodeShape& s = shapes[i];
    return memory::desc({n, s.c, s.h, s.w}, i == net.output ? dt::f32 : type, act);
  }
  void assign_buffers();
  void add_conv(int i);
  void add_eltwise_steps(memory from, const memory& to, const std::vector<PostOp>& post, const std::string& name);
  void add_eltwise(int i);
  void add_mean(int i);
  void add_binary(int i);
  void add_concat(int i);
  void add_resize(int i);
  void add_trunk_mean();
  void build();
};

void PlanBuilder::assign_buffers() {
  std::vector<int> last_read(count, -1);
  for (int i = 0; i < count; ++i) {
    for (int in : net.layers[i].inputs) last_read[in] = i;
    for (const PostOp& p : net.layers[i].post)
      if (p.kind == PostOpKind::sum) last_read[p.sum_from] = i;
  }
  last_read[net.output] = count;
  std::vector<int> slot_of(count, -1);
  std::vector<size_t> slot_bytes;
  std::vector<int> free_slots;
  for (int i = 1; i < count; ++i) {
    const size_t bytes = desc(i).get_size();
    // A convolution that adds itself to a residual nothing reads after it writes into the residual's buffer (no copy).
    int residual = -1;
    for (const PostOp& p : net.layers[i].post)
      if (p.kind == PostOpKind::sum && p.sum_from > 0 && last_read[p.sum_from] == i && desc(p.sum_from) == desc(i) &&
          std::find(net.layers[i].inputs.begin(), net.layers[i].inputs.end(), p.sum_from) == net.layers[i].inputs.end())
        residual = p.sum_from;
    if (residual >= 0) {
      slot_of[i] = slot_of[residual];
    } else if (free_slots.empty()) {
      slot_of[i] = (int)slot_bytes.size();
      slot_bytes.push_back(bytes);
    } else {  // the free slot closest above in size, else the largest
      auto best = free_slots.begin();
      for (auto it = free_slots.begin(); it != free_slots.end(); ++it) {
        const size_t have = slot_bytes[*it], best_have = slot_bytes[*best];
        const bool fits = have >= bytes, best_fits = best_have >= bytes;
        if ((fits && (!best_fits || have < best_have)) || (!fits && !best_fits && have > best_have)) best = it;
      }
      slot_of[i] = *best;
      slot_bytes[*best] = std::max(slot_bytes[*best], bytes);
      free_slots.erase(best);
    }
    std::vector<int> read = net.layers[i].inputs;
    for (const PostOp& p : net.layers[i].post)
      if (p.kind == PostOpKind::sum) read.push_back(p.sum_from);
    for (int r : read)
      if (r > 0 && last_read[r] == i && slot_of[r] >= 0 && slot_of[r] != slot_of[i] &&
          std::find(free_slots.begin(), free_slots.end(), slot_of[r]) == free_slots.end())
        free_slots.push_back(slot_of[r]);
  }
  P.pool.resize(slot_bytes.size());
  for (size_t s = 0; s < slot_bytes.size(); ++s) P.pool[s].resize((slot_bytes[s] + 3) / 4);
  P.out.resize(count);
  for (int i = 1; i < count; ++i) P.out[i] = memory(desc(i), eng, P.pool[slot_of[i]].data());
}

void PlanBuilder::add_conv(int i) {
  const DetectorLayer& l = net.layers[i];
  const NodeShape& s = shapes[i];
  const int src = l.inputs[0];
  const int ci = shapes[src].c;
  const memory::dims w_dims = l.depthwise ? memory::dims{s.c, 1, 1, l.kh, l.kw} : memory::dims{s.c, ci, l.kh, l.kw};
  const memory::desc src_md =
      src == 0 ? memory::desc({n, ci, shapes[0].h, shapes[0].w}, type, tag::any) : P.out[src].get_desc();
  convolution_forward::desc d(prop_kind::forward_inference, algorithm::convolution_direct, src_md,
                              memory::desc(w_dims, type, tag::any), memory::desc({s.c}, dt::f32, tag::a), desc(i),
                              {l.stride, l.stride}, {s.pad_t, s.pad_l}, {s.pad_b, s.pad_r});
  const size_t fused = fusable_post_ops(l.post);
  for (size_t k = fused; k < l.post.size(); ++k)
    if (l.post[k].kind == PostOpKind::sum) fail(net.path, "layer " + l.name + ": a residual sum after a repeated step");
  post_ops po;
  append_post_ops(l.post, fused, po);
  primitive_attr attr;
  attr.set_post_ops(po);
  convolution_forward::primitive_desc pd(d, attr, eng);
  memory conv_src = P.out[src];
  if (src == 0) {  // the image, reordered at the edge into the layout (and type) this kernel reads
    conv_src = memory(pd.src_desc(), eng);
    P.owned.push_back(conv_src);
    P.steps.push_back({reorder(P.image, conv_src), {{DNNL_ARG_FROM, P.image}, {DNNL_ARG_TO, conv_src}}, {}});
  }
  memory user_w(memory::desc(w_dims, dt::f32, l.depthwise ? tag::goihw : tag::oihw), eng,
                const_cast<float*>(l.weight.data()));
  memory w(pd.weights_desc(), eng);
  stream strm(eng);
  reorder(user_w, w).execute(strm, user_w, w);
  strm.wait();
  memory b(pd.bias_desc(), eng, const_cast<float*>(l.bias.data()));
  P.owned.push_back(w);
  P.owned.push_back(b);
  for (const PostOp& p : l.post)  // the residual first (unless written in place), then the convolution adds to it
    if (p.kind == PostOpKind::sum && P.out[p.sum_from].get_data_handle() != P.out[i].get_data_handle())
      P.steps.push_back(
          {reorder(P.out[p.sum_from], P.out[i]), {{DNNL_ARG_FROM, P.out[p.sum_from]}, {DNNL_ARG_TO, P.out[i]}}, {}});
  P.steps.push_back({convolution_forward(pd),
                     {{DNNL_ARG_SRC, conv_src}, {DNNL_ARG_WEIGHTS, w}, {DNNL_ARG_BIAS, b}, {DNNL_ARG_DST, P.out[i]}},
                     {}});
  add_eltwise_steps(P.out[i], P.out[i], {l.post.begin() + fused, l.post.end()}, l.name);
}

// Standalone eltwise primitives: the first from `from` into `to`, the rest in place; a scale is one more step.
void PlanBuilder::add_eltwise_steps(memory from, const memory& to, const std::vector<PostOp>& post,
                                    const std::string& name) {
  auto add = [&](algorithm alg, float alpha, float beta) {
    eltwise_forward::desc d(prop_kind::forward_inference, alg, from.get_desc(), alpha, beta);
    P.steps.push_back(
        {eltwise_forward(eltwise_forward::primitive_desc(d, eng)), {{DNNL_ARG_SRC, from}, {DNNL_ARG_DST, to}}, {}});
    from = to;
  };
  for (const PostOp& p : post) {
    if (p.kind == PostOpKind::sum) fail(net.path, "layer " + name + ": a residual sum outside a convolution");
    float alpha, beta;
    const algorithm alg = post_op_algorithm(p, alpha, beta);
    add(alg, alpha, beta);
    if (p.scale != 1.f) add(algorithm::eltwise_linear, p.scale, 0.f);
  }
}

void PlanBuilder::add_eltwise(int i) {
  add_eltwise_steps(P.out[net.layers[i].inputs[0]], P.out[i], net.layers[i].post, net.layers[i].name);
}

void PlanBuilder::add_mean(int i) {
  const int src = net.layers[i].inputs[0];
  const NodeShape& s = shapes[src];
  pooling_forward::desc d(prop_kind::forward_inference, algorithm::pooling_avg_include_padding, P.out[src].get_desc(),
                          desc(i), {s.h, s.w}, {s.h, s.w}, {0, 0}, {0, 0});
  P.steps.push_back({pooling_forward(pooling_forward::primitive_desc(d, eng)),
                     {{DNNL_ARG_SRC, P.out[src]}, {DNNL_ARG_DST, P.out[i]}},
                     {}});
}

void PlanBuilder::add_binary(int i) {
  const DetectorLayer& l = net.layers[i];
  int a = l.inputs[0], b = l.inputs[1];
  if (shapes[a].h < shapes[b].h) std::swap(a, b);  // the per-channel scale second (it broadcasts)
  binary::desc d(l.kind == LayerKind::mul ? algorithm::binary_mul : algorithm::binary_add, P.out[a].get_desc(),
                 P.out[b].get_desc(), desc(i));
  P.steps.push_back({binary(binary::primitive_desc(d, eng)),
                     {{DNNL_ARG_SRC_0, P.out[a]}, {DNNL_ARG_SRC_1, P.out[b]}, {DNNL_ARG_DST, P.out[i]}},
                     {}});
}

void PlanBuilder::add_concat(int i) {
  std::vector<memory::desc> srcs;
  std::unordered_map<int, memory> args{{DNNL_ARG_DST, P.out[i]}};
  const auto& inputs = net.layers[i].inputs;
  for (size_t k = 0; k < inputs.size(); ++k) {
    srcs.push_back(P.out[inputs[k]].get_desc());
    args[DNNL_ARG_MULTIPLE_SRC + (int)k] = P.out[inputs[k]];
  }
  P.steps.push_back({concat(concat::primitive_desc(desc(i), 1, srcs, eng)), args, {}});
}

void PlanBuilder::add_resize(int i) {
  const int src = net.layers[i].inputs[0];
  const NodeShape &a = shapes[src], &o = shapes[i];
  // NHWC float32 copies, unless the activations are already that (float32 on a CPU whose convolutions prefer NHWC)
  const memory::desc in_md({n, a.c, a.h, a.w}, dt::f32, tag::nhwc), out_md({n, o.c, o.h, o.w}, dt::f32, tag::nhwc);
  const bool in_place_in = P.out[src].get_desc() == in_md, in_place_out = P.out[i].get_desc() == out_md;
  memory in = in_place_in ? P.out[src] : memory(in_md, eng);
  memory out = in_place_out ? P.out[i] : memory(out_md, eng);
  if (!in_place_in) {
    P.owned.push_back(in);
    P.steps.push_back({reorder(P.out[src], in), {{DNNL_ARG_FROM, P.out[src]}, {DNNL_ARG_TO, in}}, {}});
  }
  if (!in_place_out) P.owned.push_back(out);
  const int nn = n;
  P.steps.push_back({primitive(), {}, [in, out, nn, a, o]() {
                       legacy_resize_nhwc(static_cast<const float*>(in.get_data_handle()), nn, a.h, a.w, a.c,
                                          static_cast<float*>(out.get_data_handle()), o.h, o.w);
                     }});
  if (!in_place_out) P.steps.push_back({reorder(out, P.out[i]), {{DNNL_ARG_FROM, out}, {DNNL_ARG_TO, P.out[i]}}, {}});
}

// The trunk layer's mean over its positions in float32 (bf16 activations widened first: oneDNN's pooling writes the
// type it reads), reordered into the caller's n x C; run right after the layer, before any later one reuses its
// buffer.
void PlanBuilder::add_trunk_mean() {
  const NodeShape& s = shapes[net.trunk];
  P.trunk = memory(memory::desc({n, s.c, 1, 1}, dt::f32, tag::nchw), eng, nullptr);
  memory src = P.out[net.trunk];
  if (src.get_desc().data_type() != dt::f32) {
    memory wide(memory::desc({n, s.c, s.h, s.w}, dt::f32, act), eng);
    P.owned.push_back(wide);
    P.steps.push_back({reorder(src, wide), {{DNNL_ARG_FROM, src}, {DNNL_ARG_TO, wide}}, {}});
    src = wide;
  }
  pooling_forward::desc d(prop_kind::forward_inference, algorithm::pooling_avg_include_padding, src.get_desc(),
                          memory::desc({n, s.c, 1, 1}, dt::f32, tag::any), {s.h, s.w}, {s.h, s.w}, {0, 0}, {0, 0});
  pooling_forward::primitive_desc pd(d, eng);
  memory mean(pd.dst_desc(), eng);
  P.owned.push_back(mean);
  P.steps.push_back({pooling_forward(pd), {{DNNL_ARG_SRC, src}, {DNNL_ARG_DST, mean}}, {}});
  P.steps.push_back({reorder(mean, P.trunk), {{DNNL_ARG_FROM, mean}, {DNNL_ARG_TO, P.trunk}}, {}});
}

void PlanBuilder::build() {
  const NodeShape& in = shapes[0];
  P.image = memory(memory::desc({n, 3, in.h, in.w}, dt::f32, tag::nchw), eng, nullptr);
  assign_buffers();
  for (int i = 1; i < count; ++i) {
    try {
      switch (net.layers[i].kind) {
        case LayerKind::input:
          break;
        case LayerKind::conv:
          add_conv(i);
          break;
        case LayerKind::eltwise:
          add_eltwise(i);
          break;
        case LayerKind::mean:
          add_mean(i);
          break;
        case LayerKind::add:
        case LayerKind::mul:
          add_binary(i);
          break;
        case LayerKind::concat:
          add_concat(i);
          break;
        case LayerKind::resize:
          add_resize(i);
          break;
      }
      if (i == net.trunk) add_trunk_mean();
    } catch (const dnnl::error& e) {
      fail(net.path, "layer " + net.layers[i].name + ": oneDNN cannot run it (" + e.what() + ")");
    }
  }
  const NodeShape& o = shapes[net.output];
  P.heat = memory(memory::desc({n, o.c, o.h, o.w}, dt::f32, tag::nhwc), eng, nullptr);
  P.steps.push_back(
      {reorder(P.out[net.output], P.heat), {{DNNL_ARG_FROM, P.out[net.output]}, {DNNL_ARG_TO, P.heat}}, {}});
}

}  // namespace

ObjectDetector::Plan& ObjectDetector::plan_for(int n) {
  auto it = plans_.find(n);
  if (it != plans_.end()) return *it->second;
  auto plan = std::make_unique<Plan>();
  const dt type = precision_ == Precision::bf16 ? dt::bf16 : dt::f32;
  PlanBuilder b{net_, shapes_, n, (int)net_.layers.size(), type, activation_tag(precision_), cpu_engine(), *plan};
  b.build();
  return *plans_.emplace(n, std::move(plan)).first->second;
}

void ObjectDetector::forward(const float* images, int n, std::vector<float>& heat, std::vector<float>* trunk) {
  if (n < 1) fail(net_.path, "forward needs at least one image");
  const int trunk_channels = this->trunk_channels();
  if (trunk && trunk_channels == 0) fail(net_.path, "forward was asked for trunk features, and this net has none");
  if (trunk) trunk->resize((size_t)n * trunk_channels);
  if (!trunk) unused_trunk_.resize((size_t)kMaxBatch * trunk_channels);
  const size_t image_floats = (size_t)3 * input_size_ * input_size_;
  const size_t heat_floats = (size_t)map_size_ * map_size_ * classes_;
  heat.resize((size_t)n * heat_floats);
  // At most kMaxBatch photos a pass: larger batches ran no faster per photo and a one-shot call over many photos paid
  // a plan (hundreds of MB touched for the first time) per batch size (docs/objects.md, Speed).
  for (int first = 0; first < n; first += kMaxBatch) {
    const int count = std::min(kMaxBatch, n - first);
    Plan& P = plan_for(count);
    P.image.set_data_handle(const_cast<float*>(images + first * image_floats));
    P.heat.set_data_handle(heat.data() + first * heat_floats);
    if (trunk_channels > 0)
      P.trunk.set_data_handle(trunk ? trunk->data() + (size_t)first * trunk_channels : unused_trunk_.data());
    stream& strm = cpu_stream();
    for (auto& step : P.steps) {
      if (step.custom) {
        strm.wait();
        step.custom();
      } else {
        step.prim.execute(strm, step.args);
      }
    }
    strm.wait();
  }
}

// The first folder holding both files, each with its sha256: DIR or DIR/centernet_mobilenetv3 of each weights folder.
std::string find_object_detector(const std::string& needed_by, const std::string& weights_dir) {
  std::string looked;
  for (const std::string& dir : weights_search_dirs(weights_dir)) {
    for (const std::string& folder : {dir, join_path(dir, kCenternetFolder)}) {
      const std::string json = join_path(folder, kCenternetJson), bin = join_path(folder, kCenternetBin);
      if (!file_exists(json) && !file_exists(bin)) continue;
      bool both = true;
      for (const auto& [path, sha256] : {std::pair{json, kCenternetJsonSha256}, std::pair{bin, kCenternetBinSha256}}) {
        if (!file_exists(path)) {
          looked += (looked.empty() ? "" : "; ") + path + " (missing)";
          both = false;
          continue;
        }
        const std::string bytes = read_file(path), got = sha256_hex(bytes);
        if (got == sha256) continue;
        looked += (looked.empty() ? "" : "; ") + path + " (" + std::to_string(bytes.size()) + " bytes, sha256 " + got +
                  ": truncated or a different file)";
        both = false;
      }
      if (both) return json;
    }
  }
  std::string where;
  for (const std::string& dir : weights_search_dirs(weights_dir)) where += "looked in " + dir + "; ";
  fail(needed_by, std::string("needs the object detector's ") + kCenternetJson + " (sha256 " + kCenternetJsonSha256 +
                      ") and " + kCenternetBin + " (sha256 " + kCenternetBinSha256 + ") in one folder: " + where +
                      (looked.empty() ? "no such files found" : "found only " + looked) + " (" + kFetchHint +
                      ", or pass --weights-dir DIR or set SAT_WEIGHTS to the folder that holds " + kCenternetFolder +
                      ")");
}

std::unique_ptr<ObjectDetector> load_object_detector(int input_size, Precision precision, const std::string& needed_by,
                                                     const std::string& weights_dir, bool with_trunk) {
  return load_object_detector_from(find_object_detector(needed_by, weights_dir), kCenternetOutput, input_size, precision,
                                   with_trunk ? kCenternetTrunk : "");
}

std::unique_ptr<ObjectDetector> load_object_detector_from(const std::string& json_path, const std::string& output,
                                                          int input_size, Precision precision,
                                                          const std::string& trunk) {
  return std::make_unique<ObjectDetector>(detector_net_from_graph(read_tfjs_graph(json_path, output), output, trunk),
                                          input_size, precision);
}

std::vector<DetectedObject> class_peaks(const float* heat, int map_h, int map_w, int classes, float threshold) {
  std::vector<DetectedObject> best(classes);
  for (int c = 0; c < classes; ++c) best[c].cls = c, best[c].score = -1.f;
  for (int y = 0; y < map_h; ++y)
    for (int x = 0; x < map_w; ++x) {
      const float* v = heat + ((size_t)y * map_w + x) * classes;
      for (int c = 0; c < classes; ++c)
        if (v[c] > best[c].score)
          best[c].score = v[c], best[c].x = (x + 0.5f) / (float)map_w, best[c].y = (y + 0.5f) / (float)map_h;
    }
  std::vector<DetectedObject> out;
  for (const DetectedObject& d : best)
    if (d.score >= threshold) out.push_back(d);
  std::stable_sort(out.begin(), out.end(),
                   [](const DetectedObject& a, const DetectedObject& b) { return a.score > b.score; });
  return out;
}

nlohmann::json objects_to_json(const std::vector<DetectedObject>& found) {
  const auto three = [](float v) { return std::round(v * 1000.0) / 1000.0; };
  nlohmann::json out = nlohmann::json::array();
  for (const DetectedObject& d : found)
    out.push_back(
        {{"class", coco_class_names()[d.cls]}, {"score", three(d.score)}, {"x", three(d.x)}, {"y", three(d.y)}});
  return out;
}

void pool_class_maps(const float* heat, int map_h, int map_w, int classes, int grid_h, int grid_w, float* out) {
  if (grid_h < 1 || grid_w < 1 || map_h < grid_h || map_w < grid_w || map_h % grid_h || map_w % grid_w)
    throw Error("the class maps (" + std::to_string(map_h) + "x" + std::to_string(map_w) + ") do not pool onto a " +
                std::to_string(grid_h) + "x" + std::to_string(grid_w) + " grid");
  const int fy = map_h / grid_h, fx = map_w / grid_w;
  for (int gy = 0; gy < grid_h; ++gy)
    for (int gx = 0; gx < grid_w; ++gx) {
      float* o = out + ((size_t)gy * grid_w + gx) * classes;
      std::copy(heat + ((size_t)gy * fy * map_w + gx * fx) * classes,
                heat + ((size_t)gy * fy * map_w + gx * fx + 1) * classes, o);  // from the cell's first: any sign
      for (int y = gy * fy; y < (gy + 1) * fy; ++y)
        for (int x = gx * fx; x < (gx + 1) * fx; ++x) {
          const float* v = heat + ((size_t)y * map_w + x) * classes;
          for (int c = 0; c < classes; ++c) o[c] = std::max(o[c], v[c]);
        }
    }
}

}  // namespace sat
