"""Registry logic written once over five storage primitives.

The local directory and the in-memory fake differ only in how they read, write
atomically, append, list and lock; resolution, verification, channel moves and
history live here.

Crash safety of a channel move: under the store lock the channel file is replaced
atomically first, then the history entry is appended. A crash between the two leaves
the channel carrying its own entry; the next writer under the lock repairs the history
from it, so history never loses a move and never records one that did not happen.

Every stored file is parsed here, once (``_parse_json``, ``_build_ref``, ``_channel_doc``,
``_history_entries``): a file that is not what its place says (garbage in ``builds/``,
``channels/``, a ``history.jsonl`` line) is an IntegrityError naming the file, never a crash.
The one tolerated defect is the torn line a crash mid-append leaves (see ``_history_entries``).
"""

from __future__ import annotations

import abc
import contextlib
import json
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

from .._digest import is_digest, sha256_digest
from ..errors import IntegrityError, NotFoundError
from ..records import ChannelState, HistoryEntry, parse_record, utcnow
from ._blobcheck import BLOB_CHUNK, check_size, checked_blob, checked_stream, copy_into
from ._cas import Current, Move, compare_and_swap
from ._kv_gc import KVCollection
from ._protocol import Action, BuildRef, Resolved, check_name
from ._resolve import Lookups, resolve_ref

__all__ = ["KVRegistry"]

T = TypeVar("T")


class KVRegistry(KVCollection, abc.ABC):
    """Registry logic over a handful of key/value primitives a backend supplies (abstract below);
    garbage collection's side of it (the Collectable protocol) is :class:`._kv_gc.KVCollection`."""

    uri: str = ""

    # ---- primitives a backend supplies (and those of KVCollection: list, lock, delete, age, size) ----
    @abc.abstractmethod
    def _read(self, key: str, limit: int | None = None) -> bytes | None:
        """The bytes at ``key`` (at most ``limit``), or None when absent."""

    @abc.abstractmethod
    def _write_atomic(self, key: str, data: bytes) -> None:
        """Replace ``key`` so readers see the old or the new bytes, never a mix."""

    @abc.abstractmethod
    def _append(self, key: str, line: bytes) -> None:
        """Append one line durably."""

    def _touch(self, key: str) -> None:
        """Restart ``key``'s age (a re-put of an existing blob); stores without clocks ignore it."""

    # ---- blobs ----------------------------------------------------------------------
    def has_blob(self, digest: str) -> bool:
        return self._read(self._blob_key(digest), limit=0) is not None

    def put_blob(self, data: bytes) -> str:
        digest = sha256_digest(data)
        key = self._blob_key(digest)
        existing = self._read(key, limit=len(data) + 1)
        if existing is not None and sha256_digest(existing) == digest:
            self._touch(key)  # re-used: garbage collection's grace period starts again
            return digest  # content-addressed: already there, nothing rewritten
        self._write_atomic(key, data)
        return digest

    def stream_blob(self, digest: str, size: int, sink: Callable[[Iterator[bytes]], T]) -> T:
        """``sink(chunks)`` over the blob as it is read, then the check of :meth:`get_blob`."""
        pieces = self._read_pieces(self._blob_key(digest), limit=size + 1)
        if pieces is None:
            raise NotFoundError(f"blob {digest} not found in registry {self.uri}")
        return checked_stream(pieces, digest, size, self.uri, sink)

    def read_blob_into(self, digest: str, size: int, out: memoryview) -> None:
        """``NodeBlobs``: the blob's bytes copied into ``out`` unhashed, its size checked."""
        pieces = self._read_pieces(self._blob_key(digest), limit=size + 1)
        if pieces is None:
            raise NotFoundError(f"blob {digest} not found in registry {self.uri}")
        check_size(copy_into(pieces, out, size), digest, size, self.uri)

    def _read_pieces(self, key: str, limit: int) -> Iterator[bytes] | None:
        """The bytes at ``key`` (at most ``limit``) in pieces, or None when absent; a store that can
        read a part at a time (a file) overrides this so a blob is never held whole."""
        data = self._read(key, limit=limit)
        return None if data is None else iter([data[i : i + BLOB_CHUNK] for i in range(0, len(data), BLOB_CHUNK)])

    def get_blob(self, digest: str, size: int) -> bytes:
        """Fetch by digest, reading at most ``size`` + 1 bytes, and verify both."""
        data = self._read(self._blob_key(digest), limit=size + 1)
        if data is None:
            raise NotFoundError(f"blob {digest} not found in registry {self.uri}")
        return checked_blob(data, digest, size, self.uri)

    # ---- builds ---------------------------------------------------------------------
    def put_build(self, build_id: str, manifest_bytes: bytes) -> tuple[str, bool]:
        """Commit a build: manifest blob, then the build reference last (the commit marker).

        Returns (manifest digest, created). An existing build id is never rewritten.
        """
        check_name("build", build_id)
        with self._lock():
            existing = self._read(f"builds/{build_id}")
            if existing is not None:
                return self._build_ref(f"builds/{build_id}", existing).digest, False
            self._check_blobs_present(build_id, manifest_bytes)
            digest = self.put_blob(manifest_bytes)
            ref = {"build_id": build_id, "digest": digest, "published_at": utcnow()}
            self._write_atomic(f"builds/{build_id}", json.dumps(ref).encode())
            return digest, True

    def _check_blobs_present(self, build_id: str, manifest_bytes: bytes) -> None:
        """Under the lock: every blob the manifest names is there (a concurrent gc cannot have
        removed one), so a committed build is always complete."""
        try:
            refs = [b["digest"] for b in _manifest_blob_refs(json.loads(manifest_bytes))]
        except (ValueError, TypeError, KeyError):
            return  # not a manifest this store understands: the loader validates it
        missing = [d for d in refs if not self.has_blob(d)]
        if missing:
            # IntegrityError, as an OCI registry's refusal of such a manifest (the conformance suite)
            raise IntegrityError(
                f"publish {build_id}: blobs {missing[:3]} are missing from {self.uri} "
                "(never pushed, or removed by a concurrent gc); nothing was committed — "
                "publish again"
            )

    def get_manifest_bytes(self, digest: str) -> bytes:
        data = self._read(self._blob_key(digest))
        if data is None:
            raise NotFoundError(f"manifest {digest} not found in registry {self.uri}")
        if sha256_digest(data) != digest:
            raise IntegrityError(f"manifest {digest} in {self.uri}: content does not match its digest")
        return data

    def list_builds(self) -> list[BuildRef]:
        out = []
        for key in self._list("builds/"):
            raw = self._read(key)
            if raw is None:
                continue
            out.append(self._build_ref(key, raw))
        return sorted(out, key=lambda r: r.published_at)

    def _where(self, key: str) -> str:
        return f"registry {self.uri}: {key}"

    def _build_ref(self, key: str, raw: bytes) -> BuildRef:
        """A ``builds/<id>`` commit marker: {"build_id": <its own name>, "digest", "published_at"}."""
        where = self._where(key)
        doc = _parse_json(raw, where)
        fields = ("build_id", "digest", "published_at")
        if not isinstance(doc, dict) or not all(isinstance(doc.get(f), str) for f in fields):
            raise IntegrityError(
                f"{where}: not a build reference (expected an object with string fields {', '.join(fields)})"
            )
        name = key.rsplit("/", 1)[-1]
        if doc["build_id"] != name:
            raise IntegrityError(f"{where}: names build {doc['build_id']!r}, but is stored as {name!r}")
        if not is_digest(doc["digest"]):
            raise IntegrityError(f"{where}: digest {doc['digest'][:80]!r} is not 'sha256:' + 64 lowercase hex")
        return BuildRef(doc["build_id"], doc["digest"], doc["published_at"])

    def resolve(self, ref: str) -> Resolved:
        """Channel name, build id, manifest digest, or a unique prefix of a build id."""
        builds: list[BuildRef] | None = None

        def all_builds() -> list[BuildRef]:
            nonlocal builds
            builds = self.list_builds() if builds is None else builds
            return builds

        def by_digest(digest: str) -> Resolved:
            for b in all_builds():
                if b.digest == digest:
                    return Resolved(digest, b.build_id, b.digest, "digest")
            raise NotFoundError(f"no build with manifest digest {digest} in {self.uri}")

        def channel(name: str) -> Resolved | None:
            state = self.get_channel(name)
            return None if state is None else Resolved(name, state.build_id, state.digest, "channel")

        return resolve_ref(
            ref,
            self.uri,
            Lookups(
                by_digest=by_digest,
                channel=channel,
                exact_build=lambda i: next((b.digest for b in all_builds() if b.build_id == i), None),
                builds_with_prefix=lambda p: [b.build_id for b in all_builds() if b.build_id.startswith(p)],
                latest=lambda: [b.build_id for b in all_builds()],
            ),
        )

    # ---- channels and history -----------------------------------------------------------
    def get_channel(self, channel: str) -> ChannelState | None:
        check_name("channel", channel)
        key = f"channels/{channel}.json"
        raw = self._read(key)
        if raw is None:
            return None
        state = parse_record(ChannelState, self._channel_doc(key, raw, "state"), where=self._where(key))
        if state.channel != channel:
            raise IntegrityError(f"{self._where(key)}: holds the state of channel {state.channel!r}")
        return state

    def _channel_doc(self, key: str, raw: bytes, part: str) -> bytes:
        """One part ("state" or "entry") of a channel file, as bytes for parse_record."""
        doc = _parse_json(raw, self._where(key))
        if not isinstance(doc, dict) or not isinstance(doc.get(part), dict):
            raise IntegrityError(
                f"{self._where(key)}: not a channel file (expected an object with 'state' and 'entry' objects)"
            )
        return json.dumps(doc[part]).encode()

    def list_channels(self) -> list[ChannelState]:
        out = []
        for key in self._list("channels/"):
            name = key.rsplit("/", 1)[-1].removesuffix(".json")
            st = self.get_channel(name)
            if st is not None:
                out.append(st)
        return out

    def _history_entries(self) -> list[HistoryEntry]:
        """Every entry of history.jsonl; a line that is not one is refused, naming it, unless torn.

        A crash mid-append leaves a torn line: a prefix of the entry's bytes, with no newline
        after it, while the channel file still carries the whole entry. It is the last line until
        the next move repairs the log, which closes it and re-appends the entry, so from then on
        it is a prefix of a later line (or, after a second crash during the repair, of the entry
        the channel file carries). Those lines are skipped; any other is corruption or tampering.
        """
        raw = self._read("history.jsonl") or b""
        lines = raw.splitlines()
        out = []
        carried = None
        for n, line in enumerate(lines, 1):
            if not line.strip():
                continue
            try:
                out.append(parse_record(HistoryEntry, line, where=self._where(f"history.jsonl line {n}")))
            except IntegrityError:
                if n == len(lines) or any(later.startswith(line) for later in lines[n:]):
                    continue
                carried = [e.to_json_bytes() for e in self._channel_entries()] if carried is None else carried
                if any(whole.startswith(line) for whole in carried):
                    continue
                raise
        return out

    def _channel_entries(self) -> list[HistoryEntry]:
        """The entry each channel file carries: the move that put the channel where it is."""
        out = []
        for key in self._list("channels/"):
            raw = self._read(key)
            if raw is not None:
                out.append(parse_record(HistoryEntry, self._channel_doc(key, raw, "entry"), where=self._where(key)))
        return out

    def _repair_history(self) -> list[HistoryEntry]:
        """Under the lock: re-append any channel's latest entry missing from history."""
        entries = self._history_entries()
        raw = self._read("history.jsonl") or b""
        if raw and not raw.endswith(b"\n"):  # a torn last line: close it so appends start clean
            self._append("history.jsonl", b"\n")
        seen = {e.sequence for e in entries}
        for last in self._channel_entries():
            if last.sequence not in seen:
                self._append("history.jsonl", last.to_json_bytes() + b"\n")
                entries.append(last)
                seen.add(last.sequence)
        return sorted(entries, key=lambda e: e.sequence)

    def move_channel(
        self,
        channel: str,
        resolved: Resolved,
        *,
        expected_digest: str | None,
        action: Action,
        who: str,
        reason: str,
        gate_result_digest: str | None = None,
    ) -> HistoryEntry | None:
        """Compare-and-swap a channel to ``resolved`` (:func:`._cas.compare_and_swap`); None when it
        already points there. ``expected_digest`` is what the caller saw the channel point at when
        it decided (None for an empty channel); anything else now means a concurrent move won."""
        return compare_and_swap(
            _KVSwap(self), Move(channel, resolved, expected_digest, action, who, reason, gate_result_digest)
        )

    def _commit_move(self, entry: HistoryEntry) -> None:
        """The channel file first (atomically, carrying its entry), then the history line."""
        self._write_atomic(f"channels/{entry.channel}.json", _channel_file(entry))
        self._append("history.jsonl", entry.to_json_bytes() + b"\n")

    def history(self, channel: str | None = None) -> list[HistoryEntry]:
        entries = self._history_entries()
        seen = {e.sequence for e in entries}
        # Entries whose append was cut short are still carried by their channel file.
        entries += [e for e in self._channel_entries() if e.sequence not in seen]
        entries.sort(key=lambda e: e.sequence)
        return [e for e in entries if channel is None or e.channel == channel]

    # ---- side records -------------------------------------------------------------------
    def put_record(self, namespace: str, name: str, data: bytes) -> None:
        check_name("record namespace", namespace)
        check_name("record", name)
        self._write_atomic(f"records/{namespace}/{name}", data)

    def get_record(self, namespace: str, name: str) -> bytes | None:
        check_name("record namespace", namespace)
        check_name("record", name)
        return self._read(f"records/{namespace}/{name}")

    def update_record(self, namespace: str, name: str, update: Callable[[bytes | None], bytes]) -> bytes:
        """Read-modify-write one record under the registry lock: ``update(old or None) -> new``."""
        check_name("record namespace", namespace)
        check_name("record", name)
        with self._lock():
            new = update(self._read(f"records/{namespace}/{name}"))
            self._write_atomic(f"records/{namespace}/{name}", new)
            return new

    def list_records(self, namespace: str) -> list[str]:
        check_name("record namespace", namespace)
        return sorted(k.rsplit("/", 1)[-1] for k in self._list(f"records/{namespace}/"))


class _KVSwap:
    """The steps of a channel move (:class:`._cas.ChannelSwap`) over a key/value store."""

    def __init__(self, store: KVRegistry):
        self.store = store

    def exclusive(self) -> contextlib.AbstractContextManager[None]:
        return self.store.exclusive()

    def repaired_history(self, op: str) -> list[HistoryEntry]:
        return self.store._repair_history()

    def current(self, channel: str) -> Current | None:
        state = self.store.get_channel(channel)
        return None if state is None else Current(state.digest, state.build_id)

    def next_sequence(self, entries: list[HistoryEntry]) -> int:
        return max((e.sequence for e in entries), default=0) + 1

    def unrecorded(
        self, channel: str, current: Current | None, entries: list[HistoryEntry], sequence: int
    ) -> list[HistoryEntry]:
        return []  # every move here goes through this store: the channel file carries its entry

    def commit(self, entry: HistoryEntry, first: list[HistoryEntry], entries: list[HistoryEntry], op: str) -> None:
        self.store._commit_move(entry)


def _channel_file(entry: HistoryEntry) -> bytes:
    """A channel file's bytes: the channel's state after ``entry``, and the entry itself."""
    state = ChannelState(
        channel=entry.channel,
        build_id=entry.to_build,
        digest=entry.to_digest,
        sequence=entry.sequence,
        updated_at=entry.when,
    )
    doc = {"state": state.model_dump(mode="json"), "entry": entry.model_dump(mode="json")}
    return json.dumps(doc, sort_keys=True).encode()


def _parse_json(raw: bytes, where: str) -> Any:
    try:
        return json.loads(raw)
    except (UnicodeDecodeError, ValueError) as e:  # JSONDecodeError is a ValueError
        raise IntegrityError(f"{where}: not valid JSON ({e}); the registry is corrupted or was tampered with") from None


def _manifest_blob_refs(doc: dict[str, Any]) -> list[dict[str, Any]]:
    out = []
    if isinstance(doc.get("weights"), dict) and "blob" in doc["weights"]:
        out.append(doc["weights"]["blob"])
    for e in doc.get("executables", []) or []:
        out.append(e["blob"])
    return out
