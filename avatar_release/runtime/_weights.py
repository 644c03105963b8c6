"""Putting a build's weights on its devices.

Version-8 builds store weight chunks raw by default (``weights.compression == "none"``): a chunk's
blob is the chunk's bytes. Worker threads each take one chunk: from a store whose blobs are on
this node (``registry.NodeBlobs``: the local directory, a node cache) its bytes are read straight
into the worker's raw buffer, unhashed by the store, and hashed once here with the BLAKE3 digest
the signed manifest records (``raw_blake3``); from a remote store they stream in through the
store's sha256 check (the transport digest, checked once as the blob enters the node) and are
then BLAKE3-checked the same way. Nothing is decoded: weights are split across devices along their
first dimension, so each device's slice of a tensor is one contiguous run of the buffer, placed
from a view of it (``jax.device_put`` with the tensor's sharding) without a host copy. ``compression == "zstd"``
(a per-build choice for registries where transfer costs more than CPU) adds one bounded zstd
decode (``avatar_release._zstd``) from a second reused buffer of stored bytes.

Version-7 builds (the oldest read) store zstd chunks with sha256 raw digests: fetch, a piece at a time (the
Registry protocol's ``stream_blob``, whose size and sha256 check of the stored bytes the
conformance suite holds every store to) -> bounded zstd decompression of the pieces as they arrive
into the worker's own raw buffer -> sha256 of the raw bytes -> placement.

Either way the worker reuses its buffer for its next chunk: one buffer of the largest chunk's size
per worker (at most ``WEIGHT_CHUNK_BYTES`` unless a single tensor is larger), already paged in,
where a fresh allocation per chunk paid its page faults every time. Buffers start on a page, so
every tensor and every device's slice of it is aligned: a backend that can keep host bytes rather
than copy them (XLA:CPU does for aligned slices; seen by a placed shard's buffer lying inside ours)
places a chunk without a copy, and that buffer is handed over to the devices while the worker
takes a new one. zstd and both hashes release the GIL, so the chunks really run side by
side. A memory budget bounds the stored + raw bytes of the chunks in flight (at least one chunk
always runs). The integrity order holds per chunk: nothing is placed before its raw digest
matches the signed manifest, and every chunk's declared size was bounded (``check_bounds``)
before anything was fetched. Weights are plain bytes, never unpickled.

The stored bytes are read, never mapped from the store's file, though mapping skips a copy: a
mapped file that someone truncates in place kills the reader with SIGBUS at the first page past
its new end, where a read only comes back short (and is refused by size); a placed array that
aliased a mapping would also change with the file after its hash was checked.

"""

from __future__ import annotations

import mmap
import os
import threading
import time
from collections.abc import Iterable, Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from .._digest import blake3_digest
from .._dtypes import dtype_name, np_dtype
from .._zstd import DecodeError, decode
from ..errors import IntegrityError
from ..records import WEIGHT_CHUNK_BYTES, ArraySpec, Manifest, WeightChunk
from ..registry import NodeBlobs, Registry
from ._inflate import inflate_into

if TYPE_CHECKING:  # only for annotations: JAX starts only after XLA_FLAGS are set; _load imports this module
    import jax
    from jax.sharding import Mesh, NamedSharding

    from ._load import LoadedStage

    Stages = dict[tuple[str, str], LoadedStage]  # (stage, bucket) -> the loaded executable
    Placed = dict[tuple[str, tuple[str | None, ...]], jax.Array]  # (tensor, sharding) -> its device array

__all__ = ["StoppedEarly", "WeightStats", "stream_weights", "place_weights", "sharding_of", "DEFAULT_WEIGHT_BUDGET"]

# Stored + raw bytes of the chunks in flight at once (at least one chunk, whatever its size).
DEFAULT_WEIGHT_BUDGET = 1 << 30


@dataclass
class WeightStats:
    """What the weight path did: wall time, and the seconds each step took summed over workers."""

    chunks: int = 0
    stored_bytes: int = 0
    raw_bytes: int = 0
    workers: int = 0
    wall: float = 0.0
    # The two interleave (each piece is decompressed as it arrives): fetch is the time spent waiting
    # for the pieces, which includes the store's own size and sha256 check of the stored bytes.
    fetch: float = 0.0
    decompress: float = 0.0  # zstd (v7: with the raw bytes' sha256); 0 for raw chunks
    hash: float = 0.0  # v8: the raw bytes' BLAKE3
    place: float = 0.0
    compression: str = "zstd"  # how the chunks were stored ("none": raw, v8)
    read: str = ""  # "node" (read straight from this node's store) or "stream" (through the store's sha256)
    buffers: int = 0  # raw buffers allocated: one per worker, plus one for each handed to the devices
    handed_over: int = 0  # chunks whose placed arrays kept the host bytes (XLA:CPU may alias an aligned slice)

    def to_json(self) -> dict[str, float | int | str]:
        return {k: (round(v, 4) if isinstance(v, float) else v) for k, v in self.__dict__.items()}


def sharding_of(mesh: Mesh, spec: ArraySpec) -> NamedSharding:
    # Lazy (heavy): JAX starts only after XLA_FLAGS are set (avatar_release.machine.configure_*).
    from jax.sharding import NamedSharding, PartitionSpec

    return NamedSharding(mesh, PartitionSpec(*spec.sharding))


def _wanted(manifest: Manifest, stages: Stages) -> dict[str, list[tuple[LoadedStage, ArraySpec]]]:
    """{tensor name: [(loaded stage, its ArraySpec)]}: who needs each weight, and how sharded."""
    out: dict[str, list[tuple[LoadedStage, ArraySpec]]] = {}
    for ls in stages.values():
        for spec in ls.entry.params:
            out.setdefault(spec.name, []).append((ls, spec))
    return out


def _place(
    manifest: Manifest,
    name: str,
    arr: np.ndarray,
    users: list[tuple[LoadedStage, ArraySpec]],
    mesh: Mesh,
    placed: Placed,
) -> None:
    """Place one host tensor once per distinct sharding, each device getting its slice only."""
    # Lazy (heavy): JAX starts only after XLA_FLAGS are set (avatar_release.machine.configure_*).
    import jax

    for ls, spec in users:
        if list(arr.shape) != spec.shape or dtype_name(arr.dtype) != spec.dtype:
            raise IntegrityError(
                f"build {manifest.build_id}: tensor {name!r} is {dtype_name(arr.dtype)}"
                f"{list(arr.shape)}, executable {ls.entry.key} expects {spec.dtype}{spec.shape}"
            )
        key = (name, tuple(spec.sharding))
        if key not in placed:  # weights shared by every bucket of a stage are placed once
            # each device gets its slice only; split along the first dimension, a slice is a
            # contiguous view of the chunk, so nothing is copied on the host on its way there
            # (device_put slices in C++: half the time of make_array_from_callback's Python calls)
            placed[key] = jax.device_put(arr, sharding_of(mesh, spec))
        ls.params[name.split(".", 1)[1]] = placed[key]


def place_weights(manifest: Manifest, stages: Stages, tensors: Mapping[str, np.ndarray], mesh: Mesh) -> None:
    """Put every stage's weights (host tensors by name) on the mesh with the shardings it expects."""
    # Lazy (heavy): JAX starts only after XLA_FLAGS are set (avatar_release.machine.configure_*).
    import jax

    placed: Placed = {}
    for name, users in _wanted(manifest, stages).items():
        if name not in tensors:
            raise IntegrityError(f"build {manifest.build_id}: weights lack tensor {name!r}")
        _place(manifest, name, tensors[name], users, mesh, placed)
    jax.block_until_ready(list(placed.values()))


class _Budget:
    """Bytes in flight, bounded; a request larger than the budget waits until nothing else runs."""

    def __init__(self, limit: int) -> None:
        self.limit, self.used = limit, 0
        self.cond = threading.Condition()

    def acquire(self, n: int) -> None:
        with self.cond:
            self.cond.wait_for(lambda: self.used == 0 or self.used + n <= self.limit)
            self.used += n

    def release(self, n: int) -> None:
        with self.cond:
            self.used -= n
            self.cond.notify_all()


def _chunk_tensors(
    manifest: Manifest, i: int, chunk: WeightChunk, raw: bytes | bytearray | memoryview
) -> dict[str, np.ndarray]:
    where = f"build {manifest.build_id}: weights chunk {i}"
    out: dict[str, np.ndarray] = {}
    for t in chunk.tensors:
        dt = np_dtype(t.dtype)
        count = int(np.prod(t.shape, dtype=np.int64)) if t.shape else 1
        if t.nbytes != count * dt.itemsize or t.offset + t.nbytes > chunk.raw_size or t.offset % dt.itemsize:
            raise IntegrityError(
                f"{where}: tensor {t.name!r} ({t.dtype}{t.shape}) does not fit its place "
                f"(offset {t.offset}, {t.nbytes} bytes, chunk of {chunk.raw_size})"
            )
        arr = np.frombuffer(raw, dtype=dt, count=count, offset=t.offset).reshape(t.shape)
        arr.flags.writeable = False  # a view into the chunk: nothing may write through it
        out[t.name] = arr
    return out


def _aliases(arrays: Iterable[jax.Array], buf: bytearray | mmap.mmap) -> bool:
    """Whether a placed shard's memory lies inside ``buf`` (a backend that kept the host bytes rather
    than copying them); also True when a backend cannot say where its buffers are."""
    start = np.frombuffer(buf, dtype=np.uint8).ctypes.data
    end = start + len(buf)
    try:
        return any(start <= s.data.unsafe_buffer_pointer() < end for a in arrays for s in a.addressable_shards)
    except Exception:  # noqa: BLE001 (no pointer on this backend: never reuse, the safe answer)
        return True


def _page_aligned(size: int) -> mmap.mmap:
    """A zeroed buffer that starts on a page: every tensor (64-byte aligned in its chunk) and every
    device's slice of it (a whole number of rows) is then aligned too, and XLA:CPU places such a
    slice by keeping the host bytes instead of copying them (512 MiB of bf16 on 8 devices: 0.1 s
    against 0.8 s copied, measured 2026-12-05); a backend with its own memory copies as before."""
    return mmap.mmap(-1, max(size, 1))


class _Buffers:
    """One raw buffer per worker thread, reused chunk after chunk: the size of the largest chunk the
    rule makes (a chunk larger than that, a single huge tensor, gets a buffer of its own, not kept).
    A buffer whose bytes the devices kept (XLA:CPU) is handed over to them and replaced."""

    def __init__(self, chunks: list[WeightChunk]) -> None:
        self.size = max((c.raw_size for c in chunks if c.raw_size <= WEIGHT_CHUNK_BYTES), default=0)
        self.made = self.handed_over = 0
        self._own = threading.local()
        self._lock = threading.Lock()

    def take(self, raw_size: int) -> mmap.mmap:
        buf = getattr(self._own, "buf", None) if raw_size <= self.size else None
        if buf is None:
            buf = _page_aligned(max(self.size, raw_size))
            with self._lock:
                self.made += 1
        return buf

    def give_back(self, buf: mmap.mmap, placed: Iterable[jax.Array]) -> None:
        """Keep ``buf`` for this worker's next chunk, unless a placed array kept the bytes in it."""
        kept = _aliases(placed, buf)
        if kept:
            with self._lock:
                self.handed_over += 1
        self._own.buf = buf if len(buf) == max(self.size, 1) and not kept else None


def _fetch_inflated(registry: Registry, chunk: WeightChunk, buf: mmap.mmap, where: str) -> tuple[memoryview, float]:
    """(a chunk's raw bytes in ``buf``, seconds spent waiting on the store): its stored bytes
    streamed from the store (which checks their size and sha256 once the last piece is read)
    through the bounded decompression (which checks the raw bytes' size and sha256). A failure of
    the stored bytes is named before one of the raw bytes they made, as ``_inflate.fetch_inflated``
    does: a short file is "size N bytes, manifest says M", not "zstd frame is truncated"."""
    failed: list[IntegrityError] = []
    fetching = [0.0]

    def timed(pieces: Iterator[bytes]) -> Iterator[bytes]:
        while True:
            t0 = time.perf_counter()
            piece = next(pieces, None)
            fetching[0] += time.perf_counter() - t0
            if piece is None:
                return
            yield piece

    def sink(pieces: Iterator[bytes]) -> memoryview | None:
        failed.clear()  # a store that retries calls the sink afresh
        try:
            return inflate_into(timed(pieces), memoryview(buf), chunk.raw_size, chunk.raw_digest, where=where)
        except IntegrityError as e:
            failed.append(e)  # the store checks what is left of the stored bytes, then this is raised
            return None

    try:
        raw = registry.stream_blob(chunk.blob.digest, chunk.blob.size, sink)
    except IntegrityError as e:  # say which chunk
        raise IntegrityError(f"{where}: {e}") from None
    if failed:
        raise failed[0]
    assert raw is not None  # the sink returns the raw bytes whenever it recorded no failure
    return raw, fetching[0]


class _Stored:
    """One reused buffer of stored (zstd) bytes per worker: v8 zstd chunks read from this node."""

    def __init__(self) -> None:
        self._own = threading.local()

    def take(self, size: int) -> memoryview:
        buf = getattr(self._own, "buf", None)
        if buf is None or len(buf) < size:
            buf = self._own.buf = bytearray(size)
        return memoryview(buf)[:size]


def _read_v8(
    registry: Registry, chunk: WeightChunk, codec: str, buf: mmap.mmap, stored: _Stored, where: str
) -> tuple[memoryview, float, float, float]:
    """(a v8 chunk's raw bytes in ``buf``, seconds reading, decoding, hashing): read from this
    node's store unhashed, or streamed in through the store's sha256 (a remote store), decoded when
    stored as zstd, then BLAKE3-checked against the manifest: the one hash of each raw byte."""
    if chunk.raw_blake3 is None:
        raise IntegrityError(f"{where}: a v8 chunk without raw_blake3; the manifest is malformed")
    raw = memoryview(buf)[: chunk.raw_size]
    decoding = 0.0
    t0 = time.perf_counter()
    if isinstance(registry, NodeBlobs):
        into = raw if codec == "none" else stored.take(chunk.blob.size)
        try:
            registry.read_blob_into(chunk.blob.digest, chunk.blob.size, into)  # the size checked, not the content
        except IntegrityError as e:  # say which chunk
            raise IntegrityError(f"{where}: {e}") from None
        if codec == "none":
            reading = time.perf_counter() - t0
        else:
            packed = into
            t1 = time.perf_counter()
            reading = t1 - t0
            _decode(iter([packed]), raw, chunk, where)
            decoding = time.perf_counter() - t1
    else:
        failed: list[IntegrityError] = []

        def sink(pieces: Iterator[bytes]) -> None:
            failed.clear()  # a store that retries calls the sink afresh
            if codec == "none":
                at = 0
                for piece in pieces:
                    raw[at : at + len(piece)] = piece[: max(0, chunk.raw_size - at)]
                    at += len(piece)
                return
            try:
                _decode(pieces, raw, chunk, where)
            except IntegrityError as e:  # the store checks the stored bytes next: their fault is named first
                failed.append(e)

        try:
            registry.stream_blob(chunk.blob.digest, chunk.blob.size, sink)  # the store checks size and sha256
        except IntegrityError as e:
            raise IntegrityError(f"{where}: {e}") from None
        if failed:
            raise failed[0]
        reading = time.perf_counter() - t0  # the decode interleaves with the transfer
    t2 = time.perf_counter()
    got = blake3_digest(raw)
    if got != chunk.raw_blake3:
        raise IntegrityError(
            f"{where}: blob {chunk.blob.digest}: its bytes hash to {got}, the signed manifest says "
            f"{chunk.raw_blake3}; the store is corrupted or was tampered with — repair it from a "
            "registry holding the same build: `avatar-release repair BUILD --from REGISTRY`"
        )
    return raw, reading, decoding, time.perf_counter() - t2


def _decode(pieces: Iterator[bytes] | Iterator[memoryview], raw: memoryview, chunk: WeightChunk, where: str) -> None:
    try:
        decode(pieces, chunk.raw_size, out=raw)
    except DecodeError as e:
        raise IntegrityError(f"{where}: blob {chunk.blob.digest}: {e}") from None


def _check_held(manifest: Manifest, chunks: list[WeightChunk], wanted: dict[str, list]) -> None:
    held = {t.name for c in chunks for t in c.tensors}
    missing = sorted(set(wanted) - held)
    if missing:
        raise IntegrityError(
            f"build {manifest.build_id}: weights lack tensor {missing[0]!r}"
            + (f" (and {len(missing) - 1} more)" if len(missing) > 1 else "")
        )


def _planned(
    registry: Registry, manifest: Manifest, chunks: list[WeightChunk], v8: bool, workers: int | None
) -> WeightStats:
    """The weight path's stats before it runs: its chunks and their bytes, how they are stored and
    read, and its workers (``workers``, else one per CPU; never more than the chunks, nor 8)."""
    stats = WeightStats(
        chunks=len(chunks),
        stored_bytes=sum(c.blob.size for c in chunks),
        raw_bytes=sum(c.raw_size for c in chunks),
        compression=manifest.weights.chunk_codec,
        read="node" if v8 and isinstance(registry, NodeBlobs) else "stream",
    )
    stats.workers = max(1, min(workers or (os.cpu_count() or 1), len(chunks) or 1, 8))
    return stats


class StoppedEarly(Exception):
    """The weights' path gave up on its load's word (``stop``); the load raises that word instead."""


def _not_stopped(stop: threading.Event | None, where: str) -> None:
    """Once ``stop`` is set (a load's revocation check said no), no further chunk is fetched."""
    if stop is not None and stop.is_set():
        raise StoppedEarly(f"{where}: not fetched, the load was stopped")


def stream_weights(
    registry: Registry,
    manifest: Manifest,
    stages: Stages,
    mesh: Mesh,
    *,
    workers: int | None = None,
    budget: int = DEFAULT_WEIGHT_BUDGET,
    stop: threading.Event | None = None,
) -> WeightStats:
    """Fetch, verify, (decompress) and place every weight chunk of a v7+ build, side by side (until ``stop``)."""
    # Lazy (heavy): JAX starts only after XLA_FLAGS are set (avatar_release.machine.configure_*).
    import jax

    chunks = manifest.weights.chunks or []
    wanted = _wanted(manifest, stages)
    _check_held(manifest, chunks, wanted)
    v8 = manifest.weights.compression is not None
    stats = _planned(registry, manifest, chunks, v8, workers)
    gate, buffers, stored = _Budget(budget), _Buffers(chunks), _Stored()
    placed: Placed = {}
    lock = threading.Lock()  # the placed-arrays table and the step counters

    def one(i: int, chunk: WeightChunk) -> None:
        where = f"build {manifest.build_id}: weights chunk {i}"
        cost = chunk.blob.size + chunk.raw_size
        gate.acquire(cost)
        try:
            _not_stopped(stop, where)
            t0 = time.perf_counter()
            buf = buffers.take(chunk.raw_size)
            hashing = decoding = 0.0
            if v8:
                raw, fetching, decoding, hashing = _read_v8(registry, chunk, stats.compression, buf, stored, where)
            else:
                raw, fetching = _fetch_inflated(registry, chunk, buf, where)
            t2 = time.perf_counter()
            local: Placed = {}
            for name, arr in _chunk_tensors(manifest, i, chunk, raw).items():
                if name in wanted:
                    _place(manifest, name, arr, wanted[name], mesh, local)
            jax.block_until_ready(list(local.values()))
            buffers.give_back(buf, local.values())
            t3 = time.perf_counter()
            with lock:
                placed.update(local)
                stats.fetch += fetching
                stats.decompress += decoding if v8 else t2 - t0 - fetching
                stats.hash += hashing
                stats.place += t3 - t2
        finally:
            gate.release(cost)

    t0 = time.perf_counter()
    with ThreadPoolExecutor(max_workers=stats.workers, thread_name_prefix="weights") as pool:
        for f in [pool.submit(one, i, c) for i, c in enumerate(chunks)]:
            f.result()  # the first failure is raised; the others finish or fail on their own
    stats.wall = time.perf_counter() - t0
    stats.buffers, stats.handed_over = buffers.made, buffers.handed_over
    return stats
