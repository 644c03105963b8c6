"""Where a release stands: every build with its gate status and the channels on it, and any
channel whose pointer disagrees with its own history (a move made around the history, or a
replayed tag).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from .._digest import canonical_json, sha256_digest
from ..errors import AvatarReleaseError
from ..gates import describe_comparison, effective_status, signed_verdicts
from ..gates.compile_gate import load_compile_gate
from ..gates.store import get_result, result_refs
from ..registry import Registry, read_manifest
from ..trust.policy import TrustPolicy, load_policy
from ..trust.revocation import revocations

__all__ = ["BuildStatus", "ChannelCheck", "ReleaseStatus", "Verdict", "release_status", "channel_checks",
           "build_verdicts"]


@dataclass(frozen=True)
class Verdict:
    """One gate result of a build, as ``ls --verdicts`` lists it."""

    digest: str
    status: str
    compared_with: str  # "compared with BUILD" or "compared with nothing (--baseline none)"
    created_at: str
    signed: bool  # its envelope verifies under the trust policy (only these ever promote)

    def to_json(self) -> dict[str, Any]:
        return dict(self.__dict__)


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
    verdicts: list[Verdict] | None = None  # every gate result, oldest first (ls --verdicts)

    def to_json(self) -> dict[str, Any]:
        doc = dict(self.__dict__)
        doc["verdicts"] = None if self.verdicts is None else [v.to_json() for v in self.verdicts]
        return doc


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

    def to_json(self) -> dict[str, Any]:
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

    def to_json(self) -> dict[str, Any]:
        return {"registry": self.registry, "builds": [b.to_json() for b in self.builds],
                "channels": {c.channel: c.build_id for c in self.channels},
                "channel_checks": [c.to_json() for c in self.channels], "problems": self.problems}


def channel_checks(registry: Registry) -> list[ChannelCheck]:
    last: dict[str, tuple[str, str]] = {}
    for e in registry.history():  # oldest first: the last entry per channel wins
        last[e.channel] = (e.to_build, e.to_digest)
    out = []
    for c in registry.list_channels():
        hb, hd = last.get(c.channel, (None, None))
        out.append(ChannelCheck(c.channel, c.build_id, c.digest, hb, hd))
    return out


def build_verdicts(registry: Registry, build_id: str, policy: TrustPolicy) -> list[Verdict]:
    """Every gate result of the build: the signed ones (as the policy verifies them) and the ones
    no trusted signature backs (listed, never promoted), oldest first by their own time."""
    _, manifest = read_manifest(registry, build_id)
    signed, _ = signed_verdicts(registry, build_id, manifest, policy)
    rows = {v.digest: Verdict(v.digest, v.result.status, describe_comparison(v), v.result.created_at, True)
            for v in signed}
    for ref in result_refs(registry, build_id):
        try:
            r = get_result(registry, ref)
        except AvatarReleaseError:
            continue  # damaged: `verify` names it; a listing goes on
        digest = sha256_digest(canonical_json(r.model_dump(mode="json")))
        if digest not in rows:
            against = "compared with nothing (--baseline none)" if r.baseline is None else \
                f"compared with {r.baseline.build_id}"
            rows[digest] = Verdict(digest, r.status, against, r.created_at, False)
    return sorted(rows.values(), key=lambda v: v.created_at)


def release_status(registry: Registry, *, verdicts: bool = False) -> ReleaseStatus:
    checks = channel_checks(registry)
    policy = load_policy() if verdicts else None
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
            revoked=revoked[0].describe() if revoked else None,
            verdicts=build_verdicts(registry, b.build_id, policy) if policy is not None else None))
    return ReleaseStatus(registry.uri, builds, checks)
