// Captioning a set with a model and scoring it: from images (decoded in chunks), from planes, or from a feature
// cache (through the model's tuned encoder blocks when it has them).
#pragma once
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "datasets/coco.hpp"
#include "datasets/features.hpp"
#include "train/data_parallel.hpp"
#include "train/evaluate.hpp"
#include "train/model.hpp"

namespace sat {

// Captions N images' planes in batches; greedy when beam == 1.
std::vector<std::vector<std::string>> caption_planes(CaptionModel& model, const std::vector<float>& planes, int n,
                                                     int beam, int batch = 32);
// Captions every image of a set (decoding images in chunks) and scores the captions against the set's
// references; results, when given, receives a COCO results file [{image_id, caption}].
CaptionScores caption_and_score(CaptionModel& model, const CaptionSet& set, int beam, nlohmann::json* results = nullptr);

// coco-caption scores of the model's captions (greedy when beam is 1) for a set whose planes are given.
CaptionScores validate(CaptionModel& model, const CaptionSet& set, const std::vector<float>& planes, int beam = 1);
// The same from a feature cache holding every image of the set; results as in caption_and_score.
CaptionScores validate_features(CaptionModel& model, const CaptionSet& set, const FeatureCache& cache, int beam = 1,
                                nlohmann::json* results = nullptr);
// validate or validate_features (cache given) shared by the ranks of a data-parallel run: each rank captions its
// share of the photos (greedy), rank 0 gathers and scores them, and every rank gets the scores (so all decide alike on
// the best model and on stopping).
CaptionScores validate_across(CaptionModel& model, const CaptionSet& set, const FeatureCache* cache,
                              const std::vector<float>& planes, Collective& ranks);
// The caption memory of consensus reranking (train/consensus.hpp) for a set (a training split: never the photos it
// is chosen or scored on): each photo's grid as the model's decoder sees it (from the cache, through the tuned blocks
// when the model has them, else from the photos), pooled (`pooling`: mean, max or gem) to a vector of unit length, and
// its references.
std::shared_ptr<CaptionMemory> build_caption_memory(CaptionModel& model, const CaptionSet& set,
                                                    const FeatureCache* cache, KeyPooling pooling = KeyPooling::mean);
// Captions n grids (n x L x D floats).
std::vector<std::vector<std::string>> caption_grids(CaptionModel& model, const float* grids, int n, int beam);

}  // namespace sat
