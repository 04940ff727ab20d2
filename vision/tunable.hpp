// The top blocks of an imported network, trainable: fine-tunes a pretrained encoder's last layers (InceptionV3's
// mixed6-mixed7, say) on the cached grids of its frozen bottom (a mixed5 feature cache), so captions can shape the
// layers nsfwjs fitted to its own classes while the expensive bottom still runs once per image.
//
// Batch norm (inference statistics) is folded into each convolution, as PretrainedEncoder does at load; the folded
// OIHW weights and biases are the parameters. oneDNN runs forward and backward with every activation in the
// 8-channel blocked layout: convolution with ReLU as a post-op (backward from the output: relu_use_dst_for_bwd),
// max and average pooling (Keras semantics, TensorFlow padding), channel concatenation (backward: channel slices).
// No gradient flows into the input grid: it comes from a frozen cache.
#pragma once
#include <map>
#include <memory>
#include <string>
#include <tuple>
#include <vector>

#include "datasets/io.hpp"
#include "datasets/safetensors.hpp"
#include "vision/netgraph.hpp"

namespace sat {

class TunableBlocks {
 public:
  // graph: a network whose nodes after `from` (up to the graph's last node) are the blocks; `from` is the node
  // whose output comes in (the cache's cut). weights: the graph's tensors (uint8-quantized or float; batch norm
  // folded here). input_size: the image side the shapes follow. Errors name `where`.
  TunableBlocks(const NetGraph& graph, const TensorFile& weights, const std::string& from, int input_size,
                const std::string& where);
  ~TunableBlocks();
  TunableBlocks(const TunableBlocks&) = delete;
  TunableBlocks& operator=(const TunableBlocks&) = delete;

  int grid_h() const { return h_; }
  int grid_w() const { return w_; }
  int input_h() const { return shapes_.front().h; }  // the cached grid's (the layer tuning starts after)
  int input_w() const { return shapes_.front().w; }
  int channels_in() const { return c_in_; }
  int channels_out() const { return c_out_; }
  const std::string& from() const { return from_; }
  // Per conv node: "encoder.<layer>.weight" (OIHW, batch norm folded) and "encoder.<layer>.bias"; per affine node
  // (ResNet v2's pre-activation batch norm): "encoder.<layer>.scale" and "encoder.<layer>.offset".
  std::vector<Param>& params() { return params_; }
  // Multiply-accumulates of the blocks' convolutions for one image (forward).
  double macs_per_image() const { return macs_; }

  // grid_in: N x L x channels_in (raster order) from the cache; grid_out: N x L' x channels_out.
  // training=true keeps what backward needs. bf16 (inference only; where the CPU computes it natively): activations
  // and weights in bfloat16, sums in float32, the weights converted from the float32 parameters at each call.
  void forward(const float* grid_in, int n, bool training, std::vector<float>& grid_out, bool bf16 = false);
  // dgrid_out: N x L' x channels_out for the last training forward; adds to the parameters' gradients.
  void backward(const float* dgrid_out);

 private:
  struct Plan;
  Plan& plan_for(int n, bool training, bool bf16);
  NetGraph graph_;                        // `from` as an input node, then the blocks
  std::vector<NodeShape> shapes_;         // per node of graph_
  std::vector<int> param_of_;             // node -> index of its weight (conv) or scale (affine) in params_, else -1
  FloatBuffer zeros_, ones_;              // the fixed statistics an affine runs batch norm with
  std::vector<std::vector<int>> inputs_;  // node -> the graph_ indices of the layers it reads
  std::string from_;
  int h_ = 0, w_ = 0, c_in_ = 0, c_out_ = 0;
  double macs_ = 0;
  std::vector<Param> params_;
  std::map<std::tuple<int, bool, bool>, std::unique_ptr<Plan>> plans_;  // by photos, training, bf16
  Plan* last_training_ = nullptr;
};

}  // namespace sat
