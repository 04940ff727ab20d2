// The ranks of a data-parallel run, for the commands that can run under mpirun (train, bench decoder).
#include <omp.h>

#include "tools/cli/commands.hpp"
#include "train/data_parallel.hpp"
#if SAT_MPI
#include "train/mpi_collective.hpp"
#endif

namespace sat {

std::unique_ptr<Collective> join_ranks(double watchdog_seconds) {
  if (!launched_by_mpirun()) return std::make_unique<Collective>();
#if SAT_MPI
  auto ranks = std::make_unique<MpiCollective>(watchdog_seconds);
  // Ranks that share a node share its cores (unless mpirun bound each to its own).
  if (ranks->size() > 1) omp_set_num_threads(threads_per_rank(ranks->ranks_on_this_node()));
  return ranks;
#else
  throw Error(
      "mpirun started this sat, but it was built without MPI (cmake -DSAT_MPI=ON, with libopenmpi-dev): every "
      "rank would train alone and write the same files");
#endif
}

void abort_ranks_after(const std::string& message) {
#if SAT_MPI
  abort_run(message);
#endif
}

}  // namespace sat
