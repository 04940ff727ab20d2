// A caption memory's keys projected so that photos people describe with the same words are near: canonical
// correlation analysis (Hotelling 1936) between the memory photos' keys and the bag of words of their captions, the
// projection Gong et al. (2014, "Improving Image-Sentence Embeddings Using Large Weakly Annotated Photo Collections")
// use for image-to-caption retrieval, each direction scaled by its canonical correlation to a power.
//
// The raw key (the decoder's grid pooled, unit length) weighs every channel by how much it varies, whatever it says
// about the words; the projection keeps the directions of the key that predict the captions' words and weighs them
// by how well they do. Learned from the memory's own photos and captions (the training split), so it is part of the
// memory: sat model memory --cca DIMS builds it, the model file stores it, and the search projects each photo's key
// the same way (CaptionMemory::key_vectors).
//
// CCA learns a map for the words too: a caption's bag of words lands in the same space, and the cosine of a photo's
// projected key with it says how well the caption's words fit the photo (Gong et al. score captions against photos
// so). The search weighs it as the caption's relevance (ConsensusSettings::relevance_weight).
#pragma once
#include <string>
#include <vector>

#include "seq/tensor.hpp"

namespace sat {

struct KeyProjectionOptions {
  int dims = 256;               // directions kept (at most the key's dimension and the number of words)
  double regularization = 0.01;  // ridge on both covariances, as a fraction of their mean variance
  double power = 4;             // each direction scaled by its canonical correlation to this power
  int min_photos = 5;           // words in fewer memory photos' captions are left out of the bag of words
};

constexpr int kMaxKeyProjectionDims = 4096;

struct KeyProjection {
  Vec center;  // 1 x D: the mean key, subtracted first
  Mat map;     // D x dims: projected key = (key - center) * map
  std::vector<double> correlations;  // the canonical correlation of each kept direction, largest first
  int words = 0;                     // the bag of words' size
  // The word side (empty in memories built before it): the bag's words, sorted; each word's row of the map, for a
  // caption that stands for a whole memory photo (the word's inverse document frequency x the memory photos' mean
  // number of captions, times the word side's canonical directions scaled as the keys' are); and the mean photo's
  // bag projected. A caption's projection = sum of its distinct known words' rows - word_center.
  std::vector<std::string> vocabulary;
  Mat word_map;     // words x dims
  Vec word_center;  // 1 x dims
  bool has_word_side() const { return word_map.size() > 0; }
};

// Learns the projection from N keys (rows of `keys`, N x D, each of unit length) and each photo's captions (words
// joined by single spaces, as CaptionMemory keeps them). Throws an Error when there are too few photos or words for
// `dims` directions or the options are out of range.
KeyProjection learn_key_projection(const Mat& keys, const std::vector<std::vector<std::string>>& captions,
                                   const KeyProjectionOptions& options);

// A caption's words in the projection's space (1 x dims): the word side's rows of its distinct words that the
// vocabulary holds, summed, minus word_center. Needs the word side.
Vec project_caption(const KeyProjection& projection, const std::vector<std::string>& words);

// The cosine of a photo's projected key (dims values: CaptionMemory::key_vectors) with each caption's projection
// (0 where either is zero): how well each caption's words fit the photo.
std::vector<double> caption_relevances(const KeyProjection& projection, const float* projected_key,
                                       const std::vector<std::vector<std::string>>& captions);

// Checks a word side read from a file: the vocabulary sorted and without repeats, one row per word, `dims` columns,
// finite values. Returns what is wrong ("" when nothing).
std::string word_side_problem(const KeyProjection& projection);

}  // namespace sat
