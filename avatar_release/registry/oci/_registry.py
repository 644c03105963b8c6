"""A registry over the OCI distribution API: ``oci://HOST[:PORT]/REPO`` (the mapping).

The rooms it composes: where the repository is, :mod:`._location`; HTTP, retries and TLS,
:mod:`._transport`; login, :mod:`._auth`; media types and annotations, :mod:`._artifact`; which
tags (the current layout, and the retired one to migrate), :mod:`._layout`; the plain distribution client,
:mod:`._manifests` (tags, manifests) and :mod:`._blobs`; builds, :mod:`._builds`; history and the
channel compare-and-swap, :mod:`._journal` over :mod:`.._cas`; side records, :mod:`._records`;
referrers, :mod:`._referrers`; the writer lock, :mod:`.._lock`. The tests run all of it against a
distribution server held in memory (``tests/oci_memory.py``) instead of the network.

How the registry protocol maps onto one OCI repository
------------------------------------------------------

* **blobs** are OCI blobs (``/v2/REPO/blobs/sha256:...``), pushed with POST + PUT and
  pulled by digest. Every pull reads at most the declared size + 1 bytes (so an overlong
  body is detected without reading it all) and checks size and sha256 before returning.
* **builds** are OCI artifacts: an image manifest with ``artifactType``
  ``application/vnd.avatar-release.build.v1`` whose config blob is the avatar-release build
  manifest JSON, whose layers are every blob that manifest references (weights and
  executables, so the registry's garbage collector keeps them), and whose annotations carry
  the build id, pipeline, target, created and published times. The build reference (the
  commit marker of ``put_build``) is the tag ``_avr.b.<build id>``, written in one PUT after all
  blobs exist; a build is visible through ``resolve`` only once that tag exists.
  The digest of a build, everywhere in this backend, is the digest of that OCI manifest:
  what ``skopeo inspect --raw`` hashes to, and what a pod pins.
* **channels** are plain tags (``dev``, ``staging``, ``prod``) pointing at the build
  manifest itself, so any OCI client can pull ``REPO:prod``. Valid channel names start with a
  lowercase letter or digit; every tag this backend reserves starts with ``_avr.`` (see
  the tag layout in :mod:`._artifact`; a repository still under the layout of before
  2026-12-01, ``_b.``, ``_r.``, ``_history``, ``_pending``, is refused until
  :meth:`OciRegistry.migrate_tags`, ``avatar-release registry migrate``, moves it).
* **history** is the artifact tagged ``_avr.history``: one layer per entry (the entry's canonical
  JSON as a blob) with the entry JSON repeated in the layer's annotation, so the whole
  history reads in one manifest GET (each annotation is checked against its layer digest).
  Every move writes a new ``_avr.history`` manifest holding all previous layers plus the new
  one, so the log is append-only and entries stay referenced (never garbage-collected;
  the superseded, untagged history manifests may be, as their entries live on).
  The manifest size limit of distribution (4 MiB) bounds it to about 5,000 moves (~830
  bytes each); past that, writes fail with a RegistryError that says so.
* **side records** ``namespace/name`` are small artifacts tagged ``_avr.r.<namespace>.N.<name>``
  (names are lowercase, so the upper-case ``N`` cannot occur in them) with the record's
  bytes as their one layer.
* **referrers**: every signed blob a record holds about a build (the namespace's
  ``attachments`` in :mod:`avatar_release.records.stored`: gate evidence, shard evidence,
  promotion statements) is also attached to the build's OCI manifest, as the OCI 1.1 standard
  tools read it (``oras discover``, ``cosign tree``): an untagged image manifest whose
  ``subject`` is the build's OCI manifest, ``artifactType``
  ``application/vnd.dsse.envelope.v1+json`` (gate evidence) or
  ``application/vnd.avatar-release.promotion-statement.v1+json``, the envelope as its one layer
  titled ``<kind>-<digest>.dsse.json``, and annotations naming the build, the envelope and the
  in-toto predicate type. A registry with the referrers API says so by answering the manifest
  PUT with ``OCI-Subject``; without it (distribution 2.8) the client keeps the list itself, as
  the distribution spec asks: the image index tagged ``sha256-<hex of the build's digest>``,
  read, extended and written back under the writer lock and read back like every tag here.
  :meth:`OciRegistry.referrers` reads ``GET /v2/REPO/referrers/<digest>`` where it answers 200,
  else that tag. Attachments are written before the record that lists them (so a record that
  is there means its referrers are too), and only for a build this repository holds.

Channel moves: compare-and-swap without server support
------------------------------------------------------

The OCI API has no conditional tag update (distribution ignores ``If-Match``), so the
compare-and-swap of ``move_channel`` is made on the client:

1. every writer (``move_channel``, ``put_build``, record writes) takes an exclusive
   ``flock`` on a lock file keyed by registry host + repository, under
   ``$AVATAR_RELEASE_LOCK_DIR`` (default: ``<tmp>/avatar-release-locks``);
2. under the lock it reads the channel tag, compares it with ``expected_digest`` (raising
   :class:`ConflictError` on a mismatch) and only then writes;
3. the move is written in the order of the local store, which is crash-safe: first the
   new entry is parked in the ``_avr.pending`` artifact, then the channel tag is moved, then
   ``_avr.history`` is rewritten with the entry appended. A reader treats a pending entry as
   part of the history exactly when the channel tag already points where it says, and the
   next writer folds it into ``_avr.history``. A crash at any point therefore leaves the channel
   at the old build with no entry, or at the new one with its entry (carrying who and why);
   the history never loses a move and never records one that did not happen;
4. every tag write is read back (``HEAD``) and must name the digest just written.

Limits, stated plainly: the lock serialises writers **on one machine** (all processes
sharing the lock directory). Two machines moving the same channel at the same instant are
not serialised: the read-back catches most such races (the loser gets a
:class:`ConflictError` or a :class:`RegistryError`), but a narrow window remains in which
both believe they won and one history entry (or the single ``_avr.pending`` slot) is
overwritten. Run promotions from one place (one CI runner, or a job with a concurrency
limit of one) when the registry is shared. Processes share the lock only if they see the
same lock directory (same ``$AVATAR_RELEASE_LOCK_DIR`` or ``$TMPDIR``). The read-back
assumes the registry reads its own tag writes back (distribution does).
Tags moved by other tools (``skopeo copy`` onto ``prod``) are recorded by the next move as
an entry by ``unknown``.

Nothing is ever deleted: a DELETE by digest in the OCI API removes every tag that points at
the manifest, channels included.

Transient failures are retried by the transport (:mod:`._transport`).
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TypeVar

from ..._digest import is_digest
from ...errors import InputError, IntegrityError, RegistryError
from ...records import ChannelState, HistoryEntry
from .._cas import Move, compare_and_swap
from .._lock import DEFAULT_LOCK_TIMEOUT, FileLock
from .._protocol import CHANNELS, Action, BuildRef, Resolved, check_name
from .._resolve import plausible_name
from ._artifact import MAX_TAG, is_referrers_tag
from ._auth import Auth, Credentials, LoginAuth
from ._blobs import Blobs
from ._builds import Builds
from ._journal import Journal, JournalSwap
from ._layout import CURRENT, TagLayout, TagMigration
from ._location import OciLocation, parse_oci_uri
from ._manifests import Manifests
from ._records import Records
from ._referrers import Referrer, Referrers
from ._transport import HttpSession, RetryPolicy, Transport

__all__ = ["OciRegistry", "Referrer", "default_lock_dir"]


T = TypeVar("T")


def default_lock_dir() -> Path:
    return Path(os.environ.get("AVATAR_RELEASE_LOCK_DIR") or Path(tempfile.gettempdir()) / "avatar-release-locks")


class OciRegistry:
    """The registry protocol over one repository of an OCI distribution registry."""

    def __init__(
        self,
        uri: str,
        *,
        session: HttpSession | None = None,
        retry: RetryPolicy | None = None,
        lock_dir: str | os.PathLike | None = None,
        lock_timeout: float = DEFAULT_LOCK_TIMEOUT,
        location: OciLocation | None = None,
        auth: Auth | None = None,
        credentials: Credentials | None = None,
        tag_lister: Callable[[], list[str] | None] | None = None,
        layout: TagLayout = CURRENT,
    ):
        """``session``: a requests-compatible HTTP session (the tests' ``MemoryDistribution``
        serves one in memory); ``auth`` replaces the login the container tools would use
        (:class:`LoginAuth` over the login files); ``credentials`` gives that login its user and
        password directly; ``tag_lister`` lists tags another way (Artifact Registry's API), None
        from it meaning "use the OCI endpoint"; ``layout`` is which tags are written and read."""
        self.uri = uri
        self.location = location or parse_oci_uri(uri)
        self.transport = Transport(self.location, session=session, retry=retry)
        self.transport.auth = auth or LoginAuth(self.location.host, self.transport.fetch_token, credentials)
        key = hashlib.sha256(f"{self.location.host}/{self.location.repo}".encode()).hexdigest()[:32]
        self.lock = FileLock(
            Path(lock_dir or default_lock_dir()) / f"{key}.lock", timeout=lock_timeout, what=self.transport.where()
        )
        self.layout = layout
        self.manifests = Manifests(self.transport, tag_lister=tag_lister)
        self.blobs = Blobs(self.transport, uri)
        self.builds = Builds(self.manifests, self.blobs, layout, self.lock, uri)
        self.journal = Journal(self.manifests, self.blobs, layout, uri)
        self._referrers = Referrers(self.manifests, self.blobs, self.builds)
        self.records = Records(self.manifests, self.blobs, self._referrers, layout, self.lock)

    @property
    def retry(self) -> RetryPolicy:
        return self.transport.retry

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.uri!r})"

    def exclusive(self) -> contextlib.AbstractContextManager[None]:
        """This machine's writer lock on the repository (re-entrant; see the limits above)."""
        return self.lock.hold()

    # ---- blobs ------------------------------------------------------------------------------
    def has_blob(self, digest: str) -> bool:
        return self.blobs.has(digest)

    def put_blob(self, data: bytes) -> str:
        return self.blobs.put(data)

    def get_blob(self, digest: str, size: int) -> bytes:
        return self.blobs.get(digest, size)

    def stream_blob(self, digest: str, size: int, sink: Callable[[Iterator[bytes]], T]) -> T:
        return self.blobs.stream(digest, size, sink)

    def pull_blob_to(self, digest: str, size: int, dest: str | os.PathLike) -> Path:
        return self.blobs.pull_to(digest, size, dest)

    def push_blob_from(self, path: str | os.PathLike, *, chunk_size: int = 16 << 20, resumes: int = 3) -> str:
        return self.blobs.push_from(path, chunk_size=chunk_size, resumes=resumes)

    # ---- builds -----------------------------------------------------------------------------
    def put_build(self, build_id: str, manifest_bytes: bytes, *, artifact: bytes | None = None) -> tuple[str, bool]:
        return self.builds.put(build_id, manifest_bytes, artifact=artifact)

    def build_artifact(self, digest: str) -> bytes:
        return self.builds.artifact(digest)

    def get_manifest_bytes(self, digest: str) -> bytes:
        return self.builds.manifest_bytes(digest)

    def list_builds(self) -> list[BuildRef]:
        return self.builds.list()

    def resolve(self, ref: str) -> Resolved:
        return self.builds.resolve(ref)

    # ---- channels and history -----------------------------------------------------------------
    def history(self, channel: str | None = None) -> list[HistoryEntry]:
        if channel is not None:
            check_name("channel", channel)
        return [e for e in self.journal.all_entries() if channel is None or e.channel == channel]

    def get_channel(self, channel: str) -> ChannelState | None:
        check_name("channel", channel)
        current = self.journal.read_channel(channel)
        if current is None:
            return None
        return self.journal.channel_state(channel, current[0], current[1], self.journal.all_entries(), self.builds)

    def list_channels(self) -> list[ChannelState]:
        """Every tag that names an avatar-release build, except the reserved ``_...`` ones.

        Other tools' tags in the same repository (``latest`` on an image) are skipped, but a
        standard channel (dev, staging, prod) that points at something else is an error.
        """
        names = sorted(t for t in self.manifests.list_tags() if plausible_name(t) and not is_referrers_tag(t))
        entries = self.journal.all_entries() if names else []
        out = []
        for name in names:
            try:
                current = self.journal.read_channel(name)
            except IntegrityError:
                if name in CHANNELS:
                    raise
                continue
            if current is not None:
                out.append(self.journal.channel_state(name, current[0], current[1], entries, self.builds))
        return out

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
        """Compare-and-swap a channel tag to ``resolved`` (:func:`.._cas.compare_and_swap`); None when
        it already points there. ``expected_digest`` is what the caller saw the channel point at
        when it decided (None for an empty channel); anything else now means a concurrent move won."""
        check_name("channel", channel)
        if is_referrers_tag(channel):
            raise InputError(
                f"channel {channel!r}: an OCI registry keeps the referrers of a manifest under a tag of "
                "this form (sha256-<hex>, the distribution spec's fallback); pick another channel name"
            )
        return compare_and_swap(
            JournalSwap(self.journal, self.builds, self.lock),
            Move(channel, resolved, expected_digest, action, who, reason, gate_result_digest),
        )

    # ---- the tag layout -----------------------------------------------------------------------
    def migrate_tags(self) -> TagMigration:
        """Move a repository written in a retired tag layout (before 2026-12-01) to the current one:
        each such tag's manifest put under its current name, byte for byte (so every digest, and
        every signature over one, stays what it was), under the writer lock and read back. A current
        tag already there is left as it is; nothing is deleted. Running it again changes nothing."""
        moved, present, too_long = [], [], []
        with self.exclusive():
            tags = set(self.manifests.list_tags())
            for old, new in self.layout.migration(tags):
                if new in tags:
                    present.append(new)
                    continue
                if len(new) > MAX_TAG:
                    too_long.append(old)
                    continue
                got = self.manifests.get(old, f"migrate {old}")
                if got is None:  # deleted since the listing
                    continue
                op = f"migrate {old} to {new}"
                if self.manifests.put(new, got[1], op) != got[0] or not self.manifests.points_at(new, got[0], op):
                    raise RegistryError(
                        f"{self.transport.where()}: {op}: the registry did not keep the manifest "
                        f"{got[0]} under {new}; run the migration again"
                    )
                moved.append((old, new))
        return TagMigration(tuple(moved), tuple(present), tuple(too_long))

    # ---- side records -------------------------------------------------------------------------
    def put_record(self, namespace: str, name: str, data: bytes) -> None:
        self.records.put(namespace, name, data)

    def get_record(self, namespace: str, name: str) -> bytes | None:
        return self.records.get(namespace, name)

    def update_record(self, namespace: str, name: str, update: Callable[[bytes | None], bytes]) -> bytes:
        return self.records.update(namespace, name, update)

    def list_records(self, namespace: str) -> list[str]:
        return self.records.list(namespace)

    # ---- referrers ----------------------------------------------------------------------------
    def referrers(self, ref: str, artifact_type: str | None = None) -> list[Referrer]:
        """Everything attached to a build (a channel, build id or digest; any manifest digest too):
        the manifests whose ``subject`` is its OCI manifest, oldest first, of ``artifact_type`` if
        given. Read from ``GET /v2/REPO/referrers/<digest>`` where the registry answers it (200),
        else from the ``sha256-<hex>`` tag the distribution spec names for registries without it."""
        digest = ref if is_digest(ref) else self.resolve(ref).digest
        return self._referrers.of(digest, artifact_type)
