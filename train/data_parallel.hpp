// Data-parallel training's parts that need no MPI: the ranks of a run as the trainer sees them (Collective: one
// process by default; train/mpi_collective.hpp joins the ranks mpirun started), each rank's share of a batch, and the
// one buffer a step's gradients travel in.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "datasets/io.hpp"

namespace sat {

// The processes of a data-parallel run. This base class is one process on its own: every exchange leaves the values
// as they are. Rank 0 leads: it prints, scores validation and writes every file.
class Collective {
 public:
  virtual ~Collective() = default;
  virtual int rank() const { return 0; }
  virtual int size() const { return 1; }
  bool leads() const { return rank() == 0; }
  // Element-wise sums across ranks, in place; every rank ends with the same bytes. `what` names the exchange in
  // error messages.
  virtual void sum(float* values, int64_t n, const std::string& what) {}
  virtual void sum(double* values, int64_t n, const std::string& what) {}
  // Rank 0's bytes, on every rank.
  virtual void broadcast(std::string& bytes, const std::string& what) {}
  // Every rank's bytes in rank order, on rank 0 (the others get nothing).
  virtual std::vector<std::string> gather(const std::string& mine, const std::string& what) { return {mine}; }
  // Whether `value` is the same on every rank (every rank gets the answer).
  virtual bool same_everywhere(uint64_t value, const std::string& what) { return true; }

  // What the float sums have cost so far: seconds waiting in them, bytes each rank contributed.
  double sum_seconds = 0;
  int64_t sum_bytes = 0;
};

// Whether mpirun (Open MPI's, or a PMI launcher such as MPICH's) started this process: its environment says so.
bool launched_by_mpirun();

// Rank `rank` of `ranks` takes the items [begin, end) of n: contiguous shares in rank order, the first n % ranks of
// them one item larger. A rank's share may be empty (n < ranks).
struct Share {
  int begin = 0, end = 0;
  int size() const { return end - begin; }
};
Share share_of(int n, int ranks, int rank);

// One training step's exchange, packed into one contiguous float buffer so that the ranks sum it in a few large
// messages instead of one per tensor:
//   1. the gradient of every trainable parameter. Each rank normalizes its loss by the global batch's totals (tokens,
//      rows), so the sum over ranks is the gradient of the global batch.
//   2. the value of every buffer (a parameter that is not trained but moves in training: batch-norm running
//      statistics, hard attention's REINFORCE baseline) times this rank's weight, its share of the batch. Each is a
//      moving average of a batch mean, so the weighted sum is the update the whole batch would have made.
//   3. a few statistics for the log (sums: loss, tokens, captions...).
// Unpacking writes the sums back into the gradients and buffers.
class StepExchange {
 public:
  StepExchange(const std::vector<Param*>& params, int stats);
  int64_t size() const { return (int64_t)buffer_.size(); }  // floats
  int64_t gradient_floats() const { return gradient_floats_; }
  float* data() { return buffer_.data(); }
  // buffer_weight: one per parameter (read for the buffers only); stats: as many as the constructor was told.
  void pack(const std::vector<Param*>& params, const std::vector<float>& buffer_weight,
            const std::vector<double>& stats);
  void unpack(const std::vector<Param*>& params, std::vector<double>& stats) const;

 private:
  std::vector<int64_t> offset_;  // per parameter, where its part begins
  int64_t gradient_floats_ = 0, stats_at_ = 0;
  int stats_ = 0;
  FloatBuffer buffer_;
};

// A checksum of the parameters' values (their bits, FNV-1a a word at a time): ranks compare it to check that they hold
// the same model.
uint64_t parameter_checksum(const std::vector<Param*>& params);

}  // namespace sat
