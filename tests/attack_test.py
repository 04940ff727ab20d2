#!/usr/bin/env python3
"""sat serve under attack, on 127.0.0.1 only, bounded in count and time: slow clients, decompression bombs, requests
hidden in bodies, header floods, POSTs without a length, too many connections, overload, SIGTERM under load.

Every phase checks what the server answered (statuses, one answer per request, the server still serving) and prints
its figures (latencies, RSS); the figures are compared with the goals in docs/server.md but never fail the test on
their own (the machine may be loaded), except bounds a server that blocks would miss by far (an answer within 5 s).

    tests/attack_test.py build/sat [--model M] [--slow-seconds 60]   # by hand: the full minute of slow clients
"""
import argparse
import http.client
import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import attack_bombs  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
failures = []


def check(ok, what):
    print(("ok: " if ok else "FAIL: ") + what, flush=True)
    if not ok:
        failures.append(what)


def pct(values, q):
    if not values:
        return float("nan")
    s = sorted(values)
    return s[min(len(s) - 1, int(q * len(s)))]


def memory_mb(pid):
    """VmRSS and VmHWM (the peak so far) of the server, in MB."""
    fields = {}
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            key, _, value = line.partition(":")
            if key in ("VmRSS", "VmHWM"):
                fields[key] = int(value.split()[0]) / 1024
    return fields["VmRSS"], fields["VmHWM"]


class Server:
    def __init__(self, sat, model, extra):
        self.log = tempfile.NamedTemporaryFile(prefix="sat-attack-", suffix=".log", delete=False)
        self.proc = subprocess.Popen([sat, "serve", "--model", model, "--port", "0"] + extra, stderr=self.log)
        deadline = time.time() + 120
        self.port = None
        while time.time() < deadline and self.proc.poll() is None:
            m = re.search(r"http://127\.0\.0\.1:(\d+)", open(self.log.name).read())
            if m:
                self.port = int(m.group(1))
                break
            time.sleep(0.1)
        if not self.port:
            raise SystemExit("sat serve did not start: " + open(self.log.name).read())

    def stop(self):
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        os.unlink(self.log.name)


def connect(port, timeout=30):
    s = socket.create_connection(("127.0.0.1", port), timeout=timeout)
    s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return s


def read_answers(sock, wait):
    """Every HTTP answer on the socket until it closes or `wait` seconds pass: a list of (status, headers, body)."""
    sock.settimeout(wait)
    data = b""
    end = time.time() + wait
    try:
        while time.time() < end:
            chunk = sock.recv(65536)
            if not chunk:
                break
            data += chunk
    except (socket.timeout, ConnectionResetError):
        pass
    answers = []
    while data:
        head, sep, rest = data.partition(b"\r\n\r\n")
        if not sep:
            break
        lines = head.decode("latin-1").split("\r\n")
        status = int(lines[0].split()[1])
        headers = {k.strip().lower(): v.strip() for k, _, v in (l.partition(":") for l in lines[1:])}
        n = int(headers.get("content-length", 0))
        answers.append((status, headers, rest[:n]))
        data = rest[n:]
    return answers


def post(port, body, path="/caption", timeout=60, headers=None):
    """A whole POST on its own connection: (status, seconds, headers)."""
    start = time.time()
    try:
        c = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
        c.request("POST", path, body=body, headers=headers or {})
        r = c.getresponse()
        r.read()
        c.close()
        return r.status, time.time() - start, dict((k.lower(), v) for k, v in r.getheaders())
    except (OSError, http.client.HTTPException) as e:
        return f"error {type(e).__name__}", time.time() - start, {}


def get(port, path, timeout=30):
    start = time.time()
    try:
        c = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
        c.request("GET", path)
        r = c.getresponse()
        body = r.read()
        c.close()
        return r.status, time.time() - start, body
    except (OSError, http.client.HTTPException) as e:
        return f"error {type(e).__name__}", time.time() - start, b""


def metric(port, name):
    text = get(port, "/metrics")[2].decode()
    m = re.search("^" + re.escape(name) + r" ([0-9.e+]+)$", text, re.M)
    return float(m.group(1)) if m else 0.0


def concurrently(n, fn):
    results = [None] * n
    go = threading.Barrier(n)

    def run(i):
        go.wait()
        results[i] = fn(i)
    threads = [threading.Thread(target=run, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return results


def probe(port, photo, seconds):
    """GET /health and POST /caption in turn, one at a time, for `seconds`: their latencies, and any failure."""
    stop = time.time() + seconds
    health, caption, bad = [], [], []
    i = 0
    while time.time() < stop:
        if i % 2:
            status, secs, _ = post(port, photo, timeout=10)
            (caption if status == 200 else bad).append(secs if status == 200 else status)
        else:
            status, secs, _ = get(port, "/health", timeout=10)
            (health if status == 200 else bad).append(secs if status == 200 else status)
        i += 1
        time.sleep(0.1)
    return health, caption, bad


def slow_clients(port, photo, seconds, clients):
    """Half byte-drip (a byte every 0.5 s of an endless header), half a half-header then nothing; each reconnects when
    answered. Meanwhile a prober asks GET /health and POST /caption in turn; before, the same without them."""
    h0, c0, _ = probe(port, photo, min(seconds, 10))
    print(f"  without slow clients: GET /health p50 {pct(h0, .5):.3f} s p99 {pct(h0, .99):.3f} s ({len(h0)}), "
          f"POST /caption p50 {pct(c0, .5):.3f} s p99 {pct(c0, .99):.3f} s ({len(c0)})")
    stop = time.time() + seconds
    timeouts = [0]
    lock = threading.Lock()

    def slow(i):
        while time.time() < stop:
            try:
                s = connect(port, timeout=1)
                if i % 2:
                    s.sendall(b"POST /caption HTTP/1.1\r\nHost: x\r\nContent-Le")
                else:
                    s.sendall(b"POST /caption HTTP/1.1\r\nHost: x\r\nX-Drip: ")
                while time.time() < stop:
                    if i % 2 == 0:
                        s.sendall(b"a")
                    try:
                        got = s.recv(4096)
                    except socket.timeout:
                        continue
                    if got.startswith(b"HTTP/1.1 408"):
                        with lock:
                            timeouts[0] += 1
                    break
                s.close()
            except OSError:
                time.sleep(0.1)
    threads = [threading.Thread(target=slow, args=(i,)) for i in range(clients)]
    for t in threads:
        t.start()
    time.sleep(0.5)
    health, caption, bad = probe(port, photo, stop - time.time())
    for t in threads:
        t.join()
    print(f"  {clients} slow clients for {seconds} s: GET /health p50 {pct(health, .5):.3f} s p99 {pct(health, .99):.3f} s "
          f"({len(health)}), POST /caption p50 {pct(caption, .5):.3f} s p99 {pct(caption, .99):.3f} s ({len(caption)}); "
          f"{timeouts[0]} slow requests answered 408 (goal: p99 under 1 s)")
    # /health costs nothing: 5 s is far beyond it; a caption's own time is the machine's (a sanitizer build takes
    # seconds), so it must only be answered, within the prober's 10 s
    check(not bad and health and caption and max(health) < 5,
          f"slow clients: every normal request answered 200, /health within 5 s (worst {max(health or [0]):.2f} s; "
          f"failures {bad[:5]})")
    return timeouts[0]


def phase_bombs(srv, port, photo):
    rss0, hwm0 = memory_mb(srv.proc.pid)
    big = [attack_bombs.png(14000, 14000), attack_bombs.progressive_jpeg(14000, 14000)]
    results = concurrently(16, lambda i: post(port, big[i % 2]))
    statuses = [r[0] for r in results]
    worst = max(r[1] for r in results)
    _, hwm = memory_mb(srv.proc.pid)
    print(f"  16 bombs of 14000x14000 ({len(big[0]) // 1024} KB PNG, {len(big[1]) // 1024} KB progressive JPEG): "
          f"slowest answer {worst:.3f} s, peak RSS {hwm:.0f} MB (before {hwm0:.0f} MB)")
    # 400 from the decode budget, or 503 from admission first when the network's pace lets fewer in
    check(set(statuses) <= {400, 503} and 400 in statuses and worst < 5,
          f"bombs over the decode budget: 400 each, or 503 before any decode ({statuses})")
    inside = attack_bombs.png(7800, 7800, grey_bits=False)  # 61 megapixels: within the default budget of 64
    results = concurrently(16, lambda i: post(port, inside))
    statuses = [r[0] for r in results]
    rss, hwm = memory_mb(srv.proc.pid)
    print(f"  16 photos of 7800x7800 at once ({len(inside) // 1024} KB PNG each, within the budget): "
          f"{statuses.count(200)} captioned, {statuses.count(503)} told 503, slowest {max(r[1] for r in results):.2f} s, "
          f"peak RSS {hwm:.0f} MB, RSS after {rss:.0f} MB (goal: peak under 2 GB)")
    check(set(statuses) <= {200, 503} and statuses.count(200) >= 1,
          f"bombs within the budget: decoded one budget at a time, the rest 503 ({statuses})")
    check(get(port, "/health")[0] == 200, "still serving after the bombs")


def phase_smuggling(port, max_bytes):
    ok_before = metric(port, 'sat_requests_total{code="200"}')
    hidden = b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n"
    body = b"--x\r\n" + b"a" * 4096 + b"\r\n" + hidden
    cases = {
        "multipart without a boundary": (b"POST /caption HTTP/1.1\r\nHost: x\r\nContent-Type: multipart/form-data\r\n"
                                         b"Content-Length: %d\r\n\r\n" % len(body) + body, 400),
        "a body on a path that takes none": (b"POST /health HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n"
                                             % len(hidden) + hidden, 405),
        "Content-Length and Transfer-Encoding": (b"POST /caption HTTP/1.1\r\nHost: x\r\nContent-Length: 4\r\n"
                                                 b"Transfer-Encoding: chunked\r\n\r\n0\r\n\r\n" + hidden, 411),
        "two Content-Lengths": (b"POST /caption HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\nContent-Length: %d\r\n\r\n"
                                % len(hidden) + hidden, 400),
        "a space before the colon": (b"POST /caption HTTP/1.1\r\nHost: x\r\nContent-Length : %d\r\n\r\n" % len(hidden)
                                     + hidden, 400),
        "a folded header": (b"POST /caption HTTP/1.1\r\nHost: x\r\nX-A: 1\r\n Content-Length: %d\r\n\r\n" % len(hidden)
                            + hidden, 400),
        "bare LF line ends": (b"POST /caption HTTP/1.1\nHost: x\nContent-Length: %d\n\n" % len(hidden) + hidden, 400),
        "multipart over --max-bytes": (b"POST /caption HTTP/1.1\r\nHost: x\r\nContent-Type: multipart/form-data; "
                                       b"boundary=x\r\nContent-Length: %d\r\n\r\n" % (max_bytes + 1) + hidden, 413),
    }
    for name, (raw, want) in cases.items():
        s = connect(port)
        s.sendall(raw)
        answers = read_answers(s, 2)
        s.close()
        statuses = [a[0] for a in answers]
        check(statuses == [want], f"{name}: {want} and nothing else ({statuses})")
    ok_after = metric(port, 'sat_requests_total{code="200"}')
    hidden_run = ok_after - ok_before - 1  # the first /metrics request itself
    print(f"  hidden requests answered: {hidden_run:.0f} (goal 0)")
    check(hidden_run == 0, f"no hidden request executed ({hidden_run:.0f} extra 200s)")


def phase_headers(srv, port, flood_mb):
    rss0, _ = memory_mb(srv.proc.pid)
    s = connect(port)
    s.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n")
    line = b"X-Flood: " + b"a" * 1000 + b"\r\n"
    chunk = line * 1024
    sent = 0
    start = time.time()
    try:
        while sent < flood_mb << 20:
            s.sendall(chunk)
            sent += len(chunk)
    except OSError:
        pass
    answers = read_answers(s, 3)
    s.close()
    rss1, _ = memory_mb(srv.proc.pid)
    print(f"  header flood: {sent / 2**20:.1f} of {flood_mb} MB sent before the server closed, in {time.time() - start:.2f} s; "
          f"RSS {rss0:.0f} -> {rss1:.0f} MB")
    check([a[0] for a in answers] == [431], f"header flood: 431 ({[a[0] for a in answers]})")
    check(rss1 - rss0 < 50, f"header flood: RSS unchanged within 50 MB ({rss1 - rss0:+.0f} MB)")
    s = connect(port)
    s.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n" + b"".join(b"X-%d: 1\r\n" % i for i in range(100)) + b"\r\n")
    check([a[0] for a in read_answers(s, 2)] == [431], "100 header lines: 431")
    s.close()
    s = connect(port)
    s.sendall(b"GET /" + b"a" * 9000 + b" HTTP/1.1\r\nHost: x\r\n\r\n")
    check([a[0] for a in read_answers(s, 2)] == [414], "a 9000-byte request line: 414")
    s.close()


def phase_no_length(port):
    for raw, want, name in [
            (b"POST /caption HTTP/1.1\r\nHost: x\r\n\r\n", 400, "POST without Content-Length: no body"),
            (b"POST /caption HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n", 411, "chunked POST: 411")]:
        start = time.time()
        s = connect(port)
        s.sendall(raw)
        answers = read_answers(s, 3) if want == 411 else [read_answers_one(s)]
        secs = time.time() - start
        s.close()
        print(f"  {name}: answered in {secs:.3f} s")
        check([a[0] for a in answers] == [want] and secs < 2, f"{name} ({[a[0] for a in answers]}, {secs:.2f} s)")


def read_answers_one(sock):
    """The first answer on a kept-alive connection (it does not close)."""
    sock.settimeout(10)
    data = b""
    try:
        while b"\r\n\r\n" not in data:
            chunk = sock.recv(65536)
            if not chunk:
                return "closed", {}, b""
            data += chunk
    except OSError:
        return "no answer", {}, b""
    head, _, rest = data.partition(b"\r\n\r\n")
    n = int(re.search(rb"Content-Length: (\d+)", head).group(1))
    while len(rest) < n:
        rest += sock.recv(65536)
    return int(head.split()[1]), {}, rest[:n]


def phase_connections(port, max_connections):
    socks, refused = [], 0
    for _ in range(max_connections + 10):
        socks.append(connect(port, timeout=5))
    time.sleep(0.5)
    for s in socks:
        s.setblocking(False)
        try:
            if s.recv(4096).startswith(b"HTTP/1.1 503"):
                refused += 1
        except (BlockingIOError, ConnectionResetError):
            pass
    status = get(port, "/health")[0]
    for s in socks:
        s.close()
    print(f"  {max_connections + 10} idle connections: {refused} refused with 503")
    check(1 <= refused <= 12 and status == 200 or (refused >= 1 and get(port, "/health")[0] == 200),
          f"connections over --max-connections: 503 ({refused}), the server still answers once they close")


def phase_overload(port, photo, n):
    results = concurrently(n, lambda i: post(port, photo, timeout=120))
    ok = [r[1] for r in results if r[0] == 200]
    busy = [r for r in results if r[0] == 503]
    other = [r[0] for r in results if r[0] not in (200, 503)]
    print(f"  {n} concurrent requests: {len(ok)} answered 200 (p50 {pct(ok, .5):.2f} s, p99 {pct(ok, .99):.2f} s), "
          f"{len(busy)} told 503 (slowest {max([r[1] for r in busy] or [0]):.3f} s) (goal: 503 at once, p99 under 5 s)")
    check(not other and busy and ok, f"overload: 200 or 503, some of each (others: {other[:5]})")
    check(all(r[2].get("retry-after") for r in busy), "every 503 says Retry-After")
    check(max([r[1] for r in busy] or [0]) < 2, "the 503s come at once (within 2 s)")


def phase_sigterm(srv, port, photo, n):
    sent = threading.Semaphore(0)
    results = [None] * n

    def one(i):
        try:
            s = connect(port, timeout=120)
            s.sendall(b"POST /caption HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n" % len(photo) + photo)
            sent.release()
            results[i] = read_answers(s, 120)
            s.close()
        except OSError as e:
            sent.release()
            results[i] = [(f"error {e}", {}, b"")]
    threads = [threading.Thread(target=one, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for _ in range(n):
        sent.acquire()
    time.sleep(0.5)  # every byte sent has arrived on loopback
    srv.proc.send_signal(signal.SIGTERM)
    start = time.time()
    for t in threads:
        t.join()
    try:
        rc = srv.proc.wait(timeout=120)
    except subprocess.TimeoutExpired:
        rc = "hung"
    statuses = [r[0][0] if r else None for r in results]
    print(f"  SIGTERM with {n} in flight: {statuses.count(200)} answered 200 within {time.time() - start:.1f} s, exit {rc}")
    check(statuses == [200] * n and rc == 0, f"SIGTERM: every request that had arrived answered, then exit 0 "
          f"({[s for s in statuses if s != 200][:5]}, exit {rc})")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("sat")
    ap.add_argument("--model", default=os.path.join(ROOT, "models", "flickr8k-inception.sat"))
    ap.add_argument("--photo", default=os.path.join(ROOT, "examples", "dog_and_man.jpg"))
    ap.add_argument("--slow-seconds", type=float, default=10, help="how long the slow clients stay (60 by hand)")
    ap.add_argument("--slow-clients", type=int, default=64)
    ap.add_argument("--overload", type=int, default=300)
    ap.add_argument("--in-flight", type=int, default=64, help="requests in flight at SIGTERM")
    ap.add_argument("--flood-mb", type=int, default=96)
    ap.add_argument("--phases", default="slow,bombs,smuggling,headers,nolength,connections,overload,sigterm",
                    help="which phases to run (a negative control against another server picks the safe ones)")
    ap.add_argument("--server-args", default="--request-timeout 5",
                    help="beyond the defaults (a short request timeout, so that 408s come within the slow phase)")
    a = ap.parse_args()
    photo = open(a.photo, "rb").read()
    srv = Server(a.sat, a.model, a.server_args.split())
    try:
        port = srv.port
        print(f"sat serve on 127.0.0.1:{port} ({os.path.basename(a.model)}, {a.server_args}), RSS "
              f"{memory_mb(srv.proc.pid)[0]:.0f} MB", flush=True)
        phases = a.phases.split(",")
        check(post(port, photo)[0] == 200, "a normal caption first")
        if "slow" in phases:
            timeouts = slow_clients(port, photo, a.slow_seconds, a.slow_clients)
            check(timeouts > 0 or a.slow_seconds < 6, f"slow requests end in 408 ({timeouts})")
        if "bombs" in phases:
            phase_bombs(srv, port, photo)
        if "smuggling" in phases:
            phase_smuggling(port, 20 << 20)
        if "headers" in phases:
            phase_headers(srv, port, a.flood_mb)
        if "nolength" in phases:
            phase_no_length(port)
        if "connections" in phases:
            phase_connections(port, 512)
        if "overload" in phases:
            phase_overload(port, photo, a.overload)
        if "sigterm" in phases:
            srv.proc.send_signal(signal.SIGTERM)
            check(srv.proc.wait(timeout=120) == 0, "SIGTERM when idle: exit 0")
            srv.stop()
            # every request of the burst admitted (no --max-wait refusal), so that all are in flight at SIGTERM
            srv = Server(a.sat, a.model, a.server_args.split() + ["--max-wait", "3600"])
            phase_sigterm(srv, srv.port, photo, a.in_flight)
    finally:
        srv.stop()
    print(f"{len(failures)} failure(s)")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
