// The nearest memory photos' words as the decoder's input (sat train --neighbour-words; retrieval-augmented
// captioning in the manner of Sarto et al. 2022 and Ramos et al. 2023, with the words instead of the sentences):
// for a photo, its k nearest photos in the caption memory (train/consensus.hpp: the keys reranking finds them by)
// and, for each of K chosen words, the share of those photos' captions that say it, times a scale. Those K values
// join every location of the encoder's grid after its own channels, so the decoder reads them as it reads the
// detector's tags: in its initial state, in each step's context and in the attention's scores.
// A training photo's own captions are in the memory: its neighbours leave its own memory photo out.
#pragma once
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "datasets/vocab.hpp"
#include "seq/tensor.hpp"
#include "train/consensus.hpp"

namespace sat {

constexpr int kMaxNeighbourWords = 4096;       // K
constexpr int kMaxNeighbourWordPhotos = 1000;  // k
constexpr float kMaxNeighbourWordScale = 100;

struct NeighbourWords {
  std::vector<std::string> words;  // the K words whose shares the decoder reads, in the order of its channels
  int neighbours = 30;             // k: the memory photos whose captions are counted
  float scale = 40;                // a share of 1 becomes this (sat train --neighbour-scale)
  int count() const { return (int)words.size(); }
  bool on() const { return !words.empty(); }
  nlohmann::json to_json() const;
  // Checks the ranges and that the words are distinct and non-empty; errors name `source`.
  static NeighbourWords from_json(const nlohmann::json& j, const std::string& source);
};

// The `count` words of `vocab` (not its <pad> <start> <end> <unk>) that the most of the memory's captions say, most
// said first (ties: the vocabulary's order). Fewer when fewer of its words are said at all.
std::vector<std::string> most_said_words(const CaptionMemory& memory, const Vocab& vocab, int count);

// For each of `words`, the share of the captions of the memory photos `photos` that say it, times `scale`, at out
// (words.size() values; zeros for no photos).
void neighbour_word_shares(const CaptionMemory& memory, const std::vector<int>& photos,
                           const std::vector<std::string>& words, float scale, float* out);

// Each image's `nw.neighbours` nearest memory photos by the key of its grid (CaptionMemory::key_vectors of F,
// N*L x D, the encoder's grids), leaving out memory photo leave_out[i] for image i (-1, or leave_out empty: none).
std::vector<std::vector<int>> neighbour_photos(const CaptionMemory& memory, const Mat& F, int n, int neighbours,
                                               const std::vector<int>& leave_out = {});

// F (N*L x D) with each image's neighbour word shares joined to every one of its L locations: N*L x (D + K).
Mat join_neighbour_words(const Mat& F, int n, const CaptionMemory& memory, const NeighbourWords& nw,
                         const std::vector<int>& leave_out = {});

// Per caption set image, the memory photo holding the same captions (its own, when the memory was built from that
// set), or -1: what training leaves out of each photo's neighbours. images_captions[i]: image i's references, raw.
std::vector<int> own_memory_photos(const CaptionMemory& memory,
                                   const std::vector<std::vector<std::string>>& images_captions);

}  // namespace sat
