"""How long the command line takes to answer when it does no work: help, a typo, a usage error,
a missing registry. Each is a fresh ``python -m avatar_release`` process (what a user waits for),
timed end to end; the median of ``--runs`` is kept, with the modules each one imported.

Goal (issue 29, "Measure"): under 0.5 s each, and no jax import for any.

    python benchmarks/bench_cli.py [--runs 7] [--out benchmarks/results/cli.json]
    python benchmarks/bench_cli.py --smoke          # one run each; the tests run it
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

from _out import out_path, write_results  # noqa: E402 (benchmarks/_out.py, beside this file)

GOAL_S = 0.5
CASES = {  # name -> (arguments, the exit code a user sees)
    "help": (["--help"], 0),
    "command help": (["promote", "--help"], 0),
    "mistyped command": (["promot", "x"], 2),
    "mistyped channel": (["promote", "x", "--to", "production"], 2),
    "no registry": (["ls"], 3),
}
HEAVY = ("jax", "jaxlib", "numpy", "torch", "pydantic", "requests")
# Runs the CLI as `python -m avatar_release` does, then says which heavy modules it loaded.
_PROBE = (
    "import runpy, sys, json\nsys.argv = ['avatar-release'] + sys.argv[1:]\ncode = 0\n"
    "try:\n    runpy.run_module('avatar_release', run_name='__main__')\n"
    "except SystemExit as e:\n    code = e.code if isinstance(e.code, int) else 1\n"
    f"print(json.dumps({{'rc': code, 'heavy': sorted(m for m in {HEAVY!r} if m in sys.modules)}}), "
    "file=sys.__stderr__)\n"
)


def one(args: list[str], cwd: str, env: dict[str, str]) -> tuple[float, int, list[str]]:
    t0 = time.perf_counter()
    p = subprocess.run(
        [sys.executable, "-c", _PROBE, *args], capture_output=True, text=True, cwd=cwd, env=env, timeout=120
    )
    seconds = time.perf_counter() - t0
    doc = json.loads(p.stderr.strip().splitlines()[-1])
    return seconds, doc["rc"], doc["heavy"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=7)
    ap.add_argument("--smoke", action="store_true")
    ap.add_argument("--out", default=None)
    a = ap.parse_args()
    runs = 1 if a.smoke else a.runs
    with tempfile.TemporaryDirectory() as cwd:  # no project, no registry, no config here or above
        env = {k: v for k, v in os.environ.items() if not k.startswith("AVATAR_RELEASE_")}
        env["AVATAR_RELEASE_CONFIG_DIR"] = str(Path(cwd) / "config")
        env["PYTHONPATH"] = str(ROOT)
        cases = {}
        for name, (args, rc) in CASES.items():
            times, heavy, codes = [], set(), set()
            for _ in range(runs):
                s, code, loaded = one(args, cwd, env)
                times.append(s)
                heavy |= set(loaded)
                codes.add(code)
            cases[name] = {
                "args": args,
                "exit_codes": sorted(codes),
                "expected_exit_code": rc,
                "median_s": round(statistics.median(times), 4),
                "max_s": round(max(times), 4),
                "imports_jax": "jax" in heavy,
                "heavy_imports": sorted(heavy),
                "meets_goal": statistics.median(times) < GOAL_S and "jax" not in heavy,
            }
    doc = {"benchmark": "cli", "goal_s": GOAL_S, "runs": runs, "cpu_count": os.cpu_count(), "cases": cases}
    write_results(doc, out_path(a.out, "cli", smoke=a.smoke), smoke=a.smoke, echo=True)


if __name__ == "__main__":
    main()
