#include "tools/cli/server.hpp"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <memory>
#include <optional>

#include <iostream>

#include <nlohmann/json.hpp>
#include <opencv2/core/utils/logger.hpp>

#include "datasets/image_codecs.hpp"
#include "tools/cli/http_server.hpp"
#include "tools/cli/page.hpp"
#include "train/search_policy.hpp"  // the limits of the search options
#include "vision/detector.hpp"
#include "vision/image.hpp"

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
         a.object_evidence == b.object_evidence && a.evidence_threshold == b.evidence_threshold &&
         a.neighbour_evidence == b.neighbour_evidence && a.beam_evidence == b.beam_evidence &&
         a.relevance_weight == b.relevance_weight &&
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
    } else if (key == "object_evidence") {
      if ((bad = number(key, value, 0, (int)kMaxObjectEvidence, x)).empty()) out.object_evidence = x;
    } else if (key == "evidence_threshold") {
      if ((bad = number(key, value, 0, 1, x)).empty()) out.evidence_threshold = x;
    } else if (key == "neighbour_evidence") {
      if ((bad = number(key, value, 0, 1, x)).empty()) out.neighbour_evidence = x;
    } else if (key == "beam_evidence") {
      if ((bad = number(key, value, 0, (int)kMaxObjectEvidence, x)).empty()) out.beam_evidence = x;
    } else if (key == "relevance_weight") {
      if ((bad = number(key, value, 0, (int)kMaxRelevanceWeight, x)).empty()) out.relevance_weight = x;
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
             "' (beam, length_norm, no_repeat, consensus_weight, memory_candidates, object_evidence, "
             "evidence_threshold, neighbour_evidence, beam_evidence, relevance_weight, beam_groups, diversity, "
             "candidates, include, attention, objects, object_threshold)";
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
      if (c.evidence != 0) one["object_evidence"] = c.evidence;
      if (c.relevance != 0) one["relevance"] = c.relevance;
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

http::Response json_answer(std::string body) {
  http::Response r;
  r.body = std::move(body);
  return r;
}

// 503 with when to come back: overload is answered at once, never by waiting.
http::Response busy(const std::string& message) {
  http::Response r = http::error_response(503, message);
  r.headers.emplace_back("Retry-After", "1");
  return r;
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

http::Response wrong_method(const http::Request& req, const char* allowed) {
  http::Response r = http::error_response(405, req.method + " " + req.path + " is not served (use " + allowed + ")");
  r.headers.emplace_back("Allow", allowed);
  return r;
}

// Everything a request may touch, shared by the loop thread (heads, GETs), the workers (POST /caption) and the
// network thread (captions).
struct Service {
  const Captioner& captioner;
  const ServerOptions& opt;
  std::string model_path, model_name, page, page_policy;
  bool objects = false;
  BatchQueue queue;
  ServerMetrics metrics;
  std::atomic<uint64_t> captioned{0};
  std::atomic<int> admitted{0};      // POST /caption requests between their head and their answer
  std::atomic<int64_t> image_us{0};  // the network's recent time per image (a moving average), 0 until measured

  // Admission: a place in --queue, and an expected wait within --max-wait at the network's recent pace (one
  // request alone is always let in). Both are known from the head, so a refusal costs no body and no decode.
  std::optional<http::Response> admit() {
    const int before = admitted.fetch_add(1);
    const double per_image = image_us.load() / 1e6, expected = (before + 1) * per_image;
    if (before == 0 || (before < opt.queue && expected <= opt.max_wait_s)) return std::nullopt;
    --admitted;
    http::Response r =
        http::error_response(503, "busy: " + std::to_string(before) + " captions already in the server (about " +
                                      std::to_string((int)std::ceil(expected)) + " s of work); try again");
    r.headers.emplace_back("Retry-After", std::to_string(std::clamp((int)std::ceil(expected - opt.max_wait_s), 1, 60)));
    return r;
  }

  Service(const Captioner& c, const ServerOptions& o) : captioner(c), opt(o), queue((size_t)o.queue) {}

  // The library names the model by its path; answers name it by its file (the server's folders are not public).
  std::string public_message(std::string message) const {
    for (size_t at; !model_path.empty() && (at = message.find(model_path)) != std::string::npos;)
      message.replace(at, model_path.size(), model_name);
    return message;
  }

  // On the loop thread: routing, the GET answers, and admission, all before any body is read.
  std::optional<http::Response> on_head(const http::Request& req) {
    const bool get = req.method == "GET" || req.method == "HEAD";
    if (req.path == "/caption") {
      if (req.method != "POST") return wrong_method(req, "POST");
      return admit();
    }
    if (req.path != "/" && req.path != "/health" && req.path != "/metrics")
      return http::error_response(404,
                                  "no such path: " + req.path + " (GET /, POST /caption, GET /health, GET /metrics)");
    if (!get) return wrong_method(req, "GET");
    if (req.path == "/health") {
      const ModelInfo info = captioner.info();
      return json_answer(json{
          {"status", "ok"},
          {"model", model_name},
          {"attention", info.attention},
          {"objects", objects},
          {"queue", queue.depth()},
          {"max_batch", opt.max_batch},
          {"captioned",
           captioned.load()}}.dump());
    }
    http::Response r;
    if (req.path == "/metrics") {
      r.content_type = "text/plain; version=0.0.4";
      r.body = metrics.text(queue.depth());
      return r;
    }
    r.content_type = "text/html; charset=utf-8";
    r.body = page;
    r.headers = {{"Content-Security-Policy", page_policy},
                 {"X-Content-Type-Options", "nosniff"},
                 {"Referrer-Policy", "no-referrer"},
                 {"Cache-Control", "no-cache"}};
    return r;
  }

  // On a worker: POST /caption, the image from the body (or its first multipart file), the search options from the
  // query, checked before the image is decoded and queued for the network thread, which answers.
  void caption(http::Request& req, http::Respond respond_) {
    auto respond = [this, respond_](http::Response r) {
      --admitted;
      respond_(std::move(r));
    };
    std::string image_part;
    const std::string* content_type = req.header("content-type");
    const bool multipart = content_type && content_type->rfind("multipart/form-data", 0) == 0;
    if (multipart) {
      if (std::string bad = http::multipart_file(req.body, *content_type, image_part); !bad.empty())
        return respond(http::error_response(400, bad));
    }
    const std::string& bytes = multipart ? image_part : req.body;
    auto job = std::make_unique<CaptionJob>();
    if (std::string bad = parse_search_query(req.params, job->options); !bad.empty())
      return respond(http::error_response(400, bad));
    try {  // the options checked against the model (resolve_search: the one place), before any work
      captioner.check(job->options);
    } catch (const Error& e) {
      return respond(http::error_response(400, public_message(e.what())));
    }
    if (bytes.empty())
      return respond(http::error_response(400, "empty body: POST the image's bytes (or a multipart file)"));
    try {
      job->image =
          decode_image_bgr(bytes.data(), bytes.size(), "request body", DecodeOptions{false, false}, &job->pixels);
    } catch (const ImageBusy& e) {
      return respond(busy(e.what()));
    } catch (const Error& e) {
      return respond(http::error_response(400, e.what()));
    }
    std::string().swap(req.body);
    const bool attention = job->options.attention, objects_asked = job->options.objects;
    job->done = [this, respond, attention, objects_asked](CaptionResult* result, std::exception_ptr error) {
      if (result) return respond(json_answer(caption_json(*result, attention, objects_asked)));
      try {
        std::rethrow_exception(error);
      } catch (const std::exception& e) {
        respond(http::error_response(500, public_message(e.what())));
      }
    };
    if (!queue.push(job.get()))
      return respond(busy("busy: " + std::to_string(opt.queue) + " images already wait; try again"));
    job.release();  // the network thread owns it now
  }

  // The network: one batch at a time (the encoder and search use every core).
  void network() {
    for (;;) {
      std::vector<CaptionJob*> batch = queue.next_batch(opt.max_batch, std::chrono::milliseconds(opt.batch_wait_ms));
      if (batch.empty()) return;
      std::vector<std::unique_ptr<CaptionJob>> jobs(batch.begin(), batch.end());
      std::vector<cv::Mat> images;
      for (const auto& job : jobs) images.push_back(job->image);
      metrics.batch(jobs.size());
      std::vector<CaptionResult> results;
      std::exception_ptr error;
      const auto start = std::chrono::steady_clock::now();
      try {
        results = captioner.caption(images, jobs.front()->options);
        captioned += jobs.size();
        const double us = std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - start).count();
        const int64_t per = (int64_t)(us / jobs.size()), old = image_us.load();
        image_us = old == 0 ? per : (old * 3 + per) / 4;
      } catch (...) {
        error = std::current_exception();
      }
      images.clear();
      for (size_t i = 0; i < jobs.size(); ++i) {
        jobs[i]->image.release();
        jobs[i]->pixels.release();
        jobs[i]->done(error ? nullptr : &results[i], error);
      }
    }
  }
};

}  // namespace

void serve(const Captioner& captioner, const std::string& model_path, const ServerOptions& opt) {
  if (opt.max_batch < 1 || opt.queue < 1 || opt.batch_wait_ms < 0 || opt.http_threads < 1 || opt.max_bytes < 1 ||
      opt.max_connections < 1 || opt.request_timeout_s <= 0 || opt.pixel_budget < 1)
    throw Error(
        "serve: --max-batch, --queue, --http-threads, --max-bytes, --max-connections, --request-timeout and "
        "--pixel-budget must be positive, --batch-wait-ms not negative");
  install_stop_handler();
  load_image_codecs();  // now, not at the first request (and an install without them is refused at start)
  set_pixel_budget(opt.pixel_budget);
  // OpenCV's codecs (WebP, TIFF, the rarer JPEG codings) complain about a bad file on stderr, a warning through its
  // logger and imdecode's "can't read header" through std::cerr, with nothing to tie the line to its request; each
  // is already answered to its client as sat's one-line 400. The server's log keeps its own lines (fprintf).
  struct QuietDecoders {
    cv::utils::logging::LogLevel level = cv::utils::logging::setLogLevel(cv::utils::logging::LOG_LEVEL_SILENT);
    std::streambuf* cerr = std::cerr.rdbuf(nullptr);
    ~QuietDecoders() {
      cv::utils::logging::setLogLevel(level);
      std::cerr.rdbuf(cerr);
    }
  } quiet;

  Service service(captioner, opt);
  service.objects = objects_available(captioner, opt.weights_dir);
  service.page = serve_page();
  service.page_policy = page_security_policy(service.page);
  // The file's name, not its path: /health is public, the build machine's folders are not
  service.model_path = model_path;
  service.model_name = std::filesystem::path(model_path).filename().string();

  http::ServerLimits limits;
  limits.parse.max_body = opt.max_bytes;
  limits.max_connections = (size_t)opt.max_connections;
  limits.request_timeout_ms = (int)std::lround(opt.request_timeout_s * 1000);
  limits.workers = opt.http_threads;
  http::Handlers handlers;
  handlers.on_head = [&](const http::Request& req) { return service.on_head(req); };
  handlers.on_request = [&](http::Request& req, http::Respond respond) { service.caption(req, std::move(respond)); };
  handlers.on_dropped = [&](const http::Request&) { --service.admitted; };
  handlers.on_answered = [&](int status, double seconds) { service.metrics.request(status, seconds); };
  http::Server http(limits, std::move(handlers));
  const int port = http.bind(opt.host, opt.port);

  std::thread network([&] { service.network(); });
  std::atomic<bool> listening_ended{false};
  std::thread stopper([&] {
    while (!stop_signal && !listening_ended) std::this_thread::sleep_for(std::chrono::milliseconds(20));
    if (stop_signal)
      std::fprintf(stderr, "sat serve: %s: finishing the requests already accepted\n",
                   stop_signal == SIGTERM ? "SIGTERM" : "SIGINT");
    http.stop();
  });
  std::fprintf(stderr,
               "sat serve: listening on http://%s:%d (model %s, batches of up to %d, queue %d, %d connections, "
               "decode budget %.0f megapixels)\n",
               opt.host.c_str(), port, model_path.c_str(), opt.max_batch, opt.queue, opt.max_connections,
               opt.pixel_budget / 1e6);
  std::fflush(stderr);
  http.run();  // returns after stop(), once every request that had arrived is answered
  listening_ended = true;
  stopper.join();
  service.queue.close();
  network.join();
  std::fprintf(stderr, "sat serve: stopped after %llu captions\n", (unsigned long long)service.captioned.load());
}

}  // namespace sat
