// An imported pretrained CNN (InceptionV3 from tfjs, ResNet v2 from TF-slim) run for inference on oneDNN: batch norm
// folded into the convolution weights and bias, ReLU as a post-op, every activation in the channel-blocked layout
// oneDNN's convolutions choose on this CPU (no reorders inside the network: the image goes in planar, the grid
// comes out N x L x D). At batch 1 each concatenation's inputs are written straight into their slice of its
// output; a residual unit's last convolution adds itself into the shortcut's buffer (sum post-op); activation
// buffers are reused once nothing reads them any more.
#pragma once
#include <map>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "datasets/safetensors.hpp"
#include "vision/netgraph.hpp"
#include "vision/image_encoder.hpp"
#include "vision/onednn.hpp"

namespace sat {

// int8 (vision/onednn.hpp): the largest value each 8-bit activation can hold, by node name, for every node that
// int8_activation_nodes lists; values above it are clipped. Chosen from float32 activations on photos
// (PretrainedEncoder::sample_activations, then choose_int8_ranges).
using Int8Ranges = std::map<std::string, float>;
// The nodes whose outputs are unsigned 8-bit in int8: a ReLU's output (a convolution's or an affine
// pre-activation's) that only convolutions read. The rest (the root convolution's output, the residual stream, the
// grid) stay float32.
std::vector<int> int8_activation_nodes(const NetGraph& g);
// For each node, the clip c that minimizes the mean squared error of quantizing its sampled values to
// {0, c/255, ..., c} (values above c become c), searched over c = max * 0.96^k, k = 0..79. Nodes whose samples
// are all zero get the range 1 (any range is exact).
Int8Ranges choose_int8_ranges(const std::map<std::string, std::vector<float>>& samples);
nlohmann::json int8_ranges_to_json(const Int8Ranges& r);
Int8Ranges int8_ranges_from_json(const nlohmann::json& j);  // checks each range is finite and positive

// int8 weights, per output channel: the largest |w| of a channel's n weights (its scale is that over 127), and the
// channel's weights times 1 / scale rounded to the nearest integer, ties to even, as lrintf rounds (|x * inv| <= 127).
float max_abs(const float* x, size_t n);
void quantize_int8(const float* x, size_t n, float inv, int8_t* to);

class PretrainedEncoder : public ImageEncoder {
 public:
  // graph: already cut at the layer that gives the grid. weights: the tensors its conv nodes name
  // (kernels HWIO, biases, batch-norm beta/gamma/moving statistics), float32 or uint8-quantized.
  // `where` names the model file in errors (missing tensor, wrong shape).
  // The encoder keeps the weights (pass them with std::move when the caller needs them no more): unfolded OHWI
  // kernels are read from them as they are when a plan is built.
  // precision: f32, or bf16 (vision/onednn.hpp: the grid then differs from f32's by bfloat16 rounding; at
  // ResNet-101 v2's block3, 2.6% relative RMS error over the grid, 0.9% over its mean-pooled features).
  // int8 needs `int8_ranges` for every int8_activation_nodes node (else an Error naming `where` and the node),
  // and a graph without concatenations (a ResNet v2 trunk).
  PretrainedEncoder(const NetGraph& graph, TensorFile weights, int input_size, const std::string& where,
                    Precision precision = Precision::f32, Int8Ranges int8_ranges = {});
  // The same with weights shared, not copied (a model keeps its imported weights; ResNet-101's are 110 MB as
  // float32).
  PretrainedEncoder(const NetGraph& graph, std::shared_ptr<const TensorFile> shared, int input_size,
                    const std::string& where, Precision precision = Precision::f32, Int8Ranges int8_ranges = {});
  ~PretrainedEncoder() override;
  PretrainedEncoder(const PretrainedEncoder&) = delete;
  PretrainedEncoder& operator=(const PretrainedEncoder&) = delete;

  int input_size() const { return input_size_; }
  int grid_h() const { return grid_h_; }
  int grid_w() const { return grid_w_; }
  int channels() const { return channels_; }
  double macs_per_image() const { return macs_; }
  Precision precision() const override { return precision_; }

  // images: N x 3 x S x S planar floats (already normalized). grid: N x L x D, L in raster order.
  void forward(const float* images, int n, std::vector<float>& grid);
  void encode(const float* images, int n, std::vector<float>& grid) override { forward(images, n, grid); }
  // How many of n images one pass of the network takes (forward runs the rest in further passes): all of them,
  // except in int8, whose passes are kept to about 4 x 224^2 pixels so that a pass's activations stay in the
  // cache (block3 at 448, Zen 4: 15.2 images/s one at a time against 13.5 sixteen at a time; at 224, 57.1
  // four at a time against 45.4 and 54.4; bf16 and float32 are as fast or faster in larger batches).
  int images_per_pass(int n) const;
  // Float32 encoders only (calibration for int8): runs the network on images like forward and appends up to
  // `per_node` of each int8_activation_nodes node's output values (evenly strided) to samples[node name].
  void sample_activations(const float* images, int n, std::map<std::string, std::vector<float>>& samples,
                          size_t per_node);

 private:
  struct Plan;
  Plan& plan_for(int n);
  NetGraph graph_;
  std::shared_ptr<const TensorFile> shared_;
  std::vector<NodeShape> shapes_;
  int input_size_, grid_h_, grid_w_, channels_;
  double macs_;
  Precision precision_;
  Int8Ranges int8_ranges_;
  std::vector<int> int8_nodes_;                 // int8_activation_nodes of graph_
  std::map<int, FloatBuffer> conv_w_, conv_b_;  // node index -> folded OIHW weights and bias
  std::map<int, FloatBuffer> scale_, shift_;    // affine node index -> per-channel scale and offset
  FloatBuffer zeros_, ones_;                    // the fixed statistics an affine runs batch norm with
  std::map<int, std::unique_ptr<Plan>> plans_;
};

// The encoder model file ("sat-encoder"): an imported network, the input it expects, where it came from.
struct PretrainedNet {
  NetGraph graph;      // the whole imported trunk; users cut it (mixed5 by default for InceptionV3)
  TensorFile weights;  // as imported (uint8-quantized tensors stay quantized)
  int input_size = 299;
  float mean[3] = {0.f, 0.f, 0.f}, stdev[3] = {1.f, 1.f, 1.f};  // planes = (RGB / 255 - mean) / std
  nlohmann::json info = nlohmann::json::object();               // provenance: source, licence, command
  // Set when the weights are a file of someone else's (a TF-slim ResNet v2 safetensors): models built on it name
  // the file and its sha256 instead of holding a copy of the weights.
  std::string external_file, external_sha256;
};
void save_pretrained_net(const std::string& path, const PretrainedNet& net);
// A sat encoder file (sat import-tfjs), or a TF-slim ResNet v2 trunk in safetensors (../shared/models/resnet_v2_101):
// validates the header, the graph and every tensor the graph names (shape included); errors name the file.
PretrainedNet load_pretrained_net(const std::string& path);

// External encoder weights: where a model's named weights file is looked for, in order: the directory given to the
// loading call, else the one given here (the CLI's --weights-dir), $SAT_WEIGHTS, then the defaults: the shipped
// folder (../shared/models beside the source checkout; <prefix>/share/sat/models when installed, datasets/shipped.hpp)
// and the user's cache, where tools/fetch-weights.sh puts them. In each, DIR/FILE and DIR/STEM/FILE
// (resnet_v2_101/resnet_v2_101.safetensors) are tried.
void set_weights_dir(const std::string& dir);
// Replaces both defaults ("" leaves none: the tests look only where they say).
void set_default_weights_dir(const std::string& dir);
std::vector<std::string> weights_search_dirs(const std::string& weights_dir = "");
// $XDG_CACHE_HOME/sat/weights, else ~/.cache/sat/weights ("" with neither set): tools/fetch-weights.sh's default.
std::string weights_cache_dir();
// The end of a missing-weights error: how to get them.
inline constexpr const char* kFetchHint = "get them with tools/fetch-weights.sh from sat's source";
// Finds and loads the file with that name and sha256. None found, truncated or a different file: one Error naming
// `model_path`, the file it needs with its sha256, and where it looked. `found` receives the path used.
// The first file found under that name, mapped, its sha256 being computed on a thread of its own: a model's loader
// starts it as soon as the header names the file, so that hashing its 55 MB overlaps the rest of the loading
// (load_external_weights then waits for it). nullptr when no readable file of that name is found.
struct WeightsHashHeadStart;
std::shared_ptr<WeightsHashHeadStart> start_weights_hash(const std::string& file, const std::string& weights_dir = "");
TensorFile load_external_weights(const std::string& file, const std::string& sha256, const std::string& model_path,
                                 std::string* found = nullptr, const std::string& weights_dir = "",
                                 const std::shared_ptr<WeightsHashHeadStart>& head_start = nullptr);
// Only the tensors a (cut) graph uses, in their stored form.
TensorFile select_tensors(const NetGraph& graph, const TensorFile& all, const std::string& where);
TensorFile select_tensors(const NetGraph& graph, TensorFile&& all, const std::string& where);  // moves them out

// A tensor's values as float32 (uint8 dequantized), checked against `shape`; errors name `where`.
FloatBuffer pretrained_tensor(const TensorFile& tf, const std::string& name, const std::vector<int64_t>& shape,
                              const std::string& where);

// A conv node's weights with its batch norm (inference statistics) folded in: OIHW weight and bias.
struct FoldedConv {
  int out = 0, in = 0, kh = 0, kw = 0;
  FloatBuffer weight, bias;
};
// expected: pretrained_tensor_shapes of the node's graph. Errors name `where` (missing tensor, wrong shape).
FoldedConv fold_conv(const NetNode& node, const TensorFile& weights,
                     const std::map<std::string, std::vector<int64_t>>& expected, const std::string& where);

// The tensor names a graph's conv nodes need, with their expected shapes given the graph's channel counts.
std::map<std::string, std::vector<int64_t>> pretrained_tensor_shapes(const NetGraph& graph);

}  // namespace sat
