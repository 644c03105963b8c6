"""The node cache against a real OCI registry server (docker-registry): a second pod's load pulls
nothing, a damaged entry is found and pulled again, the size bound holds with least recently used
entries evicted first, and two processes pulling the same build at once both get it whole."""

from __future__ import annotations

import json
import multiprocessing
import os
import threading
import uuid
from pathlib import Path

import pytest
import requests

from avatar_release.errors import InputError
from avatar_release.records import Manifest, parse_record
from avatar_release.registry import CachedRegistry, LocalRegistry, NodeCache, OciRegistry, Prefetching, with_node_cache
from avatar_release.registry.cache import parse_size
from avatar_release.registry.oci import RetryPolicy

DATA = Path(__file__).resolve().parents[1] / "data"
FAST = RetryPolicy(attempts=4, base_delay=0.01, max_delay=0.05, connect_timeout=2.0, read_timeout=20.0)


class CountingSession(requests.Session):
    """A real HTTP session that counts the blob GETs it sends; with ``together``, the first that
    many GETs are each held until all of them are in flight at once (proof of side-by-side pulls:
    pulled one after another, they would never meet)."""

    def __init__(self, together: int = 0):
        super().__init__()
        self.blob_gets: list[str] = []
        self.barrier = threading.Barrier(together, timeout=60) if together else None
        self.watched: set[str] = set()  # the blobs the barrier applies to
        self._lock = threading.Lock()

    def request(self, method, url, **kw):
        if method == "GET" and "/blobs/sha256:" in url:
            digest = url.rsplit("/", 1)[1]
            with self._lock:
                self.blob_gets.append(digest)
                n = len([d for d in self.blob_gets if d in self.watched])
            if self.barrier is not None and digest in self.watched and n <= self.barrier.parties:
                self.barrier.wait()
        return super().request(method, url, **kw)


def pod(
    uri: str, cache_dir: Path, *, max_bytes: int = 1 << 30, concurrency: int = 4, session: CountingSession | None = None
) -> CachedRegistry:
    """What one pod opens: its own client of the registry, the node's shared cache directory."""
    store = OciRegistry(uri, session=session or CountingSession(), retry=FAST, lock_dir=cache_dir.parent / "locks")
    return CachedRegistry(store, NodeCache(cache_dir, max_bytes=max_bytes, concurrency=concurrency))


def gets(reg: CachedRegistry) -> list[str]:
    return reg.store.transport.session().blob_gets  # type: ignore[attr-defined]


@pytest.fixture
def uri(oci_server) -> str:
    return oci_server.uri(f"t/{uuid.uuid4().hex[:10]}")


def put_blobs(uri: str, tmp_path: Path, n: int, size: int = 4096) -> list[tuple[str, int, bytes]]:
    writer = OciRegistry(uri, retry=FAST, lock_dir=tmp_path / "locks")
    out = []
    for _i in range(n):
        data = os.urandom(size)
        out.append((writer.put_blob(data), size, data))
    return out


def publish_build(uri: str, tmp_path: Path) -> tuple[str, Manifest, dict[str, bytes]]:
    """A build (weight chunks and executables; the newest stored manifest version this avatar-release
    reads) whose every blob names real bytes on the server."""
    writer = OciRegistry(uri, retry=FAST, lock_dir=tmp_path / "locks")
    doc = json.loads(_newest_readable_manifest())
    doc["build_id"] = "tiny-cpu-8-" + uuid.uuid4().hex[:12]
    held: dict[str, bytes] = {}

    def real(node):
        if isinstance(node, dict):
            if "digest" in node and "media_type" in node and isinstance(node.get("size"), int):
                data = os.urandom(3000 + len(held))
                node.update(digest=writer.put_blob(data), size=len(data))
                held[node["digest"]] = data
                return
            for v in node.values():
                real(v)
        elif isinstance(node, list):
            for v in node:
                real(v)

    real(doc)
    m = parse_record(Manifest, json.dumps(doc).encode(), where="test")
    digest, _ = writer.put_build(m.build_id, m.to_json_bytes())
    return digest, m, held


def _newest_readable_manifest() -> bytes:
    stored = sorted(DATA.glob("build-manifest.v[0-9]*.json"), key=lambda p: int(p.stem.split(".v")[1].split("-")[0]))
    for path in reversed(stored):
        try:
            parse_record(Manifest, path.read_bytes(), where=str(path))
            return path.read_bytes()
        except Exception:  # noqa: BLE001 - outside the support window: try the one before
            continue
    raise AssertionError("no stored build manifest is readable")


def read_all(reg: CachedRegistry, blobs) -> dict[str, bytes]:
    return {d: reg.stream_blob(d, s, lambda pieces: b"".join(pieces)) for d, s, *_ in blobs}


# ---- a second pod ---------------------------------------------------------------------------------
def test_a_second_pod_reads_every_blob_from_the_node_cache(uri, tmp_path):
    blobs = put_blobs(uri, tmp_path, 6)
    first = pod(uri, tmp_path / "cache")
    assert read_all(first, blobs) == {d: data for d, _, data in blobs}
    assert sorted(gets(first)) == sorted(d for d, _, _ in blobs)  # each pulled once

    second = pod(uri, tmp_path / "cache")  # another process on the node: a fresh client, the same volume
    assert read_all(second, blobs) == {d: data for d, _, data in blobs}
    assert gets(second) == []
    assert second.cache.stats.hits == 6 and second.cache.stats.pulls == 0


def test_reading_a_build_pulls_its_blobs_side_by_side_in_the_background(uri, tmp_path):
    digest, m, held = publish_build(uri, tmp_path)
    assert len(m.blobs()) >= 4
    session = CountingSession(together=4)
    reg = pod(uri, tmp_path / "cache", concurrency=4, session=session)
    assert isinstance(reg, Prefetching)
    session.watched = set(held)

    def pulled() -> list[str]:
        return sorted(d for d in gets(reg) if d in held)

    reg.get_manifest_bytes(digest)
    assert pulled() == []  # reading the manifest pulls none of its blobs: the loader checks it first
    first = m.blobs()[0]
    assert reg.get_blob(first.digest, first.size) == held[first.digest]  # the build's read-ahead starts: the
    for b in m.blobs():  # first four GETs meet at the barrier, so they were in flight together
        out = bytearray(b.size)
        reg.read_blob_into(b.digest, b.size, memoryview(out))
        assert bytes(out) == held[b.digest]
    assert pulled() == sorted(held)  # each blob pulled once


# ---- damage ---------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "damage", ["flipped byte", "truncated", "seal removed and byte flipped", "byte flipped, sealed before a reboot"]
)
def test_a_damaged_entry_is_found_dropped_and_pulled_again(uri, tmp_path, damage):
    [(digest, size, data)] = put_blobs(uri, tmp_path, 1)
    reg = pod(uri, tmp_path / "cache")
    assert read_all(reg, [(digest, size)]) == {digest: data}
    entry = tmp_path / "cache" / "blobs" / digest.split(":")[1]
    raw = bytearray(entry.read_bytes())
    if damage == "truncated":
        raw = raw[:-10]
    else:
        raw[100] ^= 0xFF
    entry.write_bytes(bytes(raw))
    seal = tmp_path / "cache" / "seals" / entry.name
    if damage.startswith("seal removed"):
        seal.unlink()
    if damage.endswith("reboot"):  # unsynced bytes a crash lost: the seal matches the file, but another boot wrote it
        now = entry.stat()
        seal.write_text(f"{now.st_ino} {now.st_size} {now.st_mtime_ns} {now.st_ctime_ns} another-boot\n")

    again = pod(uri, tmp_path / "cache")
    assert again.get_blob(digest, size) == data  # the right bytes, not the damaged ones
    assert gets(again) == [digest]  # found damaged, pulled again once
    assert entry.read_bytes() == data
    assert pod(uri, tmp_path / "cache").get_blob(digest, size) == data


def test_a_loader_that_refuses_the_bytes_gets_them_pulled_again_when_the_entry_is_damaged(uri, tmp_path):
    """Decay under an unchanged seal: the loader's own digest check fails, the entry is hashed
    again, dropped, pulled again, and the sink called afresh."""
    from avatar_release._digest import StreamDigest
    from avatar_release.errors import IntegrityError

    [(digest, size, data)] = put_blobs(uri, tmp_path, 1)
    reg = pod(uri, tmp_path / "cache")
    reg.get_blob(digest, size)
    entry = tmp_path / "cache" / "blobs" / digest.split(":")[1]
    st = entry.stat()
    raw = bytearray(entry.read_bytes())
    raw[0] ^= 1
    entry.write_bytes(bytes(raw))
    seal = tmp_path / "cache" / "seals" / entry.name
    now, boot = entry.stat(), seal.read_text().split()[-1]  # the seal names the file as it is now, in this
    seal.write_text(f"{now.st_ino} {now.st_size} {now.st_mtime_ns} {now.st_ctime_ns} {boot}\n")  # boot: decay
    assert now.st_ino == st.st_ino

    def loader(pieces):
        seen = StreamDigest()
        for p in pieces:
            seen.update(p)
        if seen.digest != digest:
            raise IntegrityError("weights chunk 0: bytes hash to something else")
        return "placed"

    again = pod(uri, tmp_path / "cache")
    assert again.stream_blob(digest, size, loader) == "placed"
    assert gets(again) == [digest] and entry.read_bytes() == data


# ---- the size bound ---------------------------------------------------------------------------------
def test_eviction_keeps_the_bound_and_drops_the_least_recently_used_first(uri, tmp_path):
    blobs = put_blobs(uri, tmp_path, 6, size=10_000)
    reg = pod(uri, tmp_path / "cache", max_bytes=35_000)  # room for three
    cache = reg.cache
    for i, (d, s, _) in enumerate(blobs):
        reg.get_blob(d, s)
        if i >= 1:
            reg.get_blob(*blobs[0][:2])  # blob 0 stays in use, so it stays young
        assert cache.size() <= 35_000
    kept = {p.name for p in (tmp_path / "cache" / "blobs").iterdir()}
    hexes = [d.split(":")[1] for d, _, _ in blobs]
    assert kept == {hexes[0], hexes[4], hexes[5]}
    assert cache.stats.evicted == 3


def test_a_build_larger_than_the_bound_loads_whole_each_blob_pulled_once(uri, tmp_path):
    digest, m, held = publish_build(uri, tmp_path)
    reg = pod(uri, tmp_path / "cache", max_bytes=5000)  # room for about one of its blobs
    reg.get_manifest_bytes(digest)
    for b in m.blobs():
        assert reg.get_blob(b.digest, b.size) == held[b.digest]
    assert sorted(d for d in gets(reg) if d in held) == sorted(held)  # no blob of the loading build evicted
    reg.cache.evict()  # the next pull (here: by hand) trims the cache to its bound
    assert reg.cache.size() <= 5000


def test_an_entry_being_read_is_not_evicted_and_a_removed_one_stays_readable(uri, tmp_path):
    (d1, s1, data1), (d2, s2, data2) = put_blobs(uri, tmp_path, 2, size=10_000)
    reg = pod(uri, tmp_path / "cache", max_bytes=1 << 20)
    reg.get_blob(d1, s1)
    reg.get_blob(d2, s2)
    held = reg.cache.open(reg.store, d1, s1)  # another pod is placing it from the mapping
    assert reg.cache.evict(0) == 1  # only the idle one went
    assert reg.cache.has(d1, s1) and not reg.cache.has(d2, s2)
    os.unlink(tmp_path / "cache" / "blobs" / d1.split(":")[1])  # removed under the reader anyway
    assert bytes(held.view) == data1
    held.close()
    assert reg.get_blob(d2, s2) == data2


# ---- two processes at once ------------------------------------------------------------------------------
def _pull_in_a_process(uri: str, cache_dir: str, blobs: list[tuple[str, int]], start, out) -> None:
    reg = pod(uri, Path(cache_dir))
    start.wait(60)
    reg.prefetch([_Ref(d, s) for d, s in blobs])
    ok = all(reg.cache.entries.recheck(d, s) for d, s in blobs)
    out.put((ok, reg.cache.stats.pulls, len(gets(reg))))


class _Ref:
    def __init__(self, digest: str, size: int):
        self.digest, self.size = digest, size


@pytest.mark.slow  # two fresh interpreters: about 5 s on 2 cores
def test_two_processes_pulling_the_same_build_at_once_both_succeed(uri, tmp_path):
    blobs = [(d, s) for d, s, _ in put_blobs(uri, tmp_path, 12, size=256 << 10)]
    ctx = multiprocessing.get_context("spawn")
    start, out = ctx.Barrier(2), ctx.Queue()
    procs = [
        ctx.Process(target=_pull_in_a_process, args=(uri, str(tmp_path / "cache"), blobs, start, out)) for _ in range(2)
    ]
    for p in procs:
        p.start()
    results = [out.get(timeout=120) for _ in procs]
    for p in procs:
        p.join(60)
    assert [p.exitcode for p in procs] == [0, 0]
    assert all(ok for ok, _, _ in results)
    assert sum(pulls for _, pulls, _ in results) == len(blobs)  # each blob pulled by one of them
    assert sum(n for _, _, n in results) == len(blobs)
    names = {p.name for p in (tmp_path / "cache" / "blobs").iterdir()}
    assert names == {d.split(":")[1] for d, _ in blobs}  # no temporary file left behind


def test_a_cache_directory_that_cannot_be_made_is_a_registry_error_naming_it(uri, tmp_path):
    from avatar_release.errors import RegistryError

    [(digest, size, _)] = put_blobs(uri, tmp_path, 1)
    (tmp_path / "a-file").write_text("not a directory")
    reg = pod(uri, tmp_path / "a-file" / "cache")
    with pytest.raises(RegistryError, match=r"node cache .*a-file/cache: cannot create it .*--cache-dir"):
        reg.get_blob(digest, size)


# ---- settings ------------------------------------------------------------------------------------------------
def test_the_environment_names_the_cache_and_only_remote_stores_go_through_it(uri, tmp_path):
    remote = OciRegistry(uri, retry=FAST, lock_dir=tmp_path / "locks")
    assert with_node_cache(remote, {}) is remote
    cached = with_node_cache(
        remote,
        {
            "AVATAR_RELEASE_CACHE_DIR": str(tmp_path / "c"),
            "AVATAR_RELEASE_CACHE_SIZE": "2GiB",
            "AVATAR_RELEASE_PULL_CONCURRENCY": "3",
        },
    )
    assert isinstance(cached, CachedRegistry)
    assert (cached.cache.root, cached.cache.max_bytes, cached.cache.concurrency) == (tmp_path / "c", 2 << 30, 3)
    local = LocalRegistry(tmp_path / "reg")
    assert with_node_cache(local, {"AVATAR_RELEASE_CACHE_DIR": str(tmp_path / "c")}) is local
    assert parse_size("500M") == 500_000_000 and parse_size("1073741824") == 1 << 30
    with pytest.raises(InputError, match=r"AVATAR_RELEASE_CACHE_SIZE: '50 gigs' is not a size.*e\.g\. 50GiB"):
        with_node_cache(remote, {"AVATAR_RELEASE_CACHE_DIR": "x", "AVATAR_RELEASE_CACHE_SIZE": "50 gigs"})
    with pytest.raises(InputError, match="AVATAR_RELEASE_PULL_CONCURRENCY: '0' is not a number of pulls from 1 to 64"):
        with_node_cache(remote, {"AVATAR_RELEASE_CACHE_DIR": "x", "AVATAR_RELEASE_PULL_CONCURRENCY": "0"})


# ---- a real build --------------------------------------------------------------------------------------------
def _publish_real(built_registry, uri: str, tmp_path: Path) -> tuple[str, Manifest]:
    from avatar_release.registry import read_manifest

    root, built = built_registry
    local = LocalRegistry(root, create=False)
    resolved, manifest = read_manifest(local, built.build_id)
    writer = OciRegistry(uri, retry=FAST, lock_dir=tmp_path / "locks")
    for blob in manifest.blobs():
        writer.put_blob(local.get_blob(blob.digest, blob.size))
    digest, _ = writer.put_build(manifest.build_id, local.get_manifest_bytes(resolved.digest))
    return digest, manifest


@pytest.mark.slow  # the session's tiny build, loaded twice
def test_a_second_pod_loads_a_real_build_without_pulling_a_blob(built_registry, uri, tmp_path):
    from avatar_release.runtime import load

    digest, manifest = _publish_real(built_registry, uri, tmp_path)
    blobs = {b.digest for b in manifest.blobs()}
    first = pod(uri, tmp_path / "cache", concurrency=8)
    build = load(digest, first)
    assert build.guard.count == 0 and build.digest == digest
    assert sorted(d for d in gets(first) if d in blobs) == sorted(blobs)  # each pulled once, on the first load
    second = pod(uri, tmp_path / "cache")
    build = load(digest, second)
    assert build.guard.count == 0 and build.digest == digest
    assert [d for d in gets(second) if d in blobs] == []  # the second pod on the node pulled nothing
    assert second.cache.stats.pulls == 0


@pytest.mark.slow  # two renders of the session's tiny build, each a fresh process as a pod is
def test_render_and_verify_with_cache_dir_read_the_build_from_the_node_when_the_registry_lost_its_blobs(
    built_registry, oci_server, uri, tmp_path
):
    import subprocess
    import sys

    digest, manifest = _publish_real(built_registry, uri, tmp_path)
    env = {**os.environ, "AVATAR_RELEASE_LOCK_DIR": str(tmp_path / "locks")}
    env.pop("AVATAR_RELEASE_CACHE_DIR", None)

    def render(out: str) -> subprocess.CompletedProcess:
        return subprocess.run(
            [
                sys.executable,
                "-m",
                "avatar_release",
                "render",
                digest,
                "--registry",
                uri,
                "--cache-dir",
                str(tmp_path / "cache"),
                "--seconds",
                "0.2",
                "--out",
                str(tmp_path / out),
                "--json",
            ],
            env=env,
            capture_output=True,
            text=True,
            timeout=600,
        )

    first = render("first.mp4")
    assert first.returncode == 0, first.stderr[-3000:]
    n = len({b.digest for b in manifest.blobs()})
    assert json.loads(first.stdout)["node_cache"]["pulls"] == n  # the summary says what the cache did
    cached = {p.name for p in (tmp_path / "cache" / "blobs").iterdir()}
    assert cached == {b.digest.split(":")[1] for b in manifest.blobs()}
    repo = uri.split("/", 3)[3]
    for b in manifest.blobs():  # the registry loses every blob; manifests and tags stay
        r = requests.delete(f"http://{oci_server.host}/v2/{repo}/blobs/{b.digest}", timeout=30)
        assert r.status_code == 202, r.text
    assert OciRegistry(uri, retry=FAST, lock_dir=tmp_path / "locks").has_blob(manifest.blobs()[0].digest) is False
    second = render("second.mp4")
    assert second.returncode == 0, second.stderr[-3000:]
    summary = json.loads(second.stdout)
    assert summary["compiles"] == 0 and summary["node_cache"]["pulls"] == 0 and summary["node_cache"]["hits"] >= n
    verified = subprocess.run(
        [
            sys.executable,
            "-m",
            "avatar_release",
            "verify",
            digest,
            "--registry",
            uri,
            "--cache-dir",
            str(tmp_path / "cache"),
            "--no-programs",
            "--json",
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert verified.returncode == 0 and json.loads(verified.stdout)["ok"], verified.stdout[
        -3000:
    ]  # what the node loads
    no_cache = subprocess.run(
        [
            sys.executable,
            "-m",
            "avatar_release",
            "render",
            digest,
            "--registry",
            uri,
            "--seconds",
            "0.2",
            "--out",
            str(tmp_path / "third.mp4"),
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert no_cache.returncode != 0 and "not found" in no_cache.stderr + no_cache.stdout  # without it: gone
