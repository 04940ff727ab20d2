// A small CNN on oneDNN: blocks of conv -> batch norm (+ReLU) -> optional max pool, trained end to end.
// Output is the feature grid: N x L x D (L = grid_h * grid_w locations in raster order, D channels).
#pragma once
#include <map>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "datasets/io.hpp"
#include "vision/image_encoder.hpp"
#include "vision/netgraph.hpp"

namespace sat {

struct ConvBlockConfig {
  int out_channels = 32;
  int kernel = 3;
  int pool = 2;  // max-pool window and stride; 1 = no pooling
};

// How to turn an image into the feature grid. kind "cnn": the small CNN below, trained here end to end.
// kind "pretrained": an imported network (graph cut at `cut`, e.g. InceptionV3 at mixed5), frozen, run on oneDNN
// by PretrainedEncoder; its weights travel with the model file.
// The forms object maps can join a grid in (EncoderConfig::object_form), named for messages ("maps, tags, both or
// tags+trunk"); whether a form holds the detector's trunk features; the channels a form adds for a detector of
// `classes` classes and `trunk_channels` trunk channels.
extern const char* const kObjectForms;
bool valid_object_form(const std::string& form);
bool object_form_has_trunk(const std::string& form);
int object_form_channels(const std::string& form, int classes, int trunk_channels);

struct EncoderConfig {
  std::string kind = "cnn";
  int input_size = 128;
  std::vector<ConvBlockConfig> blocks = {{16, 3, 2}, {32, 3, 2}, {64, 3, 2}, {128, 3, 2}};
  // Two channels holding each location's (row, column) in [-1, 1], appended to the grid so the
  // decoder can say where things are ("above", "top left").
  bool coord_channels = true;
  float mean[3] = {0.5f, 0.5f, 0.5f};
  float stdev[3] = {0.25f, 0.25f, 0.25f};
  float bn_momentum = 0.9f;
  // pretrained only
  NetGraph graph;
  std::string cut;
  int pretrained_grid_h = 0, pretrained_grid_w = 0, pretrained_channels = 0;  // from the graph at input_size
  // Fine-tuned: the layers after this one (e.g. mixed5) are trained with the decoder; feature caches hold this
  // layer's output (empty: the whole network is frozen and caches hold the grid itself).
  std::string tune_from;
  // Weights kept outside the model file (ResNet v2 from ../shared/models, too large and not ours to copy): the
  // file's name and sha256. Empty: the encoder's weights are stored in the model file.
  std::string weights_file, weights_sha256;
  // Object maps (vision/detector.hpp): the COCO detector's class heat on the same photo at input_size, times
  // object_scale, as object_channels more features at each location after the grid's, in one of three forms:
  //   "maps": each class's heat max-pooled onto the grid (80 channels: "a dog is centred here");
  //   "tags": each class's peak over the whole photo, the same at every location (80: "there is a dog");
  //   "both": the maps, then the tags (160);
  //   "tags+trunk": the tags, then the detector's trunk output (vision/detector.hpp: kCenternetTrunk) averaged over
  //   the photo, times object_scale too (80 + 480: what the trunk saw, the same at every location).
  // 0: none. A tuned encoder's caches hold the frozen part's raw output with the object channels pooled onto its grid
  // (CaptionModel::tuned_forward pools them on to the tuned layers' grid).
  int object_channels = 0;
  float object_scale = 1.f;
  std::string object_form = "maps";

  bool pretrained() const { return kind == "pretrained"; }
  bool tuned() const { return pretrained() && !tune_from.empty(); }
  // What a feature cache for this encoder holds: the config itself, or for a tuned encoder the frozen part
  // (the graph cut at tune_from).
  EncoderConfig cache_config() const;
  // A pretrained config: the graph cut at `cut`, shapes inferred at input_size (throws Error if too small). The
  // grid is the cut layer's attention grid (ResNet v2: normalized by the next unit's pre-activation) unless raw.
  static EncoderConfig make_pretrained(const NetGraph& full, const std::string& cut, int input_size,
                                       const float mean[3], const float stdev[3], bool raw = false);
  int grid_h() const;
  int grid_w() const;
  int locations() const { return grid_h() * grid_w(); }
  int feature_dim() const {
    return pretrained() ? pretrained_channels + object_channels : blocks.back().out_channels + (coord_channels ? 2 : 0);
  }
  int grid_channels() const { return feature_dim() - object_channels; }  // the CNN's own, before the object maps
  nlohmann::json to_json() const;
  static EncoderConfig from_json(const nlohmann::json& j);  // throws Error on bad values
  // "16,32,64,128" -> 3x3 conv blocks with 2x2 pooling.
  static std::vector<ConvBlockConfig> parse_blocks(const std::string& spec);
};

class CnnEncoder : public ImageEncoder {
 public:
  explicit CnnEncoder(const EncoderConfig& cfg);
  ~CnnEncoder() override;
  CnnEncoder(const CnnEncoder&) = delete;
  CnnEncoder& operator=(const CnnEncoder&) = delete;

  const EncoderConfig& config() const { return cfg_; }
  std::vector<Param>& params() { return params_; }
  void init(Rng& rng);  // He-normal conv weights, unit BN scale

  // images: N x 3 x S x S planar floats. grid: N x L x D.
  // training=true uses batch statistics, updates running statistics, and keeps what backward needs.
  void forward(const float* images, int n, bool training, std::vector<float>& grid);
  // dgrid: N x L x D for the last training forward; adds parameter gradients.
  void backward(const float* dgrid);
  void encode(const float* images, int n, std::vector<float>& grid) override { forward(images, n, false, grid); }
  Precision precision() const override { return Precision::f32; }

  // For tests: the batch-norm epsilon in use.
  static constexpr float kBnEpsilon = 1e-5f;

 private:
  struct Plan;
  Plan& plan_for(int n, bool training);
  EncoderConfig cfg_;
  std::vector<Param> params_;  // per block: conv.weight, bn.scale, bn.shift, bn.running_mean, bn.running_var
  std::map<std::pair<int, bool>, std::unique_ptr<Plan>> plans_;
  Plan* last_training_ = nullptr;
};

}  // namespace sat
