"""Sharded gates: wall time of a gate of ``tiny`` split into N = 1, 2, 4 shards run as parallel
processes (each its own `avatar-release gate BUILD --shard K/N`, both twins), plus the merge,
against the unsharded gate; and the merge's cost as a share of one shard.

The issue asks for ``small``; on the 2 shared cores of this machine a ``small`` gate takes many
minutes per run, so this measures ``tiny`` (same code path, 4 requests, 96 frames). On one host
the shards compete for the same cores: the speed-up a fleet of hosts would see is not measurable
here; what is measured is the overhead sharding adds (extra fresh processes, loads, partial
evidence, merge). Each configuration runs in fresh processes; the median of --runs is reported.

    python benchmarks/bench_shards.py [--runs 1] [--registry DIR] [--out benchmarks/results/shards.json]
    python benchmarks/bench_shards.py --smoke --registry DIR --out FILE   # N = 2 only, no unsharded gate; the tests run it

``--registry``: a registry whose dev channel holds an ungated tiny build (default: compile one); it
is copied, never changed. ``--smoke`` runs N = 2 alone (two shards side by side, then the merge),
without the unsharded gate: its ratios to the unsharded gate are null.
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
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("JAX_PLATFORMS", "cpu")

from _out import out_path, write_results  # noqa: E402 (benchmarks/_out.py, beside this file)

_CLI = [sys.executable, "-c", "import sys; from avatar_release.cli import main; sys.exit(main(sys.argv[1:]))"]


def _run(args: list[str], env: dict) -> float:
    t0 = time.perf_counter()
    subprocess.run([*_CLI, *args], check=True, capture_output=True, env=env)
    return time.perf_counter() - t0


def _sharded(build: str, reg: str, n: int, env: dict, tag: str) -> dict:
    env = {**env, "AVATAR_RELEASE_GATE_RUN_ID": tag}
    t0 = time.perf_counter()
    procs = [
        subprocess.Popen(
            [*_CLI, "gate", build, "--shard", f"{k}/{n}", "--registry", reg, "--json"],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env=env,
        )
        for k in range(n)
    ]
    shard_walls = []
    for p in procs:
        out, err = p.communicate()
        if p.returncode:
            raise SystemExit(f"shard failed: {err.decode()[-2000:]}")
        shard_walls.append(sum(r["wall_seconds"] for r in json.loads(out)["shard"]["runs"]))
    shards = time.perf_counter() - t0
    merge = _run(
        [
            "gate",
            "merge",
            build,
            "--baseline",
            "none",
            "--registry",
            reg,
            "--json",
            "--report",
            str(Path(reg).parent / f"rep-{tag}"),
        ],
        env,
    )
    return {
        "shards_wall_s": round(shards, 3),
        "merge_s": round(merge, 3),
        "total_s": round(shards + merge, 3),
        "slowest_shard_worker_s": round(max(shard_walls), 3),
    }


def _build(reg: str, given: str | None, env: dict) -> str:
    """The build to gate: the dev build of a copy of ``given``, or one compiled by the CLI."""
    if given:
        from avatar_release.registry import LocalRegistry, read_manifest

        shutil.copytree(given, reg)
        return read_manifest(LocalRegistry(reg, create=False), "dev")[0].build_id
    out = subprocess.run(
        [*_CLI, "compile", "--registry", reg, "--json"], check=True, capture_output=True, env=env, text=True
    )
    return json.loads(out.stdout)["build_id"]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=1)
    ap.add_argument(
        "--registry", help="a registry whose dev channel holds an ungated tiny build (default: compile one)"
    )
    ap.add_argument("--smoke", action="store_true", help="N = 2 only, no unsharded gate: proves the benchmark runs")
    ap.add_argument("--out", help="write the JSON here (default benchmarks/results/shards.json; --smoke: nowhere)")
    args = ap.parse_args()
    os.environ.setdefault("AVATAR_RELEASE_PROJECT", str(ROOT))  # the bundled pipeline's specs, wherever it runs
    runs, counts = (1, (2,)) if args.smoke else (args.runs, (1, 2, 4))
    with tempfile.TemporaryDirectory(prefix="bench-shards-") as tmp:
        env = {**os.environ, "AVATAR_RELEASE_CONFIG_DIR": f"{tmp}/cfg", "XLA_FLAGS": ""}
        env.pop("AVATAR_RELEASE_TRUST_POLICY", None)
        env.pop("AVATAR_RELEASE_GATE_KEY", None)
        reg = f"{tmp}/reg"
        build = _build(reg, args.registry, env)
        whole = (
            []
            if args.smoke
            else [
                _run(
                    ["gate", build, "--baseline", "none", "--registry", reg, "--json", "--report", f"{tmp}/rep-whole"],
                    env,
                )
                for _ in range(runs)
            ]
        )
        rows = {}
        for n in counts:
            measured = [_sharded(build, reg, n, env, f"n{n}-r{i}") for i in range(runs)]
            rows[n] = {k: statistics.median(r[k] for r in measured) for k in measured[0]}
    w = statistics.median(whole) if whole else None
    result = {
        "pipeline": "tiny",
        "smoke": args.smoke,
        "build_id": build,
        "cpus": os.cpu_count(),
        "runs": runs,
        "unsharded_s": None if w is None else round(w, 3),
        "sharded": {
            str(n): {
                **r,
                "vs_unsharded": None if w is None else round(r["total_s"] / w, 3),
                "merge_share_of_one_shard": round(r["merge_s"] / r["slowest_shard_worker_s"], 3),
            }
            for n, r in rows.items()
        },
    }
    print(f"unsharded gate of tiny: {'-' if w is None else f'{w:.1f}'}s on {os.cpu_count()} cores")
    for n, r in result["sharded"].items():
        vs = "-" if r["vs_unsharded"] is None else f"{r['vs_unsharded']:.2f}x"
        print(
            f"  N={n}: shards {r['shards_wall_s']:.1f}s (in parallel) + merge {r['merge_s']:.1f}s = {r['total_s']:.1f}s "
            f"-> {vs} the unsharded gate; merge = {r['merge_share_of_one_shard']:.0%} of one shard"
        )
    write_results(result, out_path(args.out, "shards", smoke=args.smoke), smoke=args.smoke)


if __name__ == "__main__":
    main()
