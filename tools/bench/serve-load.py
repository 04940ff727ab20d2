#!/usr/bin/env python3
"""Load on `sat serve`, loopback only, bounded: a fixed number of requests from C concurrent clients, each with a
timeout; prints throughput and p50/p99 latency. By default it starts the server itself twice, with batching
(--max-batch 8) and one image at a time (--max-batch 1), then captions photos one `sat caption` call at a time, and
prints the three side by side.

  tools/bench/serve-load.py --sat build/sat --model models/flickr8k-inception.sat --photos ../shared/data/flickr8k/images \
      --requests 200 --clients 8
  tools/bench/serve-load.py --url http://127.0.0.1:8080 --photos examples/dog_and_man.jpg   # an already running server
"""
import argparse
import concurrent.futures
import http.client
import os
import re
import subprocess
import sys
import threading
import time
import urllib.parse


def photo_list(spec, limit):
    paths = []
    for item in spec:
        if os.path.isdir(item):
            paths += sorted(os.path.join(item, f) for f in os.listdir(item)
                            if f.lower().endswith((".jpg", ".jpeg", ".png")))
        else:
            paths.append(item)
    if not paths:
        sys.exit("serve-load: no photos in " + " ".join(spec))
    return paths[:limit]


def percentile(values, p):
    values = sorted(values)
    return values[min(len(values) - 1, int(round(p / 100.0 * (len(values) - 1))))]


def run_load(url, photos, requests, clients, timeout):
    u = urllib.parse.urlparse(url)
    if u.hostname not in ("127.0.0.1", "localhost", "::1"):
        sys.exit("serve-load: loopback only, got " + url)
    bodies = [open(p, "rb").read() for p in photos]
    lock = threading.Lock()
    latencies, statuses = [], {}

    def one(i):
        body = bodies[i % len(bodies)]
        conn = http.client.HTTPConnection(u.hostname, u.port, timeout=timeout)
        start = time.perf_counter()
        try:
            conn.request("POST", "/caption", body=body, headers={"Content-Type": "application/octet-stream"})
            response = conn.getresponse()
            response.read()
            status = response.status
        except Exception as e:  # a timeout or a refused connection counts, it does not stop the run
            status = type(e).__name__
        finally:
            conn.close()
        seconds = time.perf_counter() - start
        with lock:
            statuses[status] = statuses.get(status, 0) + 1
            if status == 200:
                latencies.append(seconds)

    start = time.perf_counter()
    with concurrent.futures.ThreadPoolExecutor(max_workers=clients) as pool:
        list(pool.map(one, range(requests)))
    wall = time.perf_counter() - start
    ok = statuses.get(200, 0)
    return {"wall": wall, "ok": ok, "rate": ok / wall, "statuses": statuses,
            "p50": percentile(latencies, 50) if latencies else float("nan"),
            "p99": percentile(latencies, 99) if latencies else float("nan")}


def start_server(sat, model, max_batch, extra):
    proc = subprocess.Popen([sat, "serve", "--model", model, "--port", "0", "--max-batch", str(max_batch)] + extra,
                            stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 120
    while time.time() < deadline:
        line = proc.stderr.readline()
        m = re.search(r"listening on (http://127\.0\.0\.1:\d+)", line)
        if m:
            threading.Thread(target=proc.stderr.read, daemon=True).start()  # keep the pipe drained
            return proc, m.group(1)
        if not line and proc.poll() is not None:
            break
    proc.kill()
    sys.exit("serve-load: sat serve did not start: " + line.strip())


def warm_up(url, photos):
    run_load(url, photos[:1], 2, 1, 120)


def show(name, r):
    print(f"{name:<34} {r['rate']:7.2f} captions/s  p50 {r['p50'] * 1000:7.0f} ms  p99 {r['p99'] * 1000:7.0f} ms  "
          f"({r['ok']} ok in {r['wall']:.1f} s; statuses {r['statuses']})", flush=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sat", default="build/sat")
    ap.add_argument("--model", default="models/flickr8k-inception.sat")
    ap.add_argument("--url", help="load a running server instead of starting one")
    ap.add_argument("--photos", nargs="+", default=["examples/dog_and_man.jpg"])
    ap.add_argument("--photo-limit", type=int, default=200)
    ap.add_argument("--requests", type=int, default=100)
    ap.add_argument("--clients", type=int, default=8)
    ap.add_argument("--timeout", type=float, default=120.0, help="seconds per request")
    ap.add_argument("--cli-photos", type=int, default=10, help="photos captioned one `sat caption` call at a time")
    ap.add_argument("--server-args", default="", help="more flags for sat serve")
    a = ap.parse_args()
    if a.requests < 1 or a.clients < 1 or a.requests > 100000:
        sys.exit("serve-load: --requests in [1, 100000] and --clients >= 1")
    photos = photo_list(a.photos, a.photo_limit)
    print(f"{a.requests} requests from {a.clients} concurrent clients, {len(photos)} photos, model {a.model}")
    if a.url:
        show(a.url, run_load(a.url, photos, a.requests, a.clients, a.timeout))
        return
    results = {}
    for name, batch in (("sat serve, batches of up to 8", 8), ("sat serve, one image at a time", 1)):
        proc, url = start_server(a.sat, a.model, batch, a.server_args.split())
        try:
            warm_up(url, photos)
            results[name] = run_load(url, photos, a.requests, a.clients, a.timeout)
            show(name, results[name])
        finally:
            proc.terminate()
            proc.wait(timeout=120)
    b, one = results["sat serve, batches of up to 8"], results["sat serve, one image at a time"]
    if a.cli_photos <= 0:  # --cli-photos 0: the server runs only
        print(f"batching / one at a time: {b['rate'] / one['rate']:.2f}x throughput")
        return
    # one process per photo: load, encode, search, exit
    start = time.perf_counter()
    times = []
    for p in photos[:a.cli_photos]:
        t = time.perf_counter()
        subprocess.run([a.sat, "caption", p, "--model", a.model], check=True, capture_output=True, timeout=a.timeout)
        times.append(time.perf_counter() - t)
    wall = time.perf_counter() - start
    show("sat caption, one call per photo", {"wall": wall, "ok": len(times), "rate": len(times) / wall,
                                             "statuses": {"exit 0": len(times)}, "p50": percentile(times, 50),
                                             "p99": percentile(times, 99)})
    print(f"batching / one at a time: {b['rate'] / one['rate']:.2f}x throughput")


if __name__ == "__main__":
    main()
