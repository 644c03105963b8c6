"""Mirror a build, with everything that belongs to it, from one registry into another.

``copy_build(src, dst, ref, channel=None)`` copies, in the order that keeps the destination
consistent at every instant (blobs before what refers to them; the build reference before its
records; the channel last):

1. every blob the build manifest names, each read verified (size + sha256) from the source and
   checked to land under the same digest;
2. the build manifest, byte for byte, under the same build id (``put_build``): the build id is
   the identity, so it never changes, and a destination already holding that id with other
   bytes is refused;
3. the build's records in every namespace declared in :data:`~avatar_release.records.stored.STORED_NAMESPACES`
   keyed by build (gate results, gate shards, compile gates, reviews, attestations), byte for
   byte, with the blobs each roots (gate results, frames, envelopes) copied first;
4. with ``channel``: a signed move of the destination's channel to the build, in the
   destination's signed release state (``trust.state_moves.signed_move``, action "promote",
   reason "copied from SOURCE"; a new, empty destination is initialised first, one with channels
   but no signed state is refused: ``registry upgrade``), then its plain pointer as a mirror.
   When the source's signed state names this very build in that channel, the move carries the
   evidence the source's move carried (its gate result and release approval envelopes, present
   in the destination by then: copied with the build's attestations, or by digest) and the
   channel's signed statement and timestamp are copied (otherwise they sign another build, and
   are left).

A channel name as ``ref`` is read from the source's signed release state when it has one (the
build it names must be the very manifest it signs), else from its plain pointer.

Blobs move side by side (``workers`` threads, 4 by default: fetching, hashing and pushing wait on
the network or release the GIL), each verified on its own, with a line of progress per blob on
``progress`` (the CLI's stderr): how many of how many, and the bytes so far. A failed blob fails the
copy before the build reference is written, so a destination never holds a build it lacks blobs of.

Idempotent and resumable: whatever is already in the destination (blobs by digest, the build,
identical records) is skipped, so re-running a copy that was killed finishes it, and re-running
a finished one changes nothing.

Signatures stay valid: signed evidence (gate results, reviews, attestations) and promotion
statements and timestamps bind ``Manifest.content_digest()`` (the digest of the manifest bytes,
the same in every store), and are copied byte for byte; a pod checks a statement against the
content digest of the manifest its channel resolves to (``trust.statements.verify``), so a
statement signed in any store verifies in every copy, directory or OCI. Between two OCI
registries the OCI manifest itself is copied byte for byte too, so the build keeps its OCI digest.
Only a version-1 statement signed in an OCI store (before 2026-12-01) bound that store's OCI
manifest digest: copied to a directory store (or another OCI registry under another digest), it
names a digest the destination does not have; the report says so (``statement_binds_store_digest``)
and the destination needs a fresh signature (``avatar-release keys sign CHANNEL``) before a
trusting pod serves that channel there.
"""

from __future__ import annotations

import json
import tempfile
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from .._digest import is_digest
from .._progress import Tick
from ..errors import ConflictError, IntegrityError, NotFoundError
from ..promote.signed import SignedChannels
from ..records import BlobRef, Manifest, parse_record
from ..records.stored import STATEMENTS, STORED_NAMESPACES, TIMESTAMPS
from ..registry import CHANNELS, OciRegistry, Registry, Resolved
from ..trust.policy import TrustPolicy, load_policy
from ..trust.state_moves import open_state, signed_move
from ..trust.state_read import ReleaseState, load_state, state_exists
from ..trust.statements import parse_statement

__all__ = ["CopyReport", "copy_build"]


@dataclass
class CopyReport:
    build_id: str
    source: str
    destination: str
    source_digest: str
    destination_digest: str = ""
    build_created: bool = False
    blobs_copied: int = 0
    blobs_present: int = 0
    bytes_copied: int = 0
    records_copied: list[str] = field(default_factory=list)
    records_present: int = 0
    channel: str | None = None
    channel_moved: bool = False
    statement_copied: bool = False
    blobs_streamed: int = 0  # of blobs_copied: through a temporary file (OCI to OCI, large blobs)
    statement_binds_store_digest: bool = False  # signed in another store's digest: re-sign at the destination
    seconds: float = 0.0

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


class _Copier:
    def __init__(self, src: Registry, dst: Registry, report: CopyReport, stream_above: int):
        self.src, self.dst, self.report, self.stream_above = src, dst, report, stream_above
        self._done: set[str] = set()
        self._mutex = threading.Lock()  # the report's counters and the set of blobs taken

    def _take(self, digest: str) -> bool:
        with self._mutex:
            if digest in self._done:
                return False
            self._done.add(digest)
            return True

    def blob(self, ref: BlobRef) -> None:
        if not self._take(ref.digest):
            return
        if self.dst.has_blob(ref.digest):
            with self._mutex:
                self.report.blobs_present += 1
            return
        if ref.size >= self.stream_above and isinstance(self.src, OciRegistry) and isinstance(self.dst, OciRegistry):
            landed = self._streamed(self.src, self.dst, ref)
        else:
            data = self.src.get_blob(ref.digest, ref.size)  # verified: exactly size bytes hashing to digest
            landed = self.dst.put_blob(data)
        if landed != ref.digest:
            raise IntegrityError(f"copy to {self.dst.uri}: blob {ref.digest} was stored as {landed}")
        with self._mutex:
            self.report.blobs_copied += 1
            self.report.bytes_copied += ref.size

    def blobs(self, refs: list[BlobRef], workers: int, progress: Callable[[str], None]) -> None:
        """Every blob of ``refs``, ``workers`` at a time; the first failure is raised once all stop."""
        total, done = sum(r.size for r in refs), [0, 0]

        def one(ref: BlobRef) -> None:
            self.blob(ref)
            with self._mutex:
                done[0] += 1
                done[1] += ref.size
                tick = Tick(f"copy {self.report.build_id} ({len(refs)} blobs)", done[1], total, "B")
            progress(tick)

        with ThreadPoolExecutor(
            max_workers=max(1, min(workers, len(refs) or 1)), thread_name_prefix="avatar-release-copy"
        ) as pool:
            futures = [pool.submit(one, r) for r in refs]
        for f in futures:
            f.result()  # re-raises the first blob that failed, after every worker has stopped

    def _streamed(self, src: OciRegistry, dst: OciRegistry, ref: BlobRef) -> str:
        """A large blob between OCI registries through a temporary file: memory is one chunk."""
        with tempfile.TemporaryDirectory(prefix="avatar-release-copy-") as tmp:
            path = src.pull_blob_to(ref.digest, ref.size, Path(tmp) / "blob")  # verified before it exists
            with self._mutex:
                self.report.blobs_streamed += 1
            return dst.push_blob_from(path)

    def fetch(self, ref: BlobRef) -> bytes:
        return self.src.get_blob(ref.digest, ref.size)

    def record(self, namespace: str, name: str, raw: bytes) -> None:
        # A record is written only after the blobs it roots, so an identical record already in the
        # destination means its blobs are there too: nothing to read or check.
        if self.dst.get_record(namespace, name) == raw:
            self.report.records_present += 1
            return
        for ref in STORED_NAMESPACES[namespace].roots(raw, name, self.fetch):
            self.blob(ref)
        self.dst.put_record(namespace, name, raw)
        self.report.records_copied.append(f"{namespace}/{name}")


def _manifest_blobs(manifest_bytes: bytes) -> list[BlobRef]:
    """Every blob reference (``{digest, size, media_type}``) anywhere in the manifest JSON, so fields
    added by later manifest versions are copied too."""
    out: dict[str, BlobRef] = {}

    def walk(node: object) -> None:
        if isinstance(node, dict):
            if is_digest(str(node.get("digest", ""))) and isinstance(node.get("size"), int) and "media_type" in node:
                out.setdefault(
                    node["digest"],
                    BlobRef(digest=node["digest"], size=node["size"], media_type=str(node["media_type"])),
                )
                return
            for v in node.values():
                walk(v)
        elif isinstance(node, list):
            for v in node:
                walk(v)

    walk(json.loads(manifest_bytes))
    return list(out.values())


def _put_build(src: Registry, dst: Registry, build_id: str, manifest_bytes: bytes, report: CopyReport) -> None:
    if isinstance(src, OciRegistry) and isinstance(dst, OciRegistry):
        # The same OCI manifest, byte for byte: the build keeps its digest, so statements signed
        # over that digest in the source verify here too.
        digest, created = dst.put_build(build_id, manifest_bytes, artifact=src.build_artifact(report.source_digest))
    else:
        digest, created = dst.put_build(build_id, manifest_bytes)
    if not created and dst.get_manifest_bytes(digest) != manifest_bytes:
        raise ConflictError(
            f"copy to {dst.uri}: build {build_id} already exists there with a different manifest ({digest}); "
            "a build id names one build — nothing was overwritten"
        )
    report.destination_digest, report.build_created = digest, created


def _build_records(src: Registry, build_id: str) -> list[tuple[str, str]]:
    out: list[tuple[str, str]] = []
    for ns in STORED_NAMESPACES.values():
        if ns.keyed_by == "build":
            out += [(ns.name, n) for n in src.list_records(ns.name) if ns.build_of(n) == build_id]
    return out


def _statement_digest(raw: bytes) -> str | None:
    """The build digest a stored statement signs (DSSE envelope or version-1 statement), unverified."""
    try:
        return parse_statement(raw, "x").payload.build_digest
    except Exception:  # noqa: BLE001 - unreadable: the pod will refuse it anyway
        return None


def _copy_channel(
    src: Registry,
    dst: Registry,
    channel: str,
    manifest: Manifest,
    who: str,
    copier: _Copier,
    report: CopyReport,
    policy: TrustPolicy,
    src_state: ReleaseState | None,
) -> None:
    report.channel = channel
    if src_state is not None:
        held = src_state.holder(channel)
        here = held is not None and held.manifest_digest == manifest.content_digest()
    else:  # a source not yet signed: its plain pointer is all there is
        held, at_src = None, src.get_channel(channel)
        here = at_src is not None and at_src.build_id == manifest.build_id
    evidence = held.evidence if held is not None and here else ()
    for ref in evidence:  # attestation envelopes: copied with the build's records; any its index lost, by digest
        copier.blob(ref)
    state = open_state(dst, policy, init_if_new=True)
    _, move, _ = signed_move(
        dst,
        policy,
        state,
        channel,
        dst.resolve(report.destination_digest),
        manifest,
        action="promote",
        who=who,
        reason=f"copied from {src.uri}",
        gate_result_digest=held.gate_result_digest if held is not None and here else None,
        evidence=evidence,
    )
    report.channel_moved = move is not None
    if not here:
        return  # the source's signature is for another build
    raw = src.get_record(STATEMENTS.name, channel)
    if raw is None:
        return
    signed = _statement_digest(raw)
    report.statement_binds_store_digest = signed not in (report.destination_digest, manifest.content_digest())
    copier.record(STATEMENTS.name, channel, raw)
    ts = src.get_record(TIMESTAMPS.name, channel)
    if ts is not None:
        copier.record(TIMESTAMPS.name, channel, ts)
    report.statement_copied = True


def _resolve(src: Registry, ref: str, src_state: ReleaseState | None) -> Resolved:
    """``ref`` in the source: a channel as its signed state names it (when it has one)."""
    if src_state is not None and ref in CHANNELS:
        return SignedChannels(src, src_state).resolve(ref)[0]
    return src.resolve(ref)


STREAM_ABOVE = 64 << 20
COPY_WORKERS = 4


def copy_build(
    src: Registry,
    dst: Registry,
    ref: str,
    *,
    channel: str | None = None,
    who: str = "avatar-release copy",
    stream_above: int = STREAM_ABOVE,
    workers: int = COPY_WORKERS,
    progress: Callable[[str], None] = lambda line: None,
    policy: TrustPolicy | None = None,
) -> CopyReport:
    """Copy the build ``ref`` names (channel, build id, digest) from ``src`` into ``dst``; see the module.

    Between two OCI registries, blobs of ``stream_above`` bytes or more go through a temporary file
    (streamed, verified pull; chunked, resumable push), so memory does not grow with them; other
    blobs are held in memory, ``workers`` at a time (a weight chunk is at most 64 MiB). ``policy``
    (default: the trust policy in force) verifies the source's signed state and signs the
    destination's channel move; only a copy with ``channel`` or of a channel name needs it.
    """
    t0 = time.perf_counter()
    src_state = None
    if channel is not None or ref in CHANNELS:  # read first: an unverifiable source copies nothing
        policy = policy or load_policy()
        src_state = load_state(src, policy) if state_exists(src) else None
    resolved = _resolve(src, ref, src_state)
    manifest_bytes = src.get_manifest_bytes(resolved.digest)
    manifest = parse_record(Manifest, manifest_bytes, where=f"{src.uri} manifest {resolved.digest}")
    if manifest.build_id != resolved.build_id:
        raise IntegrityError(
            f"{src.uri}: manifest {resolved.digest} says build {manifest.build_id}, "
            f"the registry calls it {resolved.build_id}"
        )
    report = CopyReport(manifest.build_id, src.uri, dst.uri, resolved.digest)
    copier = _Copier(src, dst, report, stream_above)
    copier.blobs(_manifest_blobs(manifest_bytes), workers, progress)
    _put_build(src, dst, manifest.build_id, manifest_bytes, report)
    for namespace, name in _build_records(src, manifest.build_id):
        raw = src.get_record(namespace, name)
        if raw is None:
            raise NotFoundError(f"{src.uri}: record {namespace}/{name} vanished during the copy; retry")
        copier.record(namespace, name, raw)
    if channel is not None:
        _copy_channel(src, dst, channel, manifest, who, copier, report, policy or load_policy(), src_state)
    report.seconds = round(time.perf_counter() - t0, 3)
    return report
