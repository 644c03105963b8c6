"""Integrity checks that need no build: declared sizes bounded before anything is allocated,
decompression that never runs past the declared size, malformed pickles and corrupt registry
files refused as integrity errors (never a crash), and the identity's version binding."""

from __future__ import annotations

import hashlib
import json
import pickle
import tracemalloc

import pytest
import zstandard
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from avatar_release._digest import is_digest
from avatar_release.errors import IntegrityError, SchemaVersionError
from avatar_release.records import (
    ChannelState,
    HistoryEntry,
    Manifest,
    check_identity,
    manifest_identity,
    parse_record,
    readable_versions,
)
from avatar_release.registry import MemoryRegistry
from avatar_release.registry._blobcheck import BLOB_CHUNK
from avatar_release.runtime._blobs import MAX_ZSTD_RATIO, check_bounds, decompress, memory_cap
from avatar_release.runtime._inflate import inflate_into
from tests.helpers import DATA, cpu_manifest, put_stand_in_build, stored_manifest


def _digest(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


# ------------------------------------------------------------------------------ decompression
def _into(data: bytes, size: int, digest: str, *, where: str) -> bytes:
    """inflate_into, as the weight loader calls it: the stored bytes in the store's pieces, into a
    reused buffer larger than the chunk."""
    buf = bytearray(b"\xee" * (size + 64))
    pieces = iter([data[i : i + BLOB_CHUNK] for i in range(0, len(data), BLOB_CHUNK)])
    return bytes(inflate_into(pieces, memoryview(buf), size, digest, where=where))


INFLATERS = pytest.mark.parametrize("inflate", [decompress, _into], ids=["decompress", "inflate_into"])


@INFLATERS
def test_decompress_returns_exactly_the_declared_bytes(inflate):
    raw = bytes(range(256)) * 1000
    z = zstandard.ZstdCompressor().compress(raw)
    assert bytes(inflate(z, len(raw), _digest(raw), where="x")) == raw


def test_inflating_into_a_buffer_too_small_is_a_caller_error_not_an_overrun():
    z = zstandard.ZstdCompressor().compress(b"a" * 1000)
    with pytest.raises(ValueError, match="a buffer of 999 bytes cannot hold 1000"):
        inflate_into(iter([z]), memoryview(bytearray(999)), 1000, _digest(b"a" * 1000), where="x")


def test_a_frame_without_its_size_in_the_header_takes_the_streaming_check():
    """compile writes the size into every frame (the one-call path); any other frame is stepped
    through, and is held to the same declared size and digest."""
    raw = bytes(range(256)) * 1000
    plain = zstandard.ZstdCompressor(write_content_size=False).compress(raw)
    assert zstandard.get_frame_parameters(plain).content_size != len(raw)
    assert bytes(decompress(plain, len(raw), _digest(raw), where="x")) == raw
    bigger = zstandard.ZstdCompressor(write_content_size=False).compress(raw + b"!")
    with pytest.raises(IntegrityError, match=f"decompresses to more than the {len(raw)} bytes"):
        decompress(bigger, len(raw), _digest(raw), where="x")
    lying = bytearray(zstandard.ZstdCompressor().compress(raw + b"!"))  # a header that says more than declared
    with pytest.raises(IntegrityError, match=f"more than the {len(raw)} bytes"):
        decompress(bytes(lying), len(raw), _digest(raw), where="x")


@pytest.mark.parametrize(
    "case, message",
    [
        ("longer", "decompresses to more than the 1000 bytes"),
        ("shorter", "decompresses to 500 bytes, the manifest says 1000"),
        ("digest", "hash to sha256:"),
        ("junk", "zstd frame is corrupt or truncated"),
        ("trailing-frame", "decompresses to more than the 1000 bytes"),
    ],
)
@INFLATERS
def test_decompress_refuses_what_the_manifest_does_not_say(case, message, inflate):
    raw = b"a" * 1000
    z = zstandard.ZstdCompressor().compress(raw)
    data, size, digest = {
        "longer": (zstandard.ZstdCompressor().compress(b"a" * 2000), 1000, _digest(raw)),
        "shorter": (zstandard.ZstdCompressor().compress(b"a" * 500), 1000, _digest(raw)),
        "digest": (z, 1000, _digest(b"b" * 1000)),
        "junk": (b"\x00garbage" * 10, 1000, _digest(raw)),
        "trailing-frame": (z + z, 1000, _digest(raw)),  # a second frame is read, not ignored
    }[case]
    with pytest.raises(IntegrityError, match=message):
        inflate(data, size, digest, where="blob x")


@INFLATERS
def test_a_bomb_under_a_small_declared_size_allocates_only_that(inflate):
    frame = zstandard.ZstdCompressor(level=19).compress(bytes(1 << 20))
    bomb = frame * 1024  # 1 GiB of zeros in a few dozen KB
    tracemalloc.start()
    try:
        with pytest.raises(IntegrityError, match="more than the 2097152 bytes"):
            inflate(bomb, 2 << 20, _digest(bytes(2 << 20)), where="x")
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 8 << 20, peak  # the 2 MiB buffer and a chunk, not the gigabyte


# ------------------------------------------------------------------------------ bounds
def _with_dit(m: Manifest, **changes) -> Manifest:
    return m.model_copy(
        update={"executables": [e.model_copy(update=changes) if e.key == "dit/f8" else e for e in m.executables]}
    )


def test_a_real_build_is_within_every_bound():
    m = cpu_manifest()
    check_bounds(m)
    from avatar_release.runtime._blobs import build_blobs, raw_of

    ratios = [raw_of(m, what)[0] / ref.size for what, ref in build_blobs(m)]
    assert max(ratios) * 4 < MAX_ZSTD_RATIO  # the margin the constant claims


def test_a_declared_ratio_beyond_the_bound_is_refused_with_the_numbers():
    m = cpu_manifest()
    dit = m.executable("dit", "f8")
    bomb = _with_dit(m, raw_size=dit.blob.size * (MAX_ZSTD_RATIO + 1))
    with pytest.raises(IntegrityError) as e:
        check_bounds(bomb)
    assert f"declares {dit.blob.size * (MAX_ZSTD_RATIO + 1)} raw bytes from a {dit.blob.size}-byte" in str(e.value)
    assert "dit/f8" in str(e.value) and "before decompressing" in str(e.value)
    with pytest.raises(IntegrityError, match="raw size of -1"):
        check_bounds(_with_dit(m, raw_size=-1))


def test_sizes_beyond_memory_are_refused_before_fetching():
    m = cpu_manifest()
    huge = _with_dit(m, blob=m.executable("dit", "f8").blob.model_copy(update={"size": 1 << 50}))
    with pytest.raises(IntegrityError, match="more than this .*memory"):
        check_bounds(huge)
    with pytest.raises(IntegrityError, match="more than the test cap, 100"):
        check_bounds(m, cap=(100, "the test cap, 100"))


def test_memory_cap_is_the_smaller_of_the_host_and_the_targets_devices(monkeypatch):
    import os

    m = cpu_manifest()
    host, why = memory_cap(m)  # cpu-8 declares no device memory: the host
    assert host > 0 and ("physical memory" in why or "cgroup" in why)
    tpu = m.model_copy(update={"target": "tpu-v6e-8"})
    monkeypatch.setattr(os, "sysconf", lambda name: 1 << 30 if name == "SC_PHYS_PAGES" else 4096)  # 4 TiB host
    monkeypatch.setattr("avatar_release.runtime._blobs._cgroup_limit", lambda: None)
    cap, why = memory_cap(tpu)
    assert cap == 8 * 34359738368 and "tpu-v6e-8" in why and "8 x 34359738368" in why
    monkeypatch.setattr("avatar_release.runtime._blobs._cgroup_limit", lambda: 1 << 33)
    assert memory_cap(tpu) == (1 << 33, "this process's cgroup memory limit, 8589934592 bytes (8.00 GiB)")


# ------------------------------------------------------------------------------ identity
def test_every_stored_manifest_in_the_support_window_still_matches_its_identity():
    _, oldest, newest = readable_versions(Manifest)
    for version in range(oldest, newest + 1):
        if (DATA / f"build-manifest.v{version}.json").is_file():
            check_identity(stored_manifest(version))
    check_identity(cpu_manifest())


def test_the_identity_covers_the_schema_version_and_every_manifest_is_sealed():
    m = cpu_manifest()
    relabelled = m.model_copy(update={"schema_version": m.schema_version - 1})
    assert manifest_identity(relabelled) != m.identity
    with pytest.raises(IntegrityError, match="hash to identity"):
        check_identity(relabelled)
    with pytest.raises(IntegrityError, match="carries no seal"):
        check_identity(m.model_copy(update={"seal": None}))


# ------------------------------------------------------------------------------ pickles
@pytest.fixture(scope="module")
def tiny_executable():
    """A millisecond compile shaped like a build's stage: sharded over a mesh of every device."""
    import jax
    import numpy as np
    from jax.experimental.serialize_executable import serialize
    from jax.sharding import Mesh, NamedSharding, PartitionSpec

    sharding = NamedSharding(Mesh(np.array(jax.devices()), ("fsdp",)), PartitionSpec("fsdp"))
    spec = jax.ShapeDtypeStruct((len(jax.devices()),), np.float32, sharding=sharding)
    compiled = jax.jit(lambda p, x: (p["w"] * x,)).lower({"w": spec}, spec).compile()
    payload, in_tree, out_tree = serialize(compiled)
    return payload, in_tree, out_tree


class _Pid(pickle.Pickler):
    def persistent_id(self, obj):
        return obj[1] if isinstance(obj, tuple) and obj and obj[0] == "pid" else None


def _with_pid(pid) -> bytes:
    import io

    f = io.BytesIO()
    _Pid(f).dump((("pid", pid), [], False))
    return f.getvalue()


@pytest.mark.parametrize(
    "case",
    [
        "empty",
        "truncated",
        "not-a-triple",
        "unknown-device",
        "bad-pid",
        "garbage-executable",
        "too-few-leaves",
        "random",
    ],
)
def test_a_malformed_pickle_is_an_integrity_error_naming_the_executable(tiny_executable, case):
    import jax

    from avatar_release.runtime._unpickle import deserialize_and_load

    payload, in_tree, out_tree = tiny_executable
    data = {
        "empty": b"",
        "truncated": payload[: len(payload) // 3],
        "not-a-triple": pickle.dumps([1, 2, 3, 4]),
        "unknown-device": _with_pid(("device", 999)),
        "bad-pid": _with_pid(()),
        "garbage-executable": _with_pid(("exec", b"\x00not an executable")),
        "too-few-leaves": pickle.dumps((None, [], False)),
        "random": bytes(range(256)) * 4,
    }[case]
    with pytest.raises(IntegrityError, match="^stage x/y: "):
        deserialize_and_load(
            data, in_tree, out_tree, backend=jax.devices()[0].client, execution_devices=jax.devices(), what="stage x/y"
        )
    # and the genuine payload still loads
    exe = deserialize_and_load(
        payload, in_tree, out_tree, backend=jax.devices()[0].client, execution_devices=jax.devices(), what="stage x/y"
    )
    assert exe.runtime_executable().fingerprint


# ------------------------------------------------------------------------------ registry files
def _registry_with_a_build() -> tuple[MemoryRegistry, str]:
    m = cpu_manifest()
    reg = MemoryRegistry()
    digest = put_stand_in_build(reg, m)
    reg.move_channel("dev", reg.resolve(digest), expected_digest=None, action="publish", who="t", reason="")
    return reg, m.build_id


@pytest.mark.parametrize(
    "key, data, call, message",
    [
        ("channels/dev.json", b"garbage", lambda r, b: r.get_channel("dev"), "channels/dev.json: not valid JSON"),
        ("channels/dev.json", b"[]", lambda r, b: r.resolve("dev"), "channels/dev.json: not a channel file"),
        (
            "channels/dev.json",
            b'{"state": {}, "entry": {}}',
            lambda r, b: r.history(),
            "channels/dev.json: missing or non-integer schema_version",
        ),
        ("builds/{b}", b"\xff\xfe", lambda r, b: r.list_builds(), "builds/{b}: not valid JSON"),
        ("builds/{b}", b'{"build_id": 1}', lambda r, b: r.resolve(b), "builds/{b}: not a build reference"),
        (
            "builds/{b}",
            b'{"build_id": "x", "digest": "sha256:00", "published_at": ""}',
            lambda r, b: r.resolve(b),
            "builds/{b}: names build 'x'",
        ),
        (
            "builds/{b}",
            b'{"build_id": "{b}", "digest": "md5:00", "published_at": ""}',
            lambda r, b: r.resolve(b),
            "builds/{b}: digest 'md5:00'",
        ),
        ("history.jsonl", b"garbage\n{old}", lambda r, b: r.history(), "history.jsonl line 1: not valid JSON"),
    ],
)
def test_a_corrupt_registry_file_is_an_integrity_error_naming_it(key, data, call, message):
    reg, build_id = _registry_with_a_build()
    key = key.replace("{b}", build_id)
    old = reg._read(key) or b""
    reg._write_atomic(key, data.replace(b"{b}", build_id.encode()).replace(b"{old}", old))
    with pytest.raises(IntegrityError, match=message.replace("{b}", build_id)):
        call(reg, build_id)


# What each read looks at: a damaged file may change the reads of it, and no other.
_READS = {
    "list_builds": {"builds/b"},
    "list_channels": {"channels/dev.json"},
    "history": {"history.jsonl", "channels/dev.json"},
    "resolve": {"builds/b"},
}


def _reads(reg: MemoryRegistry, build_id: str) -> dict:
    return {
        "list_builds": reg.list_builds,
        "list_channels": reg.list_channels,
        "history": reg.history,
        "resolve": lambda: reg.resolve(build_id),
    }


def _leaves(doc, path=()):
    """(path, value) of every scalar in a JSON document."""
    if isinstance(doc, dict):
        for k, v in doc.items():
            yield from _leaves(v, path + (k,))
    else:
        yield path, doc


def _each_field_changed(original: bytes):
    """The stored file with one field set to another of its own values, to null, 0 or "x": changes
    that still parse, which random bytes almost never reach (history.jsonl: its one line)."""
    doc = json.loads(original.splitlines()[0])
    leaves = list(_leaves(doc))
    values = list({json.dumps(v): v for v in [v for _, v in leaves] + [None, 0, "x"]}.values())
    for path, old in leaves:
        for value in values:
            if value == old:
                continue
            changed = json.loads(json.dumps(doc))
            node = changed
            for k in path[:-1]:
                node = node[k]
            node[path[-1]] = value
            yield path, json.dumps(changed).encode() + (b"\n" if original.endswith(b"\n") else b"")


def _check_read(name: str, got, reg: MemoryRegistry, build_id: str) -> None:
    """What an accepted read of a damaged file must still be: records that read back as themselves,
    build references that say what their file says, a channel under its own name."""
    if name in ("list_channels", "history"):
        kind = ChannelState if name == "list_channels" else HistoryEntry
        for r in got:
            assert type(r) is kind and parse_record(kind, r.to_json_bytes(), where="read back") == r
        if name == "list_channels":
            assert [c.channel for c in got] == ["dev"]
        else:
            assert [e.sequence for e in got] == sorted({e.sequence for e in got})
    elif name == "list_builds":
        for b in got:
            stored = json.loads(reg._read(f"builds/{b.build_id}"))
            assert (b.build_id, b.digest, b.published_at) == (
                stored["build_id"],
                stored["digest"],
                stored["published_at"],
            ) and is_digest(b.digest)
    else:
        assert got.build_id == build_id and got.digest == json.loads(reg._read(f"builds/{build_id}"))["digest"]


def _damaged_reads(key: str, raw: bytes) -> None:
    """Write ``raw`` over ``key`` in a registry with one published build, then read everything: each
    read refuses with the project's error or returns what the stored bytes say, the reads of other
    files unchanged and the read of the damaged one well formed (``_check_read``)."""
    reg, build_id = _registry_with_a_build()
    where = key.replace("builds/b", f"builds/{build_id}")
    before = {name: call() for name, call in _reads(reg, build_id).items()}
    reg._write_atomic(where, raw.replace(b"{b}", build_id.encode()))
    for name, call in _reads(reg, build_id).items():
        try:
            got = call()
        except (IntegrityError, SchemaVersionError):
            assert key in _READS[name], f"{name} refused, though it does not read the damaged {key}"
            continue
        if key in _READS[name]:
            _check_read(name, got, reg, build_id)
        else:
            assert got == before[name], f"{name} changed when {key}, which it does not read, was damaged"


@settings(
    max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture]
)
@given(
    data=st.binary(max_size=200)
    | st.builds(
        lambda d: json.dumps(d).encode(),
        st.dictionaries(
            st.sampled_from(["state", "entry", "build_id", "digest", "published_at"]),
            st.none() | st.integers() | st.text(max_size=8) | st.dictionaries(st.text(max_size=5), st.integers()),
        ),
    ),
    key=st.sampled_from(sorted(set().union(*_READS.values()))),
)
def test_any_bytes_in_a_registry_file_are_read_or_refused_never_a_crash(data, key):
    _damaged_reads(key, data)


@pytest.mark.parametrize("key", sorted(set().union(*_READS.values())))
def test_every_field_of_a_registry_file_changed_is_read_as_stored_or_refused(key):
    reg, build_id = _registry_with_a_build()
    stored = reg._read(key.replace("builds/b", f"builds/{build_id}")).replace(build_id.encode(), b"{b}")
    changes = list(_each_field_changed(stored))
    assert len(changes) > 10
    for path, raw in changes:
        try:
            _damaged_reads(key, raw)
        except AssertionError as e:
            raise AssertionError(f"{key} with {'.'.join(map(str, path))} changed: {e}") from None
