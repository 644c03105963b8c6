"""What a chunk's deadline means on this host: emulated devices say "slower than the target", the
build's own hardware says "missed"; the real-time factor either way."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from avatar_release.runtime import PaceTally, pace_of
from tests.helpers import cpu_manifest


@dataclass
class _C:
    seconds: float
    deadline: float


def _manifest(backend: str, devices: int, kind: str):
    m = cpu_manifest()
    return m.model_copy(
        update={
            "platform": m.platform.model_copy(update={"backend": backend, "device_count": devices, "device_kind": kind})
        }
    )


def test_virtual_cpu_devices_are_emulated_and_their_overruns_are_not_misses():
    pace = pace_of(_manifest("cpu", 8, "cpu"), host_cores=2)
    chunks = [_C(0.9, 0.32), _C(0.6, 0.32), _C(0.1, 0.32)]
    assert pace.emulated and pace.where == "8 emulated cpu devices on 2 host cores"
    assert pace.miss_label() == "slower than playback (emulated host)"
    doc = pace.to_json(PaceTally.of(chunks))
    assert doc["chunks_over_deadline"] == 2 and doc["misses_on_target"] == 0
    assert doc["realtime_factor"] == pytest.approx(0.96 / 1.6, rel=1e-3)
    text = pace.summary(PaceTally.of(chunks))
    assert "2 of 3 chunks slower than playback" in text and "not a deadline miss" in text and "0.60x real time" in text


def test_on_the_builds_own_accelerators_a_miss_is_a_miss():
    pace = pace_of(_manifest("tpu", 8, "TPU v6 lite"), host_cores=2)
    chunks = [_C(0.5, 0.32), _C(0.1, 0.32)]
    assert not pace.emulated and pace.miss_label() == "MISSED" and pace.where == "8 x TPU v6 lite"
    assert pace.to_json(PaceTally.of(chunks))["misses_on_target"] == 1
    assert "1 of 2 chunks MISSED their deadline on the build's own hardware" in pace.summary(PaceTally.of(chunks))
    assert pace.summary(PaceTally.of([_C(0.1, 0.32)])).endswith("every chunk in time")


def test_one_cpu_device_is_the_host_itself_not_an_emulation():
    assert not pace_of(_manifest("cpu", 1, "cpu"), host_cores=2).emulated


def test_the_realtime_factor_is_media_seconds_per_rendered_second():
    assert PaceTally.of([_C(2.0, 1.0), _C(2.0, 1.0)]).realtime_factor == 0.5
    assert PaceTally.of([]).realtime_factor is None


def test_a_deadline_miss_is_counted_only_on_the_builds_own_hardware():
    """/metrics, /healthz, the request log and the render summary all count misses with Pace.misses."""
    chunks = PaceTally.of([_C(0.5, 0.32), _C(0.4, 0.32), _C(0.1, 0.32)])
    assert pace_of(_manifest("cpu", 8, "cpu"), host_cores=2).misses(chunks) == 0
    assert pace_of(_manifest("tpu", 8, "TPU v6 lite"), host_cores=2).misses(chunks) == 2


def test_a_chunks_progress_line_reads_correctly():
    """One frame is "1 frame"; a chunk over its deadline says it against the deadline, not after it."""
    emulated = pace_of(_manifest("cpu", 8, "cpu"), host_cores=2)
    line = emulated.chunk_line(3, frames=1, bucket="f8", seconds=0.5, deadline=0.32, compiles=0)
    assert (
        line
        == "chunk 3: 1 frame (f8) in 0.50s, over its 0.32s deadline: slower than playback (emulated host), 0 compiles"
    )
    target = pace_of(_manifest("tpu", 8, "TPU v6 lite"), host_cores=2)
    assert (
        target.chunk_line(0, frames=8, bucket="f8", seconds=0.1, deadline=0.32, compiles=1)
        == "chunk 0: 8 frames (f8) in 0.10s, deadline 0.32s met, 1 compile"
    )
    assert "over its 0.32s deadline: MISSED" in target.chunk_line(
        1, frames=8, bucket="f8", seconds=0.5, deadline=0.32, compiles=0
    )
