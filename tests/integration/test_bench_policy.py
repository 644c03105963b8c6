"""benchmarks/bench_policy.py keeps working: its smoke mode gates a real build, promotes it to
prod through the CLI (the first-use identity signs the release approval) and times the policy and
a pod's trust checks."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]


def test_smoke_mode_promotes_to_prod_and_times_the_policy_and_the_pods_checks(registry_copy, tmp_path):
    root, result = registry_copy
    out = tmp_path / "policy.json"
    subprocess.run([sys.executable, str(REPO / "benchmarks" / "bench_policy.py"), "--smoke", "--registry", str(root),
                    "--out", str(out)], check=True, capture_output=True, text=True, cwd=tmp_path, timeout=600)
    doc = json.loads(out.read_text())
    assert doc["build_id"] == result.build_id
    for channel in ("staging", "prod"):
        row = doc["promote"][channel]
        assert 0 < row["policy_seconds"] < row["cli_wall_seconds"]
    pod = doc["pod"]["swap_load"]
    assert pod["statement_seconds"] > 0 and pod["revocation_seconds"] > 0 and pod["load_seconds"] > 0
