"""benchmarks/bench_trust.py keeps working: its smoke mode promotes a real build with a signed
statement and times a pod's cold load with and without the trust key, in fresh processes."""

from __future__ import annotations

import pytest

from tests.helpers import run_smoke

pytestmark = pytest.mark.slow


def test_smoke_mode_times_the_signature_check_as_a_share_of_a_cold_load(registry_copy, tmp_path):
    root, result = registry_copy
    out = tmp_path / "trust.json"
    doc = run_smoke("bench_trust.py", "--registry", str(root), out=out, timeout=600)
    assert doc["build_id"] == result.build_id and doc["runs"] == 1
    assert 0 < doc["signature_s"] < doc["cold_load_s"]["with_key"] and doc["cold_load_s"]["without_key"] > 0
    assert doc["evidence_sign_s"] > 0 and doc["evidence_verify_s"] > 0
    ratios = doc["ratios"]
    assert 0 < ratios["signature / cold load"] <= ratios["pre-load verification / cold load"] < 1
    assert doc["gate_s"] is None and ratios["evidence signing / gate"] is None  # --smoke: a stand-in gate result
