"""Sharded gates: wall time of a gate of ``tiny`` split into N = 1, 2, 4 shards run as parallel
processes (each its own `avatar-release gate BUILD --shard K/N`, both twins), plus the merge,
against the unsharded gate; and the merge's cost as a share of one shard.

The issue asks for ``small``; on the 2 shared cores of this machine a ``small`` gate takes many
minutes per run, so this measures ``tiny`` (same code path, 4 requests, 96 frames). On one host
the shards compete for the same cores: the speed-up a fleet of hosts would see is not measurable
here; what is measured is the overhead sharding adds (extra fresh processes, loads, partial
evidence, merge). Each configuration runs in fresh processes; the median of --runs is reported.

    python benchmarks/bench_shards.py [--runs 1] [--out benchmarks/results/shards.json]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("JAX_PLATFORMS", "cpu")
_CLI = [sys.executable, "-c", "import sys; from avatar_release.cli import main; sys.exit(main(sys.argv[1:]))"]


def _run(args: list[str], env: dict) -> float:
    t0 = time.perf_counter()
    subprocess.run([*_CLI, *args], check=True, capture_output=True, env=env)
    return time.perf_counter() - t0


def _sharded(build: str, reg: str, n: int, env: dict, tag: str) -> dict:
    env = {**env, "AVATAR_RELEASE_GATE_RUN_ID": tag}
    t0 = time.perf_counter()
    procs = [subprocess.Popen([*_CLI, "gate", build, "--shard", f"{k}/{n}", "--registry", reg, "--json"],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env) for k in range(n)]
    shard_walls = []
    for p in procs:
        out, err = p.communicate()
        if p.returncode:
            raise SystemExit(f"shard failed: {err.decode()[-2000:]}")
        shard_walls.append(sum(r["wall_seconds"] for r in json.loads(out)["shard"]["runs"]))
    shards = time.perf_counter() - t0
    merge = _run(["gate", "merge", build, "--baseline", "none", "--registry", reg, "--json",
                  "--report", str(Path(reg).parent / f"rep-{tag}")], env)
    return {"shards_wall_s": round(shards, 3), "merge_s": round(merge, 3), "total_s": round(shards + merge, 3),
            "slowest_shard_worker_s": round(max(shard_walls), 3)}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=1)
    ap.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "shards.json"))
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-shards-") as tmp:
        env = {**os.environ, "AVATAR_RELEASE_CONFIG_DIR": f"{tmp}/cfg", "XLA_FLAGS": ""}
        env.pop("AVATAR_RELEASE_TRUST_POLICY", None)
        env.pop("AVATAR_RELEASE_GATE_KEY", None)
        reg = f"{tmp}/reg"
        out = subprocess.run([*_CLI, "compile", "--registry", reg, "--json"], check=True, capture_output=True,
                             env=env, text=True)
        build = json.loads(out.stdout)["build_id"]
        whole = [_run(["gate", build, "--baseline", "none", "--registry", reg, "--json",
                       "--report", f"{tmp}/rep-whole"], env) for _ in range(args.runs)]
        rows = {}
        for n in (1, 2, 4):
            runs = [_sharded(build, reg, n, env, f"n{n}-r{i}") for i in range(args.runs)]
            rows[n] = {k: statistics.median(r[k] for r in runs) for k in runs[0]}
    w = statistics.median(whole)
    result = {"pipeline": "tiny", "cpus": os.cpu_count(), "runs": args.runs, "unsharded_s": round(w, 3),
              "sharded": {str(n): {**r, "vs_unsharded": round(r["total_s"] / w, 3),
                                   "merge_share_of_one_shard": round(r["merge_s"] / r["slowest_shard_worker_s"], 3)}
                          for n, r in rows.items()}}
    print(f"unsharded gate of tiny: {w:.1f}s on {os.cpu_count()} cores")
    for n, r in result["sharded"].items():
        print(f"  N={n}: shards {r['shards_wall_s']:.1f}s (in parallel) + merge {r['merge_s']:.1f}s = {r['total_s']:.1f}s "
              f"-> {r['vs_unsharded']:.2f}x the unsharded gate; merge = {r['merge_share_of_one_shard']:.0%} of one shard")
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    print(f"written to {args.out}")


if __name__ == "__main__":
    main()
