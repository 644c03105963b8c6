"""The OCI backend against a real registry (CNCF distribution), cross-checked with skopeo.

What every store does (blobs, builds, channels, history, records, races) is the conformance
suite's (``test_registry_conformance.py``, over all five backends); here is what only the OCI
mapping has: URIs, the wire format seen by skopeo, bounded reads, the client-side compare-and-swap's
read-back, retries and outages, the old tag layout, chunked pushes and streamed pulls.

Each test works in its own repository of one module-wide server; tests that stop the server
start their own. Retries use millisecond delays so that fault tests stay fast.
"""

from __future__ import annotations

import hashlib
import json
import subprocess
import threading
import uuid

import pytest
import requests

from avatar_release._digest import sha256_digest
from avatar_release.errors import (
    ConflictError,
    InputError,
    IntegrityError,
    NotFoundError,
    RegistryError,
    SchemaVersionError,
)
from avatar_release.registry import OciRegistry, Registry, open_registry
from avatar_release.registry.oci import LAYOUT_1, RetryPolicy, TagLayout, parse_oci_uri
from tests.oci_memory import MemoryResponse
from tests.oci_server import OciServer
from tests.tools import binary

FAST = RetryPolicy(attempts=4, base_delay=0.01, max_delay=0.05, connect_timeout=2.0, read_timeout=20.0)
TAG_LAYOUT = TagLayout()


# ---- fixtures and helpers ----------------------------------------------------------------------
class HookedSession(requests.Session):
    """A real HTTP session with hooks: ``before`` may answer instead of the server, ``after`` sees replies."""

    def __init__(self, before=None, after=None):
        super().__init__()
        self.before, self.after = before, after
        self.log: list[tuple[str, str, dict]] = []

    def request(self, method, url, **kw):
        self.log.append((method, url, dict(kw.get("headers") or {})))
        if self.before is not None:
            canned = self.before(method, url, kw)
            if canned is not None:
                return canned
        resp = super().request(method, url, **kw)
        if self.after is not None:
            resp = self.after(method, url, resp) or resp
        return resp


def fake_response(status: int, url: str, body: bytes = b"") -> MemoryResponse:
    return MemoryResponse(status, {}, body, url)


def server_error(url: str) -> requests.Response:
    return fake_response(500, url, b'{"errors":[{"code":"UNKNOWN","message":"injected failure"}]}')


@pytest.fixture
def make_reg(oci_server, tmp_path):
    """Registries on a fresh repository of the shared server, sharing one lock directory."""
    repo = f"t/{uuid.uuid4().hex[:12]}"

    def make(session=None, retry=FAST, server=None, layout=TAG_LAYOUT):
        host = (server or oci_server).host
        return OciRegistry(
            f"oci://{host}/{repo}", session=session, retry=retry, lock_dir=tmp_path / "locks", layout=layout
        )

    return make


@pytest.fixture
def reg(make_reg):
    return make_reg()


def publish(reg, build_id: str, payloads=(b"exe",), **fields) -> tuple[str, dict]:
    """A build whose manifest references real blobs (so they become OCI layers)."""
    media = "application/vnd.avatar-release.executable.v1+zstd"
    refs = [{"digest": reg.put_blob(p), "size": len(p), "media_type": media} for p in payloads]
    doc = {
        "build_id": build_id,
        "pipeline": "tiny",
        "target": "cpu-8",
        "created_at": "2026-11-29T00:00:00.000000Z",
        "weights": {"blob": refs[0]},
        "executables": [{"key": f"dit/b{i}", "blob": r} for i, r in enumerate(refs)],
        **fields,
    }
    digest, _ = reg.put_build(build_id, json.dumps(doc).encode())
    return digest, doc


def skopeo(*args: str) -> bytes:
    exe = binary("skopeo")
    proc = subprocess.run([exe, *args], capture_output=True, timeout=60)
    assert proc.returncode == 0, proc.stderr.decode()
    return proc.stdout


# ---- URIs ------------------------------------------------------------------------------------------
def test_oci_uris_pick_http_for_loopback_and_https_elsewhere():
    assert parse_oci_uri("oci://127.0.0.1:5000/team/avatar").base == "http://127.0.0.1:5000/v2/team/avatar"
    assert parse_oci_uri("oci://localhost/avatar").scheme == "http"
    assert parse_oci_uri("oci://registry.example.com/avatar").base == "https://registry.example.com/v2/avatar"
    assert parse_oci_uri("oci+http://registry.lan:5000/avatar").scheme == "http"
    assert parse_oci_uri("oci+https://127.0.0.1:5000/avatar").scheme == "https"
    opened = open_registry("oci://127.0.0.1:5000/avatar")
    assert isinstance(opened, OciRegistry) and isinstance(opened, Registry)


@pytest.mark.parametrize(
    "uri, why",
    [
        ("oci://127.0.0.1:5000", "invalid repository"),
        ("oci://127.0.0.1:5000/Upper", "invalid repository"),
        ("oci://127.0.0.1:5000/a/../b", "invalid repository"),
        ("oci://user:pw@host/repo", "no credentials"),
        ("oci://host/repo?x=1", "no credentials, query"),
        ("oci:///repo", "invalid host"),
        ("ocix://host/repo", "expected oci://"),
    ],
)
def test_bad_oci_uris_are_input_errors(uri, why):
    with pytest.raises(InputError, match=why):
        OciRegistry(uri)


# ---- builds as OCI artifacts, seen by an independent client ------------------------------------------
def test_build_is_an_oci_artifact_that_skopeo_reads(reg, oci_server):
    digest, doc = publish(reg, "tiny-cpu-8-aaaa", (b"weights", b"exe-1", b"exe-2"))
    reg.move_channel("dev", reg.resolve("tiny-cpu-8-aaaa"), expected_digest=None, action="publish", who="t", reason="r")
    reg.move_channel("staging", reg.resolve("dev"), expected_digest=None, action="promote", who="t", reason="r")
    ref = f"docker://{oci_server.host}/{reg.location.repo}"

    raw = skopeo("inspect", "--raw", "--tls-verify=false", f"{ref}:staging")
    assert sha256_digest(raw) == reg.resolve("staging").digest == reg.resolve("dev").digest == digest
    m = json.loads(raw)
    assert m["mediaType"] == "application/vnd.oci.image.manifest.v1+json"
    assert m["artifactType"] == "application/vnd.avatar-release.build.v1"
    assert m["annotations"]["io.avatar-release.build-id"] == "tiny-cpu-8-aaaa"
    assert m["annotations"]["io.avatar-release.pipeline"] == "tiny"
    assert m["annotations"]["io.avatar-release.target"] == "cpu-8"
    assert m["annotations"]["org.opencontainers.image.created"] == doc["created_at"]
    # The avatar-release manifest is the config blob and the first layer (so `oras pull` writes it as a file);
    # every blob it references is a layer too (kept by GC).
    manifest_bytes = reg.get_manifest_bytes(digest)
    assert m["config"]["digest"] == sha256_digest(manifest_bytes) and json.loads(manifest_bytes) == doc
    assert m["layers"][0]["digest"] == m["config"]["digest"]
    assert {layer["digest"] for layer in m["layers"][1:]} == {
        sha256_digest(p) for p in (b"weights", b"exe-1", b"exe-2")
    }

    tags = json.loads(skopeo("list-tags", "--tls-verify=false", ref))["Tags"]
    assert {"dev", "staging", "_avr.b.tiny-cpu-8-aaaa", "_avr.history"} <= set(tags)
    assert "prod" not in tags
    # bookkeeping tags share one internal prefix: everything else a listing shows is a channel
    assert {t for t in tags if not t.startswith("_avr.")} == {"dev", "staging"}


def test_manifests_are_pushed_and_read_with_oci_media_types(make_reg):
    session = HookedSession()
    reg = make_reg(session=session)
    publish(reg, "b-1")
    reg.move_channel("dev", reg.resolve("b-1"), expected_digest=None, action="publish", who="t", reason="r")
    puts = [h for m, u, h in session.log if m == "PUT" and "/manifests/" in u]
    gets = [h for m, u, h in session.log if m in ("GET", "HEAD") and "/manifests/" in u]
    assert puts and all(h["Content-Type"] == "application/vnd.oci.image.manifest.v1+json" for h in puts)
    assert gets and all(h["Accept"].startswith("application/vnd.oci.image.manifest.v1+json") for h in gets)


def test_pull_reads_at_most_size_plus_one_and_checks_the_digest(make_reg):
    served = {"bytes": 0, "tamper": False}

    def after(method, url, resp):
        if method == "GET" and "/blobs/sha256:" in url:
            inner = resp.iter_content

            def counted(chunk_size=1, decode_unicode=False):
                for chunk in inner(chunk_size=chunk_size):
                    served["bytes"] += len(chunk)
                    yield bytes([chunk[0] ^ 1]) + chunk[1:] if served["tamper"] else chunk

            resp.iter_content = counted
        return resp

    reg = make_reg(session=HookedSession(after=after))
    big = bytes(range(256)) * 4096  # 1 MiB
    digest = reg.put_blob(big)
    with pytest.raises(IntegrityError, match="size more than 10 bytes, manifest says 10"):
        reg.get_blob(digest, 10)
    assert served["bytes"] <= 11  # the rest of the megabyte was never read
    served["tamper"] = True
    with pytest.raises(IntegrityError, match="content hashes to"):
        reg.get_blob(digest, len(big))


def test_a_record_whose_tag_would_pass_128_characters_is_refused_before_any_request(make_reg):
    session = HookedSession()
    reg = make_reg(session=session)
    with pytest.raises(InputError, match="over the 128"):
        reg.put_record("reviews", "x" * 120, b"x")  # a valid name: the tag _avr.r.reviews.N.<name> is not
    assert session.log == []


# ---- channels: the client-side compare-and-swap ---------------------------------------------------------------
def test_a_tag_overwritten_outside_the_lock_is_caught_by_the_read_back(make_reg):
    setup = make_reg()
    publish(setup, "b-1", (b"1",))
    publish(setup, "b-2", (b"2",))
    intruder = make_reg()
    other = intruder.manifests.get("_avr.b.b-2", "test")[1]

    def after(method, url, resp):
        if method == "PUT" and url.endswith("/manifests/staging"):  # another machine writes right after us
            intruder.manifests.put("staging", other, "intruder")
        return resp

    reg = make_reg(session=HookedSession(after=after))
    with pytest.raises(ConflictError, match="written by another writer"):
        reg.move_channel("staging", reg.resolve("b-1"), expected_digest=None, action="promote", who="a", reason="r")


@pytest.mark.slow  # 20 tag moves under two reading threads: 3-7 s on 2 cores
def test_a_reader_during_tag_moves_always_gets_a_whole_build(make_reg):
    mover = make_reg()
    for n in (1, 2):
        publish(mover, f"b-{n}", (f"payload-{n}".encode() * 1000,))
    r1, r2 = mover.resolve("b-1"), mover.resolve("b-2")
    mover.move_channel("dev", r1, expected_digest=None, action="publish", who="t", reason="r")
    stop, seen, errors = threading.Event(), [], []

    def read():
        reader = make_reg(retry=RetryPolicy(attempts=8, base_delay=0.005, max_delay=0.05))
        while not stop.is_set():
            try:
                resolved = reader.resolve("dev")
                doc = json.loads(reader.get_manifest_bytes(resolved.digest))
                blob = doc["weights"]["blob"]
                data = reader.get_blob(blob["digest"], blob["size"])
                assert doc["build_id"] == resolved.build_id
                assert data.startswith(f"payload-{resolved.build_id[-1]}".encode())
                seen.append(resolved.build_id)
            except Exception as e:  # noqa: BLE001 - collected and reported below
                errors.append(repr(e))

    readers = [threading.Thread(target=read) for _ in range(2)]
    for t in readers:
        t.start()
    current = r1
    for _ in range(20):
        nxt = r2 if current is r1 else r1
        mover.move_channel("dev", nxt, expected_digest=current.digest, action="publish", who="t", reason="flip")
        current = nxt
    stop.set()
    for t in readers:
        t.join()
    assert not errors, errors[:3]
    assert set(seen) <= {"b-1", "b-2"} and len(seen) > 5
    assert [e.sequence for e in mover.history("dev")] == list(range(1, 22))


# ---- faults: 5xx, outages, interrupted moves ----------------------------------------------------------------
def test_5xx_and_dropped_connections_are_retried(make_reg):
    state = {"left": 0, "failed": 0}

    def before(method, url, kw):
        if state["left"] > 0:
            state["left"] -= 1
            state["failed"] += 1
            if state["left"] % 2:
                raise requests.ConnectionError("injected: connection reset")
            return server_error(url)
        return None

    reg = make_reg(session=HookedSession(before=before))
    for op in range(4):
        state["left"] = 3  # fail three times in a row, then let it through
        if op == 0:
            d = reg.put_blob(b"payload")
        elif op == 1:
            assert reg.get_blob(d, 7) == b"payload"
        elif op == 2:
            publish(reg, "b-1", (b"payload",))
        else:
            reg.move_channel("dev", reg.resolve("b-1"), expected_digest=None, action="publish", who="t", reason="r")
    assert state["failed"] == 12 and reg.get_channel("dev").build_id == "b-1"


def test_persistent_5xx_gives_up_with_host_operation_and_status(make_reg, oci_server):
    reg = make_reg(session=HookedSession(before=lambda m, u, kw: fake_response(503, u, b"")))
    with pytest.raises(RegistryError) as err:
        reg.get_blob(sha256_digest(b"x"), 1)
    msg = str(err.value)
    assert oci_server.host in msg and "pull blob" in msg and "4 attempt(s)" in msg and "HTTP 503" in msg
    assert err.value.exit_code == 7


def test_an_unreachable_registry_is_a_registry_error(tmp_path):
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed again below: nothing listens there
    reg = OciRegistry(f"oci://127.0.0.1:{port}/avatar", retry=FAST, lock_dir=tmp_path)
    with pytest.raises(RegistryError, match=rf"127\.0\.0\.1:{port}/avatar: resolve channel dev failed after 4"):
        reg.resolve("dev")


def test_server_stopped_mid_publish_leaves_nothing_half_published(tmp_path):
    server = OciServer(binary("docker-registry"), tmp_path / "srv").start()
    try:
        uri = server.uri("avatar")
        reg = OciRegistry(uri, retry=FAST, lock_dir=tmp_path / "locks")
        publish(reg, "b-1", (b"1",))
        reg.move_channel("dev", reg.resolve("b-1"), expected_digest=None, action="publish", who="t", reason="r")
        uploads = {"n": 0}

        def before(method, url, kw):
            if method == "POST" and "/blobs/uploads/" in url:
                uploads["n"] += 1
                if uploads["n"] == 2:
                    server.stop()  # the registry goes away in the middle of the publish
            return None

        flaky = OciRegistry(uri, session=HookedSession(before=before), retry=FAST, lock_dir=tmp_path / "locks")
        with pytest.raises(RegistryError, match=rf"{server.host}/avatar: push blob .* failed after 4 attempt"):
            digest, _ = publish(flaky, "b-2", (b"2a", b"2b", b"2c"))
            flaky.move_channel(
                "dev", flaky.resolve(digest), expected_digest=None, action="publish", who="t", reason="r"
            )
        server.start()
        after = OciRegistry(uri, retry=FAST, lock_dir=tmp_path / "locks")
        assert after.resolve("dev").build_id == "b-1"
        with pytest.raises(NotFoundError):
            after.resolve("b-2")
        assert [b.build_id for b in after.list_builds()] == ["b-1"] and len(after.history()) == 1
    finally:
        server.stop()


def _failing_put(tag: str):
    def before(method, url, kw):
        return server_error(url) if method == "PUT" and url.endswith(f"/manifests/{tag}") else None

    return before


def test_a_move_whose_tag_write_fails_changes_nothing(make_reg):
    setup = make_reg()
    publish(setup, "b-1", (b"1",))
    publish(setup, "b-2", (b"2",))
    r1, r2 = setup.resolve("b-1"), setup.resolve("b-2")
    setup.move_channel("dev", r1, expected_digest=None, action="publish", who="t", reason="r")
    broken = make_reg(session=HookedSession(before=_failing_put("dev")))
    with pytest.raises(RegistryError, match="move channel dev failed after 4 attempt"):
        broken.move_channel("dev", r2, expected_digest=r1.digest, action="promote", who="a", reason="r")
    assert setup.get_channel("dev").build_id == "b-1" and len(setup.history()) == 1  # parked entry not shown
    e = setup.move_channel("dev", r2, expected_digest=r1.digest, action="promote", who="a", reason="again")
    assert e.sequence > 1 and [h.to_build for h in setup.history("dev")] == ["b-1", "b-2"]


def test_a_move_whose_history_write_fails_keeps_its_entry(make_reg):
    setup = make_reg()
    publish(setup, "b-1", (b"1",))
    publish(setup, "b-2", (b"2",))
    publish(setup, "b-3", (b"3",))
    r1, r2, r3 = (setup.resolve(f"b-{n}") for n in (1, 2, 3))
    setup.move_channel("dev", r1, expected_digest=None, action="publish", who="t", reason="r")
    broken = make_reg(session=HookedSession(before=_failing_put("_avr.history")))
    with pytest.raises(RegistryError, match="append history failed after 4 attempt"):
        broken.move_channel("dev", r2, expected_digest=r1.digest, action="promote", who="alice", reason="why")
    # The tag moved; the parked entry (with who and why) is part of the history from now on.
    assert setup.get_channel("dev").build_id == "b-2" and setup.get_channel("dev").sequence == 2
    assert [(h.sequence, h.who, h.reason) for h in setup.history("dev")][-1] == (2, "alice", "why")
    # The next move folds it into the history artifact for good.
    setup.move_channel("dev", r3, expected_digest=r2.digest, action="promote", who="bob", reason="next")
    stored = setup.journal.entries_of(("_avr.history",), "application/vnd.avatar-release.history.v1")
    assert [(e.sequence, e.who) for e in stored] == [(1, "t"), (2, "alice"), (3, "bob")]


def test_a_tag_moved_by_another_tool_is_recorded_by_the_next_move(make_reg, oci_server):
    reg = make_reg()
    for n in (1, 2, 3):
        publish(reg, f"b-{n}", (str(n).encode(),))
    r1, r2, r3 = (reg.resolve(f"b-{n}") for n in (1, 2, 3))
    reg.move_channel("prod", r1, expected_digest=None, action="promote", who="t", reason="r")
    reg.manifests.put("prod", reg.manifests.get(r2.digest, "test")[1], "someone else")  # e.g. skopeo copy
    state = reg.get_channel("prod")
    assert (state.build_id, state.sequence) == ("b-2", 0)
    e = reg.move_channel("prod", r3, expected_digest=r2.digest, action="promote", who="t", reason="r")
    assert [(h.who, h.to_build) for h in reg.history("prod")] == [("t", "b-1"), ("unknown", "b-2"), ("t", "b-3")]
    assert e.sequence == 3 and e.from_build == "b-2"


# ---- a real build, loaded and rendered from the OCI registry ------------------------------------------------
@pytest.mark.slow
def test_a_real_build_loads_and_renders_from_the_oci_registry(built_registry, reg):
    import numpy as np

    from avatar_release.media import sample_audio, sample_image
    from avatar_release.registry import LocalRegistry, read_manifest
    from avatar_release.runtime import load, stream

    root, _ = built_registry
    local = LocalRegistry(root, create=False)
    resolved, manifest = read_manifest(local, "dev")
    for blob in manifest.blobs():
        reg.put_blob(local.get_blob(blob.digest, blob.size))
    digest, created = reg.put_build(manifest.build_id, local.get_manifest_bytes(resolved.digest))
    reg.move_channel("prod", reg.resolve(digest), expected_digest=None, action="promote", who="t", reason="e2e")

    build = load("prod", reg)
    assert build.build_id == manifest.build_id and build.digest == digest
    image, audio = sample_image(48, 80), sample_audio(0.3)
    chunk = next(iter(stream(build, image, audio)))
    assert chunk.frames.dtype == np.uint8 and chunk.frames.shape[1:] == (48, 80, 3)
    assert build.guard.count == 0 and chunk.compiles == 0
    reference = next(iter(stream(load("dev", local), image, audio)))
    assert np.array_equal(chunk.frames, reference.frames)
    assert hashlib.sha256(chunk.frames.tobytes()).hexdigest() == hashlib.sha256(reference.frames.tobytes()).hexdigest()


def test_a_repository_in_the_retired_tag_layout_is_refused_until_migrated_then_moves_on(make_reg, oci_server):
    """Layout 1 (``_b.``, ``_r.``, ``_history``, ``_pending``) is outside the support window: refused
    naming the migration; ``migrate_tags`` puts the same manifests under ``_avr.`` names (nothing
    deleted), after which today's client reads everything and writes on."""
    old = make_reg(layout=TagLayout((LAYOUT_1,), retired=()))  # a client of before layout 2
    d1, _ = publish(old, "b-1", (b"one",))
    old.move_channel("dev", old.resolve("b-1"), expected_digest=None, action="publish", who="t", reason="r1")
    old.put_record("reviews", "b-1", b"old review")
    tags = set(old.manifests.list_tags())
    assert {"_b.b-1", "_history", "_pending", "_r.reviews.N.b-1"} <= tags and not any(
        t.startswith("_avr.") for t in tags
    )

    reg = make_reg()  # today's code on the same repository
    with pytest.raises(
        SchemaVersionError,
        match=r"tag layout of before 2026-12-01 \(_history.*`avatar-release "
        r"registry migrate --registry oci://",
    ):
        reg.history()
    done = reg.migrate_tags()
    assert (
        set(done.moved)
        == {
            ("_b.b-1", "_avr.b.b-1"),
            ("_history", "_avr.history"),
            ("_pending", "_avr.pending"),
            ("_r.reviews.N.b-1", "_avr.r.reviews.N.b-1"),
        }
        and not done.too_long
    )
    assert reg.migrate_tags().moved == ()  # again: nothing left to move
    assert [b.build_id for b in reg.list_builds()] == ["b-1"] and reg.resolve("b").digest == d1
    assert reg.resolve(d1).build_id == "b-1" and reg.put_build("b-1", b"{}") == (d1, False)
    assert reg.get_record("reviews", "b-1") == b"old review" and [e.reason for e in reg.history()] == ["r1"]
    d2, _ = publish(reg, "b-2", (b"two",))
    reg.move_channel("dev", reg.resolve("b-2"), expected_digest=d1, action="publish", who="t", reason="r2")
    assert [e.reason for e in reg.history()] == ["r1", "r2"]
    assert {"_b.b-1", "_history"} <= set(reg.manifests.list_tags())  # nothing of layout 1 deleted


# ---- blobs larger than memory: chunked, resumable pushes and streamed, verified pulls -------------------------
def test_a_chunked_push_resumes_from_where_the_registry_got_to(make_reg, tmp_path):
    import os

    data = os.urandom(5 << 20)
    src = tmp_path / "big.bin"
    src.write_bytes(data)
    patches = []

    def before(method, url, kw):
        if method == "PATCH":
            patches.append(kw["headers"]["Content-Range"])
            if 2 <= len(patches) <= 5:  # the second chunk fails on every attempt the transport makes
                return server_error(url)
        return None

    session = HookedSession(before=before)
    reg = make_reg(session=session)
    digest = reg.push_blob_from(src, chunk_size=1 << 20)
    assert digest == sha256_digest(data) and reg.get_blob(digest, len(data)) == data
    resumes = [u for m, u, _ in session.log if m == "GET" and "/blobs/uploads/" in u]
    assert len(resumes) == 1  # one status query, then on from the offset the registry reported
    assert patches[:2] == ["0-1048575", "1048576-2097151"] and patches[-1] == "4194304-5242879"
    assert reg.push_blob_from(src) == digest  # already there: one HEAD
    assert session.log[-1][0] == "HEAD"


def test_a_streamed_pull_holds_one_chunk_and_verifies_before_the_file_appears(make_reg, tmp_path):
    import os
    import tracemalloc

    data = os.urandom(24 << 20)
    reg = make_reg()
    src = tmp_path / "big.bin"
    src.write_bytes(data)
    tracemalloc.start()
    try:
        digest = reg.push_blob_from(src, chunk_size=4 << 20)
        _, push_peak = tracemalloc.get_traced_memory()
        tracemalloc.reset_peak()
        out = reg.pull_blob_to(digest, len(data), tmp_path / "out.bin")
        _, pull_peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert out.read_bytes() == data
    print(
        f"[measure] 24 MiB blob: chunked push peak {push_peak / 2**20:.1f} MiB (4 MiB chunks), streamed pull peak {pull_peak / 2**20:.1f} MiB"
    )
    assert push_peak < 12 << 20 and pull_peak < 4 << 20, (push_peak, pull_peak)  # a 24 MiB blob
    with pytest.raises(IntegrityError, match="more than 1000 bytes"):
        reg.pull_blob_to(digest, 1000, tmp_path / "short.bin")
    assert not (tmp_path / "short.bin").exists() and not list(tmp_path.glob(".short.bin.*"))
    with pytest.raises(NotFoundError):
        reg.pull_blob_to("sha256:" + "0" * 64, 3, tmp_path / "missing.bin")
