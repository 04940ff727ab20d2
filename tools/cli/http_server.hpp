// The connections of sat serve: one event-loop thread (epoll) reads every connection, parses requests with the
// limits of tools/cli/http.hpp, and times each request from its first byte; complete requests go to a few worker
// threads, whose answers come back to the loop to be written. A slow client holds a few kilobytes and a file
// descriptor, never a thread (docs/server.md says why cpp-httplib's thread per connection was replaced).
#pragma once
#include <functional>
#include <memory>
#include <optional>
#include <string>

#include "tools/cli/http.hpp"

namespace sat::http {

struct ServerLimits {
  Limits parse;
  size_t max_connections = 512;  // open at once; beyond, a new connection gets 503 and is closed
  int request_timeout_ms = 20000;  // a request's first byte to its last (head and body), whatever the rate: 408
  int idle_timeout_ms = 5000;      // a kept-alive connection with no new request: closed
  int write_timeout_ms = 30000;    // an answer the client does not read: the connection is closed
  int workers = 2;
};

// Answers a request, exactly once, from any thread.
using Respond = std::function<void(Response)>;

struct Handlers {
  // On the loop thread once the head has arrived, before the body is read (so it must not block): an answer to give
  // at once, the body left unread and the connection closed; or nullopt to read the body and call on_request.
  std::function<std::optional<Response>(const Request&)> on_head;
  // On a worker thread, with the whole request. `respond` may be called later, from another thread.
  std::function<void(Request&, Respond)> on_request;
  // On the loop thread, for a request on_head let through that never reached on_request (its body did not arrive
  // in time, or the client left): what on_head reserved for it is given back here.
  std::function<void(const Request&)> on_dropped;
  // Once per answer, the parser's and the loop's own (400, 408, 413, 431, 503 ...) included: its status and the time
  // from the request's first byte (0 for a refusal at accept). On the loop thread.
  std::function<void(int status, double seconds)> on_answered;
};

class Server {
 public:
  Server(const ServerLimits& limits, Handlers handlers);
  ~Server();
  // Listens on host:port (0: any free port); the port, or throws Error.
  int bind(const std::string& host, int port);
  // Serves until stop(); then accepts nothing more, answers every request whose bytes arrived (one still arriving
  // may finish within its timeout), closes every connection and returns.
  void run();
  // From any thread (not a signal handler).
  void stop();

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace sat::http
