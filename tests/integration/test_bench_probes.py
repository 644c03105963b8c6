"""benchmarks/bench_probes.py keeps working: its smoke mode floods a real pod from another address
and shows what a flood did before (probes shared the render port's budget: 503) and now (a probe
listener of its own, a per-client cap: every probe answered)."""

from __future__ import annotations

import pytest

from tests.helpers import run_smoke

pytestmark = pytest.mark.slow


def test_smoke_mode_floods_a_real_pod_and_the_probe_port_answers_every_probe(registry_copy, tmp_path):
    root, _ = registry_copy
    out = tmp_path / "probes.json"
    doc = run_smoke("bench_probes.py", "--registry", str(root), out=out, timeout=300)
    own, shared = doc["own"], doc["shared"]
    assert own["probe_port"]["probes"] > 10 and own["probe_port"]["failures"] == 0
    assert own["render_port"]["failures"] == 0  # the per-client cap kept the flooder to its share
    assert own["flood"]["opened"] >= 2 * doc["connections"] and own["flood"]["closed_by_pod"] > 0
    # the flood is real: with the old behaviour (no probe port, no cap) /livez fails under it
    assert shared["render_port"]["failures"] > 0
