"""A band is evidence for the machine it was measured on: a gate applying one from another machine
says so, naming what differs (reassociation noise depends on the CPU's bf16 paths)."""

from __future__ import annotations

from pathlib import Path

from avatar_release.gates.steps import band_measured_elsewhere
from avatar_release.records import Band, parse_record

BAND = Path(__file__).resolve().parents[2] / "manifests" / "bands" / "tiny-cpu-8.json"


def _band() -> Band:
    return parse_record(Band, BAND.read_bytes(), where=str(BAND))


def test_the_same_machine_says_nothing():
    band = _band()
    assert band_measured_elsewhere(band, band.environment) is None


def test_another_cpu_is_named_by_the_features_that_differ():
    band = _band()
    features = [f for f in band.environment.cpu_features or [] if not f.startswith("amx")] + ["avx10"]
    other = band.environment.model_copy(update={"cpu_features": features, "fingerprint": "sha256:" + "0" * 64})
    note = band_measured_elsewhere(band, other)
    assert note is not None and "another machine" in note and "+avx10" in note and "gate calibrate" in note
    gone = {f for f in band.environment.cpu_features or []} - set(features)
    assert all(f"-{f}" in note for f in gone)
