// Captioning with a model: the inference path every front end takes, and captioning a set to score it (from images
// decoded in chunks, from planes, or from a feature cache through the model's tuned encoder blocks when it has them).
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

// The one inference path beneath every front end (sat caption, attend, eval, report, the library's sat::Captioner and
// so the server): planes or cached grids -> the encoder's grids -> CaptionModel::search -> each image's candidates.
// Where the time goes, for a front end that shows it.
struct InferenceTiming {
  double encode_seconds = 0, search_seconds = 0;
};
// n images' planes (n x 3 x S x S, normalized as the model's encoder reads them), encoded `batch` at a time (the
// encoder's memory grows with it) and each batch's grids searched; timing, when given, adds up where the time went.
std::vector<CandidateList> caption_planes(CaptionModel& model, const float* planes, int n, const SearchSettings& search,
                                          int batch, InferenceTiming* timing = nullptr);
// n cached grids (n records of model.encoder_config.cache_config(), as sat extract writes them): through the model's
// tuned encoder blocks when it has them, then searched.
std::vector<CandidateList> caption_cached(CaptionModel& model, const float* grids, int n, const SearchSettings& search);
// The COCO objects in n images' planes (as caption_planes takes them), through the model's detector
// (CaptionModel::object_detector): per image, each class whose heat peaks at or above `threshold`, best first.
std::vector<std::vector<DetectedObject>> detect_planes(CaptionModel& model, const float* planes, int n,
                                                       float threshold);
// The kept caption's words of each list.
std::vector<std::vector<std::string>> kept_words(const CaptionModel& model, const std::vector<CandidateList>& lists);

// Captions every image of a set (decoding images in chunks) and scores the captions against the set's
// references; results, when given, receives a COCO results file [{image_id, caption}].
CaptionScores caption_and_score(CaptionModel& model, const CaptionSet& set, const SearchSettings& search,
                                nlohmann::json* results = nullptr);
// The same from a feature cache holding every image of the set.
CaptionScores validate_features(CaptionModel& model, const CaptionSet& set, const FeatureCache& cache,
                                const SearchSettings& search, nlohmann::json* results = nullptr);
// validate or validate_features (cache given) shared by the ranks of a data-parallel run: each rank captions its
// share of the photos (greedy), rank 0 gathers and scores them, and every rank gets the scores (so all decide alike on
// the best model and on stopping).
CaptionScores validate_across(CaptionModel& model, const CaptionSet& set, const FeatureCache* cache,
                              const std::vector<float>& planes, Collective& ranks);
// The caption memory of consensus reranking (train/consensus.hpp) for a set (a training split: never the photos it
// is chosen or scored on): each photo's grid as the model's decoder sees it (from the cache, through the tuned blocks
// when the model has them, else from the photos), pooled (`pooling`: mean, max or gem), its object channels times
// `object_weight` (CaptionMemory::object_weight; other than 1 only for a model with object channels), made unit
// length, and its references. With `projection` (dims > 0), the keys are then projected by what
// learn_key_projection learns from these keys and captions, and made unit length again.
std::shared_ptr<CaptionMemory> build_caption_memory(CaptionModel& model, const CaptionSet& set,
                                                    const FeatureCache* cache, KeyPooling pooling = KeyPooling::mean,
                                                    float object_weight = 1.f,
                                                    const KeyProjectionOptions* projection = nullptr);

}  // namespace sat
