"""The tpu-v6e-8 target, built on this CPU-only host: compile time, HBM fit, estimated time per
chunk against the deadline (exposed collectives' wire time included), and hidden vs exposed
all-to-alls per Ulysses head-group count.

    python benchmarks/bench_tpu.py [--quick] [--no-before] [--replicated] [--out benchmarks/results/tpu.json]
    python benchmarks/bench_tpu.py --smoke --out FILE   # one tiny compile, G = 1, 2
    python benchmarks/bench_tpu.py --smoke --registry DIR --compiled --out FILE   # the tests' row

Production shapes are compiled twice, side by side: "before" (the stand-in shapes, dense DiT
attention and sharded decoder this project had until issue 20, reproduced with --set overrides:
DiT 32 blocks x 8 steps, SR 32 blocks, 1080p SR x2, `dit.attention=xla`, `vae.weights=sharded`,
`vae.norm_stats=grouped`) and "after" (the spec defaults derived in docs/concepts/production-shapes.md). Per pipeline and stage: estimated time per
chunk / deadline, compute-floor share, bound, HBM fraction, hidden/exposed all-to-alls, compile
wall time and peak RSS.

Every compile runs in a fresh `avatar-release compile --json` process (its peak RSS is recorded:
the production pipelines' 19B parameters would be 38 GB if materialised). Memory figures are
XLA's memory_analysis(); times per chunk are compiler estimates (XLA cost model + published
v6e peaks), never measurements: nothing here runs on a TPU. `--quick` skips the production
shapes (minutes each on 2 cores); ``--smoke`` compiles tiny once (spec defaults) and probes its
schedule for G = 1, 2 only. ``--compiled`` reads tiny's row from the build on ``--registry``'s dev
channel instead of compiling it (the tests hand it their session's TPU build of tiny, which
tests/integration/test_tpu_target.py compiled: the same libtpu compile is not paid twice per run);
that row has no process wall time or peak RSS. Nothing is asserted.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from _builds import GIB, compile_rows, compiled_row  # noqa: E402 (benchmarks/_builds.py, beside this file)
from _out import out_path, write_results  # noqa: E402 (benchmarks/_out.py, beside this file)

# The stand-in shapes, the dense DiT attention and the sharded decoder before issue 20
# (config.py's history). What --set cannot undo is today's compiler: the per-layer weight gather,
# the Ulysses all-to-alls, the SR's tall query blocks and the per-run cost count apply to both
# sides (benchmarks/README.md keeps the figures recorded before them).
_BEFORE_COMMON = [
    "dit.depth=32",
    "dit.steps=8",
    "sr.depth=32",
    "dit.attention=xla",
    "vae.weights=sharded",
    "vae.norm_stats=grouped",
]
BEFORE = {"avatar-720p": _BEFORE_COMMON, "avatar-1080p": _BEFORE_COMMON + ["sr_scale=2"]}


def _stage_rows(rows: list[dict]) -> None:
    """Per pipeline and stage, before and after side by side."""
    print("\nper stage (first bucket), compiler estimate per chunk on tpu-v6e-8, not a measurement")
    print(
        f"{'pipeline':<13} {'shapes':<7} {'stage':<9} {'est ms':>8} {'/deadline':>9} {'bound':>8} "
        f"{'compute share':>13} {'a2a hidden/exposed':>18} {'exposed wire ms':>15} {'GB/chip':>8}"
    )
    for r in rows:
        if not r["pipeline"].startswith("avatar-") or r["exit_code"] != 0:
            continue
        label = "before" if r["set"] else "after"
        c = r["chunks"][0]
        for st in c["stages"]:
            est = st["seconds"]
            a2a = "-" if st["all_to_alls"] is None else f"{st['all_to_alls_hidden']}/{st['all_to_alls_exposed']}"
            share = "-" if st["compute_share"] is None else f"{st['compute_share']:.2f}"
            wire = "-" if st["exposed_collective_seconds"] is None else f"{st['exposed_collective_seconds'] * 1e3:.1f}"
            print(
                f"{r['pipeline']:<13} {label:<7} {st['key']:<9} {est * 1e3:>8.0f} "
                f"{est / c['deadline_seconds']:>9.2f} {st['bound'] or '-':>8} {share:>13} {a2a:>18} {wire:>15} "
                f"{st['bytes_accessed'] / 1e9:>8.0f}"
            )


def _num(value: float | None, width: int, places: int) -> str:
    """A figure for the table; "-" where the row has none (a build read with --compiled)."""
    return f"{'-':>{width}}" if value is None else f"{value:>{width}.{places}f}"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true", help="tiny only: skip the production shapes")
    ap.add_argument("--no-before", action="store_true", help="skip the 'before' compiles of the production shapes")
    ap.add_argument("--replicated", action="store_true", help="also compile 720p with replicated weights (refused)")
    ap.add_argument("--smoke", action="store_true", help="tiny once (spec defaults), schedule probe G = 1, 2")
    ap.add_argument("--out", help="write the JSON here (default benchmarks/results/tpu.json; --smoke: nowhere)")
    ap.add_argument("--registry", help="with --compiled: the registry whose dev channel holds tiny for tpu-v6e-8")
    ap.add_argument("--compiled", action="store_true", help="read tiny's row from --registry's dev, compile nothing")
    args = ap.parse_args()
    if args.compiled and not args.registry:
        ap.error("--compiled reads the build on --registry's dev channel: give --registry DIR")
    os.environ.setdefault("AVATAR_RELEASE_PROJECT", str(ROOT))  # the bundled pipeline's specs, wherever it runs
    if args.smoke:
        args.quick = True

    runs = [] if args.compiled else [("tiny", "tpu-v6e-8", [])]
    if not args.smoke:
        runs += [
            ("tiny", "tpu-v6e-8", ["attention_kernel=blocksparse", "fused_preattn=true"]),
            ("tiny", "tpu-v6e-8", ["dit.attention=flash"]),
        ]
    if not args.quick:
        for pipeline in ("avatar-720p", "avatar-1080p"):
            if not args.no_before:
                runs.append((pipeline, "tpu-v6e-8", BEFORE[pipeline]))
            runs.append((pipeline, "tpu-v6e-8", []))
        if args.replicated:
            runs.append(("avatar-720p", "tpu-v6e-8-replicated", []))
    rows = ([compiled_row(Path(args.registry), "tiny", "tpu-v6e-8")] if args.compiled else []) + compile_rows(runs)

    from avatar_release.machine import configure_compile_env
    from avatar_release.specs import load_target

    configure_compile_env(load_target("tpu-v6e-8"))
    from model.schedule import probe_schedule

    probes = {}
    groups = (1, 2) if args.smoke else (1, 2, 4)
    for pipeline in ["tiny"] + ([] if args.quick else ["avatar-720p"]):
        print(f"schedule probe {pipeline} G={','.join(map(str, groups))} ...", flush=True)
        probes[pipeline] = [p.to_json() for p in probe_schedule(pipeline, "tpu-v6e-8", groups)]

    print("\ncompile on this CPU-only host for tpu-v6e-8 (fresh process each)")
    print(
        f"{'pipeline':<13} {'target':<21} {'set':<44} {'wall s':>7} {'rss GiB':>8} {'HBM/chip':>16} {'use':>6}"
        f" {'est/chunk':>10} {'deadline':>9} {'est/deadline':>12}"
    )
    for r in rows:
        fit = r.get("memory_fit") or {}
        hbm = f"{fit['total_bytes'] / GIB:.1f}/{fit['capacity_bytes'] / GIB:.0f} GiB" if fit else "-"
        use = f"{fit['total_bytes'] / fit['capacity_bytes']:.2f}" if fit else "-"
        c = (r.get("chunks") or [{}])[0]
        est = f"{c['estimated_seconds'] * 1e3:.0f} ms" if c.get("estimated_seconds") else "-"
        dl = f"{c['deadline_seconds'] * 1e3:.0f} ms" if c else "-"
        ratio = f"{c['ratio']:.2f}" if c.get("ratio") is not None else ("refused" if r["exit_code"] else "-")
        print(
            f"{r['pipeline']:<13} {r['target']:<21} {' '.join(r['set']) or '(spec defaults)':<44} "
            f"{_num(r['wall_seconds'], 7, 1)} {_num(r.get('peak_rss_gib'), 8, 2)} {hbm:>16} {use:>6} {est:>10} {dl:>9} "
            f"{ratio:>12}"
        )
    _stage_rows(rows)
    warned = [
        f"{r['pipeline']} {' '.join(r['set']) or '(spec defaults)'}: {len(r['xla_log'])}"
        for r in rows
        if r.get("xla_log")
    ]
    print("\ncompiler log lines (XLA warnings) per build: " + ("; ".join(warned) if warned else "none in any build"))
    print("\nall-to-alls of one SR attention layer compiled for tpu-v6e-8 (hidden = compute inside start/done)")
    for pipeline, ps in probes.items():
        for p in ps:
            share = p["hidden"] / p["all_to_alls"] if p["all_to_alls"] else 0
            print(
                f"  {pipeline:<12} G={p['groups']}: {p['all_to_alls']:>2} all-to-alls, {p['hidden']:>2} hidden, "
                f"{p['exposed']:>2} exposed (hidden share {share:.2f})"
            )
    doc = {
        "label": "compile-only evidence for tpu-v6e-8 on a CPU-only host; times per chunk are compiler "
        "estimates, not measurements",
        "smoke": args.smoke,
        "host_cpus": os.cpu_count(),
        "compiles": rows,
        "schedule": probes,
    }
    write_results(doc, out_path(args.out, "tpu", smoke=args.smoke), smoke=args.smoke)


if __name__ == "__main__":
    main()
