// sat serve: captions over HTTP. Requests that arrive together are captioned as one batch through the public API
// (sat::Captioner); a bounded queue turns overload into immediate 503s instead of memory growth.
#pragma once
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <future>
#include <map>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "train/sat/captioner.hpp"

namespace sat {

struct ServerOptions {
  std::string host = "127.0.0.1";
  int port = 8080;  // 0: any free port (printed when listening)
  int max_batch = 8;
  int batch_wait_ms = 5;  // after the first image of a batch, how long to wait for more
  int queue = 64;         // images waiting for the network at most; more get 503
  size_t max_bytes = 20u << 20;
  int http_threads = 16;  // connections served at once
  std::string weights_dir;  // the Captioner's LoadOptions::weights_dir: where objects=1 finds the object detector
};

// One image waiting for the network, and where its caption goes.
struct CaptionJob {
  cv::Mat image;
  CaptionOptions options;
  std::promise<CaptionResult> result;
};

// The queue between HTTP threads and the one thread that runs the network: bounded, and batches are formed from
// jobs with the same search settings (those of the oldest job), oldest first.
class BatchQueue {
 public:
  explicit BatchQueue(size_t capacity) : capacity_(capacity) {}
  // false when full (the caller answers 503) or closed
  bool push(CaptionJob* job);
  // Waits for a first job, then up to `wait` for more with its settings, until `max_batch`; empty once closed and
  // drained.
  std::vector<CaptionJob*> next_batch(int max_batch, std::chrono::milliseconds wait);
  void close();  // no more pushes; next_batch drains what is queued, then returns empty
  size_t depth() const;

 private:
  std::vector<CaptionJob*> take_matching(int max_batch);  // under mu_
  size_t capacity_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<CaptionJob*> jobs_;
  bool closed_ = false;
};

bool same_search(const CaptionOptions& a, const CaptionOptions& b);

// Prometheus text exposition of what the server did.
class ServerMetrics {
 public:
  void request(int status, double seconds);
  void batch(size_t size);
  std::string text(size_t queue_depth) const;

 private:
  mutable std::mutex mu_;
  std::map<int, uint64_t> by_status_;
  std::vector<uint64_t> latency_counts_ = std::vector<uint64_t>(kLatencyBounds.size() + 1, 0);
  double latency_sum_ = 0;
  uint64_t latency_count_ = 0;
  std::vector<uint64_t> batch_counts_ = std::vector<uint64_t>(kBatchBounds.size() + 1, 0);
  uint64_t batch_images_ = 0, batches_ = 0;
  static const std::vector<double> kLatencyBounds, kBatchBounds;
};

// Parses the query's search settings (beam, length_norm, no_repeat, consensus_weight, attention); "" or an Error
// message.
std::string parse_search_query(const std::multimap<std::string, std::string>& params, CaptionOptions& out);
// The JSON answer for one caption.
std::string caption_json(const CaptionResult& r, bool attention, bool objects = false);

// SIGTERM and SIGINT, from here on, ask serve() to stop (the process is not ended by them); serve() installs it too.
void install_stop_handler();
// Serves until SIGTERM or SIGINT, then finishes every request it accepted and returns.
void serve(const Captioner& captioner, const std::string& model_path, const ServerOptions& options);

}  // namespace sat
