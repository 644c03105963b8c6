"""The gate set's identity covers the rule by which its pictures reach the pipeline's size."""

from __future__ import annotations

from pathlib import Path

from avatar_release.gates import gateset
from tests.helpers import cpu_manifest

DATA = Path(__file__).resolve().parent.parent / "data"


def test_the_gate_set_digest_moves_with_the_fit_rule(monkeypatch):
    manifest = cpu_manifest()
    gs = gateset.gate_set(manifest)
    assert gs.version == 3
    # The pictures are drawn at the pipeline's size, so another rule renders the same pixels;
    # the gate set is still another one, and results gated under the old rule stop comparing.
    monkeypatch.setattr(gateset, "_FIT", "contain")
    assert gateset.gate_set(manifest).digest != gs.digest
    monkeypatch.setattr(gateset, "_FIT", "cover")
    assert gateset.gate_set(manifest).digest == gs.digest
