// Caption search: greedy and batched beam search (length-normalized; never an empty caption, never <unk>,
// <pad> or <start>).
#pragma once
#include <cstdint>
#include <vector>

#include "seq/decoder.hpp"
#include "seq/ensemble.hpp"

namespace sat {

struct Hypothesis {
  std::vector<int> tokens;                 // words only (no <start>, no <end>)
  std::vector<std::vector<float>> alphas;  // one attention map (L) per emitted token, <end> included
  std::vector<int> locations;              // hard attention: the glimpse location per emitted token
  double logprob = 0;                      // sum over emitted tokens, <end> included
  double score = 0;                        // logprob / (number of emitted tokens)^length_norm
};

// no_repeat_ngram n > 0 (both searches): a caption never repeats an n-word phrase (n = 3: a word that would end a
// trigram the caption already holds is not taken), which stops the loops a weak model falls into ("a man in a
// black and white shirt and a black and white shirt ..."); 0 lets the model repeat.
constexpr int kMaxNoRepeat = 9;

// Diverse beam search (Vijayakumar et al. 2018, Hamming diversity): the beam's rows split into `groups` groups of
// beam / groups rows each, every group a beam search of its own. At each step the groups choose in turn, and group
// g ranks its candidates by log p - penalty x (how many rows of groups 0..g-1 chose that word at this step), so
// later groups are pushed off the words the earlier ones took; each group ends when it has finished beam / groups
// captions. Captions keep their own log p and score (the penalty only steers the choice). groups 1 (or penalty 0
// with one group) is plain beam search; groups must divide the beam.
struct BeamDiversity {
  int groups = 1;
  double penalty = 0;
};
constexpr double kMaxDiversityPenalty = 100;

// Steering the beam toward some words: word_group[w] is the group word w belongs to (-1: none; one entry per word of
// the vocabulary, or none at all: no steering), and bonus(i, g) is added to the rank of image i's rows the first time
// a row says a word of group g (the objects' evidence in the search: naming what the photo likely holds gains,
// naming what it likely does not costs). Like the diversity penalty it only steers which captions are found: each
// keeps its own log p and score. At most 32 groups.
struct BeamSteering {
  std::vector<int> word_group;
  Mat bonus;  // N x groups
  bool active() const { return !word_group.empty(); }
};
constexpr int kMaxSteeringGroups = 32;
// Throws an Error saying what is wrong with `steering` for N images and a vocabulary of vocab_size words.
void check_steering(const BeamSteering& steering, int N, int vocab_size);
// Throws an Error saying what is wrong with `diversity` for a beam of `beam` rows.
void check_diversity(const BeamDiversity& diversity, int beam);

// F: N*L x D features of N images. One hypothesis per image.
std::vector<Hypothesis> greedy_search(Decoder& dec, const Mat& F, int N, int max_len, int no_repeat_ngram = 0);
// `copies` captions per image (N * copies hypotheses, each image's consecutive) with each word drawn from the
// model's distribution (never <unk>, <pad>, <start>; never empty): the samples of self-critical training.
std::vector<Hypothesis> sample_search(Decoder& dec, const Mat& F, int N, int max_len, Rng& rng, int copies = 1);
// The same with each caption's words drawn from its own stream (RowRng seeded by row_seeds, N * copies of them): a
// caption's samples do not depend on which other images share the batch (data-parallel self-critical training).
std::vector<Hypothesis> sample_search(Decoder& dec, const Mat& F, int N, int max_len,
                                      const std::vector<uint64_t>& row_seeds, int copies = 1);
// Finished hypotheses compete by logprob / (emitted tokens)^length_norm: 1 is the mean log-probability per token,
// 0 the plain log-probability (shorter captions win more often).
std::vector<Hypothesis> beam_search(Decoder& dec, const Mat& F, int N, int beam, int max_len, double length_norm = 1.0,
                                    int no_repeat_ngram = 0, const BeamDiversity& diversity = {});
// Every caption the beam search finished for each image (N lists; the `beam` first to end with <end>, and those the
// beam's rows held when max_len cut them off), best score first: the first of each list is beam_search's caption. The
// candidates consensus reranking (train/consensus.hpp) chooses among.
std::vector<std::vector<Hypothesis>> beam_search_nbest(Decoder& dec, const Mat& F, int N, int beam, int max_len,
                                                       double length_norm = 1.0, int no_repeat_ngram = 0,
                                                       const BeamDiversity& diversity = {},
                                                       const BeamSteering& steering = {});
std::vector<std::vector<Hypothesis>> beam_search_nbest(DecoderEnsemble& dec, const Mat& F, int N, int beam, int max_len,
                                                       double length_norm = 1.0, int no_repeat_ngram = 0,
                                                       const BeamDiversity& diversity = {},
                                                       const BeamSteering& steering = {});
// Constrained beam search: for image i, the captions that say words[i] somewhere (up to `beam`, best score first,
// scored as beam_search_nbest scores its own), found with two beams per image, the rows before the word and the rows
// after it. words[i] must be a word a caption can say (not <pad>, <start>, <end> or <unk>). An image whose word no
// row reaches within max_len words gets an empty list.
std::vector<std::vector<Hypothesis>> beam_search_including(Decoder& dec, const Mat& F, int N, int beam, int max_len,
                                                           double length_norm, int no_repeat_ngram,
                                                           const std::vector<int>& words);
std::vector<std::vector<Hypothesis>> beam_search_including(DecoderEnsemble& dec, const Mat& F, int N, int beam,
                                                           int max_len, double length_norm, int no_repeat_ngram,
                                                           const std::vector<int>& words);
// Given captions (word ids, no <start>/<end>; 1 to max_len - 1 words) scored on one image's grid F (L x D) as the
// searches would score them: teacher-forced through the inference path, each word's log-probability after the
// searches' bans (a caption they could never emit scores -inf), <end> appended; score = logprob / (words + 1)^
// length_norm, as beam search's. Consensus reranking scores the memory's captions this way.
std::vector<Hypothesis> score_captions(Decoder& dec, const Mat& F, const std::vector<std::vector<int>>& captions,
                                       int max_len, double length_norm = 1.0, int no_repeat_ngram = 0);
std::vector<Hypothesis> score_captions(DecoderEnsemble& dec, const Mat& F,
                                       const std::vector<std::vector<int>>& captions, int max_len,
                                       double length_norm = 1.0, int no_repeat_ngram = 0);
// The same searches over an ensemble's mean distribution (seq/ensemble.hpp).
std::vector<Hypothesis> greedy_search(DecoderEnsemble& dec, const Mat& F, int N, int max_len, int no_repeat_ngram = 0);
std::vector<Hypothesis> beam_search(DecoderEnsemble& dec, const Mat& F, int N, int beam, int max_len,
                                    double length_norm = 1.0, int no_repeat_ngram = 0,
                                    const BeamDiversity& diversity = {});

}  // namespace sat
