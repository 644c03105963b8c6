"""Garbage collection for directory-like stores: never touches what a channel can reach.

Kept, always:
  * every build a channel points at, and every build staging or prod ever pointed at
    (rollback targets): as the signed release state names them (its moves, verified from the
    trust policy's root) and as the plain pointers and history say (a mirror that someone
    edited can make gc keep more, never delete a build a decision can reach);
  * the signed release state (namespace ``release-state``, never pruned) and the blobs its
    metadata names: every move record and the evidence each move carried;
  * with ``prune_builds=False`` (the default), every published build;
  * for each kept build: its manifest, executables and weights, and the roots of every side
    record keyed by it (each namespace declares its own in ``records.stored``: gate results
    and their frames, the compile gate, the review); records of a namespace gc does not know
    are never touched.
Deleted: blobs nothing kept refers to, once older than ``min_age_s`` (a publish in flight
writes blobs before committing its build; the grace period, a re-put touching a reused blob,
and ``put_build`` re-checking under the lock that every blob is present keep it safe), and
with ``prune_builds=True`` the references and every build-keyed side record of builds outside
the kept set. Build references go first, blobs last: a crash mid-collection leaves orphans for
the next run, never a build with missing blobs.

The OCI backends never delete (a DELETE by digest removes every tag pointing at it): use the
registry's own garbage collector there; the layers of each build manifest keep its blobs alive.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol

from ..errors import InputError
from ..records import BlobRef, Manifest, parse_record
from ..records.stored import STORED_NAMESPACES
from ..registry import CHANNELS, BuildRef, Collectable, Registry
from ..trust.policy import load_policy
from ..trust.state_read import load_state, moves, state_exists

__all__ = ["GcReport", "collect_garbage"]


class _CollectableRegistry(Registry, Collectable, Protocol):
    """A store gc can work on: the registry protocol and the deletes of a directory-like store."""


# Channels whose past positions stay reachable by a rollback.
_ROLLBACK_CHANNELS = ("staging", "prod")


@dataclass
class GcReport:
    dry_run: bool
    kept_builds: list[str] = field(default_factory=list)
    pruned_builds: list[str] = field(default_factory=list)
    deleted_blobs: int = 0
    freed_bytes: int = 0
    kept_blobs: int = 0
    young_blobs: int = 0  # unreferenced but inside the grace period
    pruned_records: list[str] = field(default_factory=list)  # "<namespace>/<build id>"
    unknown_namespaces: list[str] = field(default_factory=list)  # kept whole: not declared
    swept_temporaries: int = 0

    def to_json(self) -> dict[str, Any]:
        return dict(self.__dict__)


def collect_garbage(
    reg: Registry, *, prune_builds: bool = False, min_age_s: float = 3600.0, dry_run: bool = False
) -> GcReport:
    if not isinstance(reg, Collectable):
        raise InputError(f"gc: {reg.uri} is not a directory-like store; use the registry server's own gc")
    report = GcReport(dry_run=dry_run)
    with reg.exclusive():  # no channel move, build commit or record update interleaves
        keep, drop = _partition_builds(reg, prune_builds)
        report.kept_builds = [b.build_id for b in keep]
        report.pruned_builds = [b.build_id for b in drop]
        reachable = _reachable(reg, keep, report)

        if not dry_run:  # references first: after this the dropped builds are invisible
            for b in drop:
                reg.delete_build(b.build_id)
        present, dropped = set(reg.record_namespaces()), {b.build_id for b in drop}
        for ns in STORED_NAMESPACES.values():
            if ns.keyed_by != "build" or ns.name not in present:
                continue
            for key in reg.list_records(ns.name):
                if ns.build_of(key) in dropped:
                    report.pruned_records.append(f"{ns.name}/{key}")
                    if not dry_run:
                        reg.delete_record(ns.name, key)

        for digest in reg.list_blob_digests():
            # A namespace gc does not know may refer to any blob: then nothing is deleted.
            if digest in reachable or report.unknown_namespaces:
                report.kept_blobs += 1
            elif reg.blob_age(digest) < min_age_s:
                report.young_blobs += 1
            else:
                report.deleted_blobs += 1
                report.freed_bytes += reg.blob_size(digest)
                if not dry_run:
                    reg.delete_blob(digest)
        if not dry_run and hasattr(reg, "sweep"):
            report.swept_temporaries = len(reg.sweep(older_than=min_age_s))
    return report


def _partition_builds(reg: Registry, prune_builds: bool) -> tuple[list[BuildRef], list[BuildRef]]:
    protected = {c.digest for c in reg.list_channels()}
    for e in reg.history():
        if e.channel in _ROLLBACK_CHANNELS:
            protected.add(e.to_digest)
            if e.from_digest:
                protected.add(e.from_digest)
    signed = _signed_builds(reg) if prune_builds else set()
    builds = reg.list_builds()
    keep = [b for b in builds if not prune_builds or b.digest in protected or b.build_id in signed]
    return keep, [b for b in builds if b not in keep]


def _signed_builds(reg: Registry) -> set[str]:
    """Build ids the signed release state names: each channel's, and every build staging and prod
    held or left (rollback targets, read along their signed chains of moves)."""
    if not state_exists(reg):
        return set()
    state = load_state(reg, load_policy())  # an unverifiable state: refused (exit 4) before anything is deleted
    out: set[str] = set()
    for channel in CHANNELS:
        holder = state.holder(channel)
        if holder is None:
            continue
        out.add(holder.build_id)
        if channel in _ROLLBACK_CHANNELS:
            for m in moves(reg, holder):
                out.update(b for b in (m.build_id, m.from_build) if b)
    return out


def _reachable(reg: _CollectableRegistry, keep: list[BuildRef], report: GcReport) -> set[str]:
    """Every blob a kept build or a kept side record refers to."""

    def fetch(ref: BlobRef) -> bytes:
        return reg.get_blob(ref.digest, ref.size)

    kept_ids = {b.build_id for b in keep}
    reachable: set[str] = set()
    for b in keep:
        reachable.add(b.digest)
        m = parse_record(Manifest, reg.get_manifest_bytes(b.digest), where=f"manifest {b.digest}")
        reachable.update(r.digest for r in m.blobs())
    for name in reg.record_namespaces():
        ns = STORED_NAMESPACES.get(name)
        if ns is None:
            report.unknown_namespaces.append(name)
            continue
        for key in reg.list_records(name):
            if ns.keyed_by == "build" and ns.build_of(key) not in kept_ids:
                continue
            raw = reg.get_record(name, key)
            if raw is not None:
                reachable.update(r.digest for r in ns.roots(raw, key, fetch))
    return reachable
