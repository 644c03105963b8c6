"""The pod: the build it serves, its warm-up, its health, and following its channel.

A build is ready only after verify + load + one warm chunk that compiled nothing. Following a
channel loads the new build in the background (with the trust config when one is set; taking the
programs and placed weights it shares byte for byte with the build served, so a swap holds no
second copy of them), warms it under the device lock (between renders) and swaps the pointer; a
build that fails to verify or compiles is refused and the old one keeps serving. A render holds
the build object it started with, so a swap never changes a video half-way.
"""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from .._dtypes import np_dtype
from ..errors import AvatarReleaseError, RecompileError, Revoked
from ..media import sample_audio, sample_image
from ..records import Manifest
from ..registry import Registry, Resolved
from ..runtime import (
    LoadedBuild,
    PaceTally,
    TrustConfig,
    devices_for,
    load,
    pace_of,
    resolve_channel,
    revocation_keys,
    stream,
)
from ..trust.evidence import attestation_refs
from ..trust.revocation import revocations
from ..trust.state_pod import StateExpired
from ._errors import clean_message
from ._log import log_event
from ._metrics import Metrics

__all__ = ["Pod", "start_pod", "warm_up"]


def warm_up(build: LoadedBuild) -> float:
    """Render one chunk of the largest bucket from the sample inputs the build declares (a text or
    tensor input: zeros of its shape); refuse a build that compiles."""
    p = build.manifest.program
    t0 = time.perf_counter()
    frames = max(b.frames for b in build.manifest.buckets)
    before = build.guard.count
    image, audio = p.input_of("image"), p.input_of("audio")
    values = {i.name: np.zeros(i.shape, np_dtype(i.dtype)) for i in p.request_inputs() if i.kind in ("text", "tensor")}
    for _ in stream(
        build,
        None if image is None else sample_image(image.shape[0], image.shape[1]),
        None if audio is None else sample_audio(frames / p.fps, sample_rate=audio.sample_rate),
        frames=frames,
        values=values,
    ):
        pass
    if build.guard.count > before:
        raise RecompileError(
            f"warm-up of build {build.build_id} compiled {build.guard.count - before} time(s): not ready",
            build.guard.events[before:],
        )
    return time.perf_counter() - t0


@dataclass
class FollowState:
    last_check: float | None = None
    last_result: str | None = None
    refused_digest: str | None = None
    refused_reason: str | None = None
    revoked: str | None = None  # the served build's revocation, once one is seen
    # (build digest, its attestation index) last scanned for a revocation
    scanned: tuple[str, tuple[str, ...]] | None = None
    swaps: int = 0
    history: list[dict[str, Any]] = field(default_factory=list)
    stale: str | None = None  # with a trust root: why the signed state is not fresh now (not ready)
    verified: dict[str, Any] | None = None  # with a trust root: the signed state's word at the last check


class Pod:
    def __init__(
        self,
        registry: Registry,
        channel: str,
        build: LoadedBuild,
        *,
        trust: TrustConfig | None = None,
        warm_seconds: float = 0.0,
        metrics: Metrics | None = None,
    ):
        self.registry = registry
        self.channel = channel
        self.trust = trust
        self.build = build
        self.warm_seconds = warm_seconds
        self.metrics = metrics or Metrics()
        self.metrics.set_build(build, channel)
        self.device_lock = threading.Lock()  # one render (or warm-up) on the accelerator at a time
        self.draining = False
        self.requests = 0
        self.follow = FollowState()
        self.pace = PaceTally()  # every request's chunks against their playback time
        if trust is not None and trust.root is not None:
            self.metrics.trust_fresh.set(1)

    @property
    def ready(self) -> bool:
        return self.build.guard.count == 0 and not self.draining and self.follow.stale is None

    @property
    def refuses_stale(self) -> bool:
        """Whether requests are refused now: the signed state is not fresh and the trust config does
        not say to serve on (``--serve-expired``)."""
        return self.follow.stale is not None and not (self.trust is not None and self.trust.serve_expired)

    def deadline_report(self) -> dict[str, Any]:
        """What a chunk's deadline means here (``emulated``: chunks over it say the host is slower than
        the target) and how this pod has kept it so far (every request's chunks since it started)."""
        return pace_of(self.build.manifest).to_json(self.pace)

    def health(self) -> dict[str, Any]:
        b, t = self.build, self.build.timings
        return {
            "ready": self.ready,
            "draining": self.draining,
            "channel": self.channel,
            "build_id": b.build_id,
            "digest": b.digest,
            "compiles": b.guard.count,
            "requests": self.requests,
            "load_seconds": round(t.total(), 4),
            "load": t.to_json(),
            "warm_chunk_seconds": round(self.warm_seconds, 4),
            "fps": b.manifest.program.fps,
            "buckets": {x.name: x.frames for x in b.manifest.buckets},
            "deadline": self.deadline_report(),
            "follow": {
                "swaps": self.follow.swaps,
                "last_check": self.follow.last_check,
                "last_result": self.follow.last_result,
                "refused_digest": self.follow.refused_digest,
                "refused_reason": self.follow.refused_reason,
                "revoked": self.follow.revoked,
                "stale": self.follow.stale,
                "signed": self.follow.verified,
            },
        }

    # ---------------------------------------------------------------------------- following
    def check_channel(self, *, retry_refused: bool = False) -> str:
        """Look at the channel once; swap in a new build or refuse it. Returns what happened.

        A refused digest is not tried again on every poll (it would reload a bad build forever);
        ``retry_refused`` (SIGHUP: the operator says the registry was fixed) tries it again."""
        self.follow.last_check = time.time()
        try:
            resolved, _, verified = resolve_channel(self.registry, self.channel, self._root_trust())
        except StateExpired as exc:  # nobody re-signed the timestamp, or the registry is frozen: not ready
            self.follow.stale = clean_message(str(exc))
            self.metrics.trust_fresh.set(0)
            log_event("trust_expired", channel=self.channel, serving=self.build.build_id, reason=self.follow.stale)
            return self._result("stale")
        if verified is not None:
            if self.follow.stale is not None:
                log_event("trust_fresh", channel=self.channel, serving=self.build.build_id)
            self.follow.stale = None
            self.follow.verified = verified.to_json()
            self.metrics.trust_fresh.set(1)
            if verified.revoked is not None and resolved.digest == self.build.digest:
                self._flag_revoked(
                    f"revoked by {verified.revoked.get('by', '?')} at {verified.revoked.get('at', '?')} "
                    f"(signed release state): {verified.revoked.get('reason', '')}"
                )
                return self._result("unchanged")
        if resolved.digest == self.build.digest:
            self._check_served_revoked()
            return self._result("unchanged")
        if resolved.digest == self.follow.refused_digest and not retry_refused:
            return self._result("still-refused")
        log_event("swap_loading", channel=self.channel, old=self.build.build_id, digest=resolved.digest)
        try:
            new = _load(self.registry, self.channel, resolved, self.trust, serving=self.build)
            with self.device_lock:  # between renders: the warm chunk never competes with a request
                warm = warm_up(new)
        except (AvatarReleaseError, OSError, ValueError) as exc:
            return self._refuse(resolved, exc)
        return self._swap_in(new, warm)

    def _refuse(self, resolved: Resolved, exc: Exception) -> str:
        """The channel's new build failed to load or warm: remember its digest (not tried again until
        ``retry_refused``) and why; the build served now keeps serving."""
        self.follow.refused_digest = resolved.digest
        self.follow.refused_reason = clean_message(f"{type(exc).__name__}: {exc}")
        self.metrics.swaps.labels("revoked" if isinstance(exc, Revoked) else "refused").inc()
        log_event(
            "swap_refused",
            channel=self.channel,
            serving=self.build.build_id,
            digest=resolved.digest,
            reason=self.follow.refused_reason,
        )
        return self._result("refused")

    def _swap_in(self, new: LoadedBuild, warm: float) -> str:
        """Serve ``new`` (loaded and warmed) from the next request on; a render under way keeps the
        build it started with."""
        with self.device_lock:
            old, self.build, self.warm_seconds = self.build, new, warm
        self.follow.swaps += 1
        self.follow.refused_digest = self.follow.refused_reason = self.follow.revoked = None
        self.metrics.revoked.set(0)
        self.metrics.swaps.labels("swapped").inc()
        self.metrics.set_build(new, self.channel)
        log_event(
            "swapped",
            channel=self.channel,
            old=old.build_id,
            new=new.build_id,
            digest=new.digest,
            warm_chunk_seconds=round(warm, 4),
            load_seconds=round(new.timings.total(), 4),
        )
        return self._result("swapped")

    def _check_served_revoked(self) -> None:
        """A revocation of the build served now: say so (log once, gauge, health); keep serving,
        since the channel still points here and there is nothing better to serve until it moves."""
        if self.follow.revoked is not None:
            return
        b = self.build
        seen = (b.digest, tuple(r.digest for r in attestation_refs(self.registry, b.build_id)))
        if seen == self.follow.scanned:
            return  # no new attestation since the last poll: nothing new to read
        self.follow.scanned = seen
        found = revocations(self.registry, b.build_id, b.manifest.content_digest(), revocation_keys(self.trust))
        if found:
            self._flag_revoked(found[0].describe())

    def _flag_revoked(self, why: str) -> None:
        if self.follow.revoked is not None:
            return
        b = self.build
        self.follow.revoked = why
        self.metrics.revoked.set(1)
        log_event("serving_revoked", channel=self.channel, build=b.build_id, digest=b.digest, reason=why)

    def _root_trust(self) -> TrustConfig | None:
        return self.trust if self.trust is not None and self.trust.root is not None else None

    def _result(self, what: str) -> str:
        self.follow.last_result = what
        return what

    def start_following(self, poll_seconds: float, wake: threading.Event, stop: threading.Event) -> threading.Thread:
        """A background thread: check about every ``poll_seconds`` (see `follow_wait`) or when
        ``wake`` is set (SIGHUP)."""
        rng = random.Random()

        def loop() -> None:
            while not stop.is_set():
                woken = wake.wait(follow_wait(poll_seconds, rng))
                wake.clear()
                if stop.is_set():
                    return
                try:
                    self.check_channel(retry_refused=woken)
                except Exception as exc:  # a registry hiccup: keep serving, try again next poll
                    self.follow.last_result = "error"
                    log_event(
                        "follow_error", channel=self.channel, reason=clean_message(f"{type(exc).__name__}: {exc}")
                    )

        t = threading.Thread(target=loop, name="channel-follow", daemon=True)
        t.start()
        return t


FOLLOW_JITTER = 0.25


def follow_wait(poll_seconds: float, rng: random.Random) -> float:
    """The wait before the next channel check: ``poll_seconds`` ± 25%, drawn afresh each time.

    A fleet started together (a rollout, a node pool coming up) would otherwise poll in lockstep:
    every pod hits the registry in the same second and warms the new build at the same moment.
    Spread over half an interval, a promotion reaches every pod within 1.25 × ``--poll``."""
    return poll_seconds * rng.uniform(1.0 - FOLLOW_JITTER, 1.0 + FOLLOW_JITTER)


def _load(
    registry: Registry, ref: str, resolved: Resolved, trust: TrustConfig | None, serving: LoadedBuild | None = None
) -> LoadedBuild:
    # With a trust key or root the channel is loaded by name (its signed statement, or the signed
    # release state, is checked); without, the digest resolved here is what every fetch uses.
    # A swap (``serving``): the programs and weights the new build shares byte for byte with the
    # build served now are taken from it (runtime/_reuse.py), while that build keeps serving.
    return load(ref if trust else resolved.digest, registry, strict=True, trust=trust, serving=serving)


def _jax_up(manifest: Manifest) -> None:
    """Start JAX on the build's devices (as the load would first thing); a machine without them is
    named by the load itself (``check_environment``, after a revocation if there is one)."""
    try:
        devices_for(manifest)
    except RuntimeError:
        pass


# What prepares this process for the build ``ref`` names before it loads (the CLI's device and flag
# setup): (registry, ref) -> (resolved, manifest), read and checked.
Prepare = Callable[[Registry, str], tuple[Resolved, Manifest]]


def start_pod(
    registry: Registry,
    ref: str,
    *,
    trust: TrustConfig | None = None,
    prepare: Prepare | None = None,
    metrics: Metrics | None = None,
    beside: Callable[[], object] | None = None,
) -> Pod:
    """A pod ready to serve ``ref``: devices prepared for the build, verified (and its signed
    statement checked when ``trust`` is given), loaded strictly, one warm chunk with zero compiles.

    ``beside``: work of the caller's (``serve``: the HTTP server's imports) run on a thread of its
    own while the build loads, once JAX is up: JAX's import holds the GIL as that work would, while
    deserializing and placing weights mostly do not. Its failure is raised once the build loaded."""
    resolved, manifest = prepare(registry, ref) if prepare else resolve_channel(registry, ref, trust)[:2]
    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="beside-load") as pool:
        done = None
        if beside is not None:
            _jax_up(manifest)
            done = pool.submit(beside)
        build = _load(registry, ref, resolved, trust)
        if done is not None:
            done.result()
    warm = warm_up(build)
    return Pod(registry, ref, build, trust=trust, warm_seconds=warm, metrics=metrics)
