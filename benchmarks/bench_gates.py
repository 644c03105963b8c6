"""Gate cost: a full gate as a multiple of one plain render of the gate set.

"One plain render" is what a single serving process does with the gate set: start, verify
and load the build, render every request. A gate does that twice (the twin baseline), in
fresh processes, then compares with the baseline and stores its evidence. Goal: <= 3x.

    python benchmarks/bench_gates.py [--pipeline tiny] [--registry DIR] [--out benchmarks/results/gates.json]
    python benchmarks/bench_gates.py --smoke --registry DIR --out FILE   # no tier-2 candidate; the tests run it

Nothing is asserted; ratios are printed side by side and written as JSON. ``--registry``: a
registry whose dev channel holds an ungated build of the pipeline (default: compile one); the gate
stores its result there. ``--smoke`` skips the candidate (a second compile) and its tier-2 gate.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from _out import ROOT, out_path, write_results  # noqa: E402 (benchmarks/_out.py, beside this file)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--pipeline", default="tiny")
    ap.add_argument("--registry", help="a registry whose dev channel holds an ungated build (default: compile one)")
    ap.add_argument("--smoke", action="store_true", help="the base build's gate only, no tier-2 candidate")
    ap.add_argument("--out", help="write the JSON here (default benchmarks/results/gates.json; --smoke: nowhere)")
    args = ap.parse_args()
    os.environ.setdefault("AVATAR_RELEASE_PROJECT", str(ROOT))  # the bundled pipeline's specs, wherever it runs

    from avatar_release.machine import configure_host_devices

    configure_host_devices(8)
    from avatar_release.compile import compile_build
    from avatar_release.gates import run_gate
    from avatar_release.gates._fresh import fresh_run
    from avatar_release.gates.band import band_path
    from avatar_release.gates.gateset import gate_set
    from avatar_release.registry import LocalRegistry, read_manifest

    with tempfile.TemporaryDirectory() as tmp:
        reg = LocalRegistry(args.registry or Path(tmp) / "reg")
        if args.registry is None:
            compile_build(args.pipeline, "cpu-8", registry=reg)
        base, manifest = read_manifest(reg, "dev")
        tier2_wanted = not args.smoke and band_path(args.pipeline, "cpu-8").is_file()
        cand = (
            compile_build(args.pipeline, "cpu-8", registry=reg, overrides={"matmul_k_split": "2"}, move_dev=False)
            if tier2_wanted
            else None
        )
        gs = gate_set(manifest)

        plain = fresh_run(reg.uri, base.digest, gs.digest, label="plain")
        t0 = time.perf_counter()
        first = run_gate(base.build_id, reg, baseline="none")
        gate_alone = time.perf_counter() - t0
        t0 = time.perf_counter()
        tier2 = run_gate(cand.build_id, reg, baseline=base.build_id) if cand else None
        gate_vs_baseline = time.perf_counter() - t0 if tier2 else None

    rows = [
        ("gate, no baseline / plain render", gate_alone / plain.wall_seconds, 3.0),
    ]
    if gate_vs_baseline:
        rows.append(("gate vs baseline, tier 2 + band / plain render", gate_vs_baseline / plain.wall_seconds, 3.0))
    result = {
        "pipeline": args.pipeline,
        "smoke": args.smoke,
        "build_id": base.build_id,
        "gate_set": {"requests": len(gs.requests), "frames": gs.frames},
        "plain_render_s": round(plain.wall_seconds, 3),
        "plain_breakdown_s": plain.seconds,
        "gate_alone_s": round(gate_alone, 3),
        "gate_alone_status": first.result.status,
        "gate_vs_baseline_s": round(gate_vs_baseline, 3) if gate_vs_baseline else None,
        "gate_vs_baseline_status": tier2.result.status if tier2 else None,
        "gate_breakdown_s": (tier2 or first).result.seconds,
        "ratios": {name: {"value": round(v, 3), "goal_max": goal} for name, v, goal in rows},
        "cpu_count": os.cpu_count(),
    }
    print(f"gate set: {len(gs.requests)} requests, {gs.frames} frames; plain render {plain.wall_seconds:.1f}s")
    print(f"{'measure':<50} {'ratio':>7} {'goal':>7}")
    for name, v, goal in rows:
        print(f"{name:<50} {v:7.2f} {'<= ' + str(goal):>7}  {'ok' if v <= goal else 'MISSED'}")
    write_results(result, out_path(args.out, "gates", smoke=args.smoke), smoke=args.smoke)


if __name__ == "__main__":
    main()
