// Importer for TensorFlow.js Layers models (Keras functional models exported by tfjs-converter):
//  - the standard form: model.json (modelTopology + weightsManifest) and binary shards;
//  - the UMD-wrapped form nsfwjs ships: model.min.js whose export is the same JSON as a JavaScript object
//    literal, and group1-shardNofM.min.js whose export is one base64 string holding the raw shard.
// Weights may be float32 or quantized (uint8/uint16 with value = q * scale + min, or float16).
// The convolutional trunk is kept; Conv2D -> BatchNormalization -> ReLU chains become one conv node.
#pragma once
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "datasets/safetensors.hpp"
#include "vision/netgraph.hpp"

namespace sat {

struct ImportedNet {
  NetGraph graph;
  TensorFile weights;                // uint8-quantized tensors stay quantized (lossless, 4x smaller); the rest float32
  int input_h = 0, input_w = 0;      // the model's declared input size (0 when free)
  std::vector<std::string> dropped;  // head layers after the trunk (Flatten, Dense, ...), not imported
  // Keras records which layers were frozen (trainable: false) when the model was last trained. For a model
  // fine-tuned from pretrained weights (nsfwjs: InceptionV3 from ImageNet), the frozen layers still hold the
  // original weights. frozen_through: the deepest cut point whose every convolution was frozen ("" when none);
  // first_trained: the first convolution (in graph order) whose weights were trained ("" when all were frozen).
  std::string frozen_through, first_trained;
};

// path: a model.json / model.min.js file, or a directory holding one of them (shards are found next to it).
ImportedNet import_tfjs(const std::string& path);

// Parses a JavaScript object literal as minifiers write it (unquoted keys, !0 / !1, single-quoted strings,
// numbers like .5) into JSON. `where` names the file for errors.
nlohmann::json parse_js_literal(const std::string& text, size_t& pos, const std::string& where);

// Standard base64 (RFC 4648, padding optional). Throws Error naming `where` on a bad character.
std::string decode_base64(const std::string& text, size_t begin, size_t end, const std::string& where);

}  // namespace sat
