"""``zrt serve`` under load: a cold server's time to answer /healthz, then 200 concurrent
estimate requests answered from stored results (p50, p99, throughput), then 200 concurrent
new estimates against a bounded queue (accepted, 429s, every accepted job finished).

    python benchmarks/bench_serve.py [--workers N] [--requests N] [--max-queue N]

The server is a new process (``zrt serve`` on a free port, a temporary database); the
clients are one asyncio httpx client with a connection per request. Targets (issue 12): a
cold server ready in under 3 s (torch is imported in the workers, after the port opens);
a cached estimate answered in under 50 ms p50 (one client, a request at a time; the
200-request burst's p50 and p99 are reported beside it: they measure the queue of
connections, i.e. throughput); nothing lost (every request answered 200,
202 or 429, every accepted job done).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from _bench import result

READY_TARGET_S = 3.0
CACHED_P50_TARGET_MS = 50.0


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start(db: Path, *args: str) -> tuple[subprocess.Popen, str, float]:
    """A new ``zrt serve``; its URL and the seconds until /healthz answered (polled with
    urllib every 20 ms: a light client, so the poll does not slow what it measures)."""
    import urllib.error
    import urllib.request

    port = free_port()
    t0 = time.perf_counter()
    proc = subprocess.Popen([sys.executable, "-m", "zrt_core.cli.main", "serve", "--port",
                             str(port), "--db", str(db), *args],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    while True:
        try:
            with urllib.request.urlopen(url + "/healthz", timeout=1) as r:
                if r.status == 200:
                    return proc, url, time.perf_counter() - t0
        except (urllib.error.URLError, ConnectionError):
            if proc.poll() is not None:
                raise SystemExit(f"zrt serve exited with {proc.returncode}") from None
            time.sleep(0.02)


def cpu_s(pid: int) -> float:
    """User + system CPU seconds of a running process (Linux /proc)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def body(batch: int) -> dict:
    return {"model": "llama3-8b", "hardware": "nvidia_h100_sxm",
            "infer": {"input_len": 1024, "output_len": 128, "batch": batch}}


async def burst(url: str, bodies: list[dict]) -> tuple[list[float], list[int], list[dict],
                                                         float]:
    """Every body POSTed at once: latencies (s), statuses, answers, wall time (s)."""
    import httpx

    limits = httpx.Limits(max_connections=len(bodies), max_keepalive_connections=0)
    async with httpx.AsyncClient(base_url=url, timeout=120, limits=limits) as client:
        async def one(b: dict) -> tuple[float, int, dict]:
            t0 = time.perf_counter()
            r = await client.post("/v1/estimate", json=b)
            return time.perf_counter() - t0, r.status_code, r.json()

        t0 = time.perf_counter()
        out = await asyncio.gather(*(one(b) for b in bodies))
        wall = time.perf_counter() - t0
    return [o[0] for o in out], [o[1] for o in out], [o[2] for o in out], wall


def wait_all(url: str, ids: list[str], timeout_s: float = 600) -> dict[str, str]:
    import httpx

    states: dict[str, str] = {}
    deadline = time.perf_counter() + timeout_s
    with httpx.Client(base_url=url, timeout=60) as c:
        for i in ids:
            while time.perf_counter() < deadline:
                states[i] = c.get(f"/v1/jobs/{i}").json()["status"]
                if states[i] in ("done", "failed", "cancelled"):
                    break
                time.sleep(0.1)
    return states


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--requests", type=int, default=200)
    parser.add_argument("--max-queue", type=int, default=64)
    args = parser.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="zrt-bench-serve-"))
    os.environ.setdefault("ZRT_CACHE_DIR", str(tmp / "cache"))

    # cold start: three fresh servers, the median time to /healthz (and the server's CPU
    # time by then: a shared machine inflates the wall time, not the CPU time)
    readies, cpus = [], []
    for i in range(3):
        proc, _url, ready_s = start(tmp / f"cold{i}.sqlite", "--workers", "1")
        readies.append(ready_s)
        cpus.append(cpu_s(proc.pid))
        proc.terminate()  # a clean stop ends its worker too
        proc.wait()
    print(f"cold ready: {', '.join(f'{r:.2f}' for r in readies)} s wall, "
          f"{', '.join(f'{c:.2f}' for c in cpus)} s CPU")

    proc, url, _ = start(tmp / "jobs.sqlite", "--workers", str(args.workers),
                         "--max-queue", str(args.max_queue))
    try:
        # stored answers: 20 distinct estimates run once, then requests cycle through them
        distinct = [body(b) for b in range(1, 21)]
        answers = asyncio.run(burst(url, distinct))[2]
        states = wait_all(url, [a["id"] for a in answers])
        assert set(states.values()) == {"done"}, states
        # one client, one request at a time: the latency of a stored answer
        import httpx

        with httpx.Client(base_url=url, timeout=60) as c:
            one = []
            for i in range(args.requests):
                t0 = time.perf_counter()
                assert c.post("/v1/estimate", json=distinct[i % 20]).status_code == 200
                one.append((time.perf_counter() - t0) * 1e3)
        cached_p50_ms = statistics.median(one)
        print(f"cached, one at a time: {args.requests} requests, p50 {cached_p50_ms:.1f} ms, "
              f"p99 {pct(one, 0.99):.1f} ms")
        cached = [distinct[i % len(distinct)] for i in range(args.requests)]
        lat, statuses, answers, wall = asyncio.run(burst(url, cached))
        lat_ms = [x * 1e3 for x in lat]
        done = sum(s == 200 and a["status"] == "done" for s, a in zip(statuses, answers, strict=True))
        print(f"cached: {args.requests} concurrent, {done} answered done; p50 "
              f"{statistics.median(lat_ms):.1f} ms, p99 {pct(lat_ms, 0.99):.1f} ms, "
              f"{args.requests / wall:.0f} requests/s")

        # new work against the bounded queue
        fresh = [body(b) for b in range(1000, 1000 + args.requests)]
        t0 = time.perf_counter()
        lat, statuses, answers, wall = asyncio.run(burst(url, fresh))
        accepted = [a["id"] for s, a in zip(statuses, answers, strict=True) if s == 202]
        limited = sum(s == 429 for s in statuses)
        other = [s for s in statuses if s not in (202, 429)]
        states = wait_all(url, accepted)
        jobs_s = len(accepted) / (time.perf_counter() - t0)
        finished = sum(v == "done" for v in states.values())
        lat_ms = [x * 1e3 for x in lat]
        print(f"new: {args.requests} concurrent, {len(accepted)} accepted, {limited} answered "
              f"429, {len(other)} other; submit p50 {statistics.median(lat_ms):.1f} ms, p99 "
              f"{pct(lat_ms, 0.99):.1f} ms; {finished} of {len(accepted)} done, "
              f"{jobs_s:.1f} jobs/s with {args.workers} workers")
    finally:
        proc.kill()
        proc.wait()

    result("cold server ready (median of 3)", statistics.median(readies), READY_TARGET_S,
           "s")
    result("cached estimate p50 (one client)", cached_p50_ms, CACHED_P50_TARGET_MS, "ms")
    result("requests lost (neither 202 nor 429, or an accepted job not done)",
           len(other) + len(accepted) - finished, 0, "requests")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
