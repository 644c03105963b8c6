"""Prometheus metrics of one pod, in their own registry (two pods in one process do not mix).

Names are ``avatar_serve_*``. ``avatar_serve_compiles_total`` must stay 0: a loaded build that
compiles is a defect, and an alert on ``> 0`` is the cheapest guard a fleet can have.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, Info, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST

from ..runtime import LoadedBuild

__all__ = ["Metrics", "CONTENT_TYPE_LATEST"]

_LATENCY = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)

# The help texts too long for a line of their own beside the metric.
_DEADLINE_MISSES = (
    "Chunks that missed their deadline (slower than their playback time) on the build's own hardware, by bucket; "
    "/healthz deadline.misses_on_target. Never counted on emulated devices "
    "(/healthz deadline.emulated): see avatar_serve_chunks_over_playback"
)
_OVER_PLAYBACK = (
    "Chunks slower than their playback time, by bucket, on any host (/healthz deadline.chunks_over_deadline); "
    "on emulated devices they only say the host is slower than the target, not a deadline miss"
)
_REVOKED = (
    "1 while the build served carries a signed revocation "
    "(the pod keeps serving it until its channel moves; alert on it)"
)
_TRUST_FRESH = (
    "1 while the signed release state this pod follows is unexpired (with --trust-root; 0: nobody refreshed "
    "its timestamp, or the registry is frozen: the pod is not ready)"
)


class Metrics:
    def __init__(self) -> None:
        r = self.registry = CollectorRegistry(auto_describe=True)
        self.requests = Counter(
            "avatar_serve_requests", "Requests answered, by route and status", ["route", "status"], registry=r
        )
        self.queue_depth = Gauge(
            "avatar_serve_queue_depth", "Renders admitted and waiting for the accelerator", registry=r
        )
        self.in_flight = Gauge("avatar_serve_renders_in_flight", "Renders running now (0 or 1)", registry=r)
        self.rejected = Counter(
            "avatar_serve_rejected", "Requests refused before rendering, by error code", ["code"], registry=r
        )
        self.chunk_seconds = Histogram(
            "avatar_serve_chunk_seconds",
            "Render time of one chunk, by bucket",
            ["bucket"],
            buckets=_LATENCY,
            registry=r,
        )
        # One definition of a deadline miss with /healthz (deadline.misses_on_target), the request log
        # (misses) and the render summary: a chunk over its playback time on the build's own hardware.
        self.deadline_misses = Counter("avatar_serve_deadline_misses", _DEADLINE_MISSES, ["bucket"], registry=r)
        self.over_playback = Counter("avatar_serve_chunks_over_playback", _OVER_PLAYBACK, ["bucket"], registry=r)
        self.first_fragment = Histogram(
            "avatar_serve_time_to_first_fragment_seconds",
            "Admission to the first video bytes sent",
            buckets=_LATENCY,
            registry=r,
        )
        self.request_seconds = Histogram(
            "avatar_serve_render_seconds", "Admission to the last byte of a video", buckets=_LATENCY, registry=r
        )
        self.compiles = Counter("avatar_serve_compiles", "XLA compiles seen while serving (must stay 0)", registry=r)
        self.build = Info("avatar_serve_build", "The build this pod serves", registry=r)
        self.swaps = Counter(
            "avatar_serve_swaps", "Channel follows: builds swapped in or refused", ["result"], registry=r
        )
        self.revoked = Gauge("avatar_serve_build_revoked", _REVOKED, registry=r)
        self.trust_fresh = Gauge("avatar_serve_trust_fresh", _TRUST_FRESH, registry=r)
        self.disconnects = Counter(
            "avatar_serve_client_disconnects", "Renders stopped because the client left", registry=r
        )
        self.compiles.inc(0)

    def set_build(self, build: LoadedBuild, channel: str) -> None:
        self.build.info(
            {
                "build_id": build.build_id,
                "digest": build.digest,
                "channel": channel,
                "pipeline": build.manifest.pipeline,
                "target": build.manifest.target,
            }
        )

    def exposition(self) -> bytes:
        return generate_latest(self.registry)
