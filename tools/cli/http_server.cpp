#include "tools/cli/http_server.hpp"

#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <mutex>
#include <thread>
#include <unordered_map>
#include <vector>

#include "datasets/sat/error.hpp"

namespace sat::http {

using Clock = std::chrono::steady_clock;

namespace {

// idle: no byte of the next request yet; head, body: it is arriving; working: a worker has it; writing: its answer
// is being written; lingering: answered and shut for writing, reading what the client still sends until it closes,
// so that closing with its unread bytes does not reset the connection before it reads the answer.
enum class State { idle, head, body, working, writing, lingering };

struct Conn {
  int fd = -1;  // -1 once closed while a worker still has its request
  uint64_t id = 0;
  State state = State::idle;
  std::string in, out;
  size_t out_at = 0, scanned = 0, head_bytes = 0;
  Request req;
  Clock::time_point start, deadline;
  bool keep_alive = true, head_only = false, close_after = false;
  bool let_through = false;  // on_head let its request through; on_request has not had it yet
};

constexpr uint64_t kListenId = 0, kWakeId = ~uint64_t{0};
constexpr int kLingerMs = 2000;
constexpr size_t kExtraLingering = 256;  // connections refused at accept or closing, beyond max_connections

}  // namespace

struct Server::Impl {
  ServerLimits limits;
  Handlers handlers;
  int listen_fd = -1, epoll_fd = -1, wake_fd = -1;
  std::unordered_map<uint64_t, std::unique_ptr<Conn>> conns;
  uint64_t next_id = 1;
  std::vector<uint64_t> dead;
  size_t lingering = 0;
  std::atomic<bool> stopping{false};
  bool accepting = true;

  std::mutex done_mu;
  std::vector<std::pair<uint64_t, Response>> done;

  std::mutex work_mu;
  std::condition_variable work_cv;
  std::deque<std::function<void()>> work;
  bool work_closed = false;
  std::vector<std::thread> workers;

  void wake() {
    const uint64_t one = 1;
    (void)!::write(wake_fd, &one, sizeof one);
  }
  void watch(Conn& c, uint32_t events) {
    epoll_event ev{};
    ev.events = events;
    ev.data.u64 = c.id;
    epoll_ctl(epoll_fd, EPOLL_CTL_MOD, c.fd, &ev);
  }
  // Closed now, erased at the end of the loop's turn (callers up the stack may still hold it), or, while a worker
  // has its request, when the answer comes back.
  void close_conn(Conn& c) {
    if (c.fd < 0) return;
    epoll_ctl(epoll_fd, EPOLL_CTL_DEL, c.fd, nullptr);
    ::close(c.fd);
    c.fd = -1;
    if (c.state == State::lingering) --lingering;
    dropped(c);
    if (c.state != State::working) dead.push_back(c.id);
  }
  void bury() {
    for (uint64_t id : dead) conns.erase(id);
    dead.clear();
  }
  void dropped(Conn& c) {
    if (!c.let_through) return;
    c.let_through = false;
    if (handlers.on_dropped) handlers.on_dropped(c.req);
  }
  void begin_request(Conn& c, Clock::time_point now) {
    c.state = State::head;
    c.start = now;
    c.deadline = now + std::chrono::milliseconds(limits.request_timeout_ms);
  }
  void to_idle(Conn& c) {
    c.req = Request{};
    c.scanned = c.head_bytes = 0;
    c.state = State::idle;
    const auto now = Clock::now();
    c.deadline = now + std::chrono::milliseconds(limits.idle_timeout_ms);
    watch(c, EPOLLIN | EPOLLRDHUP);
    if (!c.in.empty()) {  // a pipelined request already read
      begin_request(c, now);
      advance(c);
    }
  }
  void begin_linger(Conn& c) {
    ::shutdown(c.fd, SHUT_WR);
    c.state = State::lingering;
    ++lingering;
    c.in.clear();
    c.deadline = Clock::now() + std::chrono::milliseconds(kLingerMs);
    watch(c, EPOLLIN | EPOLLRDHUP);
  }

  void answer(Conn& c, Response r) {
    const double seconds = c.state == State::idle ? 0.0 : std::chrono::duration<double>(Clock::now() - c.start).count();
    if (handlers.on_answered) handlers.on_answered(r.status, seconds);
    const bool keep = c.keep_alive && !r.close && !stopping;
    c.close_after = !keep;
    c.out = serialize(r, keep, c.head_only);
    c.out_at = 0;
    c.state = State::writing;
    c.deadline = Clock::now() + std::chrono::milliseconds(limits.write_timeout_ms);
    write_some(c);
  }

  void write_some(Conn& c) {
    while (c.out_at < c.out.size()) {
      const ssize_t n = ::send(c.fd, c.out.data() + c.out_at, c.out.size() - c.out_at, MSG_NOSIGNAL);
      if (n > 0) {
        c.out_at += (size_t)n;
      } else if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
        watch(c, EPOLLOUT);
        return;
      } else if (n < 0 && errno == EINTR) {
        continue;
      } else {
        return close_conn(c);
      }
    }
    std::string().swap(c.out);
    if (c.close_after) return begin_linger(c);
    to_idle(c);
  }

  // Parses what has arrived; hands a complete request to a worker, or answers a refusal.
  void advance(Conn& c) {
    if (c.state == State::head) {
      const HeadResult r = parse_head(c.in, limits.parse, c.req, c.scanned);
      if (r.kind == HeadResult::need_more) return;
      if (r.kind == HeadResult::error) {
        c.keep_alive = false;
        c.in.clear();
        Response refusal = error_response(r.status, r.message);
        refusal.close = true;
        return answer(c, std::move(refusal));
      }
      c.head_bytes = r.head_bytes;
      c.keep_alive = c.req.keep_alive;
      c.head_only = c.req.method == "HEAD";
      if (handlers.on_head) {
        if (std::optional<Response> early = handlers.on_head(c.req)) {
          early->close = early->close || c.req.content_length > 0;  // its body is not read
          c.in.erase(0, c.head_bytes);
          return answer(c, std::move(*early));
        }
      }
      c.state = State::body;
      c.let_through = true;
      const std::string* expect = c.req.header("expect");
      if (expect && c.in.size() < c.head_bytes + c.req.content_length) {
        static const char kContinue[] = "HTTP/1.1 100 Continue\r\n\r\n";
        (void)!::send(c.fd, kContinue, sizeof kContinue - 1, MSG_NOSIGNAL);  // the socket's buffer is empty here
      }
    }
    if (c.state == State::body && c.in.size() >= c.head_bytes + c.req.content_length) {
      c.req.body = c.in.substr(c.head_bytes, c.req.content_length);
      c.in.erase(0, c.head_bytes + c.req.content_length);
      c.state = State::working;
      c.let_through = false;
      watch(c, 0);  // nothing more is read from it until answered (pipelined bytes wait in the kernel)
      dispatch(c);
    }
  }

  void dispatch(Conn& c) {
    const uint64_t id = c.id;
    auto task = [this, id, req = std::move(c.req)]() mutable {
      auto answered = std::make_shared<std::atomic<bool>>(false);
      Respond respond = [this, id, answered](Response r) {
        if (answered->exchange(true)) return;
        {
          std::lock_guard<std::mutex> lock(done_mu);
          done.emplace_back(id, std::move(r));
        }
        wake();
      };
      try {
        handlers.on_request(req, respond);
      } catch (const std::exception& e) {
        respond(error_response(500, e.what()));
      }
    };
    {
      std::lock_guard<std::mutex> lock(work_mu);
      work.push_back(std::move(task));
    }
    work_cv.notify_one();
  }

  void read_some(Conn& c) {
    char buf[65536];
    for (size_t total = 0; total < (1u << 20);) {  // at most 1 MB per turn: the other connections get theirs
      const ssize_t n = ::recv(c.fd, buf, sizeof buf, 0);
      if (n > 0) {
        total += (size_t)n;
        if (c.state == State::lingering) continue;
        if (c.state == State::idle) begin_request(c, Clock::now());
        c.in.append(buf, (size_t)n);
        advance(c);
        if (c.fd < 0 || (c.state != State::head && c.state != State::body)) return;
      } else if (n == 0) {
        return close_conn(c);  // the client is gone, or closed before finishing its request
      } else if (errno == EAGAIN || errno == EWOULDBLOCK) {
        return;
      } else if (errno != EINTR) {
        return close_conn(c);
      }
    }
  }

  void accept_all() {
    for (;;) {
      const int fd = ::accept4(listen_fd, nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
      if (fd < 0) return;  // EAGAIN, or out of descriptors (the limit was checked at bind)
      if (conns.size() >= limits.max_connections + kExtraLingering) {
        ::close(fd);
        continue;
      }
      int yes = 1;
      setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &yes, sizeof yes);
      auto conn = std::make_unique<Conn>();
      Conn& c = *conn;
      c.fd = fd;
      c.id = next_id++;
      conns.emplace(c.id, std::move(conn));
      epoll_event ev{};
      ev.events = EPOLLIN | EPOLLRDHUP;
      ev.data.u64 = c.id;
      epoll_ctl(epoll_fd, EPOLL_CTL_ADD, fd, &ev);
      c.deadline = Clock::now() + std::chrono::milliseconds(limits.idle_timeout_ms);
      if (conns.size() - lingering > limits.max_connections) {
        c.keep_alive = false;
        Response busy = error_response(503, "busy: " + std::to_string(limits.max_connections) +
                                                " connections already open; try again");
        busy.headers.emplace_back("Retry-After", "1");
        busy.close = true;
        answer(c, std::move(busy));
      }
    }
  }

  void finish_answers() {
    std::vector<std::pair<uint64_t, Response>> ready;
    {
      std::lock_guard<std::mutex> lock(done_mu);
      ready.swap(done);
    }
    for (auto& [id, response] : ready) {
      auto it = conns.find(id);
      if (it == conns.end()) continue;
      Conn& c = *it->second;
      if (c.fd < 0) {  // closed by the client meanwhile
        conns.erase(it);
        continue;
      }
      answer(c, std::move(response));
    }
  }

  void sweep() {
    const auto now = Clock::now();
    std::vector<Conn*> due;
    for (auto& [id, c] : conns)
      if (c->state != State::working && c->fd >= 0 &&
          (now >= c->deadline || (!accepting && c->state == State::idle)))
        due.push_back(c.get());
    for (Conn* c : due) {
      if (c->state == State::head || c->state == State::body) {
        dropped(*c);
        c->keep_alive = false;
        Response late = error_response(408, "request not received within " +
                                                std::to_string(limits.request_timeout_ms / 1000.0).substr(0, 4) + " s");
        late.close = true;
        answer(*c, std::move(late));
      } else {
        close_conn(*c);
      }
    }
  }

  void worker() {
    for (;;) {
      std::function<void()> task;
      {
        std::unique_lock<std::mutex> lock(work_mu);
        work_cv.wait(lock, [&] { return work_closed || !work.empty(); });
        if (work.empty()) return;
        task = std::move(work.front());
        work.pop_front();
      }
      task();
    }
  }
};

Server::Server(const ServerLimits& limits, Handlers handlers) : impl_(std::make_unique<Impl>()) {
  impl_->limits = limits;
  impl_->handlers = std::move(handlers);
}

Server::~Server() {
  if (impl_->listen_fd >= 0) ::close(impl_->listen_fd);
  if (impl_->epoll_fd >= 0) ::close(impl_->epoll_fd);
  if (impl_->wake_fd >= 0) ::close(impl_->wake_fd);
}

int Server::bind(const std::string& host, int port) {
  Impl& s = *impl_;
  const std::string where = host + ":" + std::to_string(port);
  // Every connection is a descriptor: the limit must hold them all, with room for the model's files and the loop's
  rlimit files{};
  const rlim_t need = s.limits.max_connections + kExtraLingering + 64;
  if (getrlimit(RLIMIT_NOFILE, &files) == 0 && files.rlim_cur < need) {
    files.rlim_cur = std::min(need, files.rlim_max);
    setrlimit(RLIMIT_NOFILE, &files);
    if (files.rlim_cur < need)
      throw Error("serve: --max-connections " + std::to_string(s.limits.max_connections) + " needs " +
                  std::to_string(need) + " open files, but the limit is " + std::to_string(files.rlim_max) +
                  " (ulimit -n)");
  }
  addrinfo hints{}, *found = nullptr;
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV;
  if (getaddrinfo(host.c_str(), std::to_string(port).c_str(), &hints, &found) != 0 || !found)
    throw Error("serve: cannot listen on " + where + " (address in use or not this machine's)");
  int fd = -1;
  for (addrinfo* a = found; a && fd < 0; a = a->ai_next) {
    fd = ::socket(a->ai_family, a->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC, a->ai_protocol);
    if (fd < 0) continue;
    // Only SO_REUSEADDR (a restart need not wait for TIME_WAIT); not SO_REUSEPORT, which lets a second server
    // share a port in use
    int yes = 1;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof yes);
    if (::bind(fd, a->ai_addr, a->ai_addrlen) != 0 || ::listen(fd, 1024) != 0) {
      ::close(fd);
      fd = -1;
    }
  }
  freeaddrinfo(found);
  if (fd < 0) throw Error("serve: cannot listen on " + where + " (address in use or not this machine's)");
  sockaddr_storage addr{};
  socklen_t len = sizeof addr;
  getsockname(fd, (sockaddr*)&addr, &len);
  const int bound = ntohs(addr.ss_family == AF_INET6 ? ((sockaddr_in6*)&addr)->sin6_port : ((sockaddr_in*)&addr)->sin_port);
  s.listen_fd = fd;
  s.epoll_fd = epoll_create1(EPOLL_CLOEXEC);
  s.wake_fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  if (s.epoll_fd < 0 || s.wake_fd < 0) throw Error("serve: cannot create the event loop: " + std::string(strerror(errno)));
  epoll_event ev{};
  ev.events = EPOLLIN;
  ev.data.u64 = kListenId;
  epoll_ctl(s.epoll_fd, EPOLL_CTL_ADD, fd, &ev);
  ev.data.u64 = kWakeId;
  epoll_ctl(s.epoll_fd, EPOLL_CTL_ADD, s.wake_fd, &ev);
  return bound;
}

void Server::stop() {
  impl_->stopping = true;
  impl_->wake();
}

void Server::run() {
  Impl& s = *impl_;
  if (s.listen_fd < 0) throw Error("serve: run() before bind()");
  for (int i = 0; i < std::max(1, s.limits.workers); ++i) s.workers.emplace_back([&s] { s.worker(); });
  std::vector<epoll_event> events(256);
  auto last_sweep = Clock::now();
  for (;;) {
    if (s.stopping && s.accepting) {
      // The backlog's connections are accepted, and what they sent read, before the listening socket closes:
      // closing it would reset them, requests that had arrived included
      s.accept_all();
      std::vector<Conn*> idle;
      for (auto& [id, c] : s.conns)
        if (c->state == State::idle && c->fd >= 0) idle.push_back(c.get());
      for (Conn* c : idle) s.read_some(*c);
      epoll_ctl(s.epoll_fd, EPOLL_CTL_DEL, s.listen_fd, nullptr);
      ::close(s.listen_fd);
      s.listen_fd = -1;
      s.accepting = false;
      s.sweep();  // idle connections close now
      s.bury();
    }
    if (!s.accepting && s.conns.empty()) break;
    const int n = epoll_wait(s.epoll_fd, events.data(), (int)events.size(), 50);
    for (int i = 0; i < n; ++i) {
      const uint64_t id = events[i].data.u64;
      const uint32_t what = events[i].events;
      if (id == kListenId) {
        if (s.accepting) s.accept_all();
        continue;
      }
      if (id == kWakeId) {
        uint64_t count;
        (void)!::read(s.wake_fd, &count, sizeof count);
        continue;
      }
      auto it = s.conns.find(id);
      if (it == s.conns.end() || it->second->fd < 0) continue;
      Conn& c = *it->second;
      if (c.state == State::working) {  // watched for nothing: only an error or a hang-up reaches here
        if (what & (EPOLLERR | EPOLLHUP)) s.close_conn(c);
        continue;
      }
      if (c.state == State::writing) {
        if (what & (EPOLLERR | EPOLLHUP)) s.close_conn(c);
        else if (what & EPOLLOUT) s.write_some(c);
        continue;
      }
      s.read_some(c);
    }
    s.finish_answers();
    s.bury();
    const auto now = Clock::now();
    if (now - last_sweep >= std::chrono::milliseconds(50)) {
      last_sweep = now;
      s.sweep();
      s.bury();
    }
  }
  {
    std::lock_guard<std::mutex> lock(s.work_mu);
    s.work_closed = true;
  }
  s.work_cv.notify_all();
  for (std::thread& t : s.workers) t.join();
  s.workers.clear();
}

}  // namespace sat::http
