"""A registry over the OCI distribution API: ``oci://HOST[:PORT]/REPO`` (the mapping).

Where the repository is: :mod:`._location`; HTTP, retries and TLS: :mod:`._transport`;
login: :mod:`._auth`; media types and annotations: :mod:`._artifact`.

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
  the tag layout in :mod:`._artifact`; tags of the older layout, ``_b.``, ``_r.``, ``_history``,
  ``_pending``, are still read).
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
import dataclasses
import fcntl
import hashlib
import json
import os
import tempfile
import threading
import time
from pathlib import Path
from typing import Any, Callable, Iterator
from urllib.parse import quote, urljoin

from ... import _atomic
from ..._digest import is_digest, sha256_digest
from ...errors import ConflictError, InputError, IntegrityError, NotFoundError, RegistryError
from ...records import ChannelState, HistoryEntry, parse_record, utcnow
from ...records.stored import STORED_NAMESPACES, Attachment
from .._blobcheck import checked_blob
from .._protocol import CHANNELS, BuildRef, Resolved, check_name
from .._resolve import Lookups, plausible_name, resolve_ref
from ._artifact import (
    OCI_MANIFEST,
    OCI_INDEX,
    ANN_ENVELOPE,
    ANN_PREDICATE,
    EMPTY_BLOB,
    ACCEPT,
    BUILD_ARTIFACT,
    HISTORY_ARTIFACT,
    PENDING_ARTIFACT,
    RECORD_ARTIFACT,
    BUILD_CONFIG_TYPE,
    ENTRY_TYPE,
    RECORD_TYPE,
    ANN_BUILD_ID,
    ANN_PIPELINE,
    ANN_TARGET,
    ANN_PUBLISHED,
    ANN_ENTRY,
    ANN_RECORD,
    ANN_CREATED,
    ANN_TITLE,
    BUILD_PREFIX,
    RECORD_PREFIX,
    RECORD_SEP,
    HISTORY_TAG,
    PENDING_TAG,
    V1_BUILD_PREFIX,
    V1_HISTORY_TAG,
    V1_PENDING_TAG,
    V1_RECORD_PREFIX,
    MAX_TAG,
    MAX_MANIFEST,
    MANIFEST_TITLE,
    artifact,
    blob_refs,
    build_layers,
    descriptor,
    is_referrers_tag,
    referrers_index,
    referrers_tag,
)
from ._auth import Auth, Credentials, LoginAuth
from ._location import OciLocation, parse_oci_uri
from ._transport import ERROR_BODY, Reply, RetryPolicy, Transport, next_link, registry_errors

__all__ = ["OciRegistry", "Referrer", "default_lock_dir"]

# Where history and the parked move are read from: the layout-2 tag, else the layout-1 one.
_HISTORY_TAGS = (HISTORY_TAG, V1_HISTORY_TAG)
_PENDING_TAGS = (PENDING_TAG, V1_PENDING_TAG)


# ---- the lock -----------------------------------------------------------------------------
class _FileLock:
    """An exclusive flock on one file, re-entrant within a thread, with a timeout.

    flock locks belong to an open file description, so two threads (each opening the
    file) exclude each other just like two processes do.
    """

    def __init__(self, path: Path, timeout: float, what: str):
        self.path, self.timeout, self.what = path, timeout, what
        self._tls = threading.local()

    @contextlib.contextmanager
    def hold(self) -> Iterator[None]:
        if getattr(self._tls, "depth", 0):
            self._tls.depth += 1
            try:
                yield
            finally:
                self._tls.depth -= 1
            return
        fd = self._open()
        try:
            self._acquire(fd)
            self._tls.depth = 1
            try:
                yield
            finally:
                self._tls.depth = 0
                fcntl.flock(fd, fcntl.LOCK_UN)
        finally:
            os.close(fd)

    def _open(self) -> int:
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            return os.open(self.path, os.O_RDWR | os.O_CREAT, 0o666)
        except OSError as e:
            raise RegistryError(
                f"{self.what}: cannot open the writer lock {self.path} ({e.strerror}); "
                "set AVATAR_RELEASE_LOCK_DIR to a writable directory shared by the writers on this machine"
            ) from None

    def _acquire(self, fd: int) -> None:
        deadline = time.monotonic() + self.timeout
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                return
            except BlockingIOError:
                if time.monotonic() >= deadline:
                    raise RegistryError(
                        f"{self.what}: another writer has held the lock {self.path} for over "
                        f"{self.timeout:.0f}s; wait for it to finish, or stop it and retry"
                    ) from None
                time.sleep(0.02)


def default_lock_dir() -> Path:
    return Path(os.environ.get("AVATAR_RELEASE_LOCK_DIR") or Path(tempfile.gettempdir()) / "avatar-release-locks")


@dataclasses.dataclass(frozen=True)
class Referrer:
    """One manifest attached to a build (its ``subject`` is the build's OCI manifest): a descriptor
    from the referrers list. Pull it by digest (``oras pull REPO@DIGEST``) for the envelope."""

    digest: str
    size: int
    artifact_type: str
    annotations: dict[str, str] = dataclasses.field(default_factory=dict)
    media_type: str = OCI_MANIFEST


# ---- the registry -------------------------------------------------------------------------
class OciRegistry:
    """The registry protocol over one repository of an OCI distribution registry."""

    def __init__(
        self,
        uri: str,
        *,
        session: Any = None,
        retry: RetryPolicy | None = None,
        lock_dir: str | os.PathLike | None = None,
        lock_timeout: float = 120.0,
        location: OciLocation | None = None,
        auth: Auth | None = None,
        credentials: Credentials | None = None,
        tag_lister: Callable[[], list[str] | None] | None = None,
    ):
        """``auth`` replaces the login the container tools would use (:class:`LoginAuth` over the
        login files); ``credentials`` gives that login its user and password directly;
        ``tag_lister`` lists tags another way (Artifact Registry's API), None from it meaning
        "use the OCI endpoint"."""
        self._tag_lister = tag_lister
        self.uri = uri
        self.location = location or parse_oci_uri(uri)
        self.transport = Transport(self.location, session=session, retry=retry)
        self.transport.auth = auth or LoginAuth(self.location.host, self.transport.fetch_token, credentials)
        key = hashlib.sha256(f"{self.location.host}/{self.location.repo}".encode()).hexdigest()[:32]
        self._lock = _FileLock(Path(lock_dir or default_lock_dir()) / f"{key}.lock", lock_timeout, self._where())
        self._have_empty = False
        # Does the server answer the referrers API? None until it has said (200 / OCI-Subject, or 404).
        self._referrers_api: bool | None = None

    @property
    def retry(self) -> RetryPolicy:
        return self.transport.retry

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.uri!r})"

    # ---- transport ------------------------------------------------------------------------
    def _where(self) -> str:
        return self.transport.where()

    def _call(self, op: str, method: str, url: str, *, headers: dict[str, str] | None = None,
              data: bytes | None = None, limit: int = ERROR_BODY,
              sink: Callable[[Iterator[bytes]], None] | None = None) -> Reply:
        return self.transport.call(op, method, url, headers=headers, data=data, limit=limit, sink=sink)

    def _fail(self, op: str, reply: Reply) -> RegistryError:
        return self.transport.fail(op, reply)

    # ---- tags -------------------------------------------------------------------------------
    def _list_tags(self) -> list[str]:
        """Every tag of the repository (following ``Link`` pagination); [] for a new repository."""
        listed = self._tag_lister() if self._tag_lister is not None else None
        if listed is not None:
            return listed
        url: str | None = f"{self.location.base}/tags/list?n=1000"
        tags: list[str] = []
        while url:
            reply = self._call("list tags", "GET", url, limit=64 << 20)
            if reply.status == 404:
                return tags  # NAME_UNKNOWN: nothing pushed yet
            if reply.status != 200:
                raise self._fail("list tags", reply)
            try:
                tags += json.loads(reply.body).get("tags") or []
            except (ValueError, AttributeError):
                raise IntegrityError(f"{self._where()}: tag list is not JSON ({reply.body[:80]!r})") from None
            url = next_link(reply.headers.get("Link"), self.location.root)
        return tags

    def _tags_with(self, *prefixes: str) -> list[str]:
        """Tags starting with any of ``prefixes`` (one listing for all of them)."""
        return sorted(t for t in self._list_tags() if t.startswith(prefixes))

    # ---- manifests -------------------------------------------------------------------------
    def _get_manifest(self, ref: str, op: str) -> tuple[str, bytes] | None:
        """(digest, bytes) of the manifest a tag or digest names, or None; digest verified."""
        reply = self._call(op, "GET", f"{self.location.base}/manifests/{ref}", headers={"Accept": ACCEPT},
                           limit=MAX_MANIFEST)
        if reply.status == 404:
            return None
        if reply.status != 200:
            raise self._fail(op, reply)
        if len(reply.body) > MAX_MANIFEST:
            raise IntegrityError(f"{self._where()}: manifest {ref} is larger than {MAX_MANIFEST} bytes; refusing it")
        digest = sha256_digest(reply.body)
        claimed = reply.headers.get("Docker-Content-Digest")
        if (is_digest(ref) and digest != ref) or (claimed and is_digest(claimed) and claimed != digest):
            raise IntegrityError(
                f"{self._where()}: manifest {ref} hashes to {digest}, the registry says "
                f"{claimed or ref}; the registry or a proxy altered it"
            )
        return digest, reply.body

    def _head_manifest(self, ref: str, op: str) -> str | None:
        """The digest a tag points at (one HEAD), or None when it does not exist."""
        reply = self._call(op, "HEAD", f"{self.location.base}/manifests/{ref}", headers={"Accept": ACCEPT})
        if reply.status == 404:
            return None
        if reply.status != 200:
            raise self._fail(op, reply)
        claimed = reply.headers.get("Docker-Content-Digest")
        if claimed and is_digest(claimed):
            return claimed
        got = self._get_manifest(ref, op)  # a registry that does not send the header
        return got[0] if got else None

    def _put_manifest(self, tag: str, body: bytes, op: str, media_type: str = OCI_MANIFEST) -> str:
        """PUT a manifest under a tag with the OCI Content-Type; returns its digest (callers read back)."""
        return self._push_manifest(tag, body, op, media_type)[0]

    def _push_manifest(self, ref: str, body: bytes, op: str, media_type: str = OCI_MANIFEST) -> tuple[str, Reply]:
        """PUT a manifest under a tag or its own digest: (its digest, the registry's answer)."""
        digest = sha256_digest(body)
        if len(body) > MAX_MANIFEST:
            raise RegistryError(
                f"{self._where()}: {op}: manifest is {len(body)} bytes, over the {MAX_MANIFEST}-byte limit "
                "of OCI registries"
            )
        reply = self._call(op, "PUT", f"{self.location.base}/manifests/{ref}",
                           headers={"Content-Type": media_type}, data=body)
        if reply.status not in (200, 201):
            detail = registry_errors(reply.body)
            if "BLOB_UNKNOWN" in detail:
                raise IntegrityError(
                    f"{self._where()}: {op}: the registry refused the manifest because a blob it references is "
                    f"missing ({detail}); push every blob before the manifest that references it"
                )
            raise self._fail(op, reply)
        claimed = reply.headers.get("Docker-Content-Digest")
        if claimed and claimed != digest:
            raise IntegrityError(f"{self._where()}: {op}: registry stored {claimed}, this client sent {digest}")
        return digest, reply

    def _verify_tag(self, tag: str, digest: str, op: str) -> bool:
        return self._head_manifest(tag, f"{op} (read-back)") == digest

    def _parse(self, body: bytes, where: str, artifact_type: str) -> dict:
        """An OCI image manifest of the given artifactType, as a dict; IntegrityError otherwise."""
        try:
            doc = json.loads(body)
        except ValueError:
            raise IntegrityError(f"{self._where()}: {where} is not JSON") from None
        if not isinstance(doc, dict) or doc.get("mediaType", OCI_MANIFEST) != OCI_MANIFEST:
            kind = doc.get("mediaType") if isinstance(doc, dict) else type(doc).__name__
            raise IntegrityError(
                f"{self._where()}: {where} is a {kind}, expected an OCI image manifest ({OCI_MANIFEST})"
            )
        if doc.get("artifactType") != artifact_type:
            raise IntegrityError(
                f"{self._where()}: {where} has artifactType {doc.get('artifactType')!r}, expected "
                f"{artifact_type!r}; it was not written by avatar-release — retag it or pick another repository"
            )
        return doc

    # ---- blobs -------------------------------------------------------------------------------
    def _blob_url(self, digest: str) -> str:
        if not is_digest(digest):
            raise InputError(f"not a sha256 digest: {digest!r} (expected 'sha256:' + 64 lowercase hex)")
        return f"{self.location.base}/blobs/{digest}"

    def has_blob(self, digest: str) -> bool:
        reply = self._call(f"check blob {digest}", "HEAD", self._blob_url(digest))
        if reply.status not in (200, 404):
            raise self._fail(f"check blob {digest}", reply)
        return reply.status == 200

    def put_blob(self, data: bytes) -> str:
        digest = sha256_digest(data)
        op = f"push blob {digest} ({len(data)} bytes)"
        for _ in range(2):  # a second round when the upload session was lost between POST and PUT
            reply = self._call(op, "HEAD", self._blob_url(digest))
            if reply.status == 200 and reply.headers.get("Content-Length") in (None, str(len(data))):
                return digest  # content-addressed: already there
            start = self._call(op, "POST", f"{self.location.base}/blobs/uploads/")
            if start.status != 202 or not start.headers.get("Location"):
                raise self._fail(op, start)
            loc = urljoin(self.location.root + "/", start.headers["Location"])
            put_url = f"{loc}{'&' if '?' in loc else '?'}digest={digest}"
            done = self._call(op, "PUT", put_url, data=data,
                              headers={"Content-Type": "application/octet-stream", "Content-Length": str(len(data))})
            if done.status in (200, 201, 204):
                return digest
            if done.status == 404:  # BLOB_UPLOAD_UNKNOWN: a retried PUT after a lost answer
                continue
            raise self._fail(op, done)
        raise RegistryError(f"{self._where()}: {op}: the upload session vanished twice; retry the publish")

    def get_blob(self, digest: str, size: int) -> bytes:
        """Fetch by digest, reading at most ``size`` + 1 bytes, and verify both."""
        reply = self._call(f"pull blob {digest}", "GET", self._blob_url(digest), limit=size)
        if reply.status == 404:
            raise NotFoundError(f"blob {digest} not found in registry {self.uri}")
        if reply.status != 200:
            raise self._fail(f"pull blob {digest}", reply)
        return checked_blob(reply.body, digest, size, self.uri)

    # ---- streaming: blobs larger than memory ---------------------------------------------------
    def pull_blob_to(self, digest: str, size: int, dest: str | os.PathLike) -> Path:
        """Stream a blob into the file ``dest``, hashing as it arrives: memory is one chunk, whatever
        the size. Written to a temporary file beside ``dest``, renamed only once exactly ``size``
        bytes hashing to ``digest`` arrived (at most ``size`` + 1 bytes are read)."""
        dest = Path(dest)
        got: dict[str, Any] = {}
        op = f"pull blob {digest}"
        with _atomic.atomic_path(dest) as tmp:  # renamed over dest only if the body below returns

            def sink(chunks: Iterator[bytes]) -> None:  # called afresh on a retry: starts over
                h, n = hashlib.sha256(), 0
                with open(tmp, "wb") as f:
                    for chunk in chunks:
                        h.update(chunk)
                        n += len(chunk)
                        f.write(chunk)
                got.update(size=n, digest="sha256:" + h.hexdigest())

            reply = self._call(op, "GET", self._blob_url(digest), limit=size, sink=sink)
            if reply.status == 404:
                raise NotFoundError(f"blob {digest} not found in registry {self.uri}")
            if reply.status != 200:
                raise self._fail(op, reply)
            if got.get("size") != size or got.get("digest") != digest:
                n = got.get("size", 0)
                what = f"size {'more than ' + str(size) if n > size else n} bytes, manifest says {size}" \
                    if n != size else f"content hashes to {got.get('digest')}"
                raise IntegrityError(f"blob {digest} in {self.uri}: {what}; the store is corrupted or was tampered "
                                     "with — republish the build")
        return dest

    def push_blob_from(self, path: str | os.PathLike, *, chunk_size: int = 16 << 20, resumes: int = 3) -> str:
        """Push the file ``path`` as a blob in PATCH chunks of one upload session: memory is one chunk.

        A chunk that still fails after the transport's retries is resumed, up to ``resumes`` times,
        from the offset the registry reports for the session (``GET`` on it: ``Range: 0-N``), so a
        dropped connection costs one chunk, not the upload.
        """
        digest, size = _file_digest(Path(path))
        op = f"push blob {digest} ({size} bytes, in chunks of {chunk_size})"
        head = self._call(op, "HEAD", self._blob_url(digest))
        if head.status == 200:
            return digest
        start = self._call(op, "POST", f"{self.location.base}/blobs/uploads/")
        if start.status != 202 or not start.headers.get("Location"):
            raise self._fail(op, start)
        loc = urljoin(self.location.root + "/", start.headers["Location"])
        offset, left = 0, resumes
        with open(path, "rb") as f:
            while offset < size:
                f.seek(offset)
                chunk = f.read(min(chunk_size, size - offset))
                try:
                    reply = self._call(op, "PATCH", loc, data=chunk, headers={
                        "Content-Type": "application/octet-stream", "Content-Length": str(len(chunk)),
                        "Content-Range": f"{offset}-{offset + len(chunk) - 1}"})
                except RegistryError:
                    if left <= 0:
                        raise
                    left -= 1
                    offset, loc = self._upload_status(loc, op)
                    continue
                if reply.status != 202:
                    raise self._fail(op, reply)
                loc = urljoin(self.location.root + "/", reply.headers.get("Location") or loc)
                offset = _range_end(reply.headers.get("Range"), offset + len(chunk))
        sep = "&" if "?" in loc else "?"
        done = self._call(op, "PUT", f"{loc}{sep}digest={digest}", headers={"Content-Length": "0"})
        if done.status not in (200, 201, 204):
            raise self._fail(op, done)
        return digest

    def _upload_status(self, loc: str, op: str) -> tuple[int, str]:
        """(bytes the registry holds, session URL) of an upload session."""
        reply = self._call(f"{op} (resume)", "GET", loc)
        if reply.status not in (200, 204):
            raise self._fail(f"{op} (resume)", reply)
        return (_range_end(reply.headers.get("Range"), 0),
                urljoin(self.location.root + "/", reply.headers.get("Location") or loc))

    def _ensure_empty_blob(self) -> None:
        if not self._have_empty:
            self.put_blob(EMPTY_BLOB)
            self._have_empty = True

    # ---- builds ------------------------------------------------------------------------------
    def _build_tag(self, build_id: str) -> str:
        check_name("build", build_id)
        tag = BUILD_PREFIX + build_id
        if len(tag) > MAX_TAG:
            raise InputError(
                f"build id {build_id!r} is {len(build_id)} characters; an OCI tag holds {MAX_TAG}, "
                f"so this backend takes build ids of at most {MAX_TAG - len(BUILD_PREFIX)}"
            )
        return tag

    def _head_build(self, build_id: str, op: str) -> str | None:
        """The digest of a committed build: its layout-2 tag, else its layout-1 tag (read, never written)."""
        check_name("build", build_id)
        found = None
        if len(BUILD_PREFIX + build_id) <= MAX_TAG:
            found = self._head_manifest(BUILD_PREFIX + build_id, op)
        if found is None and len(V1_BUILD_PREFIX + build_id) <= MAX_TAG:
            found = self._head_manifest(V1_BUILD_PREFIX + build_id, op)
        return found

    def _build_artifact(self, build_id: str, manifest_bytes: bytes, config_digest: str) -> bytes:
        try:
            doc = json.loads(manifest_bytes)
        except ValueError:
            raise InputError(f"build {build_id}: the manifest is not JSON") from None
        # The manifest itself first (also the config), then every blob it names, each titled with a
        # file name, so that a standard client (``oras pull``) materializes the build as files.
        layers = [descriptor(BUILD_CONFIG_TYPE, config_digest, len(manifest_bytes), {ANN_TITLE: MANIFEST_TITLE})]
        layers += build_layers(doc, RECORD_TYPE)
        ann = {ANN_BUILD_ID: build_id, ANN_PUBLISHED: utcnow()}
        fields = doc if isinstance(doc, dict) else {}
        for key, field in ((ANN_CREATED, "created_at"), (ANN_PIPELINE, "pipeline"), (ANN_TARGET, "target")):
            if isinstance(fields.get(field), str):
                ann[key] = fields[field]
        config = descriptor(BUILD_CONFIG_TYPE, config_digest, len(manifest_bytes))
        return artifact(BUILD_ARTIFACT, layers, ann, config)

    def put_build(self, build_id: str, manifest_bytes: bytes, *, artifact: bytes | None = None) -> tuple[str, bool]:
        """Commit a build: its manifest blob, then the OCI manifest tagged ``_avr.b.<id>`` (the marker).

        Returns (OCI manifest digest, created). An existing build id is never rewritten.
        The registry itself refuses the manifest when a blob it references is missing.
        ``artifact``: the exact OCI manifest of this build in another OCI registry
        (:meth:`build_artifact`), written as is so the build keeps its digest there too (``copy``).
        """
        tag = self._build_tag(build_id)
        op = f"publish build {build_id}"
        with self._lock.hold():
            existing = self._head_build(build_id, op)
            if existing is not None:
                return existing, False
            config_digest = self.put_blob(manifest_bytes)
            body = self._build_artifact(build_id, manifest_bytes, config_digest) if artifact is None else \
                self._checked_artifact(build_id, manifest_bytes, artifact)
            digest = self._put_manifest(tag, body, op)
            now = self._head_manifest(tag, f"{op} (read-back)")
            if now is None:
                raise RegistryError(f"{self._where()}: {op}: the tag {tag} is missing right after it was written")
            # A different digest: a publisher outside this machine's lock wrote the same id at the
            # same time; the build id names what the registry holds now, so report that one.
            return now, now == digest

    def build_artifact(self, digest: str) -> bytes:
        """The exact bytes of the OCI manifest of the build with this digest (verified against it)."""
        return self._build_doc(digest, f"read build {digest}")[0]

    def _checked_artifact(self, build_id: str, manifest_bytes: bytes, artifact: bytes) -> bytes:
        """``artifact`` if it is an avatar-release build artifact of this very build and manifest."""
        doc = self._parse(artifact, f"build artifact of {build_id}", BUILD_ARTIFACT)
        config = doc.get("config") or {}
        if self._build_id_of(doc, f"build artifact of {build_id}") != build_id or \
                config.get("digest") != sha256_digest(manifest_bytes) or config.get("size") != len(manifest_bytes):
            raise IntegrityError(
                f"{self._where()}: the OCI manifest given for build {build_id} names another build or manifest; "
                "refusing it"
            )
        return artifact

    def _build_doc(self, digest: str, op: str) -> tuple[bytes, dict]:
        got = self._get_manifest(digest, op)
        if got is None:
            raise NotFoundError(f"manifest {digest} not found in registry {self.uri}")
        return got[1], self._parse(got[1], f"manifest {digest}", BUILD_ARTIFACT)

    def get_manifest_bytes(self, digest: str) -> bytes:
        """The avatar-release manifest of the build whose OCI manifest has this digest."""
        if not is_digest(digest):
            raise NotFoundError(f"manifest {digest!r} not found in registry {self.uri}: not a sha256 digest")
        _, doc = self._build_doc(digest, f"read manifest {digest}")
        config = doc.get("config") or {}
        if config.get("mediaType") != BUILD_CONFIG_TYPE or not isinstance(config.get("size"), int):
            raise IntegrityError(f"{self._where()}: manifest {digest} has no avatar-release build manifest as config")
        return self.get_blob(str(config.get("digest")), config["size"])

    def _build_ref(self, tag: str) -> BuildRef | None:
        got = self._get_manifest(tag, f"read build {tag}")
        if got is None:
            return None
        doc = self._parse(got[1], f"build tag {tag}", BUILD_ARTIFACT)
        ann = doc.get("annotations") or {}
        name = tag.removeprefix(BUILD_PREFIX) if tag.startswith(BUILD_PREFIX) else tag.removeprefix(V1_BUILD_PREFIX)
        return BuildRef(ann.get(ANN_BUILD_ID, name), got[0], ann.get(ANN_PUBLISHED, ""))

    def _build_ids(self, prefix: str = "") -> dict[str, str]:
        """build id -> its tag, for ids starting with ``prefix``; a layout-2 tag wins over a layout-1 one."""
        out: dict[str, str] = {}
        for tag in self._tags_with(V1_BUILD_PREFIX + prefix, BUILD_PREFIX + prefix):
            new = tag.startswith(BUILD_PREFIX)
            build_id = tag.removeprefix(BUILD_PREFIX if new else V1_BUILD_PREFIX)
            if new or build_id not in out:
                out[build_id] = tag
        return out

    def list_builds(self) -> list[BuildRef]:
        out = [r for r in (self._build_ref(t) for t in self._build_ids().values()) if r is not None]
        return sorted(out, key=lambda r: r.published_at)

    def _build_id_of(self, doc: dict, where: str) -> str:
        build_id = (doc.get("annotations") or {}).get(ANN_BUILD_ID)
        if not isinstance(build_id, str) or not build_id:
            raise IntegrityError(f"{self._where()}: {where} carries no {ANN_BUILD_ID} annotation")
        return build_id

    def _resolve_digest(self, ref: str) -> Resolved:
        got = self._get_manifest(ref, f"resolve {ref}")
        if got is None:
            raise NotFoundError(f"no build with manifest digest {ref} in {self.uri}")
        build_id = self._build_id_of(self._parse(got[1], f"manifest {ref}", BUILD_ARTIFACT), f"manifest {ref}")
        # Only a committed build counts: its build tag must name this very manifest.
        if self._head_build(build_id, f"resolve {ref}") != ref:
            raise NotFoundError(f"no build with manifest digest {ref} in {self.uri} (no committed build reference)")
        return Resolved(ref, build_id, ref, "digest")

    def resolve(self, ref: str) -> Resolved:
        """Channel name, build id, manifest digest, or a unique prefix of a build id.

        A channel tag is read once; the digest it gave is what everything after fetches.
        """
        def channel(name):
            if is_referrers_tag(name):
                return None  # a referrers list, never a channel
            got = self._get_manifest(name, f"resolve channel {name}")
            if got is None:
                return None
            doc = self._parse(got[1], f"channel tag {name}", BUILD_ARTIFACT)
            return Resolved(name, self._build_id_of(doc, f"channel tag {name}"), got[0], "channel")

        def exact_build(build_id):
            return self._head_build(build_id, f"resolve build {build_id}")

        return resolve_ref(ref, self.uri, Lookups(
            by_digest=self._resolve_digest, channel=channel, exact_build=exact_build,
            builds_with_prefix=lambda p: sorted(self._build_ids(p)),
            latest=lambda: [b.build_id for b in self.list_builds()],
        ))

    # ---- history -------------------------------------------------------------------------------
    def _entries_of(self, tags: tuple[str, ...], artifact_type: str) -> list[HistoryEntry]:
        """The history entries the first existing of ``tags`` carries in its layer annotations, each verified."""
        for tag in tags:
            got = self._get_manifest(tag, f"read {tag}")
            if got is not None:
                break
        else:
            return []
        doc = self._parse(got[1], f"{tag} artifact", artifact_type)
        out = []
        for n, layer in enumerate(doc.get("layers") or []):
            text = (layer.get("annotations") or {}).get(ANN_ENTRY, "")
            data = text.encode()
            if sha256_digest(data) != layer.get("digest") or len(data) != layer.get("size"):
                raise IntegrityError(
                    f"{self._where()}: {tag} entry {n} does not match its layer digest; the history was altered"
                )
            out.append(parse_record(HistoryEntry, data, where=f"{self.uri} {tag} entry {n}"))
        return out

    def _pending_if_applied(self, recorded: list[HistoryEntry]) -> HistoryEntry | None:
        """The parked entry of the last move, when its tag write happened but its history write did not."""
        pending = self._entries_of(_PENDING_TAGS, PENDING_ARTIFACT)
        if not pending or pending[0].sequence in {e.sequence for e in recorded}:
            return None
        p = pending[0]
        return p if self._head_manifest(p.channel, f"read channel {p.channel}") == p.to_digest else None

    def _all_entries(self) -> list[HistoryEntry]:
        entries = self._entries_of(_HISTORY_TAGS, HISTORY_ARTIFACT)
        applied = self._pending_if_applied(entries)
        return sorted(entries + ([applied] if applied else []), key=lambda e: e.sequence)

    def history(self, channel: str | None = None) -> list[HistoryEntry]:
        if channel is not None:
            check_name("channel", channel)
        return [e for e in self._all_entries() if channel is None or e.channel == channel]

    def _entry_layer(self, entry: HistoryEntry) -> dict:
        data = entry.to_json_bytes()
        return descriptor(ENTRY_TYPE, sha256_digest(data), len(data), {ANN_ENTRY: data.decode()})

    def _write_entries(self, tag: str, artifact_type: str, entries: list[HistoryEntry], new: list[HistoryEntry],
                       op: str) -> None:
        """Write an entry artifact (pushing the blobs of the ``new`` entries), then read it back."""
        self._ensure_empty_blob()
        for e in new:
            self.put_blob(e.to_json_bytes())
        body = artifact(artifact_type, [self._entry_layer(e) for e in entries], {})
        digest = self._put_manifest(tag, body, op)
        if not self._verify_tag(tag, digest, op):
            raise RegistryError(
                f"{self._where()}: {op}: the {tag} tag was overwritten by a writer outside this machine's "
                "lock right after this write; its entries may need repair (see the limits in the docstring of "
                "avatar_release.registry.oci)"
            )

    # ---- channels -------------------------------------------------------------------------------
    def _channel_state(self, channel: str, digest: str, doc: dict, entries: list[HistoryEntry]) -> ChannelState:
        build_id = self._build_id_of(doc, f"channel tag {channel}")
        for e in reversed(entries):
            if e.channel == channel and e.to_digest == digest:
                return ChannelState(channel=channel, build_id=build_id, digest=digest, sequence=e.sequence,
                                    updated_at=e.when)
        # The tag was moved by another tool; the next move records it.
        return ChannelState(channel=channel, build_id=build_id, digest=digest, sequence=0,
                            updated_at="unknown (tag moved outside avatar-release)")

    def _read_channel(self, channel: str) -> tuple[str, dict] | None:
        got = self._get_manifest(channel, f"read channel {channel}")
        if got is None:
            return None
        return got[0], self._parse(got[1], f"channel tag {channel}", BUILD_ARTIFACT)

    def get_channel(self, channel: str) -> ChannelState | None:
        check_name("channel", channel)
        current = self._read_channel(channel)
        if current is None:
            return None
        return self._channel_state(channel, current[0], current[1], self._all_entries())

    def list_channels(self) -> list[ChannelState]:
        """Every tag that names an avatar-release build, except the reserved ``_...`` ones.

        Other tools' tags in the same repository (``latest`` on an image) are skipped, but a
        standard channel (dev, staging, prod) that points at something else is an error.
        """
        names = sorted(t for t in self._list_tags() if plausible_name(t) and not is_referrers_tag(t))
        entries = self._all_entries() if names else []
        out = []
        for name in names:
            try:
                current = self._read_channel(name)
            except IntegrityError:
                if name in CHANNELS:
                    raise
                continue
            if current is not None:
                out.append(self._channel_state(name, current[0], current[1], entries))
        return out

    def _fold_pending(self, op: str) -> list[HistoryEntry]:
        """Under the lock: the full history, with an applied pending move written into it."""
        entries = self._entries_of(_HISTORY_TAGS, HISTORY_ARTIFACT)
        applied = self._pending_if_applied(entries)
        if applied is not None:
            entries = sorted(entries + [applied], key=lambda e: e.sequence)
            self._write_entries(HISTORY_TAG, HISTORY_ARTIFACT, entries, [applied], f"{op}: repair history")
        return entries

    def _next_sequence(self, entries: list[HistoryEntry]) -> int:
        pending = self._entries_of(_PENDING_TAGS, PENDING_ARTIFACT)
        return max([e.sequence for e in entries + pending], default=0) + 1

    def _reconcile(self, channel: str, current: tuple[str, dict] | None, entries: list[HistoryEntry],
                   seq: int) -> HistoryEntry | None:
        """An entry for a channel tag moved by another tool, so the history accounts for it."""
        if current is None:
            return None
        last = next((e for e in reversed(entries) if e.channel == channel), None)
        if last is not None and last.to_digest == current[0]:
            return None
        return HistoryEntry(
            sequence=seq, channel=channel, action="promote",
            from_build=last.to_build if last else None, from_digest=last.to_digest if last else None,
            to_build=self._build_id_of(current[1], f"channel tag {channel}"), to_digest=current[0],
            who="unknown", when=utcnow(),
            reason="the channel tag was found here without a history entry (moved outside avatar-release); "
                   "recorded by the next move",
        )

    def move_channel(
        self,
        channel: str,
        resolved: Resolved,
        *,
        expected_digest: str | None,
        action: str,
        who: str,
        reason: str,
        gate_result_digest: str | None = None,
    ) -> HistoryEntry | None:
        """Compare-and-swap a channel tag to ``resolved``; None when it already points there.

        ``expected_digest`` is what the caller saw the channel point at when it decided
        (None for an empty channel); anything else now means a concurrent move won.
        """
        check_name("channel", channel)
        if is_referrers_tag(channel):
            raise InputError(f"channel {channel!r}: an OCI registry keeps the referrers of a manifest under a tag of "
                             "this form (sha256-<hex>, the distribution spec's fallback); pick another channel name")
        op = f"move channel {channel}"
        with self._lock.hold():
            entries = self._fold_pending(op)
            current = self._read_channel(channel)
            current_digest = current[0] if current else None
            if current_digest != expected_digest:
                raise self._conflict(channel, action, expected_digest, current)
            if current_digest == resolved.digest:
                return None
            body = self._target_manifest(resolved, op)
            seq = self._next_sequence(entries)
            repair = self._reconcile(channel, current, entries, seq)
            entry = HistoryEntry(
                sequence=seq + (1 if repair else 0), channel=channel, action=action,
                from_build=self._build_id_of(current[1], "channel tag") if current else None,
                from_digest=current_digest, to_build=resolved.build_id, to_digest=resolved.digest,
                who=who, when=utcnow(), reason=reason, gate_result_digest=gate_result_digest,
            )
            self._commit_move(entry, body, entries, ([repair] if repair else []) + [entry], op)
            return entry

    def _conflict(self, channel: str, action: str, expected: str | None,
                  current: tuple[str, dict] | None) -> ConflictError:
        found = f"{current[0]} ({self._build_id_of(current[1], f'channel tag {channel}')})" if current else "empty"
        return ConflictError(
            f"channel {channel!r} moved while this {action} was being decided: expected it at "
            f"{expected or 'empty'}, found {found}; nothing was changed — retry"
        )

    def _target_manifest(self, resolved: Resolved, op: str) -> bytes:
        """The exact bytes of the build manifest a channel will point at (same bytes, same digest)."""
        body, doc = self._build_doc(resolved.digest, op)
        actual = self._build_id_of(doc, f"manifest {resolved.digest}")
        if actual != resolved.build_id:
            raise IntegrityError(
                f"{self._where()}: manifest {resolved.digest} is build {actual}, not {resolved.build_id}; "
                "resolve the reference again"
            )
        return body

    def _commit_move(self, entry: HistoryEntry, body: bytes, entries: list[HistoryEntry],
                     new: list[HistoryEntry], op: str) -> None:
        """Park the entry, move the tag (read back), append the history: the crash-safe order."""
        self._write_entries(PENDING_TAG, PENDING_ARTIFACT, [entry], [entry], f"{op}: park the move")
        self._put_manifest(entry.channel, body, op)
        if not self._verify_tag(entry.channel, entry.to_digest, op):
            raise ConflictError(
                f"channel {entry.channel!r} was written by another writer (outside this machine's lock) while "
                f"this {entry.action} moved it to {entry.to_build}; check `avatar-release history` and retry"
            )
        self._write_entries(HISTORY_TAG, HISTORY_ARTIFACT, entries + new, new, f"{op}: append history")

    # ---- side records ---------------------------------------------------------------------------
    @staticmethod
    def _record_tag(namespace: str, name: str) -> str:
        check_name("record namespace", namespace)
        check_name("record", name)
        tag = f"{RECORD_PREFIX}{namespace}{RECORD_SEP}{name}"
        if len(tag) > MAX_TAG:
            raise InputError(
                f"record {namespace}/{name}: the OCI tag {tag[:40]}... would be {len(tag)} characters, over "
                f"the {MAX_TAG} a registry accepts; use a shorter namespace or name"
            )
        return tag

    def _write_record(self, namespace: str, name: str, data: bytes) -> None:
        tag = self._record_tag(namespace, name)
        op = f"write record {namespace}/{name}"
        if not isinstance(data, (bytes, bytearray)):
            raise InputError(f"record {namespace}/{name}: expected bytes, got {type(data).__name__}")
        self._ensure_empty_blob()
        digest = self.put_blob(bytes(data))
        layers = [descriptor(RECORD_TYPE, digest, len(data), {ANN_RECORD: f"{namespace}/{name}"})]
        # Blobs a record refers to (a gate result, its frames) become layers too, so the
        # registry's garbage collector keeps them as long as the record exists.
        try:
            doc = json.loads(data)
        except ValueError:
            doc = None
        seen = {digest}
        for _, ref in blob_refs(doc) if doc is not None else ():
            if ref["digest"] not in seen:
                seen.add(ref["digest"])
                layers.append(descriptor(ref["media_type"], ref["digest"], ref["size"]))
        self._attach(namespace, name, bytes(data), op)  # before the record: a record there means its referrers are
        body = artifact(RECORD_ARTIFACT, layers, {ANN_RECORD: f"{namespace}/{name}", ANN_PUBLISHED: utcnow()})
        written = self._put_manifest(tag, body, op)
        if not self._verify_tag(tag, written, op):
            raise ConflictError(
                f"record {namespace}/{name} was overwritten by a writer outside this machine's lock; retry"
            )

    def _read_record(self, namespace: str, name: str) -> bytes | None:
        tag = self._record_tag(namespace, name)
        got = self._get_manifest(tag, f"read record {namespace}/{name}")
        old = f"{V1_RECORD_PREFIX}{namespace}{RECORD_SEP}{name}"
        if got is None and len(old) <= MAX_TAG:  # written before layout 2
            got = self._get_manifest(old, f"read record {namespace}/{name}")
        if got is None:
            return None
        layers = self._parse(got[1], f"record {namespace}/{name}", RECORD_ARTIFACT).get("layers") or []
        # The first layer is the record; any further layers are blobs it refers to (kept for GC).
        if not layers or layers[0].get("mediaType") != RECORD_TYPE or not isinstance(layers[0].get("size"), int):
            raise IntegrityError(f"{self._where()}: record {namespace}/{name} has no record layer first")
        return self.get_blob(str(layers[0].get("digest")), layers[0]["size"])

    def put_record(self, namespace: str, name: str, data: bytes) -> None:
        self._record_tag(namespace, name)
        with self._lock.hold():
            self._write_record(namespace, name, data)

    def get_record(self, namespace: str, name: str) -> bytes | None:
        return self._read_record(namespace, name)

    def update_record(self, namespace: str, name: str, update: Callable[[bytes | None], bytes]) -> bytes:
        """Read-modify-write one record under the writer lock: ``update(old or None) -> new``."""
        self._record_tag(namespace, name)
        with self._lock.hold():
            new = update(self._read_record(namespace, name))
            self._write_record(namespace, name, new)
            return new

    def list_records(self, namespace: str) -> list[str]:
        check_name("record namespace", namespace)
        prefixes = (f"{RECORD_PREFIX}{namespace}{RECORD_SEP}", f"{V1_RECORD_PREFIX}{namespace}{RECORD_SEP}")
        names = {t.removeprefix(prefixes[0]).removeprefix(prefixes[1]) for t in self._tags_with(*prefixes)}
        return sorted(names)


    # ---- referrers: signed blobs attached to a build ------------------------------------------
    def referrers(self, ref: str, artifact_type: str | None = None) -> list[Referrer]:
        """Everything attached to a build (a channel, build id or digest; any manifest digest too):
        the manifests whose ``subject`` is its OCI manifest, oldest first, of ``artifact_type`` if
        given. Read from ``GET /v2/REPO/referrers/<digest>`` where the registry answers it (200),
        else from the ``sha256-<hex>`` tag the distribution spec names for registries without it."""
        digest = ref if is_digest(ref) else self.resolve(ref).digest
        found, _ = self._referrers_of(digest, f"list referrers of {digest}", artifact_type)
        out = []
        for d in found:
            if artifact_type is not None and d.get("artifactType") != artifact_type:
                continue  # a server that did not apply the filter
            out.append(Referrer(str(d["digest"]), int(d["size"]), str(d.get("artifactType") or ""),
                                dict(d.get("annotations") or {}), str(d.get("mediaType") or OCI_MANIFEST)))
        return out

    def _referrers_of(self, digest: str, op: str, artifact_type: str | None = None) -> tuple[list[dict], bool]:
        """(the referrer descriptors of a manifest, whether they came from the fallback tag)."""
        if self._referrers_api is not False:
            listed = self._referrers_api_list(digest, op, artifact_type)
            if listed is not None:
                return listed, False
        return self._fallback_index(digest, op), True

    def _referrers_api_list(self, digest: str, op: str, artifact_type: str | None) -> list[dict] | None:
        """The referrers API's answer (every page), or None where the registry does not have it (404)."""
        url: str | None = f"{self.location.base}/referrers/{digest}"
        if artifact_type is not None:
            url += f"?artifactType={quote(artifact_type, safe='')}"
        out: list[dict] = []
        while url:
            reply = self._call(op, "GET", url, headers={"Accept": OCI_INDEX}, limit=MAX_MANIFEST)
            if reply.status == 404:
                # A registry with the API answers 200 for every repository it has: 404 means no API,
                # unless the repository itself is unknown (then there is nothing to list either way).
                if "NAME_UNKNOWN" not in registry_errors(reply.body):
                    self._referrers_api = False
                return None
            if reply.status != 200:
                raise self._fail(op, reply)
            self._referrers_api = True
            out += self._index_manifests(reply.body, f"the referrers API's answer for {digest}")
            url = next_link(reply.headers.get("Link"), self.location.root)
        return out

    def _index_manifests(self, body: bytes, where: str) -> list[dict]:
        """The descriptors of an OCI image index (a referrers list); IntegrityError for anything else."""
        try:
            doc = json.loads(body)
        except ValueError:
            raise IntegrityError(f"{self._where()}: {where} is not JSON") from None
        manifests = doc.get("manifests") if isinstance(doc, dict) else None
        described = isinstance(manifests, list) and all(
            isinstance(d, dict) and is_digest(str(d.get("digest", ""))) and isinstance(d.get("size"), int)
            for d in manifests)
        if not isinstance(doc, dict) or doc.get("mediaType", OCI_INDEX) != OCI_INDEX or not described:
            kind = doc.get("mediaType") if isinstance(doc, dict) else type(doc).__name__
            raise IntegrityError(
                f"{self._where()}: {where} is a {kind}, not an OCI image index of referrers ({OCI_INDEX})"
            )
        return manifests

    def _fallback_index(self, digest: str, op: str) -> list[dict]:
        tag = referrers_tag(digest)
        got = self._get_manifest(tag, f"{op} (tag {tag})")
        if got is None:
            return []
        # Not an index: someone else's tag. Reported rather than read as "no referrers" (and never
        # overwritten), so evidence is not silently lost.
        return self._index_manifests(got[1], f"the referrers tag {tag}")

    def _build_subject(self, build_id: str, op: str) -> dict | None:
        """The descriptor of a build's OCI manifest, or None when this repository does not hold it."""
        if not plausible_name(build_id):
            return None  # an envelope naming no possible build here: nothing to attach to
        for prefix in (BUILD_PREFIX, V1_BUILD_PREFIX):
            if len(prefix + build_id) <= MAX_TAG:
                got = self._get_manifest(prefix + build_id, op)
                if got is not None:
                    return descriptor(OCI_MANIFEST, got[0], len(got[1]))
        return None

    def _attach(self, namespace: str, name: str, data: bytes, op: str) -> None:
        """Under the writer lock: attach the signed blobs a record holds to their builds (see the module)."""
        ns = STORED_NAMESPACES.get(namespace)
        by_build: dict[str, list[Attachment]] = {}
        for a in ns.attachments(data, name) if ns is not None else ():
            by_build.setdefault(a.build_id, []).append(a)
        for build_id, wanted in by_build.items():
            subject = self._build_subject(build_id, f"{op}: attach to build {build_id}")
            if subject is not None:
                self._attach_to(subject, build_id, wanted, data, f"{op}: attach to build {build_id}")

    def _attach_to(self, subject: dict, build_id: str, wanted: list[Attachment], record: bytes, op: str) -> None:
        present, from_tag = self._referrers_of(subject["digest"], op)
        have = {(d.get("artifactType"), (d.get("annotations") or {}).get(ANN_ENVELOPE)) for d in present}
        unlisted = []
        for a in wanted:
            if (a.artifact_type, a.blob.digest) in have:
                continue
            have.add((a.artifact_type, a.blob.digest))
            # a statement is its own envelope: its bytes are in hand; evidence is read back from its blob
            envelope = record if a.blob.digest == sha256_digest(record) else self.get_blob(a.blob.digest, a.blob.size)
            body, ann = self._referrer_manifest(a, envelope, build_id, subject)
            digest, reply = self._push_manifest(sha256_digest(body), body, op)
            if reply.headers.get("OCI-Subject") == subject["digest"]:
                self._referrers_api = True  # the registry lists it itself
                continue
            d = descriptor(OCI_MANIFEST, digest, len(body), ann)
            d["artifactType"] = a.artifact_type
            unlisted.append(d)
        if unlisted:
            self._extend_fallback(subject["digest"], unlisted, present if from_tag else None, op)

    def _referrer_manifest(self, a: Attachment, envelope: bytes, build_id: str, subject: dict
                           ) -> tuple[bytes, dict[str, str]]:
        """The manifest attaching ``a`` to its build: the same bytes wherever it is written (no times),
        so the same attachment in another registry of the same OCI build has the same digest."""
        title, predicate = a.label(envelope)
        ann = {ANN_BUILD_ID: build_id, ANN_ENVELOPE: a.blob.digest}
        if predicate:
            ann[ANN_PREDICATE] = predicate
        self._ensure_empty_blob()
        layer = descriptor(a.blob.media_type, a.blob.digest, a.blob.size, {ANN_TITLE: title})
        return artifact(a.artifact_type, [layer], ann, subject=subject), ann

    def _extend_fallback(self, digest: str, new: list[dict], current: list[dict] | None, op: str) -> None:
        """Read-modify-write the referrers tag of ``digest`` (the distribution spec's fallback), read back."""
        tag = referrers_tag(digest)
        current = self._fallback_index(digest, op) if current is None else current
        known = {d["digest"] for d in current}
        manifests = current + [d for d in new if d["digest"] not in known]
        if len(manifests) == len(current):
            return
        written = self._put_manifest(tag, referrers_index(manifests), f"{op} (tag {tag})", OCI_INDEX)
        if not self._verify_tag(tag, written, op):
            raise ConflictError(
                f"{self._where()}: {op}: the referrers tag {tag} was overwritten by a writer outside this machine's "
                "lock; write the record again to attach its evidence"
            )


def _file_digest(path: Path) -> tuple[str, int]:
    h, n = hashlib.sha256(), 0
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
            n += len(chunk)
    return "sha256:" + h.hexdigest(), n


def _range_end(header: str | None, default: int) -> int:
    """``Range: 0-N`` of an upload session -> N + 1 bytes held (distribution says ``0--1`` for none)."""
    if not header or "-" not in header:
        return default
    try:
        return max(0, int(header.split("-", 1)[1]) + 1)
    except ValueError:
        return default
