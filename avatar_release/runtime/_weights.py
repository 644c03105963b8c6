"""Putting a build's weights on its devices.

Version-5 builds store weights as chunks (``records.WeightChunk``). They stream: worker threads
each take one chunk through fetch, a piece at a time (the Registry protocol's ``stream_blob``,
whose size and sha256 check of the stored bytes the conformance suite holds every store to; one
hash, not a second one here) -> bounded zstd decompression of the pieces as they arrive into the
worker's own raw buffer -> sha256 of the raw bytes -> placement, where every tensor is placed as
its shards (each device receives only its slice, ``jax.make_array_from_callback``). The worker then
reuses its buffer for its next chunk: one buffer of the largest chunk's size per worker (at most
``WEIGHT_CHUNK_BYTES`` unless a single tensor is larger), already paged in, where a fresh
allocation per chunk paid its page faults every time. When a backend keeps the host bytes rather
than copying them (XLA:CPU aliases a slice that happens to be 64-byte aligned; seen by a placed
shard's buffer lying inside ours), that buffer is handed over to the devices and the worker takes
a new one. zstd and hashlib release the GIL, so the chunks really run side by side. A memory
budget bounds the stored + raw bytes of the chunks in flight (at least one chunk always runs). The integrity order holds per chunk: nothing is placed before its stored and raw
digests match the manifest, and every chunk's declared size was bounded (``check_bounds``) before
anything was fetched. Weights are plain bytes, never unpickled.

The stored bytes are read, never mapped from the store's file, though mapping skips a copy: a
mapped file that someone truncates in place kills the reader with SIGBUS at the first page past
its new end, where a read only comes back short; a short or rewritten blob is then refused
(IntegrityError) by the size and digest the manifest names, after the decompression that ran on
its pieces and before anything is placed. Reading costs one copy out of the page cache, a piece
at a time (a mebibyte, still in the CPU's cache when zstd reads it, and handed to zstd uncopied:
``_inflate._Source``), about what the page faults of a mapping cost: a 50 MiB chunk is read,
hashed and inflated in 0.132 s of CPU, mapped in 0.130 s (read whole into a reused buffer first:
0.134 s, into a fresh one: 0.155 s; each piece copied twice more on its way to zstd: 0.140 s;
one thread's CPU time, median of 9, 2 cores, 2026-12-05), and with no memory beyond the raw
buffer but that piece, where a buffer for the stored bytes would cost each worker a chunk's size.

Builds before version 5 carry one safetensors blob: it is fetched, verified and decompressed whole
(``_load``), then placed here from its tensors.
"""

from __future__ import annotations

import os
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Mapping

import numpy as np

from .._dtypes import dtype_name, np_dtype
from ..errors import IntegrityError
from ..records import WEIGHT_CHUNK_BYTES, ArraySpec, Manifest, WeightChunk
from ..registry import Registry
from ._inflate import inflate_into

if TYPE_CHECKING:  # only for annotations: JAX starts only after XLA_FLAGS are set; _load imports this module
    import jax
    from jax.sharding import Mesh, NamedSharding

    from ._load import LoadedStage

    Stages = dict[tuple[str, str], LoadedStage]  # (stage, bucket) -> the loaded executable
    Placed = dict[tuple[str, tuple[str | None, ...]], jax.Array]  # (tensor, sharding) -> its device array

__all__ = ["WeightStats", "stream_weights", "place_weights", "sharding_of", "DEFAULT_WEIGHT_BUDGET"]

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
    decompress: float = 0.0  # includes the raw bytes' sha256
    place: float = 0.0
    buffers: int = 0  # raw buffers allocated: one per worker, plus one for each handed to the devices
    handed_over: int = 0  # chunks whose placed arrays kept the host bytes (XLA:CPU may alias an aligned slice)

    def to_json(self) -> dict[str, float]:
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


def _place(manifest: Manifest, name: str, arr: np.ndarray, users: list[tuple[LoadedStage, ArraySpec]], mesh: Mesh,
           placed: Placed) -> None:
    """Place one host tensor once per distinct sharding, each device getting its slice only."""
    # Lazy (heavy): JAX starts only after XLA_FLAGS are set (avatar_release.machine.configure_*).
    import jax

    for ls, spec in users:
        if list(arr.shape) != spec.shape or dtype_name(arr.dtype) != spec.dtype:
            raise IntegrityError(f"build {manifest.build_id}: tensor {name!r} is {dtype_name(arr.dtype)}"
                                 f"{list(arr.shape)}, executable {ls.entry.key} expects {spec.dtype}{spec.shape}")
        key = (name, tuple(spec.sharding))
        if key not in placed:  # weights shared by every bucket of a stage are placed once
            sharding = sharding_of(mesh, spec)
            placed[key] = jax.make_array_from_callback(arr.shape, sharding, lambda idx: arr[idx])
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


def _chunk_tensors(manifest: Manifest, i: int, chunk: WeightChunk, raw: bytes | bytearray | memoryview) -> dict[str, np.ndarray]:
    where = f"build {manifest.build_id}: weights chunk {i}"
    out: dict[str, np.ndarray] = {}
    for t in chunk.tensors:
        dt = np_dtype(t.dtype)
        count = int(np.prod(t.shape, dtype=np.int64)) if t.shape else 1
        if t.nbytes != count * dt.itemsize or t.offset + t.nbytes > chunk.raw_size or t.offset % dt.itemsize:
            raise IntegrityError(f"{where}: tensor {t.name!r} ({t.dtype}{t.shape}) does not fit its place "
                                 f"(offset {t.offset}, {t.nbytes} bytes, chunk of {chunk.raw_size})")
        arr = np.frombuffer(raw, dtype=dt, count=count, offset=t.offset).reshape(t.shape)
        arr.flags.writeable = False  # a view into the chunk: nothing may write through it
        out[t.name] = arr
    return out


def _aliases(arrays: Iterable[jax.Array], buf: bytearray) -> bool:
    """Whether a placed shard's memory lies inside ``buf`` (a backend that kept the host bytes rather
    than copying them); also True when a backend cannot say where its buffers are."""
    start = np.frombuffer(buf, dtype=np.uint8).ctypes.data
    end = start + len(buf)
    try:
        return any(start <= s.data.unsafe_buffer_pointer() < end for a in arrays for s in a.addressable_shards)
    except Exception:  # noqa: BLE001 (no pointer on this backend: never reuse, the safe answer)
        return True


class _Buffers:
    """One raw buffer per worker thread, reused chunk after chunk: the size of the largest chunk the
    rule makes (a chunk larger than that, a single huge tensor, gets a buffer of its own, not kept)."""

    def __init__(self, chunks: list[WeightChunk]) -> None:
        self.size = max((c.raw_size for c in chunks if c.raw_size <= WEIGHT_CHUNK_BYTES), default=0)
        self.made = self.handed_over = 0
        self._own = threading.local()
        self._lock = threading.Lock()

    def take(self, raw_size: int) -> bytearray:
        buf = getattr(self._own, "buf", None) if raw_size <= self.size else None
        if buf is None:
            buf = bytearray(max(self.size, raw_size))
            with self._lock:
                self.made += 1
        return buf

    def give_back(self, buf: bytearray, placed: Iterable[jax.Array]) -> None:
        """Keep ``buf`` for this worker's next chunk, unless a placed array kept the bytes in it."""
        kept = _aliases(placed, buf)
        if kept:
            with self._lock:
                self.handed_over += 1
        self._own.buf = buf if len(buf) == self.size and not kept else None


def _fetch_inflated(registry: Registry, chunk: WeightChunk, buf: bytearray, where: str) -> tuple[memoryview, float]:
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


def _check_held(manifest: Manifest, chunks: list[WeightChunk], wanted: dict[str, list]) -> None:
    held = {t.name for c in chunks for t in c.tensors}
    missing = sorted(set(wanted) - held)
    if missing:
        raise IntegrityError(f"build {manifest.build_id}: weights lack tensor {missing[0]!r}"
                             + (f" (and {len(missing) - 1} more)" if len(missing) > 1 else ""))


def stream_weights(registry: Registry, manifest: Manifest, stages: Stages, mesh: Mesh, *, workers: int | None = None,
                   budget: int = DEFAULT_WEIGHT_BUDGET) -> WeightStats:
    """Fetch, verify, decompress and place every weight chunk of a v5 build, side by side."""
    # Lazy (heavy): JAX starts only after XLA_FLAGS are set (avatar_release.machine.configure_*).
    import jax

    chunks = manifest.weights.chunks or []
    wanted = _wanted(manifest, stages)
    _check_held(manifest, chunks, wanted)
    stats = WeightStats(chunks=len(chunks), stored_bytes=sum(c.blob.size for c in chunks),
                        raw_bytes=sum(c.raw_size for c in chunks))
    stats.workers = max(1, min(workers or (os.cpu_count() or 1), len(chunks) or 1, 8))
    gate, buffers = _Budget(budget), _Buffers(chunks)
    placed: Placed = {}
    lock = threading.Lock()  # the placed-arrays table and the step counters

    def one(i: int, chunk: WeightChunk) -> None:
        where = f"build {manifest.build_id}: weights chunk {i}"
        cost = chunk.blob.size + chunk.raw_size
        gate.acquire(cost)
        try:
            t0 = time.perf_counter()
            buf = buffers.take(chunk.raw_size)
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
                stats.decompress += t2 - t0 - fetching
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
