// A progress bar on a terminal, plain log lines otherwise.
#pragma once
#include <chrono>
#include <string>

namespace sat {

class Progress {
 public:
  Progress(std::string label, int64_t total);
  // Shown after the counts: e.g. "loss 1.23  410 cap/s".
  void update(int64_t done, const std::string& stats);
  void finish(const std::string& stats);
  static bool is_terminal();

 private:
  std::string label_;
  int64_t total_;
  int64_t start_done_ = -1;
  std::chrono::steady_clock::time_point start_, last_print_;
  bool tty_;
};

std::string format_duration(double seconds);

}  // namespace sat
