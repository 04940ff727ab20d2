// A captioning model: encoder + decoder + vocabulary, and the model file that holds all three.
#pragma once
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "datasets/safetensors.hpp"
#include "datasets/vocab.hpp"
#include "seq/decoder.hpp"
#include "vision/cnn.hpp"

namespace sat {

struct CaptionModel {
  EncoderConfig encoder_config;
  DecoderConfig decoder_config;
  Vocab vocab;
  int max_len = 20;          // longest caption (words) the model emits
  nlohmann::json info;       // provenance: training command, data, git commit, scores
  std::unique_ptr<CnnEncoder> encoder;
  std::unique_ptr<Decoder> decoder;

  // Builds encoder and decoder from the configs (decoder sizes that depend on the encoder are filled in).
  void build();
  void init(Rng& rng);
  std::vector<Param*> params();  // encoder then decoder, buffers included

  TensorFile to_tensor_file() const;
  void save(const std::string& path) const;
  static std::unique_ptr<CaptionModel> from_tensor_file(const TensorFile& tf, const std::string& path);
  static std::unique_ptr<CaptionModel> load(const std::string& path);

  // Decodes and preprocesses images into N x 3 x S x S planes.
  std::vector<float> load_planes(const std::vector<std::string>& paths) const;
  // Inference-mode encoder over planes: N*L x D features.
  Mat encode(const std::vector<float>& planes, int n);
};

}  // namespace sat
