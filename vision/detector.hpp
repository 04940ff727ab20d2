// The COCO object detector: CenterNet (MobileNetV3-Large 0.75 trunk) from a TF.js graph model, run on oneDNN, giving
// per-class heat maps ("an object of this class is centred here") at a quarter of the image's side. Primitives are
// made once per batch size, activations stay in the channel-blocked layout oneDNN's convolutions choose (reordered
// only at the edges and around TF's legacy resize), buffers are shared by layers whose lifetimes do not overlap, and
// bf16 runs where the CPU has it natively. The files are someone else's: found by name and sha256 like the ResNet
// weights (--weights-dir, $SAT_WEIGHTS, ../shared/models, ~/.cache/sat/weights), never copied into a model.
#pragma once
#include <map>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "vision/detector_net.hpp"
#include "vision/onednn.hpp"

namespace sat {

// The shared CenterNet files (../shared/models/centernet_mobilenetv3/README.md: provenance, licence, cross-checks).
extern const char* const kCenternetJson;  // "centernet.json"
extern const char* const kCenternetJsonSha256;
extern const char* const kCenternetBin;  // "centernet.bin"
extern const char* const kCenternetBinSha256;
extern const char* const kCenternetFolder;  // "centernet_mobilenetv3"
extern const char* const kCenternetOutput;  // "tower_0/keypoints": the class heat after its sigmoid
// The trunk's last stride-32 output (480 channels, the hard-swish the head's upsampling branches read): its mean over
// the photo says in 480 numbers what the trunk saw, more than the 80 verdicts (docs/objects.md).
extern const char* const kCenternetTrunk;  // "tower_0/extern1/hard_swish/mul_1"
constexpr int kCenternetTrunkChannels = 480;
// COCO's 80 classes in the detector's channel order.
const std::vector<std::string>& coco_class_names();

class ObjectDetector {
 public:
  // net: the layers that compute the class heat, and maybe a trunk layer (detector_net_from_graph). input_size: the
  // side S of the images it takes, a multiple of 32. Errors name the net's file.
  ObjectDetector(DetectorNet net, int input_size, Precision precision = Precision::f32);
  ~ObjectDetector();
  ObjectDetector(const ObjectDetector&) = delete;
  ObjectDetector& operator=(const ObjectDetector&) = delete;

  int input_size() const { return input_size_; }
  int map_size() const { return map_size_; }  // S / 4
  int classes() const { return classes_; }
  int trunk_channels() const { return net_.trunk >= 0 ? shapes_[net_.trunk].c : 0; }  // 0: no trunk output
  Precision precision() const { return precision_; }
  double macs_per_image() const { return macs_; }
  const std::string& path() const { return net_.path; }

  // images: n x 3 x S x S planar floats, RGB 0..255 as they are (the graph takes no normalization).
  // heat: n x map_size x map_size x classes, each in 0..1. trunk (not null: the net must have a trunk output): n x
  // trunk_channels, each channel's mean over the trunk layer's positions, from the same pass. Runs kMaxBatch photos
  // at a time.
  static constexpr int kMaxBatch = 4;
  void forward(const float* images, int n, std::vector<float>& heat, std::vector<float>* trunk = nullptr);

  struct Plan;  // one batch size's primitives and buffers (vision/detector.cpp)

 private:
  Plan& plan_for(int n);
  DetectorNet net_;
  int input_size_, map_size_, classes_;
  Precision precision_;
  double macs_;
  std::vector<NodeShape> shapes_;
  std::map<int, std::unique_ptr<Plan>> plans_;
  std::vector<float> unused_trunk_;  // where the trunk's means go when forward is not asked for them
};

// The CenterNet model JSON (its weights beside it, both checked by sha256) in the first weights folder holding both
// (vision/pretrained.hpp: weights_search_dirs); none: an Error naming `needed_by` and what it looked for where.
std::string find_object_detector(const std::string& needed_by, const std::string& weights_dir = "");
// Finds the CenterNet files (the JSON and its weights, each checked by sha256) in the weights folders
// (vision/pretrained.hpp: weights_search_dirs), reads them and builds the detector. None found, or a different
// file: one Error naming `needed_by` and what it looked for where. with_trunk: it also gives kCenternetTrunk's mean.
std::unique_ptr<ObjectDetector> load_object_detector(int input_size, Precision precision, const std::string& needed_by,
                                                     const std::string& weights_dir = "", bool with_trunk = false);
// The same from a given model JSON (its shards beside it), unchecked: for tests and other graph models.
std::unique_ptr<ObjectDetector> load_object_detector_from(const std::string& json_path, const std::string& output,
                                                          int input_size, Precision precision,
                                                          const std::string& trunk = "");

// One class found in a photo: its highest peak of heat and where (the centre of that map cell, as a fraction of the
// image's width and height).
struct DetectedObject {
  int cls = 0;
  float score = 0, x = 0, y = 0;
};
// Per class, its highest peak when at least `threshold`, best first. heat: one image's map_h x map_w x classes.
std::vector<DetectedObject> class_peaks(const float* heat, int map_h, int map_w, int classes, float threshold);
// As JSON for the front ends: [{"class": "dog", "score": 0.366, "x": 0.41, "y": 0.62}] (three decimals).
nlohmann::json objects_to_json(const std::vector<DetectedObject>& found);
// The heat max-pooled onto a grid_h x grid_w grid (each cell the largest value of the map cells it covers, the map's
// side a multiple of the grid's): out is grid_h x grid_w x classes, cells in raster order. Values of any sign: a
// tuned encoder pools all its cached object channels through it, the detector's trunk channels (negative about as
// often as not) too.
void pool_class_maps(const float* heat, int map_h, int map_w, int classes, int grid_h, int grid_w, float* out);

}  // namespace sat
