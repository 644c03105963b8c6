"""The house's shape (benchmarks/bench_house.py --smoke), in the fast lane: the figures issue 27
names, and the goals held — a class over 300 lines, a module over 500 (outside the bundled
pipeline), a function over 60 or an unannotated public parameter fails here, naming it."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def test_the_house_keeps_its_goals(tmp_path):
    out = tmp_path / "house.json"
    proc = subprocess.run([sys.executable, str(REPO / "benchmarks" / "bench_house.py"), "--smoke", "--out", str(out)],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(out.read_text())
    f = doc["figures"]
    assert doc["goals"] == {"class_lines": 300, "module_lines": 500, "function_lines": 60, "unannotated_public": 0}
    assert f["read"]["modules"] > 100 and f["read"]["functions"] > 500 and f["params"] > 1000  # it read the tree
    assert f["largest_class"]["lines"] > 50 and f["largest_module"]["where"].startswith("avatar_release/")
    assert f["largest_bundled_module"]["where"].startswith(("model/", "kernels/"))
    assert f["classes_over_goal"] == [], f["classes_over_goal"]
    assert f["modules_over_goal"] == [], f["modules_over_goal"]
    assert f["functions_over_goal"] == [], f["functions_over_goal"]
    assert f["unannotated_public_params"] == 0, f["unannotated_public_examples"]
    assert all(doc["met"].values())
