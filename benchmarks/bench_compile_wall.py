"""Two checkouts side by side on `compile` alone: the bundled pipeline (tiny), the example project
(examples/own-pipeline, puppet-tiny) and, where the checkout has it, the mosaic test project (two
buckets, one bucket-independent stage). Wall seconds of the compile process and of its compile step,
executables compiled, and the build ids (the same inputs must give the same id in both checkouts).

Each compile runs the CLI of one checkout in a fresh process (``python -m avatar_release`` with the
checkout first on ``sys.path``) from a copy of the project outside both checkouts, into a fresh
registry; rounds alternate which checkout goes first (ABBA), so drift on a shared host hits both
alike. Prints the after/before ratios of the medians and writes JSON. Nothing is asserted.

    python benchmarks/bench_compile_wall.py --before /path/to/old/checkout [--rounds 3] [--out FILE]
    python benchmarks/bench_compile_wall.py --smoke      # this checkout, the example project, one round
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

HERE = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(HERE))

from _out import out_path, write_results  # noqa: E402 (benchmarks/_out.py, beside this file)

# name -> (folder of the checkout holding the project, or "" for the checkout itself; pipeline spec)
PROJECTS = {
    "tiny": ("", "tiny"),
    "puppet-tiny": ("examples/own-pipeline", "puppet-tiny"),
    "mosaic-tiny": ("tests/projects/mosaic", "mosaic-tiny"),
}


def _project(checkout: Path, folder: str, work: Path) -> Path | None:
    """Where the compile runs: the checkout itself (the bundled pipeline), or a copy of its project."""
    if not folder:
        return checkout
    src = checkout / folder
    if not src.is_dir():
        return None
    copy = Path(tempfile.mkdtemp(dir=work, prefix="proj-")) / src.name
    shutil.copytree(src, copy, ignore=shutil.ignore_patterns("__pycache__", ".avatar-release", "gate-reports"))
    return copy


def compile_once(checkout: Path, project: str, work: Path) -> dict | None:
    folder, spec = PROJECTS[project]
    where = _project(checkout, folder, work)
    if where is None:
        return None
    registry = Path(tempfile.mkdtemp(dir=work, prefix="reg-"))
    env = {**os.environ, "PYTHONPATH": str(checkout), "AVATAR_RELEASE_REGISTRY": str(registry)}
    for k in ("AVATAR_RELEASE_PROJECT", "AVATAR_RELEASE_MANIFESTS", "XLA_FLAGS"):
        env.pop(k, None)
    t0 = time.perf_counter()
    out = subprocess.run(
        [sys.executable, "-m", "avatar_release", "compile", "--pipeline", spec, "--target", "cpu-8", "--json"],
        cwd=where,
        env=env,
        capture_output=True,
        text=True,
    )
    wall = time.perf_counter() - t0
    if out.returncode != 0:
        raise SystemExit(f"{checkout}: compile {spec} exited {out.returncode}:\n{out.stderr[-2000:]}")
    doc = json.loads(out.stdout)
    shared = doc.get("shared", {})
    return {
        "build_id": doc["build_id"],
        "process_seconds": round(wall, 3),
        "wall_seconds": doc["wall_seconds"],
        "compile_wall_seconds": doc["compile_wall_seconds"],
        "executables": len(doc["executables"]),
        "compiled": len(doc["executables"]) - len(shared),
        "shared": shared,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--before", type=Path, default=None, help="the other checkout (the 'before')")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--projects", default=",".join(PROJECTS), help=f"comma-separated, of {', '.join(PROJECTS)}")
    ap.add_argument("--smoke", action="store_true", help="this checkout only, the example project, one round")
    ap.add_argument(
        "--out", type=Path, help="write the JSON here (default benchmarks/results/compile_wall.json; --smoke: nowhere)"
    )
    a = ap.parse_args()
    sides = {"after": HERE} if a.smoke or a.before is None else {"before": a.before.resolve(), "after": HERE}
    projects = ["puppet-tiny"] if a.smoke else a.projects.split(",")
    rounds = 1 if a.smoke else a.rounds
    runs: dict[str, dict[str, list[dict]]] = {p: {s: [] for s in sides} for p in projects}
    with tempfile.TemporaryDirectory() as work:
        for i in range(rounds):
            order = list(sides.items()) if i % 2 == 0 else list(sides.items())[::-1]  # ABBA: no side always second
            for project in projects:
                for name, path in order:
                    row = compile_once(path, project, Path(work))
                    if row is not None:
                        runs[project][name].append(row)
                        print(f"round {i + 1} {project} {name}: {json.dumps(row)}", file=sys.stderr)
    keys = ("process_seconds", "compile_wall_seconds")
    result: dict = {
        "host_cores": os.cpu_count(),
        "rounds": rounds,
        "checkouts": {k: str(v) for k, v in sides.items()},
        "projects": {},
    }
    for project, by_side in runs.items():
        have = {s: rows for s, rows in by_side.items() if rows}
        entry: dict = {
            "medians": {s: {k: statistics.median(r[k] for r in rows) for k in keys} for s, rows in have.items()},
            "compiled": {s: rows[0]["compiled"] for s, rows in have.items()},
            "executables": {s: rows[0]["executables"] for s, rows in have.items()},
            "build_ids": {s: sorted({r["build_id"] for r in rows}) for s, rows in have.items()},
            "runs": have,
        }
        if len(have) == 2:
            m = entry["medians"]
            entry["ratio_after_over_before"] = {k: round(m["after"][k] / m["before"][k], 3) for k in keys}
            entry["same_build_id"] = entry["build_ids"]["before"] == entry["build_ids"]["after"]
        result["projects"][project] = entry
    write_results(result, out_path(a.out, "compile_wall", smoke=a.smoke), smoke=a.smoke, sort_keys=True)
    print(
        json.dumps(
            {p: {k: v for k, v in e.items() if k != "runs"} for p, e in result["projects"].items()},
            indent=2,
            sort_keys=True,
        )
    )


if __name__ == "__main__":
    main()
