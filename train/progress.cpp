#include "train/progress.hpp"

#include <cstdio>
#include <unistd.h>

namespace sat {

bool Progress::is_terminal() {
  return isatty(fileno(stderr));
}

Progress::Progress(std::string label, int64_t total)
    : label_(std::move(label)),
      total_(total),
      start_(std::chrono::steady_clock::now()),
      last_print_(start_),
      tty_(is_terminal()) {}

std::string format_duration(double s) {
  if (s < 0 || s > 1e7) return "--:--";
  int t = (int)(s + 0.5);
  char buf[32];
  if (t >= 3600)
    std::snprintf(buf, sizeof buf, "%d:%02d:%02d", t / 3600, t / 60 % 60, t % 60);
  else
    std::snprintf(buf, sizeof buf, "%d:%02d", t / 60, t % 60);
  return buf;
}

void Progress::update(int64_t done, const std::string& stats) {
  auto now = std::chrono::steady_clock::now();
  if (start_done_ < 0) start_done_ = done, start_ = now;
  double since = std::chrono::duration<double>(now - last_print_).count();
  if (tty_ ? since < 0.2 : since < 30) return;
  last_print_ = now;
  double elapsed = std::chrono::duration<double>(now - start_).count();
  double rate = (done - start_done_) / std::max(elapsed, 1e-9);
  double eta = rate > 0 ? (total_ - done) / rate : -1;
  if (tty_) {
    const int width = 24;
    int fill = total_ > 0 ? (int)(width * done / total_) : 0;
    std::string bar(fill, '=');
    if (fill < width) bar += '>' + std::string(width - fill - 1, ' ');
    std::fprintf(stderr, "\r\033[K%s [%s] %lld/%lld  %s  ETA %s", label_.c_str(), bar.c_str(), (long long)done,
                 (long long)total_, stats.c_str(), format_duration(eta).c_str());
  } else {
    std::fprintf(stderr, "%s %lld/%lld  %s  ETA %s\n", label_.c_str(), (long long)done, (long long)total_,
                 stats.c_str(), format_duration(eta).c_str());
  }
  std::fflush(stderr);
}

void Progress::finish(const std::string& stats) {
  double elapsed = std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
  std::fprintf(stderr, "%s%s %lld/%lld  %s  %s\n", tty_ ? "\r\033[K" : "", label_.c_str(), (long long)total_,
               (long long)total_, stats.c_str(), format_duration(elapsed).c_str());
  std::fflush(stderr);
}

}  // namespace sat
