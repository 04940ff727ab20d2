// What every encoder is to the rest of sat: images in, the grid the decoder attends over out. The small CNN trained
// here (vision/cnn.hpp) and the imported networks (ResNet v2 from safetensors, TF.js models: vision/pretrained.hpp)
// implement it; CaptionModel::encoder() gives the model's.
#pragma once
#include <vector>

#include "vision/onednn.hpp"

namespace sat {

class ImageEncoder {
 public:
  virtual ~ImageEncoder() = default;
  // images: n x 3 x S x S planar floats, normalized as the encoder's config says. grid: n x L x D, L locations in
  // raster order. Inference: a CNN's batch norm uses its running statistics.
  virtual void encode(const float* images, int n, std::vector<float>& grid) = 0;
  // The arithmetic the encoder runs in (the small CNN: always float32).
  virtual Precision precision() const = 0;
};

}  // namespace sat
