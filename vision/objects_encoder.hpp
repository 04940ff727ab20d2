// A grid encoder and the object detector as one encoder: each location's features are the grid's, then the
// detector's class heat on the same photo, scaled, in the form EncoderConfig::object_form names: "maps", each class
// max-pooled onto the grid (vision/detector.hpp: pool_class_maps), 80 more numbers per location that already mean
// "a dog is centred here"; "tags", each class's peak over the photo repeated at every location ("there is a dog":
// the decoder meets it in the mean feature of its initial state and in every step's context, whatever it attends
// to); "both", the maps then the tags; "tags+trunk", the tags then the detector's trunk output averaged over the
// photo (what the trunk saw, beyond the 80 verdicts; the same at every location), scaled alike.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "vision/cnn.hpp"
#include "vision/detector.hpp"
#include "vision/image_encoder.hpp"

namespace sat {

// n images' planes normalized as (RGB / 255 - mean) / stdev, back to RGB 0..255 (what the detector takes).
void planes_to_rgb255(const float* planes, int n, size_t pixels, const float mean[3], const float stdev[3], float* out);

class EncoderWithObjects : public ImageEncoder {
 public:
  // grid: gives grid_h x grid_w x grid_channels per image from planes normalized with mean / stdev at the detector's
  // input size. Both encoders are the caller's and outlive this one.
  EncoderWithObjects(ImageEncoder& grid, ObjectDetector& detector, int grid_h, int grid_w, int grid_channels,
                     const float mean[3], const float stdev[3], float scale, const std::string& form = "maps");
  void encode(const float* images, int n, std::vector<float>& grid) override;
  Precision precision() const override { return grid_.precision(); }
  int channels() const {
    return grid_channels_ + object_form_channels(form_, detector_.classes(), detector_.trunk_channels());
  }

 private:
  ImageEncoder& grid_;
  ObjectDetector& detector_;
  int grid_h_, grid_w_, grid_channels_;
  float mean_[3], stdev_[3], scale_;
  std::string form_;
  std::vector<float> base_, rgb_, heat_, trunk_, pooled_, peaks_;
};

// The object channels on their way to the decoder (CaptionModel::object_standardization): object channel k becomes
// (x - center[k]) * gain[k]. Caches and the frozen part's output keep them raw; a cache's records and a photo's grid
// are standardized alike, after them. sat train sets it for the trunk's channels of "tags+trunk" from its training
// photos (ObjectChannelStats); the tags keep center 0 and gain 1. Empty: every channel as it is.
struct ObjectStandardization {
  std::vector<float> center, gain;  // one per object channel, or both empty
  bool on() const { return !gain.empty(); }
  // count rows of `width` values whose object channels are [first, first + gain.size()): standardized in place.
  void apply(float* rows, size_t count, int width, int first) const;
  bool operator==(const ObjectStandardization& o) const { return center == o.center && gain == o.gain; }
  bool operator!=(const ObjectStandardization& o) const { return !(*this == o); }
};

// The spread sat train gives each trunk channel (the standard deviation over its training photos, the mean being 0):
// the value the experiment in docs/objects.md chose, near the spread of the tags' channels at --objects 4.
constexpr float kTrunkChannelSpread = 0.5f;

// Each object channel's mean and standard deviation over the rows added (double sums).
class ObjectChannelStats {
 public:
  explicit ObjectChannelStats(int channels);
  // count rows of `width` values, the object channels at [first, first + channels)
  void add(const float* rows, size_t count, int width, int first);
  int64_t rows() const { return rows_; }
  // Channels [from, channels) to mean 0 and standard deviation `spread` (a channel that never varies keeps gain 1,
  // centred), the channels before `from` as they are. No rows added is an Error.
  ObjectStandardization standardization(int from, float spread) const;

 private:
  std::vector<double> sum_, sum_sq_;
  int64_t rows_ = 0;
};

}  // namespace sat
