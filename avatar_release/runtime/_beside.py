"""The revocation check on a thread of its own, beside the executables and weights of a load.

Reading a build's attestations (and, on a registry with signed release state, verifying that state
to find the evidence it lists; a fresh process imports python-tuf for it) is Python work that holds
the GIL, while deserializing executables and placing weights mostly run in XLA with it released: a
fresh pod's cores are partly idle then. So ``_load.load`` starts this check as that section starts:
the executables' bytes are fetched and verified and the weights placed beside it, but no
executable is unpickled or handed to XLA's deserializer before the verdict (``cleared``; a
revocation may answer a leaked signing key, and an executable is code), and the load waits for it
before it returns a build: a revoked build is never deserialized, returned, run or warmed, and
nothing reaches a pod's ready line before the verdict. The weights' path is told to
stop fetching once a revocation is found (``stop``), so a revoked build of many gigabytes is refused
in about the time the check takes, not after all its weights are placed.

What runs before it is unchanged: with a trust key or root, the signature (or the signed release
state) is checked before any blob is fetched or unpickled; every blob is verified before it is
unpickled.
"""

from __future__ import annotations

import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from typing import TYPE_CHECKING

from ..registry import Registry
from ..trust.revocation import check_not_revoked

if TYPE_CHECKING:
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

__all__ = ["RevocationBeside"]


class RevocationBeside:
    """``check_not_revoked`` begun on its own thread; ``verdict()`` (or leaving the ``with`` block)
    waits for it, raising ``Revoked`` or whatever the read raised. ``stop`` is set once the check
    has raised, so the work beside it can give up early."""

    def __init__(
        self,
        registry: Registry,
        build_id: str,
        subject_digest: str,
        trusted: dict[str, Ed25519PublicKey] | None,
        *,
        what: str,
    ):
        self.stop = threading.Event()
        self.seconds = self.wait = 0.0

        def check() -> None:
            t0 = time.perf_counter()
            try:
                check_not_revoked(registry, build_id, subject_digest, trusted, what=what)
            except BaseException:
                self.stop.set()
                raise
            finally:
                self.seconds = time.perf_counter() - t0

        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="revocation")
        self._done: Future[None] = self._pool.submit(check)

    def cleared(self) -> None:
        """Wait for the check (from any thread) and raise what it raised: the load calls it after a
        program's bytes are fetched and verified, before they are unpickled and handed to XLA."""
        self._done.result()

    def verdict(self) -> float:
        """Wait for the check; raise what it raised; else its seconds."""
        try:
            self._done.result()
        finally:
            self._pool.shutdown(wait=True)
        return self.seconds

    def __enter__(self) -> RevocationBeside:
        return self

    def __exit__(self, *exc: object) -> None:
        """Wait for the verdict (``wait``: the seconds waited); a revocation is raised in place of any
        failure of the work beside it."""
        t0 = time.perf_counter()
        self.verdict()
        self.wait = time.perf_counter() - t0
