// Consensus reranking (Devlin et al. 2015, "Exploring Nearest Neighbor Approaches for Image Captioning"; Mao et
// al. 2015 rerank a beam the same way): beam search finds the model's candidate captions for a photo, and the one
// kept is the one with the best
//
//     score + weight * CIDEr-D(candidate, captions of the photo's k nearest training photos)
//
// where score is the beam's own (log p / words^length_norm) and the neighbours are the training photos whose key
// (the decoder's grid pooled over its locations, by the mean unless the memory says otherwise: KeyPooling; its object
// channels, if any, times the memory's object weight; unit length) has the largest cosine with the photo's made the
// same way.
// CIDEr-D here takes its document frequencies from all the memory's captions, so a caption's agreement does not
// depend on what else is captioned with it. The memory (the training photos' vectors and captions) lives in the
// model file: `sat model memory` builds it from the training split, and weight 0 turns reranking off.
#pragma once
#include <future>
#include <memory>
#include <string>
#include <vector>

#include "seq/search.hpp"
#include "train/key_projection.hpp"
#include "train/metrics.hpp"

namespace sat {

// How a photo's grid (L x D) becomes its memory key, before unit length: the mean over the L locations (what
// memories were first built with), the maximum (a thing in a few cells counts as much as one filling the grid), or
// the generalized mean of order 3 of max(x, 0) (Radenović et al. 2018: between the two).
enum class KeyPooling { mean, max, gem };
const char* key_pooling_name(KeyPooling pooling);
KeyPooling parse_key_pooling(const std::string& name);  // "mean", "max" or "gem"; else an Error

// The most a memory key's object channels may be weighted (CaptionMemory::object_weight).
constexpr float kMaxKeyObjectWeight = 100;

struct CaptionMemory {
  Mat keys;  // M x K: each memory photo's key (key_vectors), unit length (K: D, or the projection's dims)
  KeyPooling pooling = KeyPooling::mean;
  // The grid's last `object_channels` channels (the detector's, EncoderConfig::object_channels) are multiplied by
  // `object_weight` in the keys, after pooling and before unit length: above 1, photos with the same objects in
  // them are nearer (a dog counts for more than the grass around it); 0 leaves the objects out.
  int object_channels = 0;
  float object_weight = 1.f;
  // Optional (empty: none): the pooled key, weighted and of unit length, minus `projection.center`, times
  // `projection.map` (train/key_projection.hpp: learned from the memory's own photos and captions by CCA).
  KeyProjection projection;
  KeyProjectionOptions projection_options;  // what it was learned with (shown by sat model info)
  bool projected() const { return projection.map.size() > 0; }
  // Whether the projection has its word side: what a caption's relevance (ConsensusSettings::relevance_weight) needs.
  bool weighs_relevance() const { return projected() && projection.has_word_side(); }
  // Per memory photo, its captions as memory_caption() gives them (words joined by single spaces).
  std::vector<std::vector<std::string>> captions;

  int photos() const { return (int)keys.rows(); }
  // The keys of N grids (F: N*L x D) as this memory makes them, before unit length: pooled (`pooling`), then the
  // object channels weighted, then (a projected memory) of unit length and projected.
  Mat key_vectors(const Mat& F, int N) const;
  // The same from keys already pooled and weighted (N x D).
  Mat projected_keys(Mat pooled) const;
  // Checks the shapes (one caption list per key, at least one caption each, unit-length keys of dimension D or the
  // projection's, a projection from D values, the object channels within the grid and their weight in
  // [0, kMaxKeyObjectWeight]), then
  // builds the CIDEr-D document frequencies on a thread of their own (80 ms for Flickr8k's 30 000 captions: a model
  // loads and encodes its photo meanwhile); errors name `source`. The first agreement waits for them, and so does
  // ready(), which also throws what building them threw (too many distinct words, say).
  void prepare(int D, const std::string& source);
  // The shape checks of prepare() alone: the keys (or their projection) read a grid of D channels, and the object
  // channels lie within it. Errors name `source`.
  void check_grid(int D, const std::string& source) const;
  void ready() const;
  // The k memory photos nearest to one grid's key (key_vectors; any length), nearest first (ties: the lower index).
  std::vector<int> nearest(const float* key, int k) const;
  // CIDEr-D of `words` against the captions of `photos` pooled.
  double agreement(const Tokens& words, const std::vector<int>& photos) const;
  // The same for several captions (the pooled captions' vectors built once).
  std::vector<double> agreements(const std::vector<Tokens>& words, const std::vector<int>& photos) const;
  // The same, caption k not compared with memory photo leave_out[k]'s own captions (-1: none).
  std::vector<double> agreements(const std::vector<Tokens>& words, const std::vector<int>& photos,
                                 const std::vector<int>& leave_out) const;
  // Memory photo i's captions as words.
  std::vector<Tokens> caption_words(int photo) const;
  // For each group of object_groups() (train/object_mentions.hpp), the share of the captions of `photos` that name
  // it (0 for no photos): how often people named the object in the photos nearest this one.
  std::vector<double> object_shares(const std::vector<int>& photos) const;

 private:
  std::shared_future<std::shared_ptr<const CiderDScorer>> cider_;  // invalid until prepare()
  std::string source_;
  const CiderDScorer& scorer() const;
};

struct ConsensusSettings {
  int neighbours = 30;  // k
  double weight = 0;    // 0: off (the beam's best caption)
  // The captions of the photo's nearest `memory_candidates` memory photos join the beam's candidates, scored by the
  // decoder as the search scores its own, each compared with the other neighbours' captions only (0: the beam's alone).
  int memory_candidates = 0;
  // The COCO detector's evidence (a model with object channels; train/object_mentions.hpp: object_evidence): each
  // candidate's total gains object_evidence x (sum over the object groups it names of the group's peak minus
  // evidence_threshold). 0: off. Applies with or without a caption memory.
  double object_evidence = 0;
  double evidence_threshold = 0.15;
  // The same evidence in the beam (seq/search.hpp: BeamSteering): a beam row's rank gains beam_evidence x (the
  // group's evidence minus evidence_threshold) the first time its words name the group, so the beam finds more
  // captions naming what the photo likely holds and fewer naming what it likely does not (each keeps its own log p
  // and score). 0: off. A model with object channels, with or without object_evidence; constrained search (include)
  // is not steered.
  double beam_evidence = 0;
  // The nearest memory photos' captions in the objects' evidence (needs the memory; read only with object_evidence
  // or beam_evidence on): each group's evidence is (1 - neighbour_evidence) x its detector peak + neighbour_evidence
  // x the share of those photos' captions that name it (CaptionMemory::object_shares). 0: the peak alone; 1: the
  // captions alone.
  double neighbour_evidence = 0;
  // The caption's relevance to the photo (a memory whose key projection has its word side, weighs_relevance): each
  // candidate's total gains relevance_weight x the cosine of the photo's projected key with the candidate's
  // projected words (train/key_projection.hpp: caption_relevances). 0: off.
  double relevance_weight = 0;
};

// A reference caption as the memory keeps it: PTB-tokenized and lowercased as coco-caption scores it, words joined
// by single spaces.
std::string memory_caption(const std::string& raw);

// A memory's captions as the model file stores them: a JSON array of arrays of strings, [["a dog runs", ...], ...].
// The fast path reads what nlohmann's dump writes (no whitespace; the escapes \" \\ \/ \b \f \n \r \t and \uXXXX)
// at memory speed; anything else (whitespace, a value that is not a string) goes to the full JSON parser, so both
// read any valid text alike. Malformed text throws.
std::vector<std::vector<std::string>> parse_caption_lists(const std::string& json_text);

// Mean over each image's L rows of F (N*L x D), one row per image: the vectors the memory is keyed by.
Mat mean_grid_vectors(const Mat& F, int N);
// The same pooled as `pooling` says (KeyPooling::mean: mean_grid_vectors).
Mat pooled_grid_vectors(const Mat& F, int N, KeyPooling pooling);

// Consensus reranking's rule: totals[i] = scores[i] + weight * agreements[i]; the choice is the first of the best.
std::vector<double> consensus_totals(const std::vector<double>& scores, const std::vector<double>& agreements,
                                     double weight);
int best_total(const std::vector<double>& totals);

// Chooses among one image's candidates (best score first, as beam_search_nbest gives them): the index of the one
// with the best score + weight * agreement. words[i] is candidate i's caption as words; key is the image's
// (CaptionMemory::key_vectors).
int choose_by_consensus(const std::vector<Hypothesis>& candidates, const std::vector<Tokens>& words,
                        const CaptionMemory& memory, const float* key, const ConsensusSettings& settings,
                        std::vector<double>* agreements = nullptr);

}  // namespace sat
