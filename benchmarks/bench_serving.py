"""Serving on loopback: time to first fragment vs the whole video, concurrency, a burst past the
queue, and the pod's memory.

A real ``avatar-release serve`` process on a real build (a tiny cpu-8 build compiled into a
temporary registry unless ``--registry`` is given). Bounded: loopback only, a fixed number of
clients and requests, every request with a timeout.

* **TTFF ratio**: a ``--seconds`` (10) request: seconds to the first ``moof`` byte at the client
  over seconds to the last byte; median of ``--runs``. Goal <= 0.25.
* **Concurrent clients**: ``--clients`` threads x ``--requests`` ``--short`` (1-second) renders each
  against a queue of ``clients``: p50/p99 of time to first fragment and to the whole video, failures.
* **Burst**: ``--burst`` simultaneous ``--short`` requests against ``--queue``: how many render, how many get
  429 (with Retry-After), none fail otherwise.
* **RSS**: the pod's peak (VmHWM) and current (VmRSS) resident memory after the runs.
* **Flat memory**: a fresh pod's peak RSS after one ``--seconds`` request vs another fresh pod's
  after one ``--long`` (120) request. Goal: within 10%.
* **Hostile input**: a PNG whose header declares 60000x60000 and ``seconds=1e6``: status, seconds
  to the answer, the pod's RSS before and after. Goal: 4xx in under a second, no growth.
* **Promotion under load**: a ``--follow`` pod, two clients rendering back to back (for 3 s before),
  dev moved to another build: requests failed across the swap (goal 0) and seconds until it was swapped in.
* **Full queue**: the burst's accepted requests' p99 time to first fragment.

    python benchmarks/bench_serving.py [--registry DIR] [--out benchmarks/results/serving.json]
    python benchmarks/bench_serving.py --smoke --registry DIR --out FILE   # every measurement, smallest; the tests run it

``--smoke``: a 1-second request for the TTFF ratio (four chunks: the muxer sends a fragment when the
next one begins) with no warm-up request before it, one run, 2 clients x 1 and a burst of 3 against a
queue of 1 in 0.4-second requests, flat memory over 1 s vs 2 s, 1 s of load before the promotion
(which compiles its second tiny build unless ``--candidate`` names one). ``--registry`` is copied,
never changed (the promotion publishes a build to its dev channel).
"""

from __future__ import annotations

import argparse
import base64
import json
import os
import shutil
import statistics
import struct
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
import zlib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from _out import out_path, write_results  # noqa: E402 (benchmarks/_out.py, beside this file)

# --smoke: (seconds, runs, clients, requests, burst, queue, long, short)
SMOKE = (1.0, 1, 2, 1, 3, 1, 2.0, 0.4)


def _pod(registry: str, queue: int, *extra: str) -> tuple[subprocess.Popen, str]:
    env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "avatar_release",
            "serve",
            "--registry",
            registry,
            "--channel",
            "dev",
            "--host",
            "127.0.0.1",
            "--port",
            "0",
            "--queue",
            str(queue),
            *extra,
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        env=env,
    )
    line = proc.stdout.readline()
    if not line:
        raise SystemExit("the pod did not start")
    return proc, f"http://127.0.0.1:{json.loads(line)['port']}"


def _render(base: str, seconds: float, timeout: float = 600, doc: dict | None = None) -> dict:
    t0 = time.perf_counter()
    body = json.dumps(doc if doc is not None else {"seconds": seconds}).encode()
    req = urllib.request.Request(
        base + "/render", data=body, method="POST", headers={"Content-Type": "application/json"}
    )
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            data, first = b"", None
            while piece := resp.read1(65536):
                data += piece
                if first is None and b"moof" in data:
                    first = time.perf_counter() - t0
            return {
                "status": 200,
                "ttff": first,
                "total": time.perf_counter() - t0,
                "bytes": len(data),
                "build": resp.headers.get("X-Build-Id"),
            }
    except urllib.error.HTTPError as e:
        return {"status": e.code, "retry_after": e.headers.get("Retry-After"), "total": time.perf_counter() - t0}
    except OSError as e:  # reset, refused, timed out: a failed request
        return {"status": 0, "error": repr(e), "total": time.perf_counter() - t0}


def _png_bomb(width: int = 60000, height: int = 60000) -> bytes:
    """A valid PNG signature and IHDR declaring width x height RGB, then one tiny IDAT and IEND."""

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    ihdr = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return (
        b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IDAT", zlib.compress(b"\0" * 1024)) + chunk(b"IEND", b"")
    )


def _flat_memory(registry: str, short: float, long: float) -> dict:
    """Peak RSS of a fresh pod after one short request vs another's after one long one."""
    out = {}
    for label, seconds in (("short", short), ("long", long)):
        proc, base = _pod(registry, 1, "--max-seconds", str(long + 10))
        try:
            r = _render(base, seconds, timeout=3600)
            assert r["status"] == 200, r
            out[label] = {"seconds": seconds, "render_s": round(r["total"], 2), "bytes": r["bytes"], **_mem(proc.pid)}
        finally:
            proc.terminate()
            proc.wait(60)
    out["peak_ratio"] = round(out["long"]["VmHWM"] / out["short"]["VmHWM"], 4)
    return out


def _hostile(base: str, pid: int) -> dict:
    out = {}
    for label, doc in (
        ("png_bomb", {"image_b64": base64.b64encode(_png_bomb()).decode(), "seconds": 1}),
        ("seconds_1e6", {"seconds": 1e6}),
    ):
        before = _mem(pid)
        r = _render(base, 0, timeout=30, doc=doc)
        after = _mem(pid)
        out[label] = {
            "status": r["status"],
            "answer_s": round(r["total"], 4),
            "rss_before_mib": before["VmRSS"],
            "rss_after_mib": after["VmRSS"],
            "peak_before_mib": before["VmHWM"],
            "peak_after_mib": after["VmHWM"],
        }
    return out


def _promotion_under_load(registry: str, clients: int = 2, candidate: str | None = None, load_s: float = 3.0) -> dict:
    """dev moves to another build while clients render (for ``load_s`` before it moves): failures across
    the swap, time to swap. ``candidate``: that build, already in the registry (default: tiny compiled
    with matmul_k_split=2)."""
    from avatar_release.promote import publish_to_dev
    from avatar_release.registry import LocalRegistry, read_manifest

    reg = LocalRegistry(registry)
    if candidate is None:
        from avatar_release.compile import compile_build

        b = compile_build("tiny", "cpu-8", registry=reg, overrides={"matmul_k_split": "2"}, move_dev=False)
    else:
        b = reg.resolve(candidate)
    proc, base = _pod(registry, clients, "--follow", "--poll", "1")
    results, stop = [], threading.Event()

    def load():
        while not stop.is_set():
            results.append(_render(base, 0.4, timeout=120))

    threads = [threading.Thread(target=load) for _ in range(clients)]
    try:
        for t in threads:
            t.start()
        time.sleep(load_s)
        t0 = time.perf_counter()
        publish_to_dev(reg, read_manifest(reg, b.digest)[0], reason="bench: promotion under load")
        swapped = None
        while time.perf_counter() - t0 < 300:
            if json.loads(urllib.request.urlopen(base + "/healthz", timeout=30).read())["build_id"] == b.build_id:
                swapped = time.perf_counter() - t0
                break
            time.sleep(0.2)
        n = len(results)
        while len(results) < n + clients:
            time.sleep(0.1)
    finally:
        stop.set()
        for t in threads:
            t.join(300)
        proc.terminate()
        proc.wait(60)
    builds = [r.get("build") for r in results if r["status"] == 200]
    return {
        "requests": len(results),
        "failed": sum(r["status"] != 200 for r in results),
        "swap_seconds": None if swapped is None else round(swapped, 2),
        "served_old": builds.count(builds[0]) if builds else 0,
        "served_new": sum(x == b.build_id for x in builds),
    }


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
    ap.add_argument(
        "--candidate",
        default=None,
        help="a build in --registry that dev moves to under load (default: compile tiny with matmul_k_split=2)",
    )
    ap.add_argument("--seconds", type=float, default=10.0)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--clients", type=int, default=3)
    ap.add_argument("--requests", type=int, default=3)
    ap.add_argument("--burst", type=int, default=8)
    ap.add_argument("--queue", type=int, default=2)
    ap.add_argument("--long", type=float, default=120.0, help="the long request of the flat-memory check")
    ap.add_argument("--short", type=float, default=1.0, help="seconds of the concurrent and burst requests")
    ap.add_argument("--skip-long", action="store_true", help="skip the flat-memory check (minutes on 2 cores)")
    ap.add_argument("--only-long", action="store_true", help="run only the flat-memory check")
    ap.add_argument("--smoke", action="store_true", help="every measurement at its smallest: proves the benchmark runs")
    ap.add_argument("--out", help="write the JSON here (default: nowhere)")
    a = ap.parse_args()
    os.environ.setdefault("AVATAR_RELEASE_PROJECT", str(ROOT))  # the bundled pipeline's specs, wherever it runs
    if a.smoke:
        a.seconds, a.runs, a.clients, a.requests, a.burst, a.queue, a.long, a.short = SMOKE
    out = out_path(a.out, None, smoke=a.smoke)

    from avatar_release.machine import configure_compile_env
    from avatar_release.specs import load_target

    # This process compiles (the build, and the promotion's second build), as `compile` would:
    # 8 CPU devices and JAX on its CPU backend only (libtpu, when installed, stays out of it).
    configure_compile_env(load_target("cpu-8"))
    with tempfile.TemporaryDirectory(prefix="bench-serving-") as tmp:
        registry = str(Path(tmp) / "reg")
        if a.registry is None:
            from avatar_release.compile import compile_build
            from avatar_release.registry import LocalRegistry

            compile_build("tiny", "cpu-8", registry=LocalRegistry(registry))
        else:
            shutil.copytree(a.registry, registry)
        result: dict = {"smoke": a.smoke, "seconds": a.seconds}
        if a.only_long:
            result["flat_memory"] = _flat_memory(registry, a.seconds, a.long)
            print(f"flat memory: {result['flat_memory']}")
            print(f"  peak RSS, {a.long:g} s / {a.seconds:g} s request  {result['flat_memory']['peak_ratio']}  <= 1.10")
            write_results(result, out, smoke=a.smoke)
            return

        proc, base = _pod(registry, max(a.clients, a.queue))
        try:
            if not a.smoke:
                _render(base, a.short)  # first request in the process (ffmpeg, page cache)
            runs = [_render(base, a.seconds) for _ in range(a.runs)]
            result["ttff"] = {
                "runs": [{k: round(v, 4) for k, v in r.items() if isinstance(v, float)} for r in runs],
                "ttff_s": statistics.median(r["ttff"] for r in runs),
                "whole_s": statistics.median(r["total"] for r in runs),
            }
            result["ttff"]["ratio"] = round(result["ttff"]["ttff_s"] / result["ttff"]["whole_s"], 4)
            print(
                f"{a.seconds:g} s request: first fragment {result['ttff']['ttff_s']:.3f} s, whole video "
                f"{result['ttff']['whole_s']:.3f} s, ratio {result['ttff']['ratio']:.3f} (goal <= 0.25)"
            )

            rs = [
                x
                for batch in _parallel(a.clients, lambda: [_render(base, a.short) for _ in range(a.requests)])
                for x in batch
            ]
            ok = [r for r in rs if r["status"] == 200]
            result["concurrent"] = {
                "clients": a.clients,
                "requests": len(rs),
                "ok": len(ok),
                "failed": len(rs) - len(ok),
                "ttff_p50": _pct([r["ttff"] for r in ok], 0.5),
                "ttff_p99": _pct([r["ttff"] for r in ok], 0.99),
                "total_p50": _pct([r["total"] for r in ok], 0.5),
                "total_p99": _pct([r["total"] for r in ok], 0.99),
            }
            print(f"{a.clients} clients x {a.requests}: {result['concurrent']}")
            result["rss_mib"] = _mem(proc.pid)
            result["hostile"] = _hostile(base, proc.pid)
            print(f"hostile input: {result['hostile']}")
        finally:
            proc.terminate()
            proc.wait(60)

        proc, base = _pod(registry, a.queue)
        try:
            rs = _parallel(a.burst, lambda: _render(base, a.short))
            accepted = [r for r in rs if r["status"] == 200]
            result["burst"] = {
                "requests": a.burst,
                "queue": a.queue,
                "ok": len(accepted),
                "ttff_p99_full_queue": _pct([r["ttff"] for r in accepted], 0.99),
                "rejected_429": sum(r["status"] == 429 for r in rs),
                "with_retry_after": sum(bool(r.get("retry_after")) for r in rs if r["status"] == 429),
                "other": sum(r["status"] not in (200, 429) for r in rs),
            }
            print(f"burst of {a.burst} against queue {a.queue}: {result['burst']}")
            result["rss_mib_burst_pod"] = _mem(proc.pid)
        finally:
            proc.terminate()
            proc.wait(60)
        result["promotion_under_load"] = _promotion_under_load(
            registry, candidate=a.candidate, load_s=1.0 if a.smoke else 3.0
        )
        print(f"promotion under load: {result['promotion_under_load']}")
        if not a.skip_long:
            result["flat_memory"] = _flat_memory(registry, a.seconds, a.long)
            print(f"flat memory: {result['flat_memory']}")
        print(f"pod memory: {result['rss_mib']} MiB")
        _summary(result)
    write_results(result, out, smoke=a.smoke)


def _summary(r: dict) -> None:
    """The goals side by side."""
    rows = [("time to first fragment / whole video", r["ttff"]["ratio"], "<= 0.25")]
    if "flat_memory" in r:
        rows.append(
            (
                f"peak RSS, {r['flat_memory']['long']['seconds']:g} s / {r['flat_memory']['short']['seconds']:g} s "
                "request",
                r["flat_memory"]["peak_ratio"],
                "<= 1.10",
            )
        )
    p = r["promotion_under_load"]
    rows.append(("failed requests across a --follow swap under load", p["failed"], "0"))
    rows.append(("p99 time to first fragment at a full queue (s)", r["burst"]["ttff_p99_full_queue"], ""))
    for label, h in r["hostile"].items():
        rows.append((f"{label}: status, seconds to answer", f"{h['status']}, {h['answer_s']}", "4xx, < 1"))
        rows.append((f"{label}: peak RSS after / before", round(h["peak_after_mib"] / h["peak_before_mib"], 4), "1.00"))
    width = max(len(x[0]) for x in rows)
    for name, value, goal in rows:
        print(f"  {name:<{width}}  {value!s:>12}  {goal}")


if __name__ == "__main__":
    main()
