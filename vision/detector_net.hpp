// An imported TF.js graph model as a list of layers oneDNN can run: each convolution with the elementwise ops and the
// residual sum that follow it folded in as post-ops, the rest (squeeze-and-excite pools and scales, concatenations,
// TF's legacy bilinear resize) as layers of their own. Built for the ops of MobileNet-style detectors (CenterNet
// with a MobileNetV3 trunk: vision/detector.hpp); any other op is an Error naming the file and the node.
#pragma once
#include <string>
#include <vector>

#include "datasets/io.hpp"
#include "vision/netgraph.hpp"
#include "vision/tfjs_graph.hpp"

namespace sat {

// An elementwise step after a convolution (or of an eltwise layer), in order, each scale * f(x) with f:
//   linear: alpha * x + beta;  relu: max(x, 0);  relu6: min(max(x, 0), 6);
//   hard_swish: x * relu6(x + 3) / 6 (TF spells it x * c * relu6(x + 3) with c the stored 1/6: scale = 6c);
//   logistic: 1 / (1 + e^-x);  sum: x + the output of layer sum_from (a residual connection; scale 1).
enum class PostOpKind { linear, relu, relu6, hard_swish, logistic, sum };
struct PostOp {
  PostOpKind kind = PostOpKind::linear;
  float alpha = 1.f, beta = 0.f, scale = 1.f;
  int sum_from = -1;
};

//   input: the image, NHWC RGB as the graph takes it;
//   conv: a convolution (depthwise: one filter per channel), bias, post-ops;
//   eltwise: post-ops (no sum) on its input, standing alone;
//   mean: the average over the spatial positions (N x C x 1 x 1);
//   add, mul: two tensors of one shape, or (mul) one and a per-channel N x C x 1 x 1 scale (squeeze-and-excite);
//   concat: along channels; resize: TF's legacy bilinear resize (align_corners and half_pixel_centers false).
enum class LayerKind { input, conv, eltwise, mean, add, mul, concat, resize };

struct DetectorLayer {
  std::string name;  // the TF node whose output this is (the last one folded in)
  LayerKind kind = LayerKind::input;
  std::vector<int> inputs;  // earlier layers
  // conv
  int kh = 1, kw = 1, stride = 1;
  bool same = true;  // TF 'SAME' padding (the extra row or column at the bottom or right), else 'VALID'
  bool depthwise = false;
  int out_channels = 0;
  FloatBuffer weight;        // OIHW; depthwise: C x 1 x kh x kw
  FloatBuffer bias;          // out_channels values (zeros when the graph adds none)
  std::vector<PostOp> post;  // conv and eltwise
  // resize: the output side is the image side x resize_num / resize_den (the graph's size constant over the size
  // it was exported at), so the graph runs at any input size
  int resize_num = 0, resize_den = 1;
};

struct DetectorNet {
  std::string path;                   // the model JSON, for errors
  std::vector<DetectorLayer> layers;  // inputs before the layers that read them; layers[0] is the input
  int output = -1;                    // the layer whose output the net gives
  int trunk = -1;  // a second layer whose mean over the image the net also gives (-1: none): the trunk's features
  int export_size = 0;                // the input side the graph was exported at (its Placeholder's shape)

  // Every layer's output shape (and a convolution's padding) for an S x S image. An Error naming the file when a
  // size does not fit (a concatenation of different sizes, an image too small).
  std::vector<NodeShape> shapes(int size) const;
  double conv_macs(int size) const;  // multiply-accumulates of the convolutions, one image
};

// The layers that compute `output` (a node name) of a TF.js graph model read by read_tfjs_graph, and `trunk` (a node
// `output` depends on; empty: none) kept as a layer of its own for its mean over the image.
DetectorNet detector_net_from_graph(const TfjsGraph& graph, const std::string& output, const std::string& trunk = "");

}  // namespace sat
