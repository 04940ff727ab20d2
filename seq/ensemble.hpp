// Several decoders over the same features and vocabulary, searched as one (an ensemble of independently trained
// members): each step's word distribution is the mean of the members' distributions, p(w) = (1/K) sum_k p_k(w),
// and its attention map the mean of theirs. Each member keeps its own LSTM state; the search reorders all of them
// alike. Hard attention is left out (its members would each sample their own glimpse).
#pragma once
#include <vector>

#include "seq/decoder.hpp"

namespace sat {

// Why one member cannot join the others, and which one (1-based, in the order given): a model file holding
// several members maps it back to the file it came from.
struct EnsembleMemberError : Error {
  EnsembleMemberError(int member, const std::string& problem)
      : Error("ensemble: member " + std::to_string(member) + " " + problem), member(member), problem(problem) {}
  int member;
  std::string problem;  // "uses hard attention, ...", without the member's number
};

class DecoderEnsemble {
 public:
  // members: at least one, each a distinct Decoder (a decoder's attention holds its current search's grid
  // projection); the same vocabulary size and grid, none with hard attention, all attending or none (else an
  // EnsembleMemberError).
  explicit DecoderEnsemble(std::vector<Decoder*> members);
  const DecoderConfig& config() const { return members_[0]->config(); }
  int size() const { return (int)members_.size(); }

  struct State {
    std::vector<Decoder::State> members;
    std::vector<int> location;  // hard attention only (never here): kept so the searches read one interface
  };
  // As Decoder::begin: F is N*L x D, read in place by every member until the search ends.
  void begin(const Mat& F, int N, State& st, int copies = 1);
  // logprobs: B x V, log of the members' mean probability (computed from their log-probabilities without
  // underflow: max + log mean exp(lp - max)). alpha: B x L, the members' mean attention. With few rows (a photo's
  // beams) the members step side by side, one per thread: their own products are too small to share out well.
  void step(const std::vector<int>& tokens, State& st, Mat& logprobs, Mat& alpha);
  void select_rows(State& st, const std::vector<int>& rows);

 private:
  std::vector<Decoder*> members_;
  std::vector<Mat> member_logp_, member_alpha_;  // per member, the last step's B x V and B x L
};

// The mean of K distributions given as log-probabilities (each B x V), as log-probabilities: rows where every
// member says -inf stay -inf.
void mean_of_distributions(const std::vector<Mat>& logps, Mat& out);

}  // namespace sat
