#include "train/mpi_collective.hpp"

#include <algorithm>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <fstream>
#include <sched.h>
#include <unistd.h>

#include <mpi.h>

namespace sat {

namespace {

// Floats per MPI_Allreduce call: a step's gradients go in one call up to 64 MB, in a few beyond (MPI counts are int).
constexpr int64_t kChunk = int64_t(1) << 24;

int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

// What a rank stopped by mpirun says (SIGTERM: mpirun stops every rank when one fails or the run is interrupted).
// Written from the signal handler, so formatted beforehand.
char g_sigterm_message[256];
extern "C" void on_sigterm(int) {
  ssize_t written = write(STDERR_FILENO, g_sigterm_message, std::strlen(g_sigterm_message));
  (void)written;
  _exit(128 + SIGTERM);
}

}  // namespace

MpiCollective::MpiCollective(double watchdog_seconds) {
  int initialized = 0, provided = 0;
  MPI_Initialized(&initialized);
  if (!initialized && MPI_Init_thread(nullptr, nullptr, MPI_THREAD_FUNNELED, &provided) != MPI_SUCCESS)
    throw Error("MPI_Init_thread failed: cannot join the ranks mpirun started");
  // Errors come back as codes (each becomes an Error naming the exchange) instead of aborting inside MPI.
  MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
  MPI_Comm_rank(MPI_COMM_WORLD, &rank_);
  MPI_Comm_size(MPI_COMM_WORLD, &size_);
  MPI_Comm node;
  check(MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, rank_, MPI_INFO_NULL, &node), "MPI_Comm_split_type",
        "finding the ranks of this node");
  MPI_Comm_size(node, &local_size_);
  MPI_Comm_free(&node);
  // Every rank's process id and node, for the watchdog's message.
  int pid = (int)getpid();
  pids_.resize(size_);
  check(MPI_Allgather(&pid, 1, MPI_INT, pids_.data(), 1, MPI_INT, MPI_COMM_WORLD), "MPI_Allgather", "the process ids");
  char host[MPI_MAX_PROCESSOR_NAME] = {};
  int host_length = 0;
  MPI_Get_processor_name(host, &host_length);
  std::vector<char> hosts((size_t)size_ * MPI_MAX_PROCESSOR_NAME);
  check(MPI_Allgather(host, MPI_MAX_PROCESSOR_NAME, MPI_CHAR, hosts.data(), MPI_MAX_PROCESSOR_NAME, MPI_CHAR,
                      MPI_COMM_WORLD),
        "MPI_Allgather", "the node names");
  for (int r = 0; r < size_; ++r) hosts_.emplace_back(hosts.data() + (size_t)r * MPI_MAX_PROCESSOR_NAME);
  if (size_ > 1) {
    std::snprintf(g_sigterm_message, sizeof g_sigterm_message,
                  "sat: rank %d of %d: stopped by mpirun (SIGTERM): another rank failed or the run was interrupted; "
                  "mpirun names the rank\n",
                  rank_, size_);
    std::signal(SIGTERM, on_sigterm);
    if (watchdog_seconds > 0) watchdog_ = std::thread(&MpiCollective::watch, this, watchdog_seconds);
  }
}

MpiCollective::~MpiCollective() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stopping_ = true;
  }
  stop_watch_.notify_all();
  if (watchdog_.joinable()) watchdog_.join();
  if (std::uncaught_exceptions() > 0) return;  // main reports the error and aborts the run (abort_run)
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (!finalized) MPI_Finalize();
}

void MpiCollective::check(int code, const char* call, const std::string& what) const {
  if (code == MPI_SUCCESS) return;
  char text[MPI_MAX_ERROR_STRING] = {};
  int length = 0;
  MPI_Error_string(code, text, &length);
  throw Error(std::string(call) + " failed in " + what + ": " + text);
}

void MpiCollective::begin_wait(const std::string& what) {
  std::lock_guard<std::mutex> lock(mutex_);
  waiting_for_ = what;
  waiting_since_ = now_ns();
}

void MpiCollective::end_wait() {
  waiting_since_ = 0;
}

void MpiCollective::sum(float* values, int64_t n, const std::string& what) {
  const int64_t t0 = now_ns();
  begin_wait(what);
  for (int64_t at = 0; at < n; at += kChunk)
    check(MPI_Allreduce(MPI_IN_PLACE, values + at, (int)std::min(kChunk, n - at), MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD),
          "MPI_Allreduce", what);
  end_wait();
  sum_seconds += (now_ns() - t0) / 1e9;
  sum_bytes += n * (int64_t)sizeof(float);
}

void MpiCollective::sum(double* values, int64_t n, const std::string& what) {
  begin_wait(what);
  for (int64_t at = 0; at < n; at += kChunk)
    check(MPI_Allreduce(MPI_IN_PLACE, values + at, (int)std::min(kChunk, n - at), MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD),
          "MPI_Allreduce", what);
  end_wait();
}

void MpiCollective::broadcast(std::string& bytes, const std::string& what) {
  begin_wait(what);
  uint64_t length = bytes.size();
  check(MPI_Bcast(&length, 1, MPI_UINT64_T, 0, MPI_COMM_WORLD), "MPI_Bcast", what);
  if (length > (uint64_t)INT32_MAX)
    throw Error("MPI_Bcast: " + what + " is too large (" + std::to_string(length) + " bytes)");
  bytes.resize(length);
  check(MPI_Bcast(bytes.data(), (int)length, MPI_CHAR, 0, MPI_COMM_WORLD), "MPI_Bcast", what);
  end_wait();
}

std::vector<std::string> MpiCollective::gather(const std::string& mine, const std::string& what) {
  if (mine.size() > (size_t)INT32_MAX) throw Error("MPI_Gatherv: " + what + " is too large");
  begin_wait(what);
  int length = (int)mine.size();
  std::vector<int> lengths(size_), offsets(size_, 0);
  check(MPI_Gather(&length, 1, MPI_INT, lengths.data(), 1, MPI_INT, 0, MPI_COMM_WORLD), "MPI_Gather", what);
  int64_t total = 0;
  for (int r = 0; r < size_; ++r) offsets[r] = (int)total, total += lengths[r];
  if (rank_ == 0 && total > INT32_MAX) throw Error("MPI_Gatherv: " + what + " is too large");
  std::string all(rank_ == 0 ? (size_t)total : 0, '\0');
  check(MPI_Gatherv(mine.data(), length, MPI_CHAR, all.data(), lengths.data(), offsets.data(), MPI_CHAR, 0,
                    MPI_COMM_WORLD),
        "MPI_Gatherv", what);
  end_wait();
  std::vector<std::string> parts;
  if (rank_ == 0)
    for (int r = 0; r < size_; ++r) parts.push_back(all.substr(offsets[r], lengths[r]));
  return parts;
}

bool MpiCollective::same_everywhere(uint64_t value, const std::string& what) {
  // One call: the maximum of the values and of their complements, i.e. the maximum and (complemented) the minimum.
  uint64_t extremes[2] = {value, ~value};
  begin_wait(what);
  check(MPI_Allreduce(MPI_IN_PLACE, extremes, 2, MPI_UINT64_T, MPI_MAX, MPI_COMM_WORLD), "MPI_Allreduce", what);
  end_wait();
  return extremes[0] == ~extremes[1];
}

std::string MpiCollective::other_ranks_state() const {
  std::string gone;
  int checked = 0, elsewhere = 0;
  for (int r = 0; r < size_; ++r) {
    if (r == rank_) continue;
    if (hosts_[r] != hosts_[rank_]) {
      ++elsewhere;
      continue;
    }
    ++checked;
    // /proc/PID/stat: "pid (command) state ...", the command may hold spaces and parentheses
    std::ifstream stat("/proc/" + std::to_string(pids_[r]) + "/stat");
    std::string line;
    std::getline(stat, line);
    const size_t close = line.rfind(')');
    const char state = close != std::string::npos && close + 2 < line.size() ? line[close + 2] : '?';
    const char* how = !stat                          ? "is gone"
                      : state == 'T' || state == 't' ? "is stopped"
                      : state == 'Z'                 ? "has exited"
                                                     : nullptr;
    if (how)
      gone += (gone.empty() ? "" : ", ") + std::string("rank ") + std::to_string(r) + " (pid " +
              std::to_string(pids_[r]) + ") " + how;
  }
  if (!gone.empty()) return gone;
  std::string s = checked ? "the other ranks on this node are running" : "no other rank runs on this node";
  if (elsewhere) s += "; " + std::to_string(elsewhere) + " on other nodes: one may hang or be unreachable";
  return s;
}

void MpiCollective::watch(double seconds) {
  std::unique_lock<std::mutex> lock(mutex_);
  while (!stopping_) {
    stop_watch_.wait_for(lock, std::chrono::milliseconds(500));
    const int64_t since = waiting_since_;
    if (stopping_ || since == 0) continue;
    const double waited = (now_ns() - since) / 1e9;
    if (waited < seconds) continue;
    // The main thread is blocked inside MPI, which only it may call: end this process; mpirun then stops the rest.
    std::fprintf(stderr,
                 "sat: rank %d of %d: no reply from the other ranks for %.0f s in %s (%s); giving up "
                 "(--mpi-timeout)\n",
                 rank_, size_, waited, waiting_for_.c_str(), other_ranks_state().c_str());
    std::fflush(stderr);
    _exit(1);
  }
}

void abort_run(const std::string& message) {
  int initialized = 0, finalized = 0;
  MPI_Initialized(&initialized);
  MPI_Finalized(&finalized);
  if (!initialized || finalized) return;
  int rank = 0, size = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  std::fprintf(stderr, "sat: rank %d of %d: %s\n", rank, size, message.c_str());
  std::fflush(stderr);
  MPI_Abort(MPI_COMM_WORLD, 1);
  _exit(1);  // MPI_Abort does not return; should it, this process still ends with the error
}

int threads_per_rank(int ranks_on_node) {
  const int online = std::max(1, (int)sysconf(_SC_NPROCESSORS_ONLN));
  cpu_set_t set;
  CPU_ZERO(&set);
  const int mine = sched_getaffinity(0, sizeof set, &set) == 0 ? CPU_COUNT(&set) : online;
  if (ranks_on_node > 1 && (int64_t)mine * ranks_on_node > online) return std::max(1, mine / ranks_on_node);
  return std::max(1, mine);
}

}  // namespace sat
