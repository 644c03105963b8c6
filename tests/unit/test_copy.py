"""``copy``: a build with its records between stores, verified, idempotent, resumable (no compile)."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from avatar_release.cli import cli
from avatar_release.errors import ConflictError, IntegrityError
from avatar_release.ops import copy_build
from avatar_release.promote import promote
from avatar_release.records import Manifest, parse_record
from avatar_release.registry import LocalRegistry, MemoryRegistry
from avatar_release.trust.keys import generate_keypair, load_private_key, load_public_key
from avatar_release.trust.policy import load_policy
from avatar_release.trust.state_read import load_state, moves
from avatar_release.trust.statements import verify_channel
from tests.helpers import signed_holder, with_release_state
from tests.release_records import gate_with_frames, publish_with_blobs, records_of


@pytest.fixture
def released(tmp_path):
    """A directory store with a gated build promoted to staging with a signed statement."""
    src = with_release_state(LocalRegistry(tmp_path / "src"))
    build_id, digest, m = publish_with_blobs(src)
    gate_with_frames(src, build_id, digest, m)
    priv, pub, _ = generate_keypair(tmp_path / "keys")
    promote(src, build_id, "staging", signing_key=load_private_key(priv))
    return src, build_id, m, load_public_key(pub)


def test_copy_carries_blobs_manifest_records_and_the_signed_channel(released, tmp_path):
    src, build_id, m, pub = released
    dst = MemoryRegistry("mirror")
    r = copy_build(src, dst, "staging", channel="staging")
    assert r.build_created and r.destination_digest == src.resolve(build_id).digest
    assert dst.get_manifest_bytes(r.destination_digest) == src.get_manifest_bytes(r.source_digest)
    assert records_of(dst, build_id) == records_of(src, build_id)  # byte-identical, every namespace
    assert {k.split("/")[0] for k in records_of(dst, build_id)} >= {
        "gate-results",
        "attestations",
        "statements",
        "timestamps",
    }
    for ref in m.blobs():
        assert dst.get_blob(ref.digest, ref.size) == src.get_blob(ref.digest, ref.size)
    assert r.channel_moved and r.statement_copied and not r.statement_binds_store_digest
    p = verify_channel(dst, "staging", pub, digest=dst.resolve("staging").digest, content_digest=m.content_digest())
    assert p.build_id == build_id
    # the destination's channel moved as a signed move, carrying the evidence the source's move carried
    at_src, at_dst = (load_state(reg, load_policy()).holder("staging") for reg in (src, dst))
    assert (at_dst.build_id, at_dst.manifest_digest) == (build_id, m.content_digest()) and at_src.evidence
    assert at_dst.evidence == at_src.evidence and at_dst.gate_result_digest == at_src.gate_result_digest
    assert all(dst.get_blob(e.digest, e.size) == src.get_blob(e.digest, e.size) for e in at_dst.evidence)
    (move,) = moves(dst, at_dst)
    assert (move.action, move.reason, move.build_id) == ("promote", f"copied from {src.uri}", build_id)
    assert dst.get_channel("staging").build_id == build_id  # and the plain pointer mirrors it


def test_a_copy_to_a_channel_the_source_holds_another_build_in_carries_no_evidence(released):
    src, build_id, m, _ = released
    other, digest, mo = publish_with_blobs(src, "b")
    gate_with_frames(src, other, digest, mo)
    dst = MemoryRegistry("mirror")
    r = copy_build(src, dst, other, channel="staging")  # staging at the source holds build_id, not other
    held = load_state(dst, load_policy()).holder("staging")
    assert r.channel_moved and not r.statement_copied and held.build_id == other
    assert held.evidence == () and held.gate_result_digest is None  # the source vouched for another build


def test_a_destination_with_channels_but_no_signed_state_is_refused(released):
    from avatar_release.trust.state_read import StateMissing

    src, build_id, m, _ = released
    dst = MemoryRegistry("old")
    copy_build(src, dst, build_id)
    dst.move_channel("dev", dst.resolve(build_id), expected_digest=None, action="publish", who="old", reason="")
    with pytest.raises(StateMissing, match="registry upgrade"):
        copy_build(src, dst, build_id, channel="staging")
    assert dst.get_channel("staging") is None


def test_a_channel_ref_is_read_from_the_sources_signed_state(released):
    src, build_id, m, _ = released
    other, _, _ = publish_with_blobs(src, "b")
    src.move_channel(
        "staging",
        src.resolve(other),
        expected_digest=src.get_channel("staging").digest,
        action="promote",
        who="mallory",
        reason="",
    )  # the plain pointer, moved without keys
    r = copy_build(src, MemoryRegistry("mirror"), "staging")
    assert r.build_id == build_id == signed_holder(src, "staging")


def test_a_second_copy_changes_nothing_and_a_killed_one_resumes(released, monkeypatch):
    src, build_id, m, _ = released
    dst = MemoryRegistry("mirror")
    calls = {"n": 0}
    real_put = dst.put_record

    def dies_after_one(*a):
        calls["n"] += 1
        if calls["n"] == 2:
            raise KeyboardInterrupt("killed")
        return real_put(*a)

    monkeypatch.setattr(dst, "put_record", dies_after_one)
    with pytest.raises(KeyboardInterrupt):
        copy_build(src, dst, build_id, channel="staging")
    monkeypatch.setattr(dst, "put_record", real_put)
    resumed = copy_build(src, dst, build_id, channel="staging")
    assert resumed.blobs_copied == 0 and resumed.records_present == 1 and resumed.records_copied
    again = copy_build(src, dst, build_id, channel="staging")
    assert (again.blobs_copied, again.records_copied, again.build_created, again.channel_moved) == (0, [], False, False)
    assert records_of(dst, build_id) == records_of(src, build_id)


def test_a_corrupt_source_blob_or_a_different_build_under_the_same_id_is_refused(released, tmp_path):
    src, build_id, m, _ = released
    dst = MemoryRegistry("other")
    ref = m.blobs()[0]
    (tmp_path / "src" / "blobs" / "sha256" / ref.digest.split(":")[1]).write_bytes(b"tampered")
    with pytest.raises(IntegrityError, match=ref.digest):
        copy_build(src, dst, build_id)
    assert not dst.has_blob(ref.digest) and dst.list_builds() == []
    other = MemoryRegistry("fresh")
    bid, _, _ = publish_with_blobs(other, "b")
    clash = _with_build(MemoryRegistry("clash"), other, bid)
    before = clash.get_manifest_bytes(clash.resolve(bid).digest)
    with pytest.raises(ConflictError, match="already exists there with a different manifest"):
        copy_build(other, clash, bid)
    assert clash.get_manifest_bytes(clash.resolve(bid).digest) == before


def _with_build(dst, src, build_id):
    """``dst`` holding ``build_id`` with a different manifest (its blobs present)."""
    doc = json.loads(src.get_manifest_bytes(src.resolve(build_id).digest))
    doc["created_at"] = "1999-01-01T00:00:00Z"
    m = parse_record(Manifest, json.dumps(doc).encode(), where="test")
    for ref in m.blobs():
        dst.put_blob(src.get_blob(ref.digest, ref.size))
    dst.put_build(build_id, m.to_json_bytes())
    return dst


def test_copy_cli_prints_what_it_did_and_json(released, tmp_path):
    src, build_id, _, _ = released
    runner = CliRunner()
    dst = tmp_path / "dst"
    r = runner.invoke(
        cli, ["copy", build_id, "--registry", str(tmp_path / "src"), "--to", str(dst), "--channel", "staging", "--json"]
    )
    assert r.exit_code == 0, r.output
    out = json.loads(r.stdout)
    assert out["ok"] and out["build_id"] == build_id and out["channel_moved"] and out["statement_copied"]
    r = runner.invoke(cli, ["copy", build_id, "--registry", str(tmp_path / "src"), "--to", str(dst)])
    assert r.exit_code == 0 and "already there" in r.output
    r = runner.invoke(cli, ["copy", "nope", "--registry", str(tmp_path / "src"), "--to", str(dst)])
    assert r.exit_code != 0 and "unknown build or channel 'nope'" in r.output


def test_blobs_move_side_by_side_with_a_progress_line_each(tmp_path):
    """A chunked (v5) build into an OCI store: blob uploads overlap (4 workers), each blob reports
    progress, and a blob that fails leaves no build reference behind."""
    import threading
    import time

    from avatar_release.registry import OciRegistry
    from avatar_release.registry.oci import RetryPolicy
    from tests.oci_memory import MemoryDistribution, MemoryResponse

    src = LocalRegistry(tmp_path / "src")
    build_id, _, m = publish_with_blobs(src)
    inflight, peak, lock = [0], [0], threading.Lock()

    def slow_uploads(method, url, headers, data):
        if method == "PUT" and "/blobs/uploads/" in url:
            with lock:
                inflight[0] += 1
                peak[0] = max(peak[0], inflight[0])
            time.sleep(0.05)
            with lock:
                inflight[0] -= 1
        return None

    fast = RetryPolicy(attempts=1, base_delay=0.001, max_delay=0.001)
    dst = OciRegistry(
        "oci+http://registry.test/mirror/a",
        session=MemoryDistribution(before=slow_uploads),
        retry=fast,
        lock_dir=tmp_path / "locks",
    )
    lines: list[str] = []
    r = copy_build(src, dst, build_id, progress=lines.append)
    n = len({b.digest for b in m.blobs()})
    assert n >= 3 and r.blobs_copied == n and peak[0] > 1  # uploads overlapped
    assert len(lines) == n and lines[-1].startswith(f"copy {build_id} ({n} blobs): ")
    assert lines[-1].finished and lines[-1].done == sum(b.size for b in {b.digest: b for b in m.blobs()}.values())
    assert dst.resolve(build_id).digest == r.destination_digest

    def refuse_one(method, url, headers, data):
        if method == "PUT" and "/blobs/uploads/" in url and "digest=" + m.blobs()[1].digest in url:
            return MemoryResponse(400, {}, b'{"errors":[{"code":"DENIED","message":"quota"}]}', url)
        return None

    broken = OciRegistry(
        "oci+http://registry.test/mirror/b",
        session=MemoryDistribution(before=refuse_one),
        retry=fast,
        lock_dir=tmp_path / "locks",
    )
    with pytest.raises(Exception, match="quota"):
        copy_build(src, broken, build_id, workers=4)
    assert broken.list_builds() == []  # the build reference is written only after every blob landed


def test_a_tuned_gpu_build_is_copied_with_its_autotune_results(tmp_path):
    """v7: the results a build was compiled with are a blob of it, copied like its executables."""
    src = LocalRegistry(tmp_path / "src")
    build_id, _, m = publish_with_blobs(src, version=7)
    assert m.autotune is not None and m.autotune.results_blob is not None
    dst = MemoryRegistry("mirror")
    r = copy_build(src, dst, build_id)
    ref = m.autotune.results_blob
    assert r.blobs_copied == len({b.digest for b in m.blobs()})
    assert dst.get_blob(ref.digest, ref.size) == src.get_blob(ref.digest, ref.size)
