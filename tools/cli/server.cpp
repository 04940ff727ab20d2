#include "tools/cli/server.hpp"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstdlib>

#include <nlohmann/json.hpp>

#include "datasets/image_codecs.hpp"
#include "tools/cli/page.hpp"
#include "train/search_policy.hpp"  // the limits of the search options
#include "vision/detector.hpp"
#include "vision/image.hpp"
// Last: it includes <resolv.h>, whose `_res` macro breaks Eigen's headers (a parameter of that name)
#include <httplib.h>

namespace sat {

using json = nlohmann::json;

bool BatchQueue::push(CaptionJob* job) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (closed_ || jobs_.size() >= capacity_) return false;
    jobs_.push_back(job);
  }
  cv_.notify_all();
  return true;
}

std::vector<CaptionJob*> BatchQueue::take_matching(int max_batch) {
  std::vector<CaptionJob*> batch;
  const CaptionOptions first = jobs_.front()->options;
  for (auto it = jobs_.begin(); it != jobs_.end() && (int)batch.size() < max_batch;) {
    if (same_search((*it)->options, first)) {
      batch.push_back(*it);
      it = jobs_.erase(it);
    } else {
      ++it;
    }
  }
  return batch;
}

std::vector<CaptionJob*> BatchQueue::next_batch(int max_batch, std::chrono::milliseconds wait) {
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait(lock, [&] { return !jobs_.empty() || closed_; });
  if (jobs_.empty()) return {};
  // A short wait lets requests that arrive together share the network call; a full batch need not wait.
  const auto deadline = std::chrono::steady_clock::now() + wait;
  const CaptionOptions first = jobs_.front()->options;
  auto matching = [&] {
    return (int)std::count_if(jobs_.begin(), jobs_.end(),
                              [&](CaptionJob* j) { return same_search(j->options, first); });
  };
  while (!closed_ && matching() < max_batch && cv_.wait_until(lock, deadline) != std::cv_status::timeout) {
  }
  return take_matching(max_batch);
}

void BatchQueue::close() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    closed_ = true;
  }
  cv_.notify_all();
}

size_t BatchQueue::depth() const {
  std::lock_guard<std::mutex> lock(mu_);
  return jobs_.size();
}

bool same_search(const CaptionOptions& a, const CaptionOptions& b) {
  return a.beam == b.beam && a.length_norm == b.length_norm && a.no_repeat_ngram == b.no_repeat_ngram &&
         a.consensus_weight == b.consensus_weight && a.memory_candidates == b.memory_candidates &&
         a.beam_groups == b.beam_groups && a.diversity == b.diversity && a.attention == b.attention &&
         a.candidates == b.candidates && a.include == b.include && a.objects == b.objects &&
         a.object_threshold == b.object_threshold;
}

const std::vector<double> ServerMetrics::kLatencyBounds = {0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10};
const std::vector<double> ServerMetrics::kBatchBounds = {1, 2, 4, 8, 16, 32};

void ServerMetrics::request(int status, double seconds) {
  std::lock_guard<std::mutex> lock(mu_);
  ++by_status_[status];
  const size_t bucket =
      std::lower_bound(kLatencyBounds.begin(), kLatencyBounds.end(), seconds) - kLatencyBounds.begin();
  ++latency_counts_[bucket];
  latency_sum_ += seconds;
  ++latency_count_;
}

void ServerMetrics::batch(size_t size) {
  std::lock_guard<std::mutex> lock(mu_);
  const size_t bucket = std::lower_bound(kBatchBounds.begin(), kBatchBounds.end(), (double)size) - kBatchBounds.begin();
  ++batch_counts_[bucket];
  batch_images_ += size;
  ++batches_;
}

static std::string number(double v, const char* format = "%.9g") {
  char buf[64];
  std::snprintf(buf, sizeof buf, format, v);
  return buf;
}

// Histogram lines: cumulative buckets, +Inf, _sum and _count (Prometheus text format 0.0.4).
static void histogram(std::string& out, const std::string& name, const std::string& help,
                      const std::vector<double>& bounds, const std::vector<uint64_t>& counts, double sum, uint64_t n) {
  out += "# HELP " + name + " " + help + "\n# TYPE " + name + " histogram\n";
  uint64_t cumulative = 0;
  for (size_t i = 0; i < bounds.size(); ++i) {
    cumulative += counts[i];
    out += name + "_bucket{le=\"" + number(bounds[i]) + "\"} " + std::to_string(cumulative) + "\n";
  }
  cumulative += counts.back();
  out += name + "_bucket{le=\"+Inf\"} " + std::to_string(cumulative) + "\n";
  out += name + "_sum " + number(sum) + "\n" + name + "_count " + std::to_string(n) + "\n";
}

std::string ServerMetrics::text(size_t queue_depth) const {
  std::lock_guard<std::mutex> lock(mu_);
  std::string out;
  out += "# HELP sat_requests_total HTTP requests answered, by status code.\n# TYPE sat_requests_total counter\n";
  uint64_t errors = 0;
  for (const auto& [status, n] : by_status_) {
    out += "sat_requests_total{code=\"" + std::to_string(status) + "\"} " + std::to_string(n) + "\n";
    if (status >= 400) errors += n;
  }
  out += "# HELP sat_errors_total HTTP requests answered with a 4xx or 5xx status.\n# TYPE sat_errors_total counter\n";
  out += "sat_errors_total " + std::to_string(errors) + "\n";
  histogram(out, "sat_request_duration_seconds", "Time from a request's arrival to its answer.", kLatencyBounds,
            latency_counts_, latency_sum_, latency_count_);
  histogram(out, "sat_batch_size", "Images captioned by one network call.", kBatchBounds, batch_counts_,
            (double)batch_images_, batches_);
  out += "# HELP sat_queue_depth Images waiting for the network.\n# TYPE sat_queue_depth gauge\n";
  out += "sat_queue_depth " + std::to_string(queue_depth) + "\n";
  return out;
}

// Whole-string numbers only: "3x" or "" is not a beam.
static bool parse_int(const std::string& s, int& out) {
  try {
    size_t used = 0;
    const long v = std::stol(s, &used);
    if (used != s.size() || v < INT32_MIN || v > INT32_MAX) return false;
    out = (int)v;
    return true;
  } catch (const std::exception&) {
    return false;
  }
}
static bool parse_double(const std::string& s, double& out) {
  try {
    size_t used = 0;
    out = std::stod(s, &used);
    return used == s.size();
  } catch (const std::exception&) {
    return false;
  }
}

// A query value that must be a whole number (or any number) in [lo, hi]: "" when it is, stored in out; else the
// error naming the parameter.
static std::string whole_number(const std::string& key, const std::string& value, int lo, int hi, int& out) {
  if (parse_int(value, out) && out >= lo && out <= hi) return "";
  return key + " must be a whole number in [" + std::to_string(lo) + ", " + std::to_string(hi) + "], got '" + value +
         "'";
}
static std::string number(const std::string& key, const std::string& value, int lo, int hi, double& out) {
  if (parse_double(value, out) && out >= lo && out <= hi) return "";
  return key + " must be a number in [" + std::to_string(lo) + ", " + std::to_string(hi) + "], got '" + value + "'";
}

std::string parse_search_query(const std::multimap<std::string, std::string>& params, CaptionOptions& out) {
  for (const auto& [key, value] : params) {
    int n = 0;
    double x = 0;
    std::string bad;
    if (key == "beam") {
      if ((bad = whole_number(key, value, 1, kMaxBeam, n)).empty()) out.beam = n;
    } else if (key == "length_norm") {
      if ((bad = number(key, value, 0, 2, x)).empty()) out.length_norm = x;
    } else if (key == "no_repeat") {
      if ((bad = whole_number(key, value, 0, kMaxNoRepeat, n)).empty()) out.no_repeat_ngram = n;
    } else if (key == "consensus_weight") {
      if ((bad = number(key, value, 0, (int)kMaxConsensusWeight, x)).empty()) out.consensus_weight = x;
    } else if (key == "memory_candidates") {
      if ((bad = whole_number(key, value, 0, kMaxMemoryCandidates, n)).empty()) out.memory_candidates = n;
    } else if (key == "beam_groups") {
      if ((bad = whole_number(key, value, 1, kMaxBeam, n)).empty()) out.beam_groups = n;
    } else if (key == "diversity") {
      if ((bad = number(key, value, 0, (int)kMaxDiversityPenalty, x)).empty()) out.diversity = x;
    } else if (key == "candidates") {
      if ((bad = whole_number(key, value, 0, kMaxBeam, n)).empty()) out.candidates = n;
    } else if (key == "include") {
      out.include = value;  // checked against the model's vocabulary with the other options (Captioner::check)
    } else if (key == "attention") {
      if (value != "0" && value != "1" && value != "true" && value != "false")
        return "attention must be 0 or 1, got '" + value + "'";
      out.attention = value == "1" || value == "true";
    } else if (key == "objects") {
      if (value != "0" && value != "1" && value != "true" && value != "false")
        return "objects must be 0 or 1, got '" + value + "'";
      out.objects = value == "1" || value == "true";
    } else if (key == "object_threshold") {
      if ((bad = number(key, value, 0, 1, x)).empty()) out.object_threshold = x;
    } else {
      return "unknown parameter '" + key +
             "' (beam, length_norm, no_repeat, consensus_weight, memory_candidates, beam_groups, diversity, "
             "candidates, "
             "include, attention, objects, object_threshold)";
    }
    if (!bad.empty()) return bad;
  }
  return "";
}

std::string caption_json(const CaptionResult& r, bool attention, bool objects) {
  json j = {{"caption", r.text}, {"words", r.words}, {"logprob", r.logprob}};
  if (attention) {
    json grids = json::array();
    for (const AttentionGrid& g : r.attention)
      grids.push_back({{"rows", g.rows}, {"cols", g.cols}, {"weights", g.weights}});
    j["attention"] = std::move(grids);
    if (!r.glimpses.empty()) {
      json glimpses = json::array();
      for (const Glimpse& g : r.glimpses) glimpses.push_back({g.row, g.col});
      j["glimpses"] = std::move(glimpses);
    }
  }
  if (!r.objects.empty() || objects) {
    json list = json::array();
    for (const FoundObject& o : r.objects)
      list.push_back({{"class", o.name},
                      {"score", std::round(o.score * 1000) / 1000},
                      {"x", std::round(o.x * 1000) / 1000},
                      {"y", std::round(o.y * 1000) / 1000}});
    j["objects"] = std::move(list);
  }
  if (!r.candidates.empty()) {
    json list = json::array();
    for (const CaptionCandidate& c : r.candidates) {
      json one = {{"rank", c.rank},           {"caption", c.text}, {"logprob", c.logprob}, {"score", c.score},
                  {"agreement", c.agreement}, {"total", c.total},  {"chosen", c.chosen}};
      if (c.memory_photo >= 0) one["memory_photo"] = c.memory_photo;
      list.push_back(std::move(one));
    }
    j["candidates"] = std::move(list);
  }
  return j.dump();
}

namespace {
// Set by the signal handler (any thread may receive the signal); a lock-free atomic is async-signal-safe.
std::atomic<int> stop_signal{0};
static_assert(std::atomic<int>::is_always_lock_free);
extern "C" void on_stop_signal(int signal) {
  stop_signal = signal;
}
}  // namespace

void install_stop_handler() {
  struct sigaction action {};
  action.sa_handler = on_stop_signal;
  sigemptyset(&action.sa_mask);
  sigaction(SIGTERM, &action, nullptr);
  sigaction(SIGINT, &action, nullptr);
}

namespace {

void answer_error(httplib::Response& res, int status, const std::string& message) {
  res.status = status;
  res.set_content(json{{"error", message}}.dump(), "application/json");
}

// The start of the request a thread is answering (httplib answers each request on one thread).
// A request httplib refuses before routing (malformed, over --max-bytes) has none: it counts as answered at once.
thread_local std::chrono::steady_clock::time_point request_start;
thread_local bool request_routed = false;

// POST /caption: the image from the body (or its first multipart file), the search options from the query, checked
// before the image is queued for the network thread; the caption as JSON, or the error with its status.
void answer_caption(const Captioner& captioner, BatchQueue& queue, const ServerOptions& opt,
                    const httplib::Request& req, httplib::Response& res, const httplib::ContentReader& read) {
  // The body is read whole before any answer: one left unread would be parsed as the connection's next request.
  // (A declared length over --max-bytes makes httplib skip the body and the read fail.)
  const bool declared_over = std::strtoull(req.get_header_value("Content-Length").c_str(), nullptr, 10) > opt.max_bytes;
  std::string bytes;
  bool multipart_file = false, over_limit = false;
  if (req.is_multipart_form_data()) {
    bool collecting = false, collected = false;  // the first part that is a file, whatever its field name
    read(
        [&](const httplib::MultipartFormData& header) {
          if (collecting) collected = true;
          collecting = !collected && !header.filename.empty();
          multipart_file = multipart_file || collecting;
          return true;
        },
        [&](const char* data, size_t n) {
          if (collecting) bytes.append(data, n);
          return !(over_limit = bytes.size() > opt.max_bytes);
        });
    if (!multipart_file) return answer_error(res, 400, "multipart request without a file part");
  } else {
    read([&](const char* data, size_t n) {
      bytes.append(data, n);
      return !(over_limit = bytes.size() > opt.max_bytes);
    });
  }
  if (over_limit || declared_over) {
    res.set_header("Connection", "close");
    return answer_error(res, 413, "body over the limit of " + std::to_string(opt.max_bytes) + " bytes");
  }
  CaptionOptions options;
  if (std::string bad = parse_search_query(req.params, options); !bad.empty()) return answer_error(res, 400, bad);
  try {  // the options checked against the model (resolve_search: the one place), before any work
    captioner.check(options);
  } catch (const Error& e) {
    return answer_error(res, 400, e.what());
  }
  if (bytes.empty()) return answer_error(res, 400, "empty body: POST the image's bytes (or a multipart file)");
  CaptionJob job;
  job.options = options;
  try {
    job.image = decode_image_bgr(bytes.data(), bytes.size(), "request body");
  } catch (const Error& e) {
    return answer_error(res, 400, e.what());
  }
  std::string().swap(bytes);
  std::future<CaptionResult> result = job.result.get_future();
  if (!queue.push(&job))
    return answer_error(res, 503, "busy: " + std::to_string(opt.queue) + " images already wait; try again");
  try {
    res.set_content(caption_json(result.get(), options.attention, options.objects), "application/json");
  } catch (const std::exception& e) {
    answer_error(res, 500, e.what());
  }
}

// Whether objects=1 can be answered: the model's input side suits the detector and the detector's files are found
// (checked by sha256 here, so /health tells the page before any request loads the detector).
bool objects_available(const Captioner& captioner, const std::string& weights_dir) {
  CaptionOptions objects;
  objects.objects = true;
  try {
    captioner.check(objects);
    find_object_detector("objects", weights_dir);
    return true;
  } catch (const Error&) {
    return false;
  }
}

}  // namespace

void serve(const Captioner& captioner, const std::string& model_path, const ServerOptions& opt) {
  if (opt.max_batch < 1 || opt.queue < 1 || opt.batch_wait_ms < 0 || opt.http_threads < 1 || opt.max_bytes < 1)
    throw Error(
        "serve: --max-batch, --queue, --threads and --max-bytes must be positive, --batch-wait-ms not negative");
  install_stop_handler();
  load_image_codecs();  // now, not at the first request (and an install without them is refused at start)

  const bool objects = objects_available(captioner, opt.weights_dir);
  const std::string page = serve_page(), page_policy = page_security_policy(page);
  BatchQueue queue((size_t)opt.queue);
  ServerMetrics metrics;
  std::atomic<uint64_t> captioned{0};

  // The network: one batch at a time (the encoder and search use every core).
  std::thread network([&] {
    for (;;) {
      std::vector<CaptionJob*> batch = queue.next_batch(opt.max_batch, std::chrono::milliseconds(opt.batch_wait_ms));
      if (batch.empty()) return;
      std::vector<cv::Mat> images;
      for (CaptionJob* job : batch) images.push_back(job->image);
      metrics.batch(batch.size());
      try {
        std::vector<CaptionResult> results = captioner.caption(images, batch.front()->options);
        for (size_t i = 0; i < batch.size(); ++i) batch[i]->result.set_value(std::move(results[i]));
        captioned += batch.size();
      } catch (...) {
        for (CaptionJob* job : batch) job->result.set_exception(std::current_exception());
      }
    }
  });

  httplib::Server http;
  const int threads = opt.http_threads;
  http.new_task_queue = [threads] { return new httplib::ThreadPool((size_t)threads); };
  http.set_payload_max_length(opt.max_bytes);
  http.set_read_timeout(30, 0);
  http.set_write_timeout(30, 0);
  http.set_pre_routing_handler([](const httplib::Request&, httplib::Response&) {
    request_start = std::chrono::steady_clock::now();
    request_routed = true;
    return httplib::Server::HandlerResponse::Unhandled;
  });
  http.set_logger([&](const httplib::Request&, const httplib::Response& res) {
    const double seconds =
        request_routed ? std::chrono::duration<double>(std::chrono::steady_clock::now() - request_start).count() : 0.0;
    request_routed = false;
    metrics.request(res.status, seconds);
  });
  // httplib's own refusals (413 over --max-bytes, 404, 400 malformed) get a JSON body like ours
  http.set_error_handler(httplib::Server::HandlerWithResponse([&](const httplib::Request& req, httplib::Response& res) {
    if (!res.body.empty()) return httplib::Server::HandlerResponse::Unhandled;
    std::string message = "HTTP " + std::to_string(res.status);
    if (res.status == 404) message = "no such path: " + req.path + " (GET /, POST /caption, GET /health, GET /metrics)";
    if (res.status == 413) message = "body over the limit of " + std::to_string(opt.max_bytes) + " bytes";
    answer_error(res, res.status, message);
    return httplib::Server::HandlerResponse::Handled;
  }));
  http.set_exception_handler([](const httplib::Request&, httplib::Response& res, std::exception_ptr e) {
    std::string message = "internal error";
    try {
      std::rethrow_exception(e);
    } catch (const std::exception& ex) {
      message = ex.what();
    } catch (...) {
    }
    answer_error(res, 500, message);
  });

  // A content reader: httplib would otherwise parse a body sent as application/x-www-form-urlencoded (curl's default
  // for --data-binary) as form fields, and refuse one over 8 KB.
  http.Post("/caption", [&](const httplib::Request& req, httplib::Response& res, const httplib::ContentReader& read) {
    answer_caption(captioner, queue, opt, req, res, read);
  });
  auto wrong_method = [](const char* allowed) {
    return [allowed](const httplib::Request& req, httplib::Response& res) {
      res.set_header("Allow", allowed);
      answer_error(res, 405, req.method + " " + req.path + " is not served (use " + allowed + ")");
    };
  };
  http.Get("/caption", wrong_method("POST"));
  http.Put("/caption", wrong_method("POST"));
  http.Delete("/caption", wrong_method("POST"));
  // POST with a body goes through a content reader that drains it (see /caption), then answers 405
  auto wrong_method_post = [](const char* allowed) {
    return [allowed](const httplib::Request& req, httplib::Response& res, const httplib::ContentReader& read) {
      read([](const char*, size_t) { return true; });
      res.set_header("Allow", allowed);
      answer_error(res, 405, req.method + " " + req.path + " is not served (use " + allowed + ")");
    };
  };
  http.Post("/", wrong_method_post("GET"));
  http.Post("/health", wrong_method_post("GET"));
  http.Post("/metrics", wrong_method_post("GET"));
  http.Get("/health", [&](const httplib::Request&, httplib::Response& res) {
    const ModelInfo info = captioner.info();
    res.set_content(json{{"status", "ok"},
                         {"model", model_path},
                         {"attention", info.attention},
                         {"objects", objects},
                         {"queue", queue.depth()},
                         {"max_batch", opt.max_batch},
                         {"captioned", captioned.load()}}
                        .dump(),
                    "application/json");
  });
  // The page (HEAD / too: httplib answers it with the GET handler's headers and no body)
  http.Get("/", [&](const httplib::Request&, httplib::Response& res) {
    res.set_header("Content-Security-Policy", page_policy);
    res.set_header("X-Content-Type-Options", "nosniff");
    res.set_header("Referrer-Policy", "no-referrer");
    res.set_header("Cache-Control", "no-cache");
    res.set_content(page, "text/html; charset=utf-8");
  });
  http.Get("/metrics", [&](const httplib::Request&, httplib::Response& res) {
    res.set_content(metrics.text(queue.depth()), "text/plain; version=0.0.4");
  });

  // Only SO_REUSEADDR: httplib's default also sets SO_REUSEPORT, which lets a second server take a port in use.
  http.set_socket_options([](int sock) {
    int yes = 1;
    setsockopt(sock, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof yes);
  });
  int port = opt.port;
  if (port == 0) {
    port = http.bind_to_any_port(opt.host);
  } else if (!http.bind_to_port(opt.host, port)) {
    port = -1;
  }
  if (port < 0) {
    queue.close();
    network.join();
    throw Error("serve: cannot listen on " + opt.host + ":" + std::to_string(opt.port) +
                " (address in use or not this machine's)");
  }

  std::atomic<bool> listening_ended{false};
  std::thread stopper([&] {
    while (!stop_signal && !listening_ended) std::this_thread::sleep_for(std::chrono::milliseconds(20));
    if (stop_signal)
      std::fprintf(stderr, "sat serve: %s: finishing the requests already accepted\n",
                   stop_signal == SIGTERM ? "SIGTERM" : "SIGINT");
    http.stop();
  });
  std::fprintf(stderr, "sat serve: listening on http://%s:%d (model %s, batches of up to %d, queue %d)\n",
               opt.host.c_str(), port, model_path.c_str(), opt.max_batch, opt.queue);
  std::fflush(stderr);
  const bool listened = http.listen_after_bind();  // returns after stop(), once its threads answered what they accepted
  listening_ended = true;
  stopper.join();
  queue.close();
  network.join();
  std::fprintf(stderr, "sat serve: stopped after %llu captions\n", (unsigned long long)captioned.load());
  if (!listened) throw Error("serve: the server stopped listening on " + opt.host + ":" + std::to_string(port));
}

}  // namespace sat
