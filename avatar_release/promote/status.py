"""Where a release stands: every build with its gate status and the channels on it, and any
channel whose pointer disagrees with its own history (a move made around the history, or a
replayed tag).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ..gates import effective_status
from ..gates.compile_gate import load_compile_gate
from ..trust.revocation import revocations

__all__ = ["BuildStatus", "ChannelCheck", "ReleaseStatus", "release_status", "channel_checks"]


@dataclass(frozen=True)
class BuildStatus:
    build_id: str
    digest: str
    published_at: str
    channels: list[str]
    gate: str  # effective status: passed, approved, rejected, needs-review, failed, ungated
    compile_gate: str | None  # the compile gate's status, when one ran
    # What the newest gate result compared with: a build id, "nothing" (--baseline none), None (ungated)
    compared_with: str | None = None
    revoked: str | None = None  # who revoked it, when and why (display: listed, not verified)

    def to_json(self) -> dict:
        return dict(self.__dict__)


@dataclass(frozen=True)
class ChannelCheck:
    """A channel's pointer against the newest history entry for it."""

    channel: str
    build_id: str
    digest: str
    history_build: str | None
    history_digest: str | None

    @property
    def consistent(self) -> bool:
        return self.history_digest == self.digest

    @property
    def problem(self) -> str | None:
        if self.consistent:
            return None
        said = f"{self.history_build} ({self.history_digest})" if self.history_digest else "nothing"
        return (f"channel {self.channel} points at {self.build_id} ({self.digest}) but its history says {said}: "
                "the pointer was moved outside avatar-release or replayed; re-promote the intended build")

    def to_json(self) -> dict:
        return {"channel": self.channel, "build_id": self.build_id, "digest": self.digest,
                "history_build": self.history_build, "history_digest": self.history_digest,
                "consistent": self.consistent, "problem": self.problem}


@dataclass(frozen=True)
class ReleaseStatus:
    registry: str
    builds: list[BuildStatus] = field(default_factory=list)
    channels: list[ChannelCheck] = field(default_factory=list)

    @property
    def problems(self) -> list[str]:
        return [c.problem for c in self.channels if c.problem]

    def to_json(self) -> dict:
        return {"registry": self.registry, "builds": [b.to_json() for b in self.builds],
                "channels": {c.channel: c.build_id for c in self.channels},
                "channel_checks": [c.to_json() for c in self.channels], "problems": self.problems}


def channel_checks(registry) -> list[ChannelCheck]:
    last: dict[str, tuple[str, str]] = {}
    for e in registry.history():  # oldest first: the last entry per channel wins
        last[e.channel] = (e.to_build, e.to_digest)
    out = []
    for c in registry.list_channels():
        hb, hd = last.get(c.channel, (None, None))
        out.append(ChannelCheck(c.channel, c.build_id, c.digest, hb, hd))
    return out


def release_status(registry) -> ReleaseStatus:
    checks = channel_checks(registry)
    builds = []
    for b in registry.list_builds():
        compiled = load_compile_gate(registry, b.build_id)
        gate, result, _ = effective_status(registry, b.build_id)
        against = None if result is None else (result.baseline.build_id if result.baseline else "nothing")
        revoked = revocations(registry, b.build_id, None, None)
        builds.append(BuildStatus(
            build_id=b.build_id, digest=b.digest, published_at=b.published_at,
            channels=sorted(c.channel for c in checks if c.digest == b.digest),
            gate=gate, compile_gate=compiled.status if compiled else None, compared_with=against,
            revoked=revoked[0].describe() if revoked else None))
    return ReleaseStatus(registry.uri, builds, checks)
