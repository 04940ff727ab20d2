// Models and searches the tests share: a tiny captioner, and the searches as CaptionModel::search takes them.
#pragma once
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "datasets/safetensors.hpp"
#include "tests/scratch.hpp"
#include "train/model.hpp"

namespace sat {

// A tiny CNN-encoder captioner (32x32 input, 8-channel blocks, the vocabulary of `captions`: by default five
// words), built but not initialized.
inline void build_tiny_model(CaptionModel& m, const std::vector<std::vector<std::string>>& captions = {
                                                  {"a", "red", "circle"}, {"a", "blue", "square"}}) {
  m.encoder_config.input_size = 32;
  m.encoder_config.blocks = {{8, 3, 2}, {8, 3, 2}};
  m.vocab = Vocab::build(captions, 1);
  m.decoder_config.embed_dim = 8;
  m.decoder_config.hidden_dim = 12;
  m.decoder_config.attn_dim = 6;
  m.max_len = 6;
  m.build();
}

// n photos of build_tiny_model's input (3 planes of 32x32 each), every value drawn from N(0, 1).
inline std::vector<float> random_tiny_photos(Rng& rng, int n) {
  std::vector<float> planes((size_t)n * 3 * 32 * 32);
  for (auto& v : planes) v = (float)rng.normal();
  return planes;
}

// beam, length norm and no-repeat always; the consensus weight, memory candidates and diversity when given;
// candidates > 0: every candidate the search considered, not only the kept one.
inline SearchSettings search_with(const CaptionModel& model, int beam, double length_norm, int no_repeat,
                                  std::optional<double> consensus_weight = {},
                                  std::optional<int> memory_candidates = {},
                                  std::optional<BeamDiversity> diversity = {}, int candidates = 0) {
  SearchOptions o;
  o.beam = beam;
  o.length_norm = length_norm;
  o.no_repeat_ngram = no_repeat;
  o.consensus_weight = consensus_weight;
  o.memory_candidates = memory_candidates;
  if (diversity) o.beam_groups = diversity->groups, o.diversity = diversity->penalty;
  o.candidates = candidates;
  return resolve_search(model, o, "the test model");
}

// The one-line error of loading the model file at `path` after `change`, its changed copy written to `copy`.
inline std::string load_error_of_changed(const std::string& path, const std::string& copy,
                                         const std::function<void(TensorFile&)>& change) {
  TensorFile tf = load_safetensors(path);
  change(tf);
  save_safetensors(copy, tf);
  return test::error_of([&] { CaptionModel::load(copy); });
}

}  // namespace sat
