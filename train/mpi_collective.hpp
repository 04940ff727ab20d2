// The ranks mpirun started, as a Collective (built with SAT_MPI: Open MPI or any MPI-3 library). Only the sat
// executable links it: the libraries, and programs using libsat.so, need no MPI.
#pragma once
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "train/data_parallel.hpp"

namespace sat {

class MpiCollective : public Collective {
 public:
  // Joins the run (MPI_Init_thread; only the main thread calls MPI). MPI errors come back as codes
  // (MPI_ERRORS_RETURN) and become Errors naming the rank and the exchange. A watchdog thread ends this process, naming
  // the exchange and what it knows of the other ranks, when one exchange waits longer than watchdog_seconds (a rank
  // that hangs: one that dies is seen by mpirun, which stops the others with SIGTERM; this process then says so).
  explicit MpiCollective(double watchdog_seconds);
  // MPI_Finalize, unless an exception is on its way out: main then aborts the whole run (abort_run) instead.
  ~MpiCollective() override;
  MpiCollective(const MpiCollective&) = delete;
  MpiCollective& operator=(const MpiCollective&) = delete;

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  int ranks_on_this_node() const { return local_size_; }
  void sum(float* values, int64_t n, const std::string& what) override;
  void sum(double* values, int64_t n, const std::string& what) override;
  void broadcast(std::string& bytes, const std::string& what) override;
  std::vector<std::string> gather(const std::string& mine, const std::string& what) override;
  bool same_everywhere(uint64_t value, const std::string& what) override;

 private:
  // Marks the start and end of a wait for the other ranks (the watchdog times the waits).
  void begin_wait(const std::string& what);
  void end_wait();
  void check(int code, const char* call, const std::string& what) const;
  void watch(double seconds);
  std::string other_ranks_state() const;

  int rank_ = 0, size_ = 1, local_size_ = 1;
  std::vector<int> pids_;                  // every rank's process id
  std::vector<std::string> hosts_;         // and node name
  std::atomic<int64_t> waiting_since_{0};  // steady-clock nanoseconds; 0: not waiting
  std::string waiting_for_;                // guarded by mutex_
  std::mutex mutex_;
  std::condition_variable stop_watch_;
  bool stopping_ = false;
  std::thread watchdog_;
};

// After an error that ends this process under mpirun: prints "sat: rank R of N: <message>" and ends the whole run
// (MPI_Abort: mpirun stops every rank and names this one). Returns when MPI is not running.
void abort_run(const std::string& message);

// OpenMP threads for one rank: the CPUs this process may run on, divided among the ranks of its node when their CPU
// sets overlap (mpirun --bind-to none, or more ranks than cores).
int threads_per_rank(int ranks_on_node);

}  // namespace sat
