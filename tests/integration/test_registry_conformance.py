"""The registry conformance suite: what every store does, run over all six backends.

One parametrized fixture, ``backend``, yields a fresh, empty store of each kind:

* ``memory``: the in-memory fake (unit tests);
* ``local``: a directory store;
* ``oci-memory``: the OCI client against the package's in-memory distribution server
  (``tests.oci_memory.MemoryDistribution``): the whole OCI mapping, no network;
* ``oci``: CNCF distribution on 127.0.0.1, anonymous HTTP;
* ``oci-basic-tls``: distribution behind htpasswd (bcrypt) over TLS with a CA made by openssl,
  logged in through a docker ``config.json``;
* ``oci-token``: distribution with ``auth.token``, a token issuer over HTTPS, logged in the same way.

The OCI backends need ``docker-registry`` (and ``openssl`` for the two with logins): without it
they skip, unless ``AVATAR_RELEASE_REQUIRE_REGISTRY`` is set (CI), where they fail. Each OCI
test uses a repository of its own on servers shared by the session (:mod:`tests.oci_server`,
:mod:`tests.oci_logins`). What only one backend has (the directory store's crash repair and
temp files, the OCI wire format, retries, logins, TLS, standard tools) is tested beside it:
``tests/unit/test_registry.py``, ``test_oci_registry.py``, ``test_oci_login.py``, ``test_oci_interop.py``.
"""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from avatar_release._digest import sha256_digest
from avatar_release.errors import ConflictError, InputError, IntegrityError, NotFoundError
from avatar_release.records import BlobRef
from avatar_release.records.stored import (
    STORED_NAMESPACES,
    render_attestations_index,
    render_results_index,
    render_shard_record,
    shard_record_name,
)
from avatar_release.registry import LocalRegistry, MemoryRegistry, OciRegistry, Registry
from avatar_release.registry.oci import RetryPolicy
from tests.oci_logins import USERS, auths, basic_uri
from tests.oci_memory import MemoryDistribution

FAST = RetryPolicy(attempts=4, base_delay=0.01, max_delay=0.05, connect_timeout=2.0, read_timeout=20.0)
# The logged-in servers (TLS + htpasswd, a token service) run in the full suite; the edit loop
# (-m "not slow") keeps the anonymous one, which exercises the same protocol code.
BACKENDS = [
    "memory",
    "local",
    "oci-memory",
    "oci",
    pytest.param("oci-basic-tls", marks=pytest.mark.slow),
    pytest.param("oci-token", marks=pytest.mark.slow),
]


@dataclass
class Backend:
    """One store under test, and what the suite needs around it."""

    name: str
    store: Registry
    open: Callable[[], Registry]  # another handle on the same store, as another client would open it
    uri: str | None  # how another process opens it (None: the store lives in this process only)
    blob_path: Callable[[str], Path] | None  # where a blob's bytes lie on disk (None: in memory)
    tampered: dict[Path, bytes] = field(default_factory=dict)
    server: MemoryDistribution | None = None  # the in-memory distribution server behind oci-memory

    def tamper_blob(self, digest: str, data: bytes) -> None:
        """Replace the stored bytes of a blob behind the store's back (a bad disk, an attacker)."""
        if self.server is not None:
            assert digest in self.server.blobs, f"{self.name}: blob {digest} is not on the server"
            self.server.blobs[digest] = data
            return
        if self.blob_path is None:
            self.store._data[f"blobs/sha256/{digest.removeprefix('sha256:')}"] = data
            return
        path = self.blob_path(digest)
        assert path.is_file(), f"{self.name}: blob {digest} is not where the suite expects it ({path})"
        self.tampered.setdefault(path, path.read_bytes())
        path.write_bytes(data)

    def restore(self) -> None:
        """Undo tamper_blob: a registry server keeps one copy of a blob for all its repositories."""
        for path, data in self.tampered.items():
            path.write_bytes(data)


def _distribution_blob(server) -> Callable[[str], Path]:
    """distribution's filesystem driver keeps a blob at blobs/sha256/<2 hex>/<hex>/data."""

    def path(digest: str) -> Path:
        hex_ = digest.removeprefix("sha256:")
        return server.root / "data" / "docker" / "registry" / "v2" / "blobs" / "sha256" / hex_[:2] / hex_ / "data"

    return path


@pytest.fixture(params=BACKENDS)
def backend(request, tmp_path, monkeypatch) -> Backend:
    """A fresh, empty store of each kind (see the module docstring)."""
    name = request.param
    if name == "memory":
        store = MemoryRegistry(f"conformance-{uuid.uuid4().hex[:8]}")
        return Backend(name, store, lambda: store, None, None)
    if name == "local":
        root = tmp_path / "store"
        return Backend(
            name,
            LocalRegistry(root),
            lambda: LocalRegistry(root, create=False),
            str(root),
            lambda d: root / "blobs" / "sha256" / d.removeprefix("sha256:"),
        )
    locks = tmp_path / "locks"
    monkeypatch.setenv("AVATAR_RELEASE_LOCK_DIR", str(locks))  # the same lock for a racing process
    if name == "oci-memory":
        server = MemoryDistribution(page_size=50)  # small pages: listings follow Link pagination
        uri = f"oci+http://registry.test/conformance/{uuid.uuid4().hex[:12]}"

        def open_memory() -> OciRegistry:
            return OciRegistry(uri, session=server, retry=FAST, lock_dir=locks)

        return Backend(name, open_memory(), open_memory, None, None, server=server)
    repo = f"conformance/{uuid.uuid4().hex[:12]}"
    if name == "oci":
        server = request.getfixturevalue("oci_server")
        uri = server.uri(repo)
    elif name == "oci-basic-tls":
        server = request.getfixturevalue("basic_server")
        request.getfixturevalue("logins")(auths(server.host, "ana", USERS["ana"]))
        uri = basic_uri(server, request.getfixturevalue("pki")["ca"])
    else:
        server, issuer = request.getfixturevalue("token_setup")
        issuer.lifetime, issuer.expires_in, issuer.expired_next = 300, 300, 0
        request.getfixturevalue("logins")(auths(server.host, "ana", USERS["ana"]))
        # after logins (which clears it): the CA of the token issuer, which serves HTTPS
        monkeypatch.setenv("AVATAR_RELEASE_REGISTRY_CA", str(request.getfixturevalue("pki")["ca"]))
        uri = server.uri(repo)

    def open_() -> OciRegistry:
        return OciRegistry(uri, retry=FAST, lock_dir=locks)

    b = Backend(name, open_(), open_, uri, _distribution_blob(server))
    request.addfinalizer(b.restore)
    return b


def publish(store: Registry, build_id: str, payloads: tuple[bytes, ...] = (b"exe",)) -> tuple[str, dict]:
    """A build whose manifest names real blobs (weights and executables), as compile publishes one."""
    media = "application/vnd.avatar-release.executable.v1+zstd"
    refs = [{"digest": store.put_blob(p), "size": len(p), "media_type": media} for p in payloads]
    doc = {
        "build_id": build_id,
        "pipeline": "tiny",
        "target": "cpu-8",
        "created_at": "2026-12-01T00:00:00.000000Z",
        "weights": {"blob": refs[0]},
        "executables": [{"key": f"dit/b{i}", "blob": r} for i, r in enumerate(refs)],
    }
    digest, created = store.put_build(build_id, json.dumps(doc).encode())
    assert created
    return digest, doc


def move(store: Registry, channel: str, ref: str, expected: str | None, who: str = "ci", reason: str = "r", **kw):
    return store.move_channel(
        channel, store.resolve(ref), expected_digest=expected, action="promote", who=who, reason=reason, **kw
    )


# ---- blobs: put, get, dedup, verified reads, missing, tampered --------------------------------------------
def test_a_blob_reads_back_as_stored_and_a_second_put_dedups(backend):
    store = backend.store
    for data in (b"hello", b"", bytes(range(256)) * 1024):
        digest = store.put_blob(data)
        assert digest == sha256_digest(data) and store.has_blob(digest)
        assert store.put_blob(data) == digest
        assert store.get_blob(digest, len(data)) == data
        assert backend.open().get_blob(digest, len(data)) == data  # another client reads the same


def test_a_missing_blob_is_not_found(backend):
    absent = sha256_digest(b"never stored")
    assert not backend.store.has_blob(absent)
    with pytest.raises(NotFoundError, match="not found"):
        backend.store.get_blob(absent, 12)


def test_a_read_that_declares_the_wrong_size_is_refused(backend):
    digest = backend.store.put_blob(b"hello world")
    with pytest.raises(IntegrityError, match="size more than 5 bytes, manifest says 5"):
        backend.store.get_blob(digest, 5)
    with pytest.raises(IntegrityError, match="size 11 bytes, manifest says 20"):
        backend.store.get_blob(digest, 20)


def test_a_tampered_blob_is_refused_on_read(backend):
    store = backend.store
    good, longer = store.put_blob(b"executable bytes"), store.put_blob(b"weights")
    backend.tamper_blob(good, b"Executable bytes")  # same size, other content
    backend.tamper_blob(longer, b"weights and a payload")
    with pytest.raises(IntegrityError, match="content hashes to"):
        store.get_blob(good, 16)
    with pytest.raises(IntegrityError, match="size more than 7 bytes"):
        store.get_blob(longer, 7)


def test_a_blob_streams_to_a_sink_and_is_checked_whole(backend):
    """``stream_blob``: the sink sees the bytes a piece at a time, and its result counts only for the
    right bytes — tampered, short or missing blobs are refused after the sink ran, never returned."""
    store = backend.store
    data = bytes(range(256)) * (12 << 10)  # 3 MiB: more than one piece in every store
    digest = store.put_blob(data)
    pieces: list[int] = []

    def collect(chunks):
        out = bytearray()
        for c in chunks:
            pieces.append(len(c))
            out += c
        return bytes(out)

    assert store.stream_blob(digest, len(data), collect) == data
    assert backend.name.startswith("oci") or len(pieces) > 1  # a directory or memory store hands pieces
    assert store.stream_blob(digest, len(data), lambda chunks: next(iter(chunks))[:1]) == data[:1]  # partial read
    with pytest.raises(IntegrityError, match="size more than 10 bytes"):
        store.stream_blob(digest, 10, collect)
    with pytest.raises(NotFoundError):
        store.stream_blob(sha256_digest(b"never stored"), 3, collect)
    small = store.put_blob(b"weights")
    backend.tamper_blob(small, b"Weights")
    with pytest.raises(IntegrityError, match="content hashes to"):
        store.stream_blob(small, 7, collect)
    backend.tamper_blob(small, b"Weig")  # cut short (a file truncated in place): refused, never a fault
    with pytest.raises(IntegrityError, match="size 4 bytes, manifest says 7"):
        store.stream_blob(small, 7, collect)


def test_a_tampered_manifest_is_refused_on_read(backend):
    digest, doc = publish(backend.store, "b-1")
    manifest_bytes = backend.store.get_manifest_bytes(digest)
    assert json.loads(manifest_bytes) == doc
    backend.tamper_blob(sha256_digest(manifest_bytes), manifest_bytes.replace(b"cpu-8", b"cpu-9"))
    with pytest.raises(IntegrityError):
        backend.open().get_manifest_bytes(digest)


# ---- builds: commit, immutability, listing, resolution --------------------------------------------------
def test_a_build_is_committed_once_and_never_rewritten(backend):
    digest, doc = publish(backend.store, "b-1")
    assert backend.store.put_build("b-1", b'{"something": "else"}') == (digest, False)
    assert json.loads(backend.open().get_manifest_bytes(digest)) == doc


def test_a_build_whose_blobs_are_missing_is_refused_and_invisible(backend):
    ghost = {"digest": sha256_digest(b"never pushed"), "size": 12, "media_type": "application/octet-stream"}
    with pytest.raises(IntegrityError, match="missing"):
        backend.store.put_build("b-ghost", json.dumps({"build_id": "b-ghost", "weights": {"blob": ghost}}).encode())
    with pytest.raises(NotFoundError):
        backend.store.resolve("b-ghost")
    assert backend.store.list_builds() == []


def test_builds_are_listed_in_publish_order_and_resolve_by_digest(backend):
    assert backend.store.list_builds() == []
    d1, _ = publish(backend.store, "b-1", (b"1",))
    d2, _ = publish(backend.store, "b-2", (b"2",))
    listed = backend.open().list_builds()
    assert [(b.build_id, b.digest) for b in listed] == [("b-1", d1), ("b-2", d2)]
    assert all(b.published_at for b in listed)
    assert (backend.store.resolve(d1).build_id, backend.store.resolve(d1).via) == ("b-1", "digest")
    with pytest.raises(NotFoundError, match="no build with manifest digest"):
        backend.store.resolve(sha256_digest(b"nothing"))


def test_resolve_takes_a_channel_a_build_id_a_digest_or_a_unique_prefix(backend):
    store = backend.store
    d1, _ = publish(store, "tiny-cpu-8-aaaa", (b"1",))
    d2, _ = publish(store, "tiny-cpu-8-bbbb", (b"2",))
    move(store, "dev", "tiny-cpu-8-aaaa", None)
    assert (store.resolve("dev").digest, store.resolve("dev").via) == (d1, "channel")
    assert (store.resolve("tiny-cpu-8-bbbb").digest, store.resolve("tiny-cpu-8-bbbb").via) == (d2, "build-id")
    assert store.resolve(d2).build_id == "tiny-cpu-8-bbbb"
    assert store.resolve("tiny-cpu-8-b").digest == d2
    with pytest.raises(NotFoundError, match="ambiguous"):
        store.resolve("tiny-cpu-8")
    with pytest.raises(NotFoundError, match="channel 'prod' is empty"):
        store.resolve("prod")
    with pytest.raises(NotFoundError, match="unknown build or channel 'nope'"):
        store.resolve("nope")


def test_names_that_could_escape_are_refused(backend):
    store = backend.store
    for bad in ("../x", "a/b", "", "UPPER", ".hidden", "a..b"):
        with pytest.raises(InputError):
            store.put_build(bad, b"{}")
        with pytest.raises(InputError):
            store.put_record("reviews", bad, b"x")
        with pytest.raises(InputError):
            store.get_record(bad or "-", "b-1")
        with pytest.raises(InputError):
            store.get_channel(bad)


# ---- channels: compare-and-swap, history, listing ----------------------------------------------------------
def test_a_channel_moves_by_compare_and_swap(backend):
    store = backend.store
    publish(store, "b-1", (b"1",))
    publish(store, "b-2", (b"2",))
    r1, r2 = store.resolve("b-1"), store.resolve("b-2")
    e = move(store, "staging", "b-1", None, who="a", reason="first")
    assert (e.sequence, e.from_build, e.to_build, e.to_digest) == (1, None, "b-1", r1.digest)
    # A writer that decided while the channel was empty loses: it has moved since.
    with pytest.raises(ConflictError, match="nothing was changed"):
        move(store, "staging", "b-2", None, who="b", reason="late")
    with pytest.raises(ConflictError, match="nothing was changed"):
        move(store, "staging", "b-2", r2.digest, who="b", reason="wrong expectation")
    assert store.get_channel("staging").build_id == "b-1"
    # Repeating a move is a no-op, not a new history entry.
    assert move(store, "staging", "b-1", r1.digest) is None
    e2 = move(store, "staging", "b-2", r1.digest, who="a", reason="second")
    assert (e2.sequence, e2.from_build, e2.from_digest, e2.to_build) == (2, "b-1", r1.digest, "b-2")
    assert [h.to_build for h in backend.open().history("staging")] == ["b-1", "b-2"]


def test_channel_states_and_history_as_another_client_sees_them(backend):
    store = backend.store
    for n in (1, 2, 3):
        publish(store, f"b-{n}", (str(n).encode(),))
    r1, r2, r3 = (store.resolve(f"b-{n}") for n in (1, 2, 3))
    gate = sha256_digest(b"gate result")
    e1 = store.move_channel("dev", r1, expected_digest=None, action="publish", who="ci", reason="one")
    e2 = store.move_channel(
        "staging", r1, expected_digest=None, action="promote", who="ann", reason="gate ok", gate_result_digest=gate
    )
    e3 = store.move_channel("dev", r2, expected_digest=r1.digest, action="publish", who="ci", reason="two")
    e4 = store.move_channel("dev", r3, expected_digest=r2.digest, action="publish", who="ci", reason="three")
    e5 = store.move_channel("dev", r2, expected_digest=r3.digest, action="rollback", who="bob", reason="bad")
    other = backend.open()
    assert other.history() == [e1, e2, e3, e4, e5] and [e.sequence for e in other.history()] == [1, 2, 3, 4, 5]
    assert [(e.action, e.who, e.reason) for e in other.history("dev")][-1] == ("rollback", "bob", "bad")
    assert [e.to_build for e in other.history("dev")] == ["b-1", "b-2", "b-3", "b-2"]
    assert other.history("staging")[0].gate_result_digest == gate and other.history("prod") == []
    dev = other.get_channel("dev")
    assert (dev.build_id, dev.digest, dev.sequence, dev.updated_at) == ("b-2", r2.digest, 5, e5.when)
    assert sorted((c.channel, c.build_id, c.sequence) for c in other.list_channels()) == [
        ("dev", "b-2", 5),
        ("staging", "b-1", 2),
    ]
    assert other.get_channel("prod") is None


def test_an_empty_store_lists_nothing(backend):
    store = backend.store
    assert store.list_builds() == [] and store.list_channels() == [] and store.history() == []
    assert store.get_channel("dev") is None
    assert all(store.list_records(ns) == [] for ns in STORED_NAMESPACES)


def test_concurrent_moves_from_separate_clients_exactly_one_wins(backend):
    ids = [f"b-{n}" for n in range(4)]
    for n, b in enumerate(ids):
        publish(backend.store, b, (str(n).encode(),))
    barrier, outcomes = threading.Barrier(len(ids)), []

    def race(build_id):
        client = backend.open()
        resolved = client.resolve(build_id)
        barrier.wait()
        try:
            client.move_channel("prod", resolved, expected_digest=None, action="promote", who=build_id, reason="race")
            outcomes.append("won")
        except ConflictError:
            outcomes.append("conflict")

    threads = [threading.Thread(target=race, args=(b,)) for b in ids]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(outcomes) == ["conflict"] * 3 + ["won"]
    (entry,) = backend.store.history("prod")
    assert backend.store.get_channel("prod").build_id == entry.to_build


_RACER = """
import os, sys, time
from avatar_release.errors import ConflictError
from avatar_release.registry import open_registry
uri, target, go = sys.argv[1:4]
reg = open_registry(uri, create=False)
resolved = reg.resolve(target)
while not os.path.exists(go):
    time.sleep(0.001)
try:
    reg.move_channel("staging", resolved, expected_digest=None, action="promote", who=target, reason="race")
    print("won")
except ConflictError:
    print("conflict")
"""


def test_concurrent_moves_from_separate_processes_exactly_one_wins(backend, tmp_path):
    if backend.uri is None:
        pytest.skip(f"{backend.name}: the store lives in one process")
    publish(backend.store, "b-1", (b"1",))
    publish(backend.store, "b-2", (b"2",))
    go = tmp_path / "go"
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", _RACER, backend.uri, b, str(go)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for b in ("b-1", "b-2")
    ]
    go.write_text("go")
    results = [p.communicate(timeout=120) for p in procs]
    assert sorted(out.strip() for out, _ in results) == ["conflict", "won"], [err[-500:] for _, err in results]
    (entry,) = backend.store.history("staging")
    assert backend.store.get_channel("staging").build_id == entry.to_build


# ---- records: every declared namespace, with the blobs each keeps alive -------------------------------------
def _blob(store: Registry, data: bytes) -> BlobRef:
    return BlobRef(digest=store.put_blob(data), size=len(data), media_type="application/octet-stream")


def _a_record_of_each_namespace(store: Registry, build_id: str) -> dict[str, tuple[str, bytes, list[BlobRef]]]:
    """namespace -> (name, bytes, the blobs it keeps alive) as the rooms that write them would store
    them (blobs first)."""
    results = [_blob(store, b'{"status": "passed"}')]
    frames = [_blob(store, b"frames" * 100)]
    envelope, partial = _blob(store, b'{"payloadType": "dsse"}'), _blob(store, b'{"shard": 0}')
    move = _blob(store, b'{"kind": "avatar-release/move"}')
    by_namespace = {
        "gate-results": (build_id, render_results_index(results, frames), results + frames),
        "gate-shards": (
            shard_record_name(build_id, 0, 2, [0, 1], "run-7"),
            render_shard_record(envelope, partial, frames),
            [envelope, partial, *frames],
        ),
        "compile-gates": (build_id, b'{"status": "passed", "gates": []}', []),
        "reviews": (build_id, b'{"verdict": "ok"}', []),
        "statements": ("staging", b'{"payloadType": "application/vnd.in-toto+json", "signatures": []}', []),
        "attestations": (build_id, render_attestations_index([envelope]), [envelope]),
        "timestamps": ("staging", b"\x00\xff binary is kept as is \n", []),
        # a channel's signed metadata keeps its move record and the evidence it names
        "release-state": (
            "3.prod.json",
            json.dumps(
                {
                    "signed": {
                        "_type": "targets",
                        "targets": {
                            "prod/build": {"custom": {"move": move.model_dump(), "evidence": [envelope.model_dump()]}}
                        },
                    }
                }
            ).encode(),
            [move, envelope],
        ),
    }
    assert set(by_namespace) == set(STORED_NAMESPACES), "a namespace was declared: add it to the suite"
    return by_namespace


def test_records_of_every_namespace_read_back_byte_for_byte_with_their_blobs(backend):
    store, build_id = backend.store, "tiny-cpu-8-aaaa"
    written = _a_record_of_each_namespace(store, build_id)
    for ns, (name, data, _) in written.items():
        assert store.get_record(ns, name) is None
        store.put_record(ns, name, data)
    other = backend.open()
    for ns, (name, data, blobs) in written.items():
        assert other.get_record(ns, name) == data
        assert other.list_records(ns) == [name]
        spec = STORED_NAMESPACES[ns]
        if spec.keyed_by == "build":
            assert spec.build_of(name) == build_id
        # The roots are the blobs the record names, every one (what garbage collection keeps), each
        # stored and read back from this store as another client sees it.
        roots = spec.roots(other.get_record(ns, name), name, lambda r: other.get_blob(r.digest, r.size))
        assert [r.digest for r in roots] == [b.digest for b in blobs], f"{ns}: roots"
        for ref in roots:
            assert other.has_blob(ref.digest) and sha256_digest(other.get_blob(ref.digest, ref.size)) == ref.digest
    assert any(blobs for _, _, blobs in written.values())  # the suite checks roots somewhere at all


def test_records_are_replaced_updated_and_listed_per_namespace(backend):
    store = backend.store
    store.put_record("reviews", "b-2", b"")
    store.put_record("reviews", "b-1", b'{"verdict": "hold"}')
    store.put_record("reviews", "b-1", b'{"verdict": "ok"}')  # a rewrite replaces
    assert store.get_record("reviews", "b-1") == b'{"verdict": "ok"}' and store.get_record("reviews", "b-2") == b""
    assert store.update_record("gate-results", "b-1", lambda old: (old or b"") + b"a") == b"a"
    assert store.update_record("gate-results", "b-1", lambda old: (old or b"") + b"b") == b"ab"
    other = backend.open()
    assert other.get_record("gate-results", "b-1") == b"ab"
    assert other.list_records("reviews") == ["b-1", "b-2"] and other.list_records("gate-results") == ["b-1"]
    assert other.list_records("attestations") == [] and other.get_record("attestations", "b-1") is None


def test_concurrent_record_updates_from_separate_clients_lose_nothing(backend):
    clients = [backend.open() for _ in range(4)]

    def add(client, k):
        for i in range(5):
            client.update_record(
                "gate-results", "b-1", lambda old, tag=f"{k}.{i}": json.dumps(json.loads(old or b"[]") + [tag]).encode()
            )

    threads = [threading.Thread(target=add, args=(c, k)) for k, c in enumerate(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(json.loads(backend.store.get_record("gate-results", "b-1"))) == sorted(
        f"{k}.{i}" for k in range(4) for i in range(5)
    )
