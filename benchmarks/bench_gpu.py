"""The gpu-h100-8 target, built on this CPU-only host: compile wall, HBM fit per GPU, and the
compiler's estimate per chunk against the deadline, per stage, with each attention route.

    python benchmarks/bench_gpu.py [--quick] [--out benchmarks/results/gpu.json]
    python benchmarks/bench_gpu.py --smoke --out FILE   # tiny once (spec defaults); the tests run it

Every compile runs in a fresh `avatar-release compile --json` process (its peak RSS recorded) from
XLA's H100 description through the CUDA plugin; no GPU is used or needed. Rows: tiny with the spec
defaults and with every attention lever (the DiT's flash and the SR's block-sparse attention as
Triton kernels, the fused pre-attention as XLA ops); avatar-720p with the spec defaults and with
each Triton kernel routed back to XLA (`attention_kernel=xla`, `dit.attention=xla`), to show what
each kernel is worth; avatar-1080p with the spec defaults. Times per chunk are compiler estimates
(XLA's counts, the kernels' declared costs and NVIDIA's published H100 peaks), never measurements:
nothing here runs on a GPU. `--quick` skips the production shapes. Nothing is asserted.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from _builds import GIB, compile_rows  # noqa: E402 (benchmarks/_builds.py, beside this file)
from _out import out_path, write_results  # noqa: E402 (benchmarks/_out.py, beside this file)

TARGET = "gpu-h100-8"
LEVERS = ["dit.attention=flash", "attention_kernel=blocksparse", "fused_preattn=true"]


def _runs(args) -> list[tuple[str, list[str]]]:
    runs = [("tiny", [])]
    if args.smoke:
        return runs
    runs.append(("tiny", LEVERS))
    if not args.quick:
        runs += [
            ("avatar-720p", []),
            ("avatar-720p", ["attention_kernel=xla"]),
            ("avatar-720p", ["dit.attention=xla"]),
            ("avatar-1080p", []),
        ]
    return runs


def _print(rows: list[dict]) -> None:
    print(f"\ncompile on this CPU-only host for {TARGET} (fresh process each); per chunk: compiler estimate")
    print(
        f"{'pipeline':<13} {'set':<58} {'wall s':>7} {'GiB/GPU':>8} {'est ms':>8} {'deadline':>9} {'ratio':>6}  stages (ms)"
    )
    for r in rows:
        fit = r.get("memory_fit") or {}
        gib = f"{fit['total_bytes'] / GIB:.1f}" if fit else "-"
        c = (r.get("chunks") or [{}])[0]
        head = f"{r['pipeline']:<13} {' '.join(r['set']) or '(spec defaults)':<58} {r['wall_seconds']:>7.1f} {gib:>8}"
        if r["exit_code"] or not c:
            print(f"{head}  refused: {r.get('refused', '')[:120]}")
            continue
        stages = ", ".join(f"{s['key'].split('/')[0]} {s['seconds'] * 1e3:.1f}" for s in c["stages"])
        print(
            f"{head} {c['estimated_seconds'] * 1e3:>8.1f} {c['deadline_seconds'] * 1e3:>9.0f} {c['ratio']:>6.2f}  "
            f"{stages}"
        )


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true", help="tiny only: skip the production shapes")
    ap.add_argument("--smoke", action="store_true", help="tiny once, spec defaults")
    ap.add_argument("--out", help="write the JSON here (default benchmarks/results/gpu.json; --smoke: nowhere)")
    args = ap.parse_args()
    os.environ.setdefault("AVATAR_RELEASE_PROJECT", str(ROOT))  # the bundled pipeline's specs, wherever it runs
    rows = compile_rows([(pipeline, TARGET, sets) for pipeline, sets in _runs(args)])
    _print(rows)
    doc = {
        "label": f"compile-only evidence for {TARGET} on a CPU-only host; times per chunk are compiler "
        "estimates, not measurements",
        "smoke": args.smoke,
        "host_cpus": os.cpu_count(),
        "compiles": rows,
    }
    write_results(doc, out_path(args.out, "gpu", smoke=args.smoke), smoke=args.smoke)


if __name__ == "__main__":
    main()
