"""Two checkouts side by side on the release path of the bundled pipeline: compile wall, time to
ready and steady chunk of `render`, and the gate set's frame hashes (must be identical).

Each step runs the CLI of one checkout in a fresh process (``python -m avatar_release`` with the
checkout first on ``sys.path``, from inside it, so each finds its own manifests and pipeline), rounds
alternating between the checkouts so that drift on a shared 2-core host hits both alike. Prints
the after/before ratios and writes JSON. Nothing is asserted: figures, not tests.

    python benchmarks/bench_checkouts.py --before /path/to/old/checkout [--rounds 3] [--out FILE]
    python benchmarks/bench_checkouts.py --smoke      # this checkout only, one round (the tests run it)

``--smoke``: this checkout, one round of a compile and one render (a full round renders twice and
reports the second, its page cache warm), no gate.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(HERE))

from _out import out_path, write_results  # noqa: E402 (benchmarks/_out.py, beside this file)


def _cli(checkout: Path, registry: Path, *args: str) -> tuple[dict, float]:
    env = {**os.environ, "PYTHONPATH": str(checkout), "AVATAR_RELEASE_REGISTRY": str(registry)}
    env.pop("AVATAR_RELEASE_PROJECT", None)
    env.pop("AVATAR_RELEASE_MANIFESTS", None)
    t0 = time.perf_counter()
    out = subprocess.run(
        [sys.executable, "-m", "avatar_release", *args, "--json"], cwd=checkout, env=env, capture_output=True, text=True
    )
    wall = time.perf_counter() - t0
    if out.returncode != 0:
        raise SystemExit(f"{checkout}: avatar-release {' '.join(args)} exited {out.returncode}:\n{out.stderr[-2000:]}")
    return json.loads(out.stdout), wall


def one_round(checkout: Path, work: Path, gate: bool, renders: int = 2) -> dict:
    registry = Path(tempfile.mkdtemp(dir=work, prefix="reg-"))
    compiled, compile_wall = _cli(checkout, registry, "compile")
    done = [
        _cli(checkout, registry, "render", "--channel", "dev", "--out", str(registry / f"o{i}.mp4"))[0]
        for i in range(renders)
    ]
    r = done[-1]  # the second render: the page cache warm, as a restarted pod's would be (--smoke: one)
    steady = [c["seconds"] for c in r["per_chunk"][1:]] or [r["per_chunk"][0]["seconds"]]
    row = {
        "build_id": compiled["build_id"],
        "compile_process_seconds": round(compile_wall, 3),
        "compile_wall_seconds": compiled["wall_seconds"],
        "time_to_ready_seconds": r["cold_start"]["total"],
        "steady_chunk_seconds": round(statistics.median(steady), 4),
        "compiles": r["compiles"],
        "cold_start": r["cold_start"],
    }
    if gate:
        g, _ = _cli(
            checkout, registry, "gate", compiled["build_id"], "--baseline", "none", "--report", str(registry / "report")
        )
        hashes = g["result"]["frame_sha256"]
        row["gate_frames_sha256"] = hashlib.sha256(json.dumps(hashes).encode()).hexdigest()
        row["gate_status"] = g["status"]
    return row


def _median(rows: list[dict], key: str) -> float:
    return statistics.median(r[key] for r in rows)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--before", type=Path, default=None, help="the other checkout (the 'before')")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--smoke", action="store_true", help="this checkout only, one round, one render, no gate")
    ap.add_argument(
        "--out", type=Path, help="write the JSON here (default benchmarks/results/checkouts.json; --smoke: nowhere)"
    )
    a = ap.parse_args()
    sides = {"after": HERE} if a.smoke or a.before is None else {"before": a.before.resolve(), "after": HERE}
    rounds = 1 if a.smoke else a.rounds
    rows: dict[str, list[dict]] = {k: [] for k in sides}
    with tempfile.TemporaryDirectory() as work:
        for i in range(rounds):
            order = list(sides.items()) if i % 2 == 0 else list(sides.items())[::-1]  # ABBA: no side always second
            for name, path in order:
                rows[name].append(one_round(path, Path(work), gate=not a.smoke and i == 0, renders=1 if a.smoke else 2))
                print(f"round {i + 1} {name}: {json.dumps(rows[name][-1])}", file=sys.stderr)
    keys = ("compile_process_seconds", "time_to_ready_seconds", "steady_chunk_seconds")
    result = {
        "host_cores": os.cpu_count(),
        "rounds": rounds,
        "checkouts": {k: str(v) for k, v in sides.items()},
        "medians": {s: {k: _median(rows[s], k) for k in keys} for s in sides},
        "runs": rows,
    }
    if "before" in sides:
        result["ratio_after_over_before"] = {
            k: round(result["medians"]["after"][k] / result["medians"]["before"][k], 3) for k in keys
        }
        b, f = rows["before"][0].get("gate_frames_sha256"), rows["after"][0].get("gate_frames_sha256")
        result["gate_frames_identical"] = b is not None and b == f
    write_results(result, out_path(a.out, "checkouts", smoke=a.smoke), smoke=a.smoke, sort_keys=True)
    print(json.dumps({k: v for k, v in result.items() if k != "runs"}, indent=2, sort_keys=True))


if __name__ == "__main__":
    main()
