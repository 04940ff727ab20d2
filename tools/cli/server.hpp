// sat serve: captions over HTTP. Requests that arrive together are captioned as one batch through the public API
// (sat::Captioner); bounded admission, connections and decoded pixels turn overload into immediate 503s instead of
// memory growth or waiting (docs/server.md).
#pragma once
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <future>
#include <map>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "train/sat/captioner.hpp"
#include "vision/image.hpp"

namespace sat {

struct ServerOptions {
  std::string host = "127.0.0.1";
  int port = 8080;  // 0: any free port (printed when listening)
  int max_batch = 8;
  int batch_wait_ms = 5;  // after the first image of a batch, how long to wait for more
  int queue = 64;         // POST /caption requests in the server at once (arriving, decoded, waiting, captioned)
  double max_wait_s = 3;  // a caption the network's recent pace would answer later than this is refused (503)
  size_t max_bytes = 20u << 20;
  int http_threads = 2;         // workers that decode images (connections are served by one event loop)
  int max_connections = 512;    // open at once; beyond, 503
  double request_timeout_s = 20;  // a request's first byte to its last, whatever the byte rate; 408 beyond
  uint64_t pixel_budget = 64'000'000;  // decoded pixels held at once by all requests (vision/image.hpp)
  std::string weights_dir;  // the Captioner's LoadOptions::weights_dir: where objects=1 finds the object detector
};

// One image waiting for the network, and where its caption goes.
struct CaptionJob {
  cv::Mat image;
  PixelHold pixels;  // the image's share of the decode budget, released once the network has taken it
  CaptionOptions options;
  std::function<void(CaptionResult*, std::exception_ptr)> done;  // called once, by the network thread
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
