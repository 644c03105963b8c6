"""Garbage collection for directory-like stores: never touches what a channel can reach.

Kept, always:
  * every build a channel points at, and every build staging or prod ever pointed at
    (rollback targets);
  * with ``prune_builds=False`` (the default), every published build;
  * for each kept build: its manifest, executables and weights, its gate results and their
    frames, its review.
Deleted: blobs nothing kept refers to, once older than ``min_age_s`` (a publish in flight
writes blobs before committing its build; the grace period, a re-put touching a reused blob,
and ``put_build`` re-checking under the lock that every blob is present keep it safe), and
with ``prune_builds=True`` the references, gate results and reviews of builds outside the
kept set. Build references go first, blobs last: a crash mid-collection leaves orphans for
the next run, never a build with missing blobs.

The OCI backends never delete (a DELETE by digest removes every tag pointing at it): use the
registry's own garbage collector there; the layers of each build manifest keep its blobs alive.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ..errors import InputError
from ..records import Manifest, parse_record

__all__ = ["GcReport", "collect_garbage"]


@dataclass
class GcReport:
    dry_run: bool
    kept_builds: list[str] = field(default_factory=list)
    pruned_builds: list[str] = field(default_factory=list)
    deleted_blobs: int = 0
    freed_bytes: int = 0
    kept_blobs: int = 0
    young_blobs: int = 0  # unreferenced but inside the grace period

    def to_json(self) -> dict:
        return dict(self.__dict__)


def collect_garbage(reg, *, prune_builds: bool = False, min_age_s: float = 3600.0, dry_run: bool = False) -> GcReport:
    from ..gates.store import frames_refs, result_refs

    if not all(hasattr(reg, a) for a in ("_delete", "_age", "_size", "_list")):
        raise InputError(f"gc: {reg.uri} is not a directory-like store; use the registry server's own gc")
    report = GcReport(dry_run=dry_run)
    with reg._lock():  # no channel move or build commit interleaves with the decision
        channels = reg.list_channels()
        protected = {c.digest for c in channels}
        for e in reg.history():
            if e.channel in ("staging", "prod"):
                protected.add(e.to_digest)
                if e.from_digest:
                    protected.add(e.from_digest)
        builds = reg.list_builds()
        keep = [b for b in builds if not prune_builds or b.digest in protected]
        drop = [b for b in builds if b not in keep]

        reachable: set[str] = set()
        for b in keep:
            reachable.add(b.digest)
            m = parse_record(Manifest, reg.get_manifest_bytes(b.digest), where=f"manifest {b.digest}")
            reachable.update(r.digest for r in m.blobs())
            reachable.update(ref.digest for ref in result_refs(reg, b.build_id))
            reachable.update(ref.digest for ref in frames_refs(reg, b.build_id))
        report.kept_builds = [b.build_id for b in keep]
        report.pruned_builds = [b.build_id for b in drop]

        if not dry_run:
            for b in drop:  # references first: after this the build is invisible
                reg._delete(f"builds/{b.build_id}")
                for ns in ("gate-results", "reviews"):
                    reg._delete(f"records/{ns}/{b.build_id}")

        for key in reg._list("blobs/sha256/"):
            digest = "sha256:" + key.rsplit("/", 1)[-1]
            if digest in reachable:
                report.kept_blobs += 1
                continue
            if reg._age(key) < min_age_s:
                report.young_blobs += 1
                continue
            report.deleted_blobs += 1
            report.freed_bytes += reg._size(key)
            if not dry_run:
                reg._delete(key)
    return report
