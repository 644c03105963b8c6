"""History and channel moves in one OCI repository: the journal, and its compare-and-swap steps.

History is the artifact under the layout's history tag: one layer per entry (the entry's
canonical JSON as a blob) with the entry repeated in the layer's annotation, so the whole
history reads in one manifest GET, each annotation checked against its layer digest. A move is
written in the local store's crash-safe order (:meth:`Journal.commit_move`): the new entry is
parked under the pending tag, the channel tag moved and read back, then the history rewritten
with the entry appended. A reader counts a parked entry exactly when the channel tag already
points where it says; the next writer folds it in. :class:`JournalSwap` gives these steps to
the one compare-and-swap (:func:`.._cas.compare_and_swap`).
"""

from __future__ import annotations

import contextlib
from typing import Any

from ..._digest import sha256_digest
from ...errors import ConflictError, IntegrityError, RegistryError, SchemaVersionError
from ...records import ChannelState, HistoryEntry, parse_record, utcnow
from ...records.window import RECORD_FORMATS_PAGE
from .._cas import Current
from .._lock import FileLock
from ._artifact import ANN_ENTRY, BUILD_ARTIFACT, ENTRY_TYPE, HISTORY_ARTIFACT, PENDING_ARTIFACT, artifact, descriptor
from ._blobs import Blobs
from ._builds import Builds
from ._layout import TagLayout
from ._manifests import Manifests

__all__ = ["Journal", "JournalSwap"]


class Journal:
    """The history and the parked move of one repository, and channel reads that name their entry."""

    def __init__(self, manifests: Manifests, blobs: Blobs, layout: TagLayout, uri: str):
        self.manifests, self.blobs, self.layout, self.uri = manifests, blobs, layout, uri

    def where(self) -> str:
        return self.manifests.where()

    # ---- reading --------------------------------------------------------------------------
    def entries_of(self, tags: tuple[str, ...], artifact_type: str) -> list[HistoryEntry]:
        """The entries the first existing of ``tags`` carries in its layer annotations, each verified."""
        for tag in tags:
            got = self.manifests.get(tag, f"read {tag}")
            if got is not None:
                break
        else:
            return []
        doc = self.manifests.parse(got[1], f"{tag} artifact", artifact_type)
        out = []
        for n, layer in enumerate(doc.get("layers") or []):
            data = (layer.get("annotations") or {}).get(ANN_ENTRY, "").encode()
            if sha256_digest(data) != layer.get("digest") or len(data) != layer.get("size"):
                raise IntegrityError(
                    f"{self.where()}: {tag} entry {n} does not match its layer digest; the history was altered"
                )
            out.append(parse_record(HistoryEntry, data, where=f"{self.uri} {tag} entry {n}"))
        return out

    def recorded(self) -> list[HistoryEntry]:
        entries = self.entries_of(self.layout.history_tags, HISTORY_ARTIFACT)
        if not entries:
            self.refuse_retired_layout()
        return entries

    def refuse_retired_layout(self) -> None:
        """A repository whose history is under a retired layout's tag (written before 2026-12-01) is
        refused, naming the migration, rather than read as one with no history."""
        for tag in self.layout.retired_history_tags:
            if self.manifests.head(tag, f"read {tag}") is not None:
                raise SchemaVersionError(
                    f"{self.uri}: this repository keeps its builds, records and history under the tag layout of "
                    f"before 2026-12-01 ({tag}, _b.<build id>, _r.<record>), outside this avatar-release's "
                    "support window, which reads the _avr.* tags only; move them (the same manifests under "
                    f"today's names; nothing is deleted or re-signed): `avatar-release registry migrate --registry "
                    f"{self.uri}` ({RECORD_FORMATS_PAGE})",
                    kind="oci tag layout",
                    found=1,
                    supported=(2, 2),
                )

    def parked(self) -> list[HistoryEntry]:
        return self.entries_of(self.layout.pending_tags, PENDING_ARTIFACT)

    def pending_if_applied(self, recorded: list[HistoryEntry]) -> HistoryEntry | None:
        """The parked entry of the last move, when its tag write happened but its history write did not."""
        pending = self.parked()
        if not pending or pending[0].sequence in {e.sequence for e in recorded}:
            return None
        p = pending[0]
        return p if self.manifests.head(p.channel, f"read channel {p.channel}") == p.to_digest else None

    def all_entries(self) -> list[HistoryEntry]:
        entries = self.recorded()
        applied = self.pending_if_applied(entries)
        return sorted(entries + ([applied] if applied else []), key=lambda e: e.sequence)

    def read_channel(self, channel: str) -> tuple[str, dict[str, Any]] | None:
        got = self.manifests.get(channel, f"read channel {channel}")
        if got is None:
            return None
        return got[0], self.manifests.parse(got[1], f"channel tag {channel}", BUILD_ARTIFACT)

    def channel_state(
        self, channel: str, digest: str, doc: dict[str, Any], entries: list[HistoryEntry], builds: Builds
    ) -> ChannelState:
        build_id = builds.id_of(doc, f"channel tag {channel}")
        for e in reversed(entries):
            if e.channel == channel and e.to_digest == digest:
                return ChannelState(
                    channel=channel, build_id=build_id, digest=digest, sequence=e.sequence, updated_at=e.when
                )
        # The tag was moved by another tool; the next move records it.
        return ChannelState(
            channel=channel,
            build_id=build_id,
            digest=digest,
            sequence=0,
            updated_at="unknown (tag moved outside avatar-release)",
        )

    # ---- writing (under the writer lock) --------------------------------------------------
    def write_entries(
        self, tag: str, artifact_type: str, entries: list[HistoryEntry], new: list[HistoryEntry], op: str
    ) -> None:
        """Write an entry artifact (pushing the blobs of the ``new`` entries), then read it back."""
        self.blobs.ensure_empty()
        for e in new:
            self.blobs.put(e.to_json_bytes())
        body = artifact(artifact_type, [_entry_layer(e) for e in entries], {})
        digest = self.manifests.put(tag, body, op)
        if not self.manifests.points_at(tag, digest, op):
            raise RegistryError(
                f"{self.where()}: {op}: the {tag} tag was overwritten by a writer outside this machine's "
                "lock right after this write; its entries may need repair (see the limits in the docstring of "
                "avatar_release.registry.oci)"
            )

    def fold_pending(self, op: str) -> list[HistoryEntry]:
        """The full history, with an applied parked move written into it."""
        entries = self.recorded()
        applied = self.pending_if_applied(entries)
        if applied is not None:
            entries = sorted(entries + [applied], key=lambda e: e.sequence)
            self.write_entries(
                self.layout.current.history, HISTORY_ARTIFACT, entries, [applied], f"{op}: repair history"
            )
        return entries

    def commit_move(
        self, entry: HistoryEntry, body: bytes, entries: list[HistoryEntry], new: list[HistoryEntry], op: str
    ) -> None:
        """Park the entry, move the tag (read back), append the history: the crash-safe order."""
        names = self.layout.current
        self.write_entries(names.pending, PENDING_ARTIFACT, [entry], [entry], f"{op}: park the move")
        self.manifests.put(entry.channel, body, op)
        if not self.manifests.points_at(entry.channel, entry.to_digest, op):
            raise ConflictError(
                f"channel {entry.channel!r} was written by another writer (outside this machine's lock) while "
                f"this {entry.action} moved it to {entry.to_build}; check `avatar-release history` and retry"
            )
        self.write_entries(names.history, HISTORY_ARTIFACT, entries + new, new, f"{op}: append history")


class JournalSwap:
    """The steps of a channel move (:class:`.._cas.ChannelSwap`) over the journal and the build tags."""

    def __init__(self, journal: Journal, builds: Builds, lock: FileLock):
        self.journal, self.builds, self.lock = journal, builds, lock

    def exclusive(self) -> contextlib.AbstractContextManager[None]:
        return self.lock.hold()

    def repaired_history(self, op: str) -> list[HistoryEntry]:
        return self.journal.fold_pending(op)

    def current(self, channel: str) -> Current | None:
        got = self.journal.read_channel(channel)
        return None if got is None else Current(got[0], self.builds.id_of(got[1], f"channel tag {channel}"))

    def next_sequence(self, entries: list[HistoryEntry]) -> int:
        return max([e.sequence for e in entries + self.journal.parked()], default=0) + 1

    def unrecorded(
        self, channel: str, current: Current | None, entries: list[HistoryEntry], sequence: int
    ) -> list[HistoryEntry]:
        """An entry for a channel tag moved by another tool, so the history accounts for it."""
        if current is None:
            return []
        last = next((e for e in reversed(entries) if e.channel == channel), None)
        if last is not None and last.to_digest == current.digest:
            return []
        return [
            HistoryEntry(
                sequence=sequence,
                channel=channel,
                action="promote",
                from_build=last.to_build if last else None,
                from_digest=last.to_digest if last else None,
                to_build=current.build_id,
                to_digest=current.digest,
                who="unknown",
                when=utcnow(),
                reason="the channel tag was found here without a history entry (moved outside avatar-release); "
                "recorded by the next move",
            )
        ]

    def commit(self, entry: HistoryEntry, first: list[HistoryEntry], entries: list[HistoryEntry], op: str) -> None:
        body = self.builds.target(entry.to_digest, entry.to_build, op)
        self.journal.commit_move(entry, body, entries, first + [entry], op)


def _entry_layer(entry: HistoryEntry) -> dict[str, Any]:
    data = entry.to_json_bytes()
    return descriptor(ENTRY_TYPE, sha256_digest(data), len(data), {ANN_ENTRY: data.decode()})
