// Grounding accuracy: with teacher forcing on the reference captions, the fraction of words that name an
// object whose attention argmax falls on a grid cell overlapping that object's box.
#pragma once
#include <cstdint>
#include <map>
#include <string>

#include "datasets/coco.hpp"
#include "train/model.hpp"

namespace sat {

struct GroundingResult {
  int64_t words = 0, hits = 0;
  std::map<std::string, std::pair<int64_t, int64_t>> by_word;  // word -> (hits, words)
  double accuracy() const { return words ? (double)hits / words : 0.0; }
};

// Index of the grid cell with the largest weight, and whether that cell overlaps the box.
bool cell_overlaps_box(int cell, int grid_h, int grid_w, int image_w, int image_h, const ObjectBox& box);

GroundingResult eval_grounding(CaptionModel& model, const CaptionSet& set, int batch_images = 32);

}  // namespace sat
