"""Garbage collection on the in-memory store: every side-record kind is asked for its roots,
pruned with its build, and a namespace gc does not know stops it from deleting any blob."""

from __future__ import annotations

import pytest

from avatar_release.errors import InputError
from avatar_release.ops import collect_garbage
from avatar_release.promote import promote, rollback
from avatar_release.records.stored import ATTESTATIONS, COMPILE_GATES, GATE_RESULTS, REVIEWS, STORED_NAMESPACES
from avatar_release.registry import MemoryRegistry, OciRegistry
from avatar_release.trust.policy import load_policy
from avatar_release.trust.state_read import load_state, moves
from tests.helpers import with_release_state
from tests.release_records import publish_stand_in, signed_gate_result


@pytest.fixture
def reg():
    reg = with_release_state(MemoryRegistry("gc"))
    a, da, ma = publish_stand_in(reg, "a")
    signed_gate_result(reg, a, da, ma)
    promote(reg, a, "staging")
    b, db, mb = publish_stand_in(reg, "b")
    signed_gate_result(reg, b, db, mb)
    reg.put_record(COMPILE_GATES.name, b, b"{}")
    reg.put_record(REVIEWS.name, b, b"{}")
    reg.put_blob(b"orphan")
    return reg, a, b


def test_every_build_keyed_record_kind_is_pruned_with_its_build(reg):
    reg, a, b = reg
    report = collect_garbage(reg, prune_builds=True, min_age_s=0)
    assert report.pruned_builds == [b] and report.kept_builds == [a]
    assert sorted(report.pruned_records) == sorted(
        f"{ns}/{b}" for ns in ("gate-results", "compile-gates", "reviews", "attestations")
    )
    for ns in (GATE_RESULTS, COMPILE_GATES, REVIEWS, ATTESTATIONS):
        assert reg.get_record(ns.name, b) is None
    assert reg.get_record(GATE_RESULTS.name, a) is not None  # the kept build's evidence stays
    # a's gate result blob is a root of its gate-results record: still there, and it still promotes
    assert promote(reg, a, "prod").changed


def test_blobs_referenced_by_kept_records_survive_and_the_rest_go(reg):
    reg, a, b = reg
    before = set(reg.list_blob_digests())
    report = collect_garbage(reg, prune_builds=True, min_age_s=0)
    after = set(reg.list_blob_digests())
    assert report.deleted_blobs == len(before - after) > 0
    kept_result = GATE_RESULTS.roots(reg.get_record(GATE_RESULTS.name, a), a, None)[0]
    assert kept_result.digest in after


def test_an_unknown_record_namespace_is_kept_and_blocks_blob_deletion(reg):
    reg, a, b = reg
    reg.put_record("added-by-a-newer-tool", a, b"{}")
    before = set(reg.list_blob_digests())
    report = collect_garbage(reg, min_age_s=0)
    assert report.unknown_namespaces == ["added-by-a-newer-tool"]
    assert set(reg.list_blob_digests()) == before and report.deleted_blobs == 0


def test_dry_run_deletes_nothing(reg):
    reg, a, b = reg
    before = (set(reg.list_blob_digests()), [x.build_id for x in reg.list_builds()])
    report = collect_garbage(reg, prune_builds=True, min_age_s=0, dry_run=True)
    assert report.deleted_blobs > 0 and report.pruned_builds == [b]
    assert (set(reg.list_blob_digests()), [x.build_id for x in reg.list_builds()]) == before


def test_every_declared_namespace_is_keyed_and_rooted():
    assert {"gate-results", "compile-gates", "reviews", "statements", "attestations", "release-state"} <= set(
        STORED_NAMESPACES
    )
    assert all(ns.keyed_by in ("build", "channel", "registry") for ns in STORED_NAMESPACES.values())
    assert STORED_NAMESPACES["release-state"].keyed_by == "registry"  # one per registry: never pruned with a build


def test_the_signed_state_and_the_moves_and_evidence_it_names_survive(reg):
    reg, a, b = reg
    records = {n: reg.get_record("release-state", n) for n in reg.list_records("release-state")}
    staging = load_state(reg, load_policy()).holder("staging")
    assert staging.build_id == a and staging.evidence  # the move carried a's signed gate result
    report = collect_garbage(reg, prune_builds=True, min_age_s=0)
    assert report.deleted_blobs > 0 and not [r for r in report.pruned_records if r.startswith("release-state/")]
    assert {n: reg.get_record("release-state", n) for n in reg.list_records("release-state")} == records
    blobs = set(reg.list_blob_digests())
    assert staging.move.digest in blobs and {e.digest for e in staging.evidence} <= blobs
    assert [m.build_id for m in moves(reg, load_state(reg, load_policy()).holder("staging"))] == [a]


def test_a_build_the_signed_history_holds_is_kept_when_the_plain_history_was_wiped(reg):
    """The plain pointers and history are a mirror anyone with write access can edit: gc must not
    delete a rollback target the signed state still names."""
    reg, a, b = reg
    later = []
    for suffix in ("c", "d"):  # staging: a -> c -> d
        x, dx, mx = publish_stand_in(reg, suffix)
        signed_gate_result(reg, x, dx, mx)
        promote(reg, x, "staging")
        later.append(x)
    c, d = later
    reg._write_atomic("history.jsonl", b"")  # a's time in staging, gone from the mirror
    report = collect_garbage(reg, prune_builds=True, min_age_s=0)
    assert report.pruned_builds == [b] and sorted(report.kept_builds) == sorted([a, c, d])
    assert rollback(reg, "staging", to=a).decision.build_id == a


def test_a_store_that_cannot_delete_is_refused():
    with pytest.raises(InputError, match="not a directory-like store"):
        collect_garbage(OciRegistry("oci://127.0.0.1:1/repo"))


def test_per_shard_records_go_with_their_build_and_keep_their_blobs_while_it_stays(reg):
    """A sharded gate leaves one record per shard run (named build__shard-K-of-N-...): gc prunes
    them with their build, and keeps every blob they name (envelope, partial, frames) otherwise."""
    from avatar_release.records import BlobRef
    from avatar_release.records.stored import GATE_SHARDS, render_shard_record, shard_record_name

    reg, a, b = reg

    def shard(build, k):
        refs = []
        for what in ("envelope", "partial", "frames"):
            data = f"{build} shard {k} {what}".encode()
            refs.append(BlobRef(digest=reg.put_blob(data), size=len(data), media_type="application/octet-stream"))
        name = shard_record_name(build, k, 2, [1, 2], "ci-7")
        reg.put_record(GATE_SHARDS.name, name, render_shard_record(refs[0], refs[1], [refs[2]]))
        return name, {r.digest for r in refs}

    kept = [shard(a, k) for k in range(2)]
    gone = [shard(b, k) for k in range(2)]
    report = collect_garbage(reg, prune_builds=True, min_age_s=0)
    assert report.pruned_builds == [b]
    assert sorted(r for r in report.pruned_records if r.startswith("gate-shards/")) == sorted(
        f"gate-shards/{name}" for name, _ in gone
    )
    blobs = set(reg.list_blob_digests())
    for name, digests in kept:
        assert reg.get_record(GATE_SHARDS.name, name) is not None and digests <= blobs
    for name, digests in gone:
        assert reg.get_record(GATE_SHARDS.name, name) is None and not digests & blobs
