// sat extract: run a model's encoder over a list of images into a feature cache (resumable).
#pragma once
#include <string>
#include <vector>

#include "train/model.hpp"

namespace sat {

struct ExtractOptions {
  int batch = 8;
  std::string dtype = "f16";
  bool quiet = false;
  // Photos that cannot be read are left out and listed in the cache header (each named on stderr) instead of
  // stopping the run at the first one.
  bool skip_bad = false;
  // Encode each photo mirrored left to right (recorded in the header): training's augmentation cache.
  bool mirror = false;
};

// Writes `out` (via out.partial, resuming it when present). names: what the cache calls each image (its file
// name in the caption set); paths: where to read it. Returns the number of images encoded by this call.
int extract_features(CaptionModel& model, const std::vector<std::string>& paths, const std::vector<std::string>& names,
                     const std::string& out, const ExtractOptions& opt);

}  // namespace sat
