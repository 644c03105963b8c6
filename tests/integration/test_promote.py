"""Promotion end to end on real gated builds in a local registry, through the CLI."""

from __future__ import annotations

import json
from pathlib import Path

from tests.helpers import cli


def _blob_bytes(root: Path) -> tuple[int, int]:
    files = [p for p in (root / "blobs").rglob("*") if p.is_file()]
    return len(files), sum(p.stat().st_size for p in files)


def test_compile_gate_promote_rollback_moves_only_pointers(gated_copy, build_cache, tmp_path, monkeypatch):
    root, first, _ = gated_copy  # the first build, gated on its own (--baseline none) once for the session
    reg = str(root)
    monkeypatch.setenv("AVATAR_RELEASE_ACTOR", "ci-bot")
    a = first.build_id

    res = cli("promote", a, "--to", "prod", "--registry", reg)
    assert res.exit_code == 1 and "only the build in staging may go to prod" in res.output

    before = _blob_bytes(root)
    res = cli("promote", a, "--to", "staging", "--reason", "release 1", "--registry", reg, "--json")
    assert res.exit_code == 0, res.output
    doc = json.loads(res.stdout)
    assert doc["changed"] and doc["entry"]["who"] == "ci-bot" and doc["gate_result_digest"].startswith("sha256:")
    res = cli("promote", a, "--to", "staging", "--registry", reg, "--json")  # again: a no-op
    assert res.exit_code == 0 and json.loads(res.stdout)["changed"] is False
    # promotion to staging rewrote nothing of the build: it signed one move record of a few hundred
    # bytes (naming the build, its evidence and the move before it) and the channel's metadata
    moved = _blob_bytes(root)
    assert moved[0] == before[0] + 1 and 0 < moved[1] - before[1] < 2048
    before = moved
    res = cli("promote", a, "--to", "prod", "--registry", reg, "--json")
    assert res.exit_code == 0, res.output
    # ...and to prod it adds two: the release approval this machine's release key signed (the second
    # role), an attestation of a few hundred bytes, and the move record; nothing of the build is rewritten
    approval = json.loads(res.stdout)["approved_here"]
    from avatar_release.registry import LocalRegistry
    from avatar_release.trust.attest import PREDICATE_TYPES, open_envelope
    from avatar_release.trust.evidence import read_attestations

    added = [
        (ref, data)
        for ref, data in read_attestations(LocalRegistry(root), a)
        if open_envelope(data, "x").predicate_type == PREDICATE_TYPES["release-approval"]
    ]
    assert approval is not None and len(added) == 1
    after = _blob_bytes(root)
    assert after[0] == before[0] + 2 and 0 < after[1] - before[1] - added[0][0].size < 2048

    # A second build (a declared lever; compiled once per session, tests/build_cache.py): on dev, gated, promoted; then prod is rolled back to the first.
    b = build_cache.compile("tiny", "cpu-8", registry=LocalRegistry(root), overrides={"matmul_k_split": "2"}).build_id
    res = cli("promote", b, "--to", "staging", "--registry", reg)
    assert res.exit_code == 1 and "never been gated" in res.output
    # Against prod (a): the only comparison that promotes while prod holds a build; a declared lever, so
    # tier 2, judged by the band.
    assert cli("gate", b, "--registry", reg, "--report", str(tmp_path / "rb")).exit_code == 0
    for ch in ("staging", "prod"):
        assert cli("promote", b, "--to", ch, "--registry", reg).exit_code == 0
    res = cli("rollback", "prod", "--reason", "b shimmers", "--registry", reg, "--json")
    assert res.exit_code == 0, res.output
    doc = json.loads(res.stdout)
    assert doc["build_id"] == a and doc["previous"] == b and doc["entry"]["action"] == "rollback"

    res = cli("history", "prod", "--registry", reg, "--json")
    entries = json.loads(res.stdout)["entries"]
    assert [(e["action"], e["to_build"]) for e in entries] == [("promote", a), ("promote", b), ("rollback", a)]
    assert all(e["gate_result_digest"] for e in entries) and entries[-1]["reason"] == "b shimmers"
    res = cli("ls", "--registry", reg, "--json")
    rows = {r["build_id"]: r for r in json.loads(res.stdout)["builds"]}
    assert rows[a]["channels"] == ["prod"] and rows[a]["gate"] == "passed"
    assert rows[b]["channels"] == ["dev", "staging"]
