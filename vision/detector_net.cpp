#include "vision/detector_net.hpp"

#include <algorithm>
#include <cmath>
#include <map>

namespace sat {

namespace {

// Builds the layer list from the graph's ops in order (TfjsGraph keeps inputs before readers).
struct Translator {
  const TfjsGraph& g;
  std::map<std::string, const GraphOp*> op_of;
  std::map<std::string, int> layer_of;  // node name -> the layer holding its value
  std::vector<DetectorLayer> layers;
  int export_size = 0;

  explicit Translator(const TfjsGraph& graph) : g(graph) {
    for (const GraphOp& op : g.ops) op_of[op.name] = &op;
  }
  [[noreturn]] void refuse(const GraphOp& op, const std::string& problem) const {
    fail(g.path, "node " + op.name + " (" + op.op + "): " + problem);
  }
  int value(const GraphOp& op, size_t k) const {
    if (k >= op.inputs.size()) refuse(op, "has too few inputs");
    std::string in = op.inputs[k];
    if (in.size() > 2 && in.compare(in.size() - 2, 2, ":0") == 0) in.resize(in.size() - 2);
    auto it = layer_of.find(in);
    if (it == layer_of.end())
      refuse(op, "input " + in +
                     " is not a tensor sat computes (a constant, or an op's "
                     "second output)");
    return it->second;
  }
  const GraphConst* scalar_const(const std::string& name) const {
    auto it = g.consts.find(name);
    if (it == g.consts.end() || it->second.is_int || it->second.values.size() != 1) return nullptr;
    return &it->second;
  }
  int add_layer(const GraphOp& op, DetectorLayer layer) {
    layer.name = op.name;
    layers.push_back(std::move(layer));
    layer_of[op.name] = (int)layers.size() - 1;
    return (int)layers.size() - 1;
  }

  void input(const GraphOp& op);
  void conv(const GraphOp& op);
  void eltwise(const GraphOp& op, PostOp post);
  void add_or_mul(const GraphOp& op);
  bool hard_swish(const GraphOp& op);
  void mean(const GraphOp& op);
  void resize(const GraphOp& op);
  void concat(const GraphOp& op);
  void translate(const GraphOp& op);
};

void Translator::input(const GraphOp& op) {
  if (!layers.empty()) refuse(op, "a second input (sat runs graphs of one image input)");
  if (op.attr.contains("shape")) {
    const auto& dims = op.attr["shape"].value("shape", nlohmann::json::object()).value("dim", nlohmann::json::array());
    if (dims.size() == 4 && dims[1].contains("size") && dims[1]["size"].is_string())
      export_size = std::atoi(dims[1]["size"].get<std::string>().c_str());
  }
  DetectorLayer layer;
  layer.kind = LayerKind::input;
  layer.out_channels = 3;
  add_layer(op, std::move(layer));
}

void Translator::conv(const GraphOp& op) {
  const bool depthwise = op.op.find("Depthwise") != std::string::npos;
  DetectorLayer layer;
  layer.kind = LayerKind::conv;
  layer.depthwise = depthwise;
  layer.inputs = {value(op, 0)};
  if (op.inputs.size() < 2) refuse(op, "has no weights");
  const GraphConst& w = g.constant(op.inputs[1], op.name);
  if (w.is_int || w.shape.size() != 4) refuse(op, "its weights are not a 4-D float tensor");
  const int kh = (int)w.shape[0], kw = (int)w.shape[1], ci = (int)w.shape[2], co = (int)w.shape[3];
  if (depthwise && co != 1) refuse(op, "a depthwise channel multiplier of " + std::to_string(co) + " (sat runs 1)");
  layer.kh = kh, layer.kw = kw;
  layer.out_channels = depthwise ? ci : co;
  const std::vector<int64_t> strides = op.int_list_attr("strides", g.path);
  if (strides.size() != 4 || strides[0] != 1 || strides[3] != 1 || strides[1] != strides[2] || strides[1] < 1)
    refuse(op, "strides other than [1, s, s, 1]");
  layer.stride = (int)strides[1];
  if (op.attr.contains("dilations")) {
    for (int64_t d : op.int_list_attr("dilations", g.path))
      if (d != 1) refuse(op, "a dilated convolution");
  }
  if (op.attr.contains("data_format") && op.string_attr("data_format", g.path) != "NHWC")
    refuse(op, "a data format other than NHWC");
  const std::string padding = op.string_attr("padding", g.path);
  if (padding != "SAME" && padding != "VALID") refuse(op, "padding " + padding + " (sat runs SAME and VALID)");
  layer.same = padding == "SAME";
  // TF HWIO (depthwise H W C 1) to OIHW (depthwise C 1 kh kw)
  const int o_count = layer.out_channels, i_count = depthwise ? 1 : ci;
  layer.weight.resize((size_t)o_count * i_count * kh * kw);
  for (int y = 0; y < kh; ++y)
    for (int x = 0; x < kw; ++x)
      for (int i = 0; i < ci; ++i)
        for (int o = 0; o < co; ++o) {
          const float v = w.values[(((size_t)y * kw + x) * ci + i) * co + o];
          if (depthwise)
            layer.weight[((size_t)i * kh + y) * kw + x] = v;
          else
            layer.weight[(((size_t)o * ci + i) * kh + y) * kw + x] = v;
        }
  layer.bias.assign(layer.out_channels, 0.f);
  const std::vector<std::string> fused = op.string_list_attr("fused_ops", g.path);
  size_t k = 0;
  if (!fused.empty()) {
    if (fused[0] != "BiasAdd") refuse(op, "fused op " + fused[0] + " first (sat reads BiasAdd, then Relu or Relu6)");
    if (op.inputs.size() < 3) refuse(op, "fuses BiasAdd but has no bias input");
    const GraphConst& b = g.constant(op.inputs[2], op.name);
    if (b.is_int || (int)b.values.size() != layer.out_channels)
      refuse(op, "its bias has " + std::to_string(b.values.size()) + " values for " +
                     std::to_string(layer.out_channels) + " channels");
    std::copy(b.values.begin(), b.values.end(), layer.bias.begin());
    k = 1;
  }
  for (; k < fused.size(); ++k) {
    if (fused[k] == "Relu")
      layer.post.push_back({PostOpKind::relu});
    else if (fused[k] == "Relu6")
      layer.post.push_back({PostOpKind::relu6});
    else
      refuse(op, "fused op " + fused[k] + " (sat reads BiasAdd, Relu, Relu6)");
  }
  add_layer(op, std::move(layer));
}

void Translator::eltwise(const GraphOp& op, PostOp post) {
  DetectorLayer layer;
  layer.kind = LayerKind::eltwise;
  layer.inputs = {value(op, 0)};
  layer.post = {post};
  add_layer(op, std::move(layer));
}

// x * c * relu6(x + 3), as TF writes hard-swish: Mul(Mul(c, x), Relu6(Add(x, 3))), either operand order.
bool Translator::hard_swish(const GraphOp& op) {
  if (op.op != "Mul" || op.inputs.size() != 2) return false;
  for (int first = 0; first < 2; ++first) {
    auto a = op_of.find(op.inputs[first]), b = op_of.find(op.inputs[1 - first]);
    if (a == op_of.end() || b == op_of.end() || a->second->op != "Mul" || b->second->op != "Relu6") continue;
    const GraphOp& scaled = *a->second;
    auto add = op_of.find(b->second->inputs.empty() ? "" : b->second->inputs[0]);
    if (add == op_of.end() || add->second->op != "Add" || add->second->inputs.size() != 2 || scaled.inputs.size() != 2)
      continue;
    const GraphOp& shifted = *add->second;
    for (int s = 0; s < 2; ++s)
      for (int t = 0; t < 2; ++t) {
        const GraphConst* c = scalar_const(scaled.inputs[s]);
        const GraphConst* three = scalar_const(shifted.inputs[t]);
        if (!c || !three || three->values[0] != 3.f || scaled.inputs[1 - s] != shifted.inputs[1 - t]) continue;
        DetectorLayer layer;
        layer.kind = LayerKind::eltwise;
        layer.inputs = {layer_of.at(scaled.inputs[1 - s])};
        layer.post = {{PostOpKind::hard_swish, 1.f, 0.f, 6.f * c->values[0]}};
        add_layer(op, std::move(layer));
        return true;
      }
  }
  return false;
}

void Translator::add_or_mul(const GraphOp& op) {
  if (op.inputs.size() != 2) refuse(op, "has " + std::to_string(op.inputs.size()) + " inputs, not 2");
  const bool mul = op.op == "Mul";
  for (int k = 0; k < 2; ++k) {
    if (const GraphConst* c = scalar_const(op.inputs[k])) {
      const int other = 1 - k;
      DetectorLayer layer;
      layer.kind = LayerKind::eltwise;
      layer.inputs = {value(op, other)};
      layer.post = {mul ? PostOp{PostOpKind::linear, c->values[0], 0.f}
                        : PostOp{PostOpKind::linear, 1.f, c->values[0]}};
      add_layer(op, std::move(layer));
      return;
    }
  }
  if (hard_swish(op)) return;
  DetectorLayer layer;
  layer.kind = mul ? LayerKind::mul : LayerKind::add;
  layer.inputs = {value(op, 0), value(op, 1)};
  add_layer(op, std::move(layer));
}

void Translator::mean(const GraphOp& op) {
  if (op.inputs.size() != 2) refuse(op, "has no reduction axes");
  const GraphConst& axes = g.constant(op.inputs[1], op.name);
  if (!axes.is_int || axes.ints != std::vector<int32_t>{1, 2} || !op.bool_attr("keep_dims", false))
    refuse(op, "a mean other than over the spatial axes [1, 2] with keep_dims");
  DetectorLayer layer;
  layer.kind = LayerKind::mean;
  layer.inputs = {value(op, 0)};
  add_layer(op, std::move(layer));
}

void Translator::resize(const GraphOp& op) {
  if (op.bool_attr("align_corners", false) || op.bool_attr("half_pixel_centers", false))
    refuse(op, "align_corners or half_pixel_centers set (sat runs TF's legacy mapping, both false)");
  if (op.inputs.size() != 2) refuse(op, "has no size input");
  const GraphConst& size = g.constant(op.inputs[1], op.name);
  if (!size.is_int || size.ints.size() != 2 || size.ints[0] != size.ints[1] || size.ints[0] < 1)
    refuse(op, "a size other than a square [s, s]");
  if (export_size <= 0) refuse(op, "the graph's input has no fixed size to scale the resize size with");
  DetectorLayer layer;
  layer.kind = LayerKind::resize;
  layer.inputs = {value(op, 0)};
  layer.resize_num = size.ints[0];
  layer.resize_den = export_size;
  add_layer(op, std::move(layer));
}

void Translator::concat(const GraphOp& op) {
  if (op.inputs.size() < 2) refuse(op, "has no axis input");
  const GraphConst& axis = g.constant(op.inputs.back(), op.name);
  if (!axis.is_int || axis.ints.size() != 1 || (axis.ints[0] != 3 && axis.ints[0] != -1))
    refuse(op, "a concatenation along an axis other than channels");
  DetectorLayer layer;
  layer.kind = LayerKind::concat;
  for (size_t k = 0; k + 1 < op.inputs.size(); ++k) layer.inputs.push_back(value(op, k));
  add_layer(op, std::move(layer));
}

void Translator::translate(const GraphOp& op) {
  const std::string& t = op.op;
  if (t == "Const") return;
  if (t == "Placeholder")
    input(op);
  else if (t == "Identity")
    layer_of[op.name] = value(op, 0);
  else if (t == "_FusedConv2D" || t == "Conv2D" || t == "FusedDepthwiseConv2dNative" || t == "DepthwiseConv2dNative")
    conv(op);
  else if (t == "Relu")
    eltwise(op, {PostOpKind::relu});
  else if (t == "Relu6")
    eltwise(op, {PostOpKind::relu6});
  else if (t == "Sigmoid")
    eltwise(op, {PostOpKind::logistic});
  else if (t == "Add" || t == "AddV2" || t == "Mul")
    add_or_mul(op);
  else if (t == "Mean")
    mean(op);
  else if (t == "ResizeBilinear")
    resize(op);
  else if (t == "ConcatV2")
    concat(op);
  else
    refuse(op, "an op sat does not run");
}

// Folds each eltwise layer into the convolution (or eltwise layer) before it, and each residual add into the later
// of its two convolutions as a sum post-op, when nothing else reads the value folded away. Returns the layers left,
// renumbered, and the output's (and the trunk's, when not -1) new index. Each is read as one more reader, so a layer
// after it is never folded into it.
std::vector<DetectorLayer> fold_layers(std::vector<DetectorLayer> layers, int& output, int& trunk) {
  const int count = (int)layers.size();
  std::vector<int> alias(count);
  for (int i = 0; i < count; ++i) alias[i] = i;
  auto resolve = [&](int i) {
    while (alias[i] != i) i = alias[i];
    return i;
  };
  std::vector<int> readers(count, 0);
  for (auto& layer : layers)
    for (int in : layer.inputs) ++readers[in];
  ++readers[output];
  if (trunk >= 0) ++readers[trunk];
  std::vector<bool> alive(count, true);
  for (int i = 0; i < count; ++i) {
    DetectorLayer& layer = layers[i];
    for (int& in : layer.inputs) in = resolve(in);
    if (layer.kind == LayerKind::eltwise) {
      const int p = layer.inputs[0];
      if ((layers[p].kind == LayerKind::conv || layers[p].kind == LayerKind::eltwise) && readers[p] == 1) {
        layers[p].post.insert(layers[p].post.end(), layer.post.begin(), layer.post.end());
        layers[p].name = layer.name;
        readers[p] = readers[i];
        alias[i] = p, alive[i] = false;
      }
    } else if (layer.kind == LayerKind::add) {
      for (int k = 0; k < 2; ++k) {
        const int x = layer.inputs[k], y = layer.inputs[1 - k];
        if (layers[x].kind != LayerKind::conv || readers[x] != 1 || y > x) continue;
        layers[x].post.push_back({PostOpKind::sum, 1.f, 0.f, 1.f, y});
        layers[x].name = layer.name;
        readers[x] = readers[i];
        alias[i] = x, alive[i] = false;
        break;
      }
    }
  }
  std::vector<int> renumber(count, -1);
  std::vector<DetectorLayer> out;
  for (int i = 0; i < count; ++i) {
    if (!alive[i]) continue;
    renumber[i] = (int)out.size();
    out.push_back(std::move(layers[i]));
  }
  for (auto& layer : out) {
    for (int& in : layer.inputs) in = renumber[resolve(in)];
    for (auto& p : layer.post)
      if (p.kind == PostOpKind::sum) p.sum_from = renumber[resolve(p.sum_from)];
  }
  output = renumber[resolve(output)];
  if (trunk >= 0) trunk = renumber[resolve(trunk)];
  return out;
}

// Fewer post-ops, the same function: a linear step right after a convolution goes into its weights and bias, and
// a linear step with no offset after another elementwise step becomes that step's scale. (Also a workaround: in
// oneDNN 2.6, a second linear post-op in one chain computes with the first one's parameters.)
void simplify_post_ops(DetectorLayer& l) {
  if (l.kind == LayerKind::conv) {
    while (!l.post.empty() && l.post[0].kind == PostOpKind::linear) {
      const PostOp p = l.post[0];
      for (float& w : l.weight) w *= p.alpha * p.scale;
      for (float& b : l.bias) b = (p.alpha * b + p.beta) * p.scale;
      l.post.erase(l.post.begin());
    }
  }
  for (size_t k = 1; k < l.post.size();) {
    const PostOp p = l.post[k];
    PostOp& before = l.post[k - 1];
    if (p.kind == PostOpKind::linear && p.beta == 0.f && p.alpha >= 0.f && before.kind != PostOpKind::sum &&
        before.kind != PostOpKind::linear) {
      before.scale *= p.alpha * p.scale;
      l.post.erase(l.post.begin() + k);
    } else {
      ++k;
    }
  }
}

// The layers `output` (and `trunk`, when not -1) read, directly or not (the translation also made the pieces of
// each hard-swish).
std::vector<DetectorLayer> reachable(std::vector<DetectorLayer> layers, int& output, int& trunk) {
  std::vector<bool> needed(layers.size(), false);
  needed[output] = true;
  if (trunk >= 0) needed[trunk] = true;
  needed[0] = true;
  for (int i = (int)layers.size() - 1; i >= 0; --i)
    if (needed[i])
      for (int in : layers[i].inputs) needed[in] = true;
  std::vector<int> renumber(layers.size(), -1);
  std::vector<DetectorLayer> out;
  for (size_t i = 0; i < layers.size(); ++i) {
    if (!needed[i]) continue;
    renumber[i] = (int)out.size();
    out.push_back(std::move(layers[i]));
  }
  for (auto& layer : out)
    for (int& in : layer.inputs) in = renumber[in];
  output = renumber[output];
  if (trunk >= 0) trunk = renumber[trunk];
  return out;
}

}  // namespace

DetectorNet detector_net_from_graph(const TfjsGraph& graph, const std::string& output, const std::string& trunk) {
  Translator t(graph);
  for (const GraphOp& op : graph.ops) t.translate(op);
  if (t.layers.empty() || t.layers[0].kind != LayerKind::input) fail(graph.path, "has no input (Placeholder) node");
  auto it = t.layer_of.find(output);
  if (it == t.layer_of.end()) fail(graph.path, "output " + output + " is not a tensor sat computes");
  DetectorNet net;
  net.path = graph.path;
  net.export_size = t.export_size;
  net.output = it->second;
  if (!trunk.empty()) {
    auto at = t.layer_of.find(trunk);
    if (at == t.layer_of.end())
      fail(graph.path, "trunk output " + trunk + " is not a tensor sat computes on the way to " + output);
    net.trunk = at->second;
  }
  net.layers = reachable(std::move(t.layers), net.output, net.trunk);
  net.layers = fold_layers(std::move(net.layers), net.output, net.trunk);
  if (net.trunk == 0 || net.trunk == net.output)
    fail(graph.path, "trunk output " + trunk + " is the graph's input or its output");
  for (DetectorLayer& l : net.layers) simplify_post_ops(l);
  return net;
}

// TF's output size and padding of a convolution along one axis.
static void conv_axis(int in, int k, int stride, bool same, int& out, int& pad_before, int& pad_after) {
  if (same) {
    out = (in + stride - 1) / stride;
    const int total = std::max((out - 1) * stride + k - in, 0);
    pad_before = total / 2, pad_after = total - total / 2;
  } else {
    out = (in - k) / stride + 1;
    pad_before = pad_after = 0;
  }
}

std::vector<NodeShape> DetectorNet::shapes(int size) const {
  std::vector<NodeShape> s(layers.size());
  for (size_t i = 0; i < layers.size(); ++i) {
    const DetectorLayer& l = layers[i];
    const auto refuse = [&](const std::string& problem) {
      fail(path,
           "layer " + l.name + " at a " + std::to_string(size) + "x" + std::to_string(size) + " input: " + problem);
    };
    NodeShape& o = s[i];
    const NodeShape* in = l.inputs.empty() ? nullptr : &s[l.inputs[0]];
    switch (l.kind) {
      case LayerKind::input:
        o.c = 3, o.h = o.w = size;
        break;
      case LayerKind::conv: {
        const int ci = l.depthwise ? l.out_channels : (int)(l.weight.size() / ((size_t)l.out_channels * l.kh * l.kw));
        if (in->c != ci) refuse("reads " + std::to_string(in->c) + " channels, its weights take " + std::to_string(ci));
        o.c = l.out_channels;
        conv_axis(in->h, l.kh, l.stride, l.same, o.h, o.pad_t, o.pad_b);
        conv_axis(in->w, l.kw, l.stride, l.same, o.w, o.pad_l, o.pad_r);
        if (o.h < 1 || o.w < 1) refuse("the image is too small");
        for (const PostOp& p : l.post)
          if (p.kind == PostOpKind::sum && (s[p.sum_from].c != o.c || s[p.sum_from].h != o.h || s[p.sum_from].w != o.w))
            refuse("adds tensors of different shapes");
        break;
      }
      case LayerKind::eltwise:
        o = NodeShape{in->c, in->h, in->w};
        break;
      case LayerKind::mean:
        o = NodeShape{in->c, 1, 1};
        break;
      case LayerKind::add:
      case LayerKind::mul: {
        const NodeShape& a = s[l.inputs[0]];
        const NodeShape& b = s[l.inputs[1]];
        const bool same_shape = a.c == b.c && a.h == b.h && a.w == b.w;
        const bool scale = l.kind == LayerKind::mul && a.c == b.c && ((b.h == 1 && b.w == 1) || (a.h == 1 && a.w == 1));
        if (!same_shape && !scale) refuse("combines tensors of different shapes");
        o = (a.h >= b.h) ? NodeShape{a.c, a.h, a.w} : NodeShape{b.c, b.h, b.w};
        break;
      }
      case LayerKind::concat:
        o = NodeShape{0, in->h, in->w};
        for (int k : l.inputs) {
          if (s[k].h != in->h || s[k].w != in->w) refuse("concatenates tensors of different sizes");
          o.c += s[k].c;
        }
        break;
      case LayerKind::resize: {
        const long side = (long)size * l.resize_num;
        if (side % l.resize_den) refuse("the resize size is not a whole number (use a multiple of 32)");
        o = NodeShape{in->c, (int)(side / l.resize_den), (int)(side / l.resize_den)};
        break;
      }
    }
  }
  return s;
}

double DetectorNet::conv_macs(int size) const {
  const std::vector<NodeShape> s = shapes(size);
  double macs = 0;
  for (size_t i = 0; i < layers.size(); ++i)
    if (layers[i].kind == LayerKind::conv) macs += (double)s[i].h * s[i].w * layers[i].weight.size();
  return macs;
}

}  // namespace sat
