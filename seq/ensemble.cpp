#include "seq/ensemble.hpp"

#include <cmath>
#include <exception>
#include <limits>

namespace sat {

// Up to this many rows a step runs the members side by side (one per thread) rather than one after another.
constexpr int kRowsSideBySide = 64;

DecoderEnsemble::DecoderEnsemble(std::vector<Decoder*> members) : members_(std::move(members)) {
  if (members_.empty()) throw Error("ensemble: no decoders");
  const DecoderConfig& first = members_[0]->config();
  for (size_t k = 0; k < members_.size(); ++k) {
    const int member = (int)k + 1;
    for (size_t j = 0; j < k; ++j)
      if (members_[j] == members_[k])
        throw EnsembleMemberError(member, "is the same decoder object as member " + std::to_string(j + 1) +
                                              " (each member searches with its own)");
    const DecoderConfig& c = members_[k]->config();
    if (c.hard()) throw EnsembleMemberError(member, "uses hard attention, which an ensemble cannot average");
    if (c.vocab_size != first.vocab_size || c.feature_dim != first.feature_dim || c.grid_h != first.grid_h ||
        c.grid_w != first.grid_w)
      throw EnsembleMemberError(member, "reads another vocabulary or grid than member 1");
    if (c.attends() != first.attends())
      throw EnsembleMemberError(member, std::string(c.attends() ? "attends" : "does not attend") + " and member 1 " +
                                            (first.attends() ? "does" : "does not"));
  }
  member_logp_.resize(members_.size());
}

void DecoderEnsemble::begin(const Mat& F, int N, State& st, int copies) {
  st.members.assign(members_.size(), Decoder::State());
  st.location.clear();
  for (size_t k = 0; k < members_.size(); ++k) members_[k]->begin(F, N, st.members[k], copies);
}

void mean_of_distributions(const std::vector<Mat>& logps, Mat& out) {
  const int64_t B = logps[0].rows(), V = logps[0].cols();
  const float k = (float)logps.size();
  constexpr float kNone = -std::numeric_limits<float>::infinity();
  out.resize(B, V);
  for (int64_t b = 0; b < B; ++b)
    for (int64_t w = 0; w < V; ++w) {
      float top = kNone;
      for (const Mat& lp : logps) top = std::max(top, lp(b, w));
      if (top == kNone) {
        out(b, w) = kNone;
        continue;
      }
      float sum = 0;
      for (const Mat& lp : logps) sum += std::exp(lp(b, w) - top);
      out(b, w) = top + std::log(sum / k);  // K identical members: exactly their own log-probability
    }
}

void DecoderEnsemble::step(const std::vector<int>& tokens, State& st, Mat& logprobs, Mat& alpha) {
  const int K = size();
  member_alpha_.resize(K);
  const bool side_by_side = K > 1 && (int)tokens.size() <= kRowsSideBySide;
  // An exception must not leave an OpenMP region: each member's is kept and the first rethrown after it.
  std::vector<std::exception_ptr> failed(K);
#pragma omp parallel for schedule(static, 1) if (side_by_side)
  for (int k = 0; k < K; ++k) {
    try {
      members_[k]->step(tokens, st.members[k], member_logp_[k], member_alpha_[k]);
    } catch (...) {
      failed[k] = std::current_exception();
    }
  }
  for (auto& e : failed)
    if (e) std::rethrow_exception(e);
  alpha = member_alpha_[0];
  for (int k = 1; k < K; ++k) alpha += member_alpha_[k];
  if (K > 1) alpha /= (float)K;
  if (K == 1)
    logprobs = member_logp_[0];
  else
    mean_of_distributions(member_logp_, logprobs);
}

void DecoderEnsemble::select_rows(State& st, const std::vector<int>& rows) {
  for (size_t k = 0; k < members_.size(); ++k) members_[k]->select_rows(st.members[k], rows);
}

}  // namespace sat
