// A grid encoder and the object detector as one encoder: each location's features are the grid's, then the
// detector's class heat on the same photo, scaled, in the form EncoderConfig::object_form names: "maps", each class
// max-pooled onto the grid (vision/detector.hpp: pool_class_maps), 80 more numbers per location that already mean
// "a dog is centred here"; "tags", each class's peak over the photo repeated at every location ("there is a dog":
// the decoder meets it in the mean feature of its initial state and in every step's context, whatever it attends
// to); "both", the maps then the tags; "tags+trunk", the tags then the detector's trunk output averaged over the
// photo (what the trunk saw, beyond the 80 verdicts; the same at every location), scaled alike.
#pragma once
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

}  // namespace sat
