"""The node cache on loopback: a build's blobs pulled from a CNCF distribution server (Debian
``docker-registry``, as the tests start it) once into the cache, side by side, then read back.

A stand-in build: ``--blobs`` blobs of random bytes (nothing compresses), ``--size-mib`` in all,
pushed to the server. Each mode runs in a fresh process (a pod), the modes alternated, ``--runs``
times each (min / median / max of the wall time to have every blob's bytes in a buffer of ours):

* ``direct``: no cache: every blob streamed from the registry through its sha256 check, 8 at a
  time (what a pod without a cache does for its weight chunks);
* ``first pull, 1 at a time``: an empty cache; the blobs pulled into it one after another
  (``NodeCache.prefetch``), then read back into the buffers;
* ``first pull, 8 at a time``: an empty cache read by 8 threads, each read pulling its blob into the
  cache and reading it back as soon as it is in (what a loader's 8 weight workers do);
* ``warm node``: the cache already holds them (another pod pulled them): read back, no blob GET;
* ``plain files``: the same bytes read from plain files on the same disk (``readinto``), 8 at a
  time: the floor a warm node can approach.

Goals (printed beside the figures): first pull 8 at a time at most 1.2x ``direct`` (the cache costs
one write of the bytes); warm node at most 1.5x plain files and under 0.5x ``direct``. Nothing is
asserted. The server's files and the cache live in one temporary directory on this machine (page
cache warm after the first run, as on a node that just pulled).

    python benchmarks/bench_node_cache.py [--size-mib 512] [--blobs 16] [--runs 3] [--out FILE]
    python benchmarks/bench_node_cache.py --smoke --out FILE   # 8 blobs of 256 KiB, one run each; the tests run it
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from _out import out_path, write_results  # noqa: E402 (benchmarks/_out.py, beside this file)

MODES = ("direct", "first pull, 1 at a time", "first pull, 8 at a time", "warm node", "plain files")
GOALS = {"first pull, 8 at a time / direct": 1.2, "warm node / plain files": 1.5, "warm node / direct": 0.5}


# ---- one run, in a fresh process ------------------------------------------------------------------------
class _Ref:
    def __init__(self, digest: str, size: int):
        self.digest, self.size = digest, size


def _child(mode: str, uri: str, cache: str, files: str, blobs: list[tuple[str, int]]) -> None:
    from avatar_release.registry import CachedRegistry, NodeCache, OciRegistry

    bufs = [bytearray(size) for _, size in blobs]
    store = OciRegistry(uri, lock_dir=tempfile.gettempdir())
    cached = CachedRegistry(store, NodeCache(cache, max_bytes=1 << 40, concurrency=1 if "1 at" in mode else 8))

    def direct(i: int) -> None:
        digest, size = blobs[i]

        def sink(pieces) -> None:
            at = 0
            for p in pieces:
                bufs[i][at : at + len(p)] = p
                at += len(p)

        store.stream_blob(digest, size, sink)

    def from_cache(i: int) -> None:
        cached.read_blob_into(blobs[i][0], blobs[i][1], memoryview(bufs[i]))

    def plain(i: int) -> None:
        with open(Path(files) / blobs[i][0].split(":")[1], "rb", buffering=0) as f:
            f.readinto(bufs[i])

    t0 = time.perf_counter()
    if mode == "first pull, 1 at a time":  # all pulled first, one after another, then read
        cached.prefetch([_Ref(d, s) for d, s in blobs])
    one = direct if mode == "direct" else plain if mode == "plain files" else from_cache
    with ThreadPoolExecutor(max_workers=8) as pool:
        list(pool.map(one, range(len(blobs))))
    seconds = time.perf_counter() - t0
    print(json.dumps({"seconds": seconds, "requests": store.transport.requests, "pulls": cached.cache.stats.pulls}))


# ---- the parent -----------------------------------------------------------------------------------------
def _run(mode: str, uri: str, cache: Path, files: Path, blobs: list[tuple[str, int]]) -> dict:
    if mode.startswith("first pull"):
        shutil.rmtree(cache, ignore_errors=True)
    proc = subprocess.run(
        [
            sys.executable,
            __file__,
            "--child",
            mode,
            "--uri",
            uri,
            "--cache",
            str(cache),
            "--files",
            str(files),
            "--blob-list",
            json.dumps(blobs),
        ],
        capture_output=True,
        text=True,
        check=False,
    )
    if proc.returncode:
        raise SystemExit(f"{mode}: exit {proc.returncode}\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def bench(size_mib: float, n_blobs: int, runs: int, tmp: Path) -> dict:
    from avatar_release.registry import CachedRegistry, NodeCache, OciRegistry
    from tests.oci_server import OciServer  # the same server the tests start

    exe = shutil.which("docker-registry") or shutil.which("registry")
    if exe is None:
        return {"skipped": "docker-registry is not installed (Debian: apt-get install docker-registry)"}
    server = OciServer(exe, tmp / "server").start()
    try:
        uri = server.uri("bench/node-cache")
        store = OciRegistry(uri, lock_dir=tmp / "locks")
        files, blobs = tmp / "files", []
        files.mkdir()
        each = int(size_mib * (1 << 20)) // n_blobs
        for _ in range(n_blobs):
            data = os.urandom(each)
            digest = store.put_blob(data)
            (files / digest.split(":")[1]).write_bytes(data)
            blobs.append((digest, each))
        warm = tmp / "warm-cache"  # filled once: the node another pod already pulled to
        CachedRegistry(store, NodeCache(warm, max_bytes=1 << 40)).prefetch([_Ref(d, s) for d, s in blobs])
        samples: dict[str, list[dict]] = {m: [] for m in MODES}
        for _ in range(runs):  # alternated: each round runs every mode once
            for mode in MODES:
                cache = warm if mode == "warm node" else tmp / "cache"
                samples[mode].append(_run(mode, uri, cache, files, blobs))
    finally:
        server.stop()
    medians = {m: statistics.median(r["seconds"] for r in rows) for m, rows in samples.items()}
    ratios = {
        k: medians[k.split(" / ")[0]] / medians[k.split(" / ")[1]]
        for k in (*GOALS, "first pull, 8 at a time / first pull, 1 at a time")
    }
    return {
        "bytes": each * n_blobs,
        "blobs": n_blobs,
        "runs": runs,
        "modes": {
            m: {
                "min_s": min(r["seconds"] for r in rows),
                "median_s": medians[m],
                "max_s": max(r["seconds"] for r in rows),
                "blob_pulls": [r["pulls"] for r in rows],
                "requests": [r["requests"] for r in rows],
            }
            for m, rows in samples.items()
        },
        "ratios": ratios,
        "goals": {k: {"goal_at_most": g, "median_ratio": ratios[k], "met": ratios[k] <= g} for k, g in GOALS.items()},
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--size-mib", type=float, default=512.0)
    ap.add_argument("--blobs", type=int, default=16)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--smoke", action="store_true")
    ap.add_argument("--out", default=None)
    ap.add_argument("--child", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--uri", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--cache", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--files", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--blob-list", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        _child(args.child, args.uri, args.cache, args.files, [tuple(b) for b in json.loads(args.blob_list)])
        return
    if args.smoke:
        args.size_mib, args.blobs, args.runs = 2.0, 8, 1
    free = shutil.disk_usage(tempfile.gettempdir()).free
    if free < 5 * args.size_mib * (1 << 20):
        raise SystemExit(f"needs {5 * args.size_mib:.0f} MiB free in {tempfile.gettempdir()}, has {free >> 20}")
    with tempfile.TemporaryDirectory(prefix="bench-node-cache-") as tmp:
        doc = bench(args.size_mib, args.blobs, args.runs, Path(tmp))
    doc = {"benchmark": "node_cache", "smoke": args.smoke, "machine": f"{os.cpu_count()} cores", **doc}
    write_results(doc, out_path(args.out, "node_cache", smoke=args.smoke), smoke=args.smoke, echo=True)


if __name__ == "__main__":
    main()
