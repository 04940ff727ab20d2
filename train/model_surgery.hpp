// Model surgery: models made of other models' weights (sat model average, ensemble, member).
#pragma once
#include <memory>
#include <string>
#include <vector>

#include "train/model.hpp"

namespace sat {

// Checkpoint averaging: a model whose every weight is the mean of that weight over the models at `paths` (epochs
// of one run, say). They must differ in their weights only: encoder, decoder, vocabulary and the frozen encoder
// must be the same, else the error names the file that differs. The result keeps the first model's settings.
std::unique_ptr<CaptionModel> average_models(const std::vector<std::string>& paths);

// An ensemble of the models at `paths` (at least two): the first model's encoder, vocabulary and settings, every
// model's decoder (an ensemble given brings all its members). They must share the encoder exactly (its config,
// its frozen weights and any fine-tuned layers' weights: members trained with sat train --init-from M
// --fresh-decoder --tune-lr 0 do) and the vocabulary, else the error names the file that differs. info.members lists
// each decoder's provenance (file, training command, epoch), an ensemble given bringing its own list.
std::unique_ptr<CaptionModel> ensemble_models(const std::vector<std::string>& paths);

// Member k (1-based, in the file's order) of the ensemble at `path` as a model of its own: the shared encoder,
// vocabulary and search settings with that one decoder (a single model is its own member 1).
std::unique_ptr<CaptionModel> ensemble_member(const std::string& path, int k);

// `from` reading `extra` more features per location after its own (the neighbour words joined to the grid): a
// decoder of from's config with feature_dim + extra whose every weight is from's, the weights that read the features
// (D x n) getting `extra` zero rows after from's D, so it computes exactly what `from` does until they train.
std::unique_ptr<Decoder> widened_decoder(Decoder& from, int extra);

}  // namespace sat
