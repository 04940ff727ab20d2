// Synthetic grounded scenes: 1-3 non-overlapping shapes on a textured, noisy background, 5 templated
// captions per image, each object's box, and which caption words name which object.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "datasets/coco.hpp"

namespace sat {

struct SynthOptions {
  int images = 1000;
  uint64_t seed = 1;
  int size = 128;
};

extern const std::vector<std::string> kSynthShapes, kSynthColours, kSynthSizes;

struct SynthScene {
  std::vector<ObjectBox> objects;  // ordered left to right: captions name them in this order
  std::vector<unsigned char> bgr;  // size*size*3
  std::vector<Caption> captions;   // 5, with grounding
};

// Scene number `index` of a set with this seed; independent of every other scene (parallel-safe).
SynthScene make_synth_scene(uint64_t seed, int index, int size);
// Writes DIR/images/NNNNNN.png and DIR/captions.json; the same options give the same bytes.
void write_synth_dataset(const std::string& dir, const SynthOptions& opt);

}  // namespace sat
