"""Stand-in builds and signed gate results in a registry, for tests of promotion, copy, trust and
garbage collection: what the policy reads, written as the toolchain writes it, without a compile.

Imported as ``tests.release_records`` by test modules and by the benchmarks' smoke modes (a test
module never imports another test module).
"""

from __future__ import annotations

import json
from typing import Any

from avatar_release.gates.store import save_result
from avatar_release.records import (
    BaselineRef,
    BlobRef,
    EnvironmentRecord,
    GateEvidence,
    GateRequestRecord,
    GateResult,
    GateSetRecord,
    Manifest,
    parse_record,
)
from avatar_release.records.stored import STORED_NAMESPACES
from tests.helpers import DATA, cpu_manifest, put_stand_in_build

__all__ = [
    "publish_stand_in",
    "environment_of",
    "signed_gate_result",
    "publish_with_blobs",
    "gate_with_frames",
    "records_of",
]


def publish_stand_in(reg: Any, suffix: str) -> tuple[str, str, Manifest]:
    """(build id, digest, manifest) of the cpu-8 stand-in published as ``tiny-cpu-8-<suffix x 12>``;
    its blobs are stand-in bytes (only the policy is under test: nothing loads them)."""
    m = cpu_manifest()
    m = m.model_copy(update={"build_id": f"tiny-cpu-8-{suffix * 12}"})
    digest = put_stand_in_build(reg, m)
    return m.build_id, digest, m


def environment_of(m: Manifest, **changes: Any) -> EnvironmentRecord:
    """The environment a gate of ``m`` ran in (its platform), with ``changes`` applied."""
    p = m.platform
    fields = dict(
        fingerprint="sha256:" + "1" * 64,
        backend=p.backend,
        platform_version=p.platform_version,
        device_kind=p.device_kind,
        device_count=p.device_count,
        jax="0.10.2",
        jaxlib=m.toolchain.jaxlib,
        cpu_features=p.cpu_features,
    )
    fields.update(changes)
    return EnvironmentRecord(**fields)


def _one_request_gate_set() -> GateSetRecord:
    return GateSetRecord(
        name="t",
        version=1,
        digest="sha256:" + "0" * 64,
        requests=[GateRequestRecord(name="r", image_variant=0, audio_variant=0, seed=0, frames=1, buckets=["f8"])],
    )


_TICKS = iter(range(10**6))


def _clock() -> str:
    """Signed times that increase from one gate result to the next."""
    return f"2026-12-01T00:00:{next(_TICKS):09d}Z"


def signed_gate_result(
    reg: Any,
    build_id: str,
    digest: str,
    m: Manifest,
    status: str = "passed",
    against: tuple[str, str] | None = None,
    created_at: str | None = None,
    below: tuple[int, ...] = (0,),
    target_spec_digest: str | None = None,
    **env_changes: Any,
) -> str:
    """A signed gate result; ``against``: (build id, digest) it was compared with (None: nothing);
    ``below``: the frames its band gate put below the band (what a review must show)."""
    baseline = (
        None
        if against is None
        else BaselineRef(build_id=against[0], digest=against[1], gate_result_digest="sha256:" + "c" * 64)
    )
    r = GateResult(
        status=status,
        build_id=build_id,
        build_digest=digest,
        pipeline="tiny",
        target="cpu-8",
        target_spec_digest=target_spec_digest,
        baseline=baseline,
        tier=None if against is None else 1,
        environment=environment_of(m, **env_changes),
        tool={},
        gate_set=_one_request_gate_set(),
        gates=[
            GateEvidence(
                name="similarity-band", status="below-band", summary="x", details={"frames_below": list(below)}
            )
        ],
        frame_sha256=[["h"]],
        frames_blob=BlobRef(digest="sha256:" + "b" * 64, size=1, media_type="x"),
        created_at=created_at or _clock(),
        created_by="test",
    )
    return save_result(reg, r)


def publish_with_blobs(reg: Any, suffix: str = "a", version: int | None = None) -> tuple[str, str, Manifest]:
    """A build whose every blob reference names real bytes in ``reg`` (copy verifies every blob): the
    cpu-8 stand-in at the version this tool writes (``tests.helpers.cpu_manifest``), or the stored
    manifest tests/data/build-manifest.v<version>.json (a version the support window reads)."""
    stored = DATA / f"build-manifest.v{version}.json"
    doc = json.loads(cpu_manifest().to_json_bytes() if version is None else stored.read_bytes())
    doc["build_id"] = f"tiny-cpu-8-{suffix * 12}"
    n = [0]

    def real(node: Any) -> None:
        if isinstance(node, dict):
            if "digest" in node and "media_type" in node and isinstance(node.get("size"), int):
                n[0] += 1
                data = f"{suffix}-blob-{n[0]}".encode() * 50
                node.update(digest=reg.put_blob(data), size=len(data))
                return
            for v in node.values():
                real(v)
        elif isinstance(node, list):
            for v in node:
                real(v)

    real(doc)
    m = parse_record(Manifest, json.dumps(doc).encode(), where="test")
    digest, _ = reg.put_build(m.build_id, m.to_json_bytes())
    return m.build_id, digest, m


def gate_with_frames(reg: Any, build_id: str, digest: str, m: Manifest) -> str:
    """A stored, signed, passing gate result whose frames blob is real (copy verifies every blob)."""
    frames = b"frame-bytes" * 10
    r = GateResult(
        status="passed",
        build_id=build_id,
        build_digest=digest,
        pipeline="tiny",
        target="cpu-8",
        baseline=None,
        tier=None,
        environment=environment_of(m),
        tool={},
        gate_set=_one_request_gate_set(),
        gates=[GateEvidence(name="similarity-band", status="passed", summary="x")],
        frame_sha256=[["h"]],
        frames_blob=BlobRef(digest=reg.put_blob(frames), size=len(frames), media_type="application/octet-stream"),
        created_at="t0",
        created_by="test",
    )
    return save_result(reg, r, subject_digest=m.content_digest())


def records_of(reg: Any, build_id: str) -> dict[str, bytes]:
    """Every stored record of ``build_id`` (and every channel's), by namespace/name."""
    out = {}
    for ns in STORED_NAMESPACES.values():
        for name in reg.list_records(ns.name):
            if ns.keyed_by == "channel" or ns.build_of(name) == build_id:
                out[f"{ns.name}/{name}"] = reg.get_record(ns.name, name)
    return out
