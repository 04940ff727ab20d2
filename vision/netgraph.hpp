// The topology of an imported pretrained CNN (Keras layer graph after folding): convolutions with batch norm
// and ReLU folded in, max/average pooling with Keras/TensorFlow padding, channel concatenation. Written into
// model files as JSON; shapes are inferred for any input size.
#pragma once
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace sat {

struct NetNode {
  std::string name;  // name of the Keras layer whose output this node produces
  std::string op;    // "input", "conv", "maxpool", "avgpool", "concat"
  std::vector<std::string> inputs;
  // conv and pooling
  int kh = 1, kw = 1, sh = 1, sw = 1;
  bool same = false;  // TensorFlow 'same' padding (extra pad at bottom/right), else 'valid'
  // conv: output channels, weight names, folded batch norm (its layer name; gamma only when bn_scale), ReLU
  int filters = 0;
  std::string kernel, bias, bn;
  bool bn_scale = false;
  float bn_epsilon = 1e-3f;
  bool relu = false;
};

struct NodeShape {
  int c = 0, h = 0, w = 0;
  int pad_t = 0, pad_l = 0, pad_b = 0, pad_r = 0;  // conv/pool padding at this input size
};

struct NetGraph {
  std::vector<NetNode> nodes;  // topological order; nodes[0] is the input

  int index_of(const std::string& name) const;  // -1 when absent
  // The sub-graph that computes `output` (its ancestors only). Throws Error naming the layer if absent.
  NetGraph cut(const std::string& output) const;
  // Shapes at an input of size h x w (3 channels). Throws Error when the image is too small for a layer.
  std::vector<NodeShape> shapes(int h, int w) const;
  // Multiply-accumulates of all convolutions for one image.
  double conv_macs(int h, int w) const;
  // Layer names a user can cut at (concatenations: mixed0..mixed10 for InceptionV3), in order.
  std::vector<std::string> cut_points() const;

  nlohmann::json to_json() const;
  static NetGraph from_json(const nlohmann::json& j);  // validates (ops, inputs defined before use)
};

}  // namespace sat
