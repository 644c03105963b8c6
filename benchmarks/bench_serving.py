"""Serving on loopback: time to first fragment vs the whole video, concurrency, a burst past the
queue, and the pod's memory.

A real ``avatar-release serve`` process on a real build (a tiny cpu-8 build compiled into a
temporary registry unless ``--registry`` is given). Bounded: loopback only, a fixed number of
clients and requests, every request with a timeout.

* **TTFF ratio**: a ``--seconds`` (10) request: seconds to the first ``moof`` byte at the client
  over seconds to the last byte; median of ``--runs``. Goal <= 0.25.
* **Concurrent clients**: ``--clients`` threads x ``--requests`` 1-second renders each against a
  queue of ``clients``: p50/p99 of time to first fragment and to the whole video, failures.
* **Burst**: ``--burst`` simultaneous requests against ``--queue``: how many render, how many get
  429 (with Retry-After), none fail otherwise.
* **RSS**: the pod's peak (VmHWM) and current (VmRSS) resident memory after the runs.

    python benchmarks/bench_serving.py [--registry DIR] [--out benchmarks/results/serving.json]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def _pod(registry: str, queue: int) -> tuple[subprocess.Popen, str]:
    env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
    proc = subprocess.Popen([sys.executable, "-m", "avatar_release", "serve", "--registry", registry, "--channel",
                             "dev", "--host", "127.0.0.1", "--port", "0", "--queue", str(queue)],
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, env=env)
    line = proc.stdout.readline()
    if not line:
        raise SystemExit("the pod did not start")
    return proc, f"http://127.0.0.1:{json.loads(line)['port']}"


def _render(base: str, seconds: float, timeout: float = 600) -> dict:
    t0 = time.perf_counter()
    req = urllib.request.Request(base + "/render", data=json.dumps({"seconds": seconds}).encode(), method="POST",
                                 headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            data, first = b"", None
            while piece := resp.read1(65536):
                data += piece
                if first is None and b"moof" in data:
                    first = time.perf_counter() - t0
            return {"status": 200, "ttff": first, "total": time.perf_counter() - t0, "bytes": len(data)}
    except urllib.error.HTTPError as e:
        return {"status": e.code, "retry_after": e.headers.get("Retry-After"), "total": time.perf_counter() - t0}


def _pct(xs: list[float], q: float) -> float | None:
    if not xs:
        return None
    xs = sorted(xs)
    return round(xs[min(len(xs) - 1, int(round(q * (len(xs) - 1))))], 4)


def _mem(pid: int) -> dict:
    fields = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        k, _, v = line.partition(":")
        if k in ("VmHWM", "VmRSS"):
            fields[k] = round(int(v.split()[0]) / 1024, 1)  # MiB
    return fields


def _parallel(n: int, fn) -> list:
    out, threads = [], [threading.Thread(target=lambda: out.append(fn())) for _ in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--registry", default=None)
    ap.add_argument("--seconds", type=float, default=10.0)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--clients", type=int, default=3)
    ap.add_argument("--requests", type=int, default=3)
    ap.add_argument("--burst", type=int, default=8)
    ap.add_argument("--queue", type=int, default=2)
    ap.add_argument("--out", default=None)
    a = ap.parse_args()

    with tempfile.TemporaryDirectory(prefix="bench-serving-") as tmp:
        registry = a.registry
        if registry is None:
            from avatar_release.machine import configure_host_devices

            configure_host_devices(8)
            from avatar_release.compile import compile_build
            from avatar_release.registry import LocalRegistry

            registry = str(Path(tmp) / "reg")
            compile_build("tiny", "cpu-8", registry=LocalRegistry(registry))
        result: dict = {"seconds": a.seconds}

        proc, base = _pod(registry, max(a.clients, a.queue))
        try:
            _render(base, 1.0)  # first request in the process (ffmpeg, page cache)
            runs = [_render(base, a.seconds) for _ in range(a.runs)]
            result["ttff"] = {"runs": [{k: round(v, 4) for k, v in r.items() if isinstance(v, float)} for r in runs],
                              "ttff_s": statistics.median(r["ttff"] for r in runs),
                              "whole_s": statistics.median(r["total"] for r in runs)}
            result["ttff"]["ratio"] = round(result["ttff"]["ttff_s"] / result["ttff"]["whole_s"], 4)
            print(f"{a.seconds:g} s request: first fragment {result['ttff']['ttff_s']:.3f} s, whole video "
                  f"{result['ttff']['whole_s']:.3f} s, ratio {result['ttff']['ratio']:.3f} (goal <= 0.25)")

            rs = [x for batch in _parallel(a.clients, lambda: [_render(base, 1.0) for _ in range(a.requests)])
                  for x in batch]
            ok = [r for r in rs if r["status"] == 200]
            result["concurrent"] = {"clients": a.clients, "requests": len(rs), "ok": len(ok),
                                    "failed": len(rs) - len(ok),
                                    "ttff_p50": _pct([r["ttff"] for r in ok], 0.5),
                                    "ttff_p99": _pct([r["ttff"] for r in ok], 0.99),
                                    "total_p50": _pct([r["total"] for r in ok], 0.5),
                                    "total_p99": _pct([r["total"] for r in ok], 0.99)}
            print(f"{a.clients} clients x {a.requests}: {result['concurrent']}")
            result["rss_mib"] = _mem(proc.pid)
        finally:
            proc.terminate()
            proc.wait(60)

        proc, base = _pod(registry, a.queue)
        try:
            rs = _parallel(a.burst, lambda: _render(base, 1.0))
            result["burst"] = {"requests": a.burst, "queue": a.queue, "ok": sum(r["status"] == 200 for r in rs),
                               "rejected_429": sum(r["status"] == 429 for r in rs),
                               "with_retry_after": sum(bool(r.get("retry_after")) for r in rs if r["status"] == 429),
                               "other": sum(r["status"] not in (200, 429) for r in rs)}
            print(f"burst of {a.burst} against queue {a.queue}: {result['burst']}")
            result["rss_mib_burst_pod"] = _mem(proc.pid)
        finally:
            proc.terminate()
            proc.wait(60)
        print(f"pod memory: {result['rss_mib']} MiB")
    if a.out:
        Path(a.out).write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
