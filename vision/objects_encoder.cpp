#include "vision/objects_encoder.hpp"

#include <algorithm>
#include <cmath>
#include <string>

#include "datasets/io.hpp"

namespace sat {

void planes_to_rgb255(const float* planes, int n, size_t pixels, const float mean[3], const float stdev[3],
                      float* out) {
  for (int b = 0; b < n; ++b)
    for (int c = 0; c < 3; ++c) {
      const float* from = planes + ((size_t)b * 3 + c) * pixels;
      float* to = out + ((size_t)b * 3 + c) * pixels;
      const float a = 255.f * stdev[c], o = 255.f * mean[c];
      for (size_t k = 0; k < pixels; ++k) to[k] = from[k] * a + o;
    }
}

EncoderWithObjects::EncoderWithObjects(ImageEncoder& grid, ObjectDetector& detector, int grid_h, int grid_w,
                                       int grid_channels, const float mean[3], const float stdev[3], float scale,
                                       const std::string& form)
    : grid_(grid),
      detector_(detector),
      grid_h_(grid_h),
      grid_w_(grid_w),
      grid_channels_(grid_channels),
      scale_(scale),
      form_(form) {
  if (!valid_object_form(form)) throw Error("object form '" + form + "' is not " + kObjectForms);
  if (object_form_has_trunk(form) && detector.trunk_channels() == 0)
    throw Error(detector.path() + ": object form '" + form + "' needs the detector's trunk output, and it gives none");
  for (int c = 0; c < 3; ++c) mean_[c] = mean[c], stdev_[c] = stdev[c];
  if (detector.map_size() % grid_h || detector.map_size() % grid_w)
    throw Error("the detector's " + std::to_string(detector.map_size()) + "x" + std::to_string(detector.map_size()) +
                " class maps do not pool onto the " + std::to_string(grid_h) + "x" + std::to_string(grid_w) + " grid");
}

void EncoderWithObjects::encode(const float* images, int n, std::vector<float>& grid) {
  grid_.encode(images, n, base_);
  // The detector takes RGB 0..255 as it is: the planes' normalization undone.
  const size_t plane = (size_t)detector_.input_size() * detector_.input_size();
  rgb_.resize((size_t)n * 3 * plane);
  planes_to_rgb255(images, n, plane, mean_, stdev_, rgb_.data());
  const bool trunk = object_form_has_trunk(form_);
  detector_.forward(rgb_.data(), n, heat_, trunk ? &trunk_ : nullptr);
  const int L = grid_h_ * grid_w_, K = detector_.classes(), D = channels(), T = trunk ? detector_.trunk_channels() : 0;
  const bool maps = form_ == "maps" || form_ == "both", tags = form_ != "maps";
  const size_t map = (size_t)detector_.map_size() * detector_.map_size() * K;
  pooled_.resize((size_t)L * K);
  peaks_.resize(K);
  grid.resize((size_t)n * L * D);
  for (int b = 0; b < n; ++b) {
    pool_class_maps(heat_.data() + b * map, detector_.map_size(), detector_.map_size(), K, grid_h_, grid_w_,
                    pooled_.data());
    // a class's peak over the photo is the largest of its pooled cells (the pooling is a max too)
    std::fill(peaks_.begin(), peaks_.end(), 0.f);
    for (int l = 0; l < L; ++l)
      for (int k = 0; k < K; ++k) peaks_[k] = std::max(peaks_[k], pooled_[(size_t)l * K + k]);
    for (int l = 0; l < L; ++l) {
      float* row = grid.data() + ((size_t)b * L + l) * D;
      const float* g = base_.data() + ((size_t)b * L + l) * grid_channels_;
      row = std::copy(g, g + grid_channels_, row);
      if (maps)
        for (int k = 0; k < K; ++k) *row++ = scale_ * pooled_[(size_t)l * K + k];
      if (tags)
        for (int k = 0; k < K; ++k) *row++ = scale_ * peaks_[k];
      for (int t = 0; t < T; ++t) *row++ = scale_ * trunk_[(size_t)b * T + t];
    }
  }
}

void ObjectStandardization::apply(float* rows, size_t count, int width, int first) const {
  if (!on()) return;
  const int K = (int)gain.size();
  if (center.size() != gain.size() || first < 0 || first + K > width)
    throw Error("object standardization of " + std::to_string(K) + " channels does not fit rows of " +
                std::to_string(width) + " from channel " + std::to_string(first));
  for (size_t r = 0; r < count; ++r) {
    float* x = rows + r * width + first;
    for (int k = 0; k < K; ++k) x[k] = (x[k] - center[k]) * gain[k];
  }
}

ObjectChannelStats::ObjectChannelStats(int channels) : sum_(std::max(channels, 0)), sum_sq_(std::max(channels, 0)) {}

void ObjectChannelStats::add(const float* rows, size_t count, int width, int first) {
  const int K = (int)sum_.size();
  if (first < 0 || first + K > width)
    throw Error("object channel statistics of " + std::to_string(K) + " channels do not fit rows of " +
                std::to_string(width) + " from channel " + std::to_string(first));
  for (size_t r = 0; r < count; ++r) {
    const float* x = rows + r * width + first;
    for (int k = 0; k < K; ++k) sum_[k] += x[k], sum_sq_[k] += (double)x[k] * x[k];
  }
  rows_ += (int64_t)count;
}

ObjectStandardization ObjectChannelStats::standardization(int from, float spread) const {
  const int K = (int)sum_.size();
  if (rows_ == 0) throw Error("object channel statistics: no rows to standardize by");
  if (from < 0 || from > K || !(spread > 0)) throw Error("object channel statistics: bad channel range or spread");
  ObjectStandardization s;
  s.center.assign(K, 0.f);
  s.gain.assign(K, 1.f);
  for (int k = from; k < K; ++k) {
    const double mean = sum_[k] / rows_, var = std::max(0.0, sum_sq_[k] / rows_ - mean * mean);
    s.center[k] = (float)mean;
    const double sd = std::sqrt(var);
    if (sd > 1e-6 * std::max(1.0, std::abs(mean))) s.gain[k] = (float)(spread / sd);
  }
  return s;
}

}  // namespace sat
