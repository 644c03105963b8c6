"""The channel move, written once: compare-and-swap under the store's writer lock.

Every store moves a channel the same way; what differs is how it keeps history and writes the
pointer. A store supplies the five steps of :class:`ChannelSwap`; :func:`compare_and_swap` runs
them in the one order that makes a move safe:

1. take the writer lock (no other move, commit or record write interleaves);
2. repair the history a crashed writer left (a move that happened is never unrecorded);
3. read where the channel points now and compare with what the caller saw when it decided
   (``expected_digest``): anything else means a concurrent move won — :class:`ConflictError`,
   nothing written;
4. do nothing when it already points at the build;
5. number the entry after every recorded move (and after any the store must record first, such
   as a tag another tool moved) and commit it the store's crash-safe way.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Protocol

from ..errors import ConflictError
from ..records import HistoryEntry, utcnow
from ._protocol import Action, Resolved, check_name

__all__ = ["Current", "ChannelSwap", "Move", "Action", "compare_and_swap", "conflict"]


@dataclass(frozen=True)
class Current:
    """Where a channel points now, as the store read it under the lock."""

    digest: str
    build_id: str


@dataclass(frozen=True)
class Move:
    """What the caller asks for: the channel, the build, and what it saw when it decided."""

    channel: str
    resolved: Resolved
    expected_digest: str | None
    action: Action
    who: str
    reason: str
    gate_result_digest: str | None = None


class ChannelSwap(Protocol):
    """The steps a store supplies to :func:`compare_and_swap` (each runs under the lock)."""

    def exclusive(self) -> contextlib.AbstractContextManager[None]: ...
    def repaired_history(self, op: str) -> list[HistoryEntry]: ...
    def current(self, channel: str) -> Current | None: ...
    def next_sequence(self, entries: list[HistoryEntry]) -> int: ...
    def unrecorded(
        self, channel: str, current: Current | None, entries: list[HistoryEntry], sequence: int
    ) -> list[HistoryEntry]: ...
    def commit(self, entry: HistoryEntry, first: list[HistoryEntry], entries: list[HistoryEntry], op: str) -> None: ...


def conflict(channel: str, action: str, expected: str | None, current: Current | None) -> ConflictError:
    found = f"{current.digest} ({current.build_id})" if current else "empty"
    return ConflictError(
        f"channel {channel!r} moved while this {action} was being decided: expected it at "
        f"{expected or 'empty'}, found {found}; nothing was changed — retry"
    )


def compare_and_swap(store: ChannelSwap, move: Move) -> HistoryEntry | None:
    """Move ``move.channel`` to ``move.resolved`` if it still points where the caller saw it.

    Returns the history entry written, or None when the channel already pointed there.
    """
    check_name("channel", move.channel)
    op = f"move channel {move.channel}"
    with store.exclusive():
        entries = store.repaired_history(op)
        current = store.current(move.channel)
        if (current.digest if current else None) != move.expected_digest:
            raise conflict(move.channel, move.action, move.expected_digest, current)
        if current is not None and current.digest == move.resolved.digest:
            return None
        sequence = store.next_sequence(entries)
        first = store.unrecorded(move.channel, current, entries, sequence)
        entry = HistoryEntry(
            sequence=sequence + len(first),
            channel=move.channel,
            action=move.action,
            from_build=current.build_id if current else None,
            from_digest=current.digest if current else None,
            to_build=move.resolved.build_id,
            to_digest=move.resolved.digest,
            who=move.who,
            when=utcnow(),
            reason=move.reason,
            gate_result_digest=move.gate_result_digest,
        )
        store.commit(entry, first, entries, op)
        return entry
