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
};

// Learns the projection from N keys (rows of `keys`, N x D, each of unit length) and each photo's captions (words
// joined by single spaces, as CaptionMemory keeps them). Throws an Error when there are too few photos or words for
// `dims` directions or the options are out of range.
KeyProjection learn_key_projection(const Mat& keys, const std::vector<std::vector<std::string>>& captions,
                                   const KeyProjectionOptions& options);

}  // namespace sat
