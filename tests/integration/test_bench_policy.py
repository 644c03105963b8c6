"""benchmarks/bench_policy.py keeps working: its smoke mode gates a real build, promotes it to
prod through the CLI (the first-use identity signs the release approval) and times the policy and
a pod's trust checks."""

from __future__ import annotations

import pytest

from tests.helpers import run_smoke

pytestmark = pytest.mark.slow


def test_smoke_mode_promotes_to_prod_and_times_the_policy_and_the_pods_checks(registry_copy, tmp_path):
    root, result = registry_copy
    out = tmp_path / "policy.json"
    doc = run_smoke("bench_policy.py", "--registry", str(root), out=out, timeout=600)
    assert doc["build_id"] == result.build_id
    for channel in ("staging", "prod"):
        row = doc["promote"][channel]
        assert 0 < row["policy_seconds"] < row["cli_wall_seconds"]
    pod = doc["pod"]["swap_load"]
    assert pod["statement_seconds"] > 0 and pod["revocation_seconds"] > 0 and pod["load_seconds"] > 0
