// The topology of an imported pretrained CNN: convolutions with batch norm and ReLU folded in, max/average pooling
// with Keras/TensorFlow padding, channel concatenation (InceptionV3 from Keras), and the pre-activation residual
// units of ResNet v2 (per-channel affine + ReLU, elementwise sum). Written into model files as JSON; shapes are
// inferred for any input size.
#pragma once
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace sat {

struct NetNode {
  std::string name;  // name of the Keras layer whose output this node produces
  std::string op;    // "input", "conv", "maxpool", "avgpool", "concat", "affine", "add"
  std::vector<std::string> inputs;
  // conv and pooling
  int kh = 1, kw = 1, sh = 1, sw = 1;
  bool same = false;          // TensorFlow 'same' padding (extra pad at bottom/right), else 'valid' or explicit
  bool explicit_pad = false;  // pads[] on top, left, bottom, right (TF-slim's conv2d_same), then 'valid'
  int pads[4] = {0, 0, 0, 0};
  // conv: output channels, weight names, folded batch norm (its layer name; gamma only when bn_scale), ReLU
  int filters = 0;
  std::string kernel, bias, bn;
  bool kernel_ohwi = false;  // kernel stored out x h x w x in (TF-slim export), else Keras's h x w x in x out
  bool bn_scale = false;
  float bn_epsilon = 1e-3f;
  bool relu = false;  // conv and affine
  // affine: y = x * scale + offset per channel (ResNet v2's pre-activation batch norm), then ReLU if relu
  std::string scale, offset;
  // add: the elementwise sum of its inputs (a residual unit's shortcut + residual)
  // Other names a user may cut at ("block3" for "block3/unit_23").
  std::vector<std::string> aliases;
  // The node that gives this node's output as an attention grid, when that is not the output itself: a ResNet v2
  // unit's sum is normalized by the next unit's pre-activation batch norm and ReLU before anything reads it.
  std::string grid;
};

struct NodeShape {
  int c = 0, h = 0, w = 0;
  int pad_t = 0, pad_l = 0, pad_b = 0, pad_r = 0;  // conv/pool padding at this input size
};

struct NetGraph {
  std::vector<NetNode> nodes;  // topological order; nodes[0] is the input

  int index_of(const std::string& name) const;  // by name, then by alias; -1 when absent
  // The sub-graph that computes `output` (its ancestors only). Throws Error naming the layer if absent.
  NetGraph cut(const std::string& output) const;
  // The name of the node whose output is the attention grid for a user's cut (`grid` followed; e.g. "block3/unit_22"
  // -> "block3/unit_23/bottleneck_v2/preact"). Throws Error listing the cut points if absent.
  std::string grid_node(const std::string& cut) const;
  // Shapes at an input of size h x w (3 channels). Throws Error when the image is too small for a layer.
  std::vector<NodeShape> shapes(int h, int w) const;
  // Multiply-accumulates of all convolutions for one image.
  double conv_macs(int h, int w) const;
  // Layer names a user can cut at (concatenations: mixed0..mixed10 for InceptionV3; blocks and units for ResNet).
  std::vector<std::string> cut_points() const;

  nlohmann::json to_json() const;
  static NetGraph from_json(const nlohmann::json& j);  // validates (ops, inputs defined before use)
};

}  // namespace sat
