"""Without a verdict to stand in for them, calibration renders the reference twice and refuses a
reference whose two fresh renders differ (gates/band.py); the renders here are stand-ins."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

from avatar_release.errors import Refusal
from avatar_release.gates import band


def _runs(monkeypatch, *hashes: list[str]) -> list[str]:
    labels: list[str] = []
    queue = list(hashes)

    def fresh_run(registry_uri, digest, gate_set_digest, *, label, on_chunk=None, **_):
        labels.append(label)
        return SimpleNamespace(flat_hashes=queue.pop(0), frames=np.zeros((1, 2, 2, 3), np.uint8), label=label)

    monkeypatch.setattr(band, "fresh_run", fresh_run)
    return labels


def _reference(monkeypatch, first: list[str], second: list[str]):
    labels = _runs(monkeypatch, first, second)
    ref = SimpleNamespace(build_id="tiny-cpu-8-000000000000", digest="sha256:" + "0" * 64)
    gs = SimpleNamespace(digest="sha256:" + "1" * 64, frames=1, requests=[])
    registry = SimpleNamespace(uri="memory://")
    return band._reference_run(registry, ref, gs, lambda message: None), labels


def test_two_identical_fresh_renders_are_the_reference(monkeypatch):
    run, labels = _reference(monkeypatch, ["a", "b"], ["a", "b"])
    assert labels == ["reference #1", "reference #2"] and run.label == "reference #1"


def test_two_fresh_renders_that_differ_are_refused(monkeypatch):
    with pytest.raises(Refusal, match="is not deterministic .two fresh runs differ.; a band measured against it"):
        _reference(monkeypatch, ["a", "b"], ["a", "c"])
