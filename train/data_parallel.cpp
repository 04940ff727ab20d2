#include "train/data_parallel.hpp"

#include <algorithm>
#include <cstdlib>
#include <cstring>

namespace sat {

bool launched_by_mpirun() {
  for (const char* var : {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_RANK"})
    if (std::getenv(var)) return true;
  return false;
}

Share share_of(int n, int ranks, int rank) {
  if (ranks < 1 || rank < 0 || rank >= ranks || n < 0)
    throw Error("share_of: rank " + std::to_string(rank) + " of " + std::to_string(ranks) + ", " + std::to_string(n) +
                " items");
  const int base = n / ranks, larger = n % ranks;
  Share s;
  s.begin = rank * base + std::min(rank, larger);
  s.end = s.begin + base + (rank < larger ? 1 : 0);
  return s;
}

StepExchange::StepExchange(const std::vector<Param*>& params, int stats) : stats_(stats) {
  // gradients first, then buffers: the gradient part is one contiguous run (the bytes a step must reduce)
  offset_.assign(params.size(), -1);
  int64_t at = 0;
  for (size_t k = 0; k < params.size(); ++k)
    if (params[k]->trainable) offset_[k] = at, at += params[k]->size();
  gradient_floats_ = at;
  for (size_t k = 0; k < params.size(); ++k)
    if (!params[k]->trainable) offset_[k] = at, at += params[k]->size();
  stats_at_ = at;
  buffer_.assign((size_t)(at + stats), 0.f);
}

void StepExchange::pack(const std::vector<Param*>& params, const std::vector<float>& buffer_weight,
                        const std::vector<double>& stats) {
  if (params.size() != offset_.size() || buffer_weight.size() != params.size() || (int)stats.size() != stats_)
    throw Error("step exchange: packed with " + std::to_string(params.size()) + " parameters, " +
                std::to_string(buffer_weight.size()) + " weights and " + std::to_string(stats.size()) +
                " statistics; laid out for " + std::to_string(offset_.size()) + " and " + std::to_string(stats_));
  for (size_t k = 0; k < params.size(); ++k) {
    Param& p = *params[k];
    float* dst = buffer_.data() + offset_[k];
    if (p.size() == 0) continue;  // an empty tensor's data() may be null: memcpy must not see it
    p.ensure_grad();              // a tensor no backward reached sends zeros
    if (p.trainable) {
      std::memcpy(dst, p.grad.data(), sizeof(float) * p.size());
    } else {
      const float w = buffer_weight[k];
      for (int64_t i = 0; i < p.size(); ++i) dst[i] = w * p.value[i];
    }
  }
  for (int i = 0; i < stats_; ++i) buffer_[stats_at_ + i] = (float)stats[i];
}

void StepExchange::unpack(const std::vector<Param*>& params, std::vector<double>& stats) const {
  if (params.size() != offset_.size()) throw Error("step exchange: unpacked into another parameter list");
  for (size_t k = 0; k < params.size(); ++k) {
    Param& p = *params[k];
    if (p.size() == 0) continue;
    const float* src = buffer_.data() + offset_[k];
    p.ensure_grad();
    std::memcpy(p.trainable ? p.grad.data() : p.value.data(), src, sizeof(float) * p.size());
  }
  stats.assign(buffer_.begin() + stats_at_, buffer_.end());
}

uint64_t parameter_checksum(const std::vector<Param*>& params) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (const Param* p : params)
    for (float v : p->value) {  // a word at a time: the bits of each float
      uint32_t bits;
      std::memcpy(&bits, &v, sizeof bits);
      h = (h ^ bits) * 0x100000001b3ull;
    }
  return h;
}

}  // namespace sat
