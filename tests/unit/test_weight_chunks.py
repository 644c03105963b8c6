"""Weights in chunks (build manifest v5; v8 raw or zstd): the chunk rule, reuse across a one-layer
change, and the streaming loader: every tensor placed as its shards, nothing placed from a chunk
that fails its digests, and a memory budget smaller than a chunk still loads. The loader tests run
over the three ways a chunk is stored: v5-v7 zstd with sha256, v8 raw ("none") and v8 zstd, both
with BLAKE3."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

from avatar_release.compile._weights import HostTensor, chunk_table_digest, pack_chunks, plan_chunks
from avatar_release.errors import IntegrityError
from avatar_release.records import ArraySpec, WeightsRecord
from avatar_release.registry import MemoryRegistry


def _tensors(layers: int = 6, dim: int = 64, seed: int = 0) -> list[HostTensor]:
    rng = np.random.default_rng(seed)
    out = []
    for i in range(layers):
        for part, shape in (("w", (dim, dim)), ("b", (dim,))):
            a = rng.standard_normal(shape).astype(np.float32)
            out.append(HostTensor(f"dit.blocks.{i}.{part}", "float32", shape, a.reshape(-1).view(np.uint8)))
    return out


def test_the_chunk_rule_is_tensor_aligned_bounded_and_deterministic():
    tensors = _tensors()
    per_layer = 64 * 64 * 4 + 64 * 4
    tables = plan_chunks(tensors, max_bytes=2 * per_layer + 64)
    assert tables == plan_chunks(list(reversed(tensors)), max_bytes=2 * per_layer + 64)  # name order, not input order
    names = [t.name for table in tables for t in table]
    assert names == sorted(t.name for t in tensors)  # every tensor once, whole, in name order
    for table in tables:
        assert max(t.offset + t.nbytes for t in table) <= 2 * per_layer + 64
        assert all(t.offset % 64 == 0 for t in table)
    big = HostTensor("a.huge", "float32", (1000,), np.zeros(4000, np.uint8))
    alone = plan_chunks([big, *tensors[:2]], max_bytes=1000)
    assert [t.name for t in alone[0]] == ["a.huge"]  # larger than a chunk: a chunk of its own


def test_a_one_layer_change_reuses_every_other_chunk():
    before = _tensors(layers=8)
    after = list(before)
    changed = np.asarray(before[4].data).copy()
    changed[:4] ^= 0xFF  # one tensor of one layer differs
    after[4] = HostTensor(before[4].name, before[4].dtype, before[4].shape, changed)
    per_layer = 64 * 64 * 4 + 64 * 4
    a, blobs_a = pack_chunks(before, level=3, max_bytes=per_layer + 64)
    b, blobs_b = pack_chunks(after, level=3, max_bytes=per_layer + 64)
    assert len(a) == len(b) == 8
    new = set(blobs_b) - set(blobs_a)
    assert len(new) == 1 and sum(len(blobs_b[d]) for d in new) <= 2 / 8 * sum(len(z) for z in blobs_b.values())
    assert chunk_table_digest(a) != chunk_table_digest(b) and chunk_table_digest(a) == chunk_table_digest(
        pack_chunks(before, level=3, max_bytes=per_layer + 64)[0]
    )


COMPRESSIONS = [None, "none", "zstd"]  # None: the v5-v7 form


def _build(reg, tensors, max_bytes, compression=None):
    chunks, blobs = pack_chunks(tensors, level=3, max_bytes=max_bytes, compression=compression)
    for z in blobs.values():
        reg.put_blob(z)
    weights = WeightsRecord(
        blob=None,
        raw_size=sum(c.raw_size for c in chunks),
        raw_digest=chunk_table_digest(chunks, compression),
        tensors=len(tensors),
        source="test",
        chunks=chunks,
        compression=compression,
    )
    specs = [
        ArraySpec(name=t.name, shape=list(t.shape), dtype=t.dtype, sharding=["fsdp"] + [None] * (len(t.shape) - 1))
        for t in tensors
    ]
    stage = SimpleNamespace(entry=SimpleNamespace(params=specs, key="dit/f8"), params={})
    return SimpleNamespace(build_id="b-test", weights=weights), {("dit", "f8"): stage}


def _mesh():
    import jax
    from jax.sharding import Mesh

    return Mesh(np.array(jax.devices("cpu")[:8]), ("fsdp",))


@pytest.mark.parametrize("compression", COMPRESSIONS)
def test_the_streaming_loader_places_each_tensor_as_its_shards(compression):
    from avatar_release.runtime._weights import stream_weights

    reg, tensors = MemoryRegistry("w"), _tensors(layers=4)
    manifest, stages = _build(reg, tensors, max_bytes=20000, compression=compression)
    stats = stream_weights(reg, manifest, stages, _mesh(), workers=2, budget=1)  # budget < a chunk: one at a time
    assert stats.chunks == len(manifest.weights.chunks) > 1 and stats.workers == 2
    assert stats.compression == (compression or "zstd") and stats.read == ("stream" if compression is None else "node")
    params = stages[("dit", "f8")].params
    for t in tensors:
        arr = params[t.name.split(".", 1)[1]]
        want = np.asarray(t.data).view(np.float32).reshape(t.shape)
        assert np.array_equal(np.asarray(arr), want)
        # each device holds only its slice of the first dimension
        assert {s.data.shape[0] for s in arr.addressable_shards} == {t.shape[0] // 8}


@pytest.mark.parametrize("compression", COMPRESSIONS)
@pytest.mark.parametrize("damage", ["stored", "raw-digest"])
def test_a_chunk_that_fails_its_digests_places_nothing_from_it(damage, compression):
    from avatar_release.runtime._weights import stream_weights

    reg, tensors = MemoryRegistry("w"), _tensors(layers=2)
    manifest, stages = _build(reg, tensors, max_bytes=10**9, compression=compression)
    (chunk,) = manifest.weights.chunks
    if damage == "stored":
        key = reg._blob_key(chunk.blob.digest)
        data = bytearray(reg._read(key))
        data[len(data) // 2] ^= 1
        reg._write_atomic(key, bytes(data))
    elif compression is None:
        manifest.weights.chunks[0] = chunk.model_copy(update={"raw_digest": "sha256:" + "0" * 64})
    else:  # v8 checks the BLAKE3 the manifest records, not the sha256 beside it
        manifest.weights.chunks[0] = chunk.model_copy(update={"raw_blake3": "blake3:" + "0" * 64})
    with pytest.raises(IntegrityError, match="weights chunk 0"):
        stream_weights(reg, manifest, stages, _mesh())
    assert stages[("dit", "f8")].params == {}


def test_a_tensor_the_executable_needs_but_no_chunk_holds_is_refused_before_fetching():
    from avatar_release.runtime._weights import stream_weights

    reg, tensors = MemoryRegistry("w"), _tensors(layers=2)
    manifest, stages = _build(reg, tensors[:-1], max_bytes=10**9)
    stages[("dit", "f8")].entry.params.append(
        ArraySpec(name=tensors[-1].name, shape=list(tensors[-1].shape), dtype="float32", sharding=["fsdp"])
    )
    with pytest.raises(IntegrityError, match=f"weights lack tensor '{tensors[-1].name}'"):
        stream_weights(reg, manifest, stages, _mesh())


@pytest.mark.parametrize("compression", COMPRESSIONS)
def test_a_worker_reuses_its_buffer_chunk_after_chunk_and_every_tensor_arrives_intact(tmp_path, compression):
    """Mapped chunks (the directory store, a mebibyte and more) inflated into one reused buffer per
    worker: chunks of different sizes one after another, sharded and replicated tensors, and every
    placed value is the stored one (a stale byte from the chunk before, or a device array that kept
    the buffer and was overwritten by the next chunk, would show here)."""
    from avatar_release.registry import LocalRegistry
    from avatar_release.runtime._weights import stream_weights

    rng = np.random.default_rng(1)
    tensors = []
    for i, rows in enumerate((512, 256, 512, 128)):  # 2, 1, 2 and 0.5 MiB of float32
        a = rng.standard_normal((rows, 1024)).astype(np.float32)
        tensors.append(HostTensor(f"dit.blocks.{i}.w", "float32", a.shape, a.reshape(-1).view(np.uint8)))
    reg = LocalRegistry(tmp_path / "reg")
    manifest, stages = _build(reg, tensors, max_bytes=2 << 20, compression=compression)
    assert len(manifest.weights.chunks) == 4
    params = stages[("dit", "f8")].entry.params
    params[1] = params[1].model_copy(update={"sharding": [None, None]})  # every device holds this one whole
    stats = stream_weights(reg, manifest, stages, _mesh(), workers=1)
    assert stats.chunks == 4 and stats.workers == 1
    # one buffer served every chunk but those whose bytes the devices kept (XLA:CPU aliases a host
    # slice that happens to be 64-byte aligned instead of copying it): each of those got a new one
    # (after the last chunk nothing more is allocated, so one worker made handed_over or one more)
    assert stats.buffers - 1 <= stats.handed_over <= stats.buffers, stats
    params = stages[("dit", "f8")].params
    for t in tensors:
        want = np.asarray(t.data).view(np.float32).reshape(t.shape)
        arr = params[t.name.split(".", 1)[1]]
        assert all(np.array_equal(np.asarray(s.data), want[s.index]) for s in arr.addressable_shards), t.name


def test_a_placed_array_that_kept_the_host_bytes_is_seen_so_the_buffer_is_not_reused():
    """XLA:CPU aliases a host array that is 64-byte aligned instead of copying it (single-device
    ``device_put`` and ``make_array_from_callback`` alike); the guard must say so exactly when it
    happened, observed here by writing to the buffer afterwards, as the next chunk would."""
    import jax
    from jax.sharding import NamedSharding, PartitionSpec

    from avatar_release.runtime._weights import _aliases

    n = 8 * 64
    outcomes = []
    for misalign in (0, 16):
        for how in ("one device", "sharded"):
            buf = bytearray(n * 4 + 128)
            at = (-np.frombuffer(buf, dtype=np.uint8).ctypes.data) % 64 + misalign
            host = np.frombuffer(buf, dtype=np.float32, count=n, offset=at).reshape(8, 64)
            host[:] = np.arange(n, dtype=np.float32).reshape(8, 64)
            arr = (
                jax.device_put(host, jax.devices("cpu")[0])
                if how == "one device"
                else jax.make_array_from_callback(
                    host.shape, NamedSharding(_mesh(), PartitionSpec("fsdp")), lambda idx, h=host: h[idx]
                )
            )
            jax.block_until_ready(arr)
            np.frombuffer(buf, dtype=np.uint8)[:] = 0xFF  # what the next chunk would do to the buffer
            kept = bool(np.isnan(np.asarray(arr)[0, 1]))  # observed, independently of the pointers
            assert _aliases([arr], buf) == kept, (misalign, how, kept)
            outcomes.append(kept)
    assert outcomes[2:] == [False, False]  # a slice 16 bytes off alignment is always copied
    assert any(outcomes[:2]), "XLA:CPU copied even aligned host arrays: the guard's other side went untested"


class _Remote:
    """A store whose blobs are not on this node (no ``read_blob_into``): chunks stream in through
    its size and sha256 check, as from an OCI registry without a node cache."""

    def __init__(self, store):
        self.store = store

    def stream_blob(self, digest, size, sink):
        return self.store.stream_blob(digest, size, sink)


@pytest.mark.parametrize("compression", ["none", "zstd"])
def test_a_remote_stores_chunks_enter_through_its_sha256_and_a_damaged_one_is_refused(compression):
    from avatar_release.registry import NodeBlobs
    from avatar_release.runtime._weights import stream_weights

    reg, tensors = MemoryRegistry("w"), _tensors(layers=2)
    manifest, stages = _build(reg, tensors, max_bytes=10**9, compression=compression)
    remote = _Remote(reg)
    assert not isinstance(remote, NodeBlobs)
    stats = stream_weights(remote, manifest, stages, _mesh())
    assert stats.read == "stream" and stats.hash > 0
    params = stages[("dit", "f8")].params
    assert all(
        np.array_equal(
            np.asarray(params[t.name.split(".", 1)[1]]), np.asarray(t.data).view(np.float32).reshape(t.shape)
        )
        for t in tensors
    )
    (chunk,) = manifest.weights.chunks
    key = reg._blob_key(chunk.blob.digest)
    data = bytearray(reg._read(key))
    data[-1] ^= 1
    reg._write_atomic(key, bytes(data))
    stages[("dit", "f8")].params.clear()
    with pytest.raises(IntegrityError, match="weights chunk 0: .*content hashes to"):
        stream_weights(remote, manifest, stages, _mesh())
    assert stages[("dit", "f8")].params == {}


def test_a_raw_chunk_cut_short_on_this_node_is_refused_by_its_size_naming_the_chunk(tmp_path):
    from avatar_release.registry import LocalRegistry
    from avatar_release.runtime._weights import stream_weights

    reg, tensors = LocalRegistry(tmp_path / "reg"), _tensors(layers=2)
    manifest, stages = _build(reg, tensors, max_bytes=10**9, compression="none")
    (chunk,) = manifest.weights.chunks
    path = tmp_path / "reg" / reg._blob_key(chunk.blob.digest)
    path.write_bytes(path.read_bytes()[:-10])
    with pytest.raises(
        IntegrityError,
        match=f"weights chunk 0: .*size {chunk.blob.size - 10} bytes, manifest says "
        f"{chunk.blob.size}.*avatar-release repair",
    ):
        stream_weights(reg, manifest, stages, _mesh())


class _StopsAfterFirst(_Remote):
    """A remote store that says "stop" (as a load's revocation check does when it finds one) once
    it has served its first chunk, and counts what it served."""

    def __init__(self, store, stop):
        super().__init__(store)
        self.stop, self.served = stop, 0

    def stream_blob(self, digest, size, sink):
        out = super().stream_blob(digest, size, sink)
        self.served += 1
        self.stop.set()
        return out


def test_a_stopped_load_fetches_no_further_chunk():
    import threading

    from avatar_release.runtime._weights import StoppedEarly, stream_weights

    reg, tensors = MemoryRegistry("w"), _tensors(layers=4)
    manifest, stages = _build(reg, tensors, max_bytes=20000, compression="none")
    assert len(manifest.weights.chunks) > 2
    stop = threading.Event()
    remote = _StopsAfterFirst(reg, stop)
    with pytest.raises(StoppedEarly, match="weights chunk 1: not fetched"):
        stream_weights(remote, manifest, stages, _mesh(), workers=1, stop=stop)
    assert remote.served == 1
