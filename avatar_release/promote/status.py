"""Where a release stands: every build with its gate status and the channels on it, and any
channel whose plain pointer disagrees with the signed release state (a pointer moved around
avatar-release, or a replayed tag).

The channels a build is on are the ones the signed release state names (what every decision
reads). The plain pointer is a mirror of it (``trust.state_moves.mirror_move``) that ``ls`` checks;
in a registry with no signed state yet (before ``registry upgrade``) the pointer is checked
against the registry's own history instead.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from .._digest import canonical_json, sha256_digest
from ..errors import AvatarReleaseError
from ..gates import describe_comparison, effective_status, signed_verdicts
from ..gates.compile_gate import load_compile_gate
from ..gates.store import get_result, result_refs
from ..registry import CHANNELS, Registry, read_manifest
from ..trust.policy import TrustPolicy, load_policy
from ..trust.revocation import revocations
from ..trust.state_read import ReleaseState, load_state, state_exists

__all__ = [
    "BuildStatus",
    "ChannelCheck",
    "ReleaseStatus",
    "Verdict",
    "release_status",
    "channel_checks",
    "build_verdicts",
]


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
    """A channel's plain pointer against what it must say: the build the signed release state names
    there (``signed``), or, in a registry with no signed state, the newest history entry for it."""

    channel: str
    build_id: str | None  # the pointer (None: there is none)
    digest: str | None
    expected_build: str | None  # None: the channel is empty
    expected_digest: str | None  # signed: the manifest's content digest; else the history's digest
    signed: bool
    consistent: bool

    @property
    def holder(self) -> str | None:
        """The build the channel holds: as the signed state names it (else as the pointer says)."""
        return self.expected_build if self.signed else self.build_id

    @property
    def problem(self) -> str | None:
        if self.consistent:
            return None
        said = f"{self.expected_build} ({self.expected_digest})" if self.expected_build else "nothing"
        points = f"points at {self.build_id} ({self.digest})" if self.build_id else "has no pointer"
        if not self.signed:
            return (
                f"channel {self.channel} {points} but its history says {said}: the pointer was moved outside "
                "avatar-release or replayed; re-promote the intended build"
            )
        return (
            f"channel {self.channel} {points} but the signed release state names {said}: the pointer (a mirror "
            "of the signed state) was moved outside avatar-release or replayed. Promote, rollback and pods with "
            "a pinned root follow the signed state; pods without one follow the pointer until the channel's "
            "next signed move writes it again"
        )

    def to_json(self) -> dict[str, Any]:
        return {
            "channel": self.channel,
            "build_id": self.build_id,
            "digest": self.digest,
            "expected_build": self.expected_build,
            "expected_digest": self.expected_digest,
            "against": "signed release state" if self.signed else "history",
            "consistent": self.consistent,
            "problem": self.problem,
        }


@dataclass(frozen=True)
class ReleaseStatus:
    registry: str
    builds: list[BuildStatus] = field(default_factory=list)
    channels: list[ChannelCheck] = field(default_factory=list)

    @property
    def problems(self) -> list[str]:
        return [c.problem for c in self.channels if c.problem]

    def to_json(self) -> dict[str, Any]:
        return {
            "registry": self.registry,
            "builds": [b.to_json() for b in self.builds],
            "channels": {c.channel: c.holder for c in self.channels if c.holder},
            "channel_checks": [c.to_json() for c in self.channels],
            "problems": self.problems,
        }


def channel_checks(registry: Registry, state: ReleaseState | None = None) -> list[ChannelCheck]:
    """Each channel's pointer against ``state`` (the verified signed state) or, without one, its history."""
    pointers = {c.channel: c for c in registry.list_channels()}
    if state is None:
        last: dict[str, tuple[str, str]] = {}
        for e in registry.history():  # oldest first: the last entry per channel wins
            last[e.channel] = (e.to_build, e.to_digest)
        out = []
        for c in pointers.values():
            hb, hd = last.get(c.channel, (None, None))
            out.append(ChannelCheck(c.channel, c.build_id, c.digest, hb, hd, signed=False, consistent=hd == c.digest))
        return out
    out = []
    for channel in CHANNELS:
        holder, pointer = state.holder(channel), pointers.get(channel)
        if holder is None and pointer is None:
            continue
        out.append(
            ChannelCheck(
                channel,
                pointer.build_id if pointer else None,
                pointer.digest if pointer else None,
                holder.build_id if holder else None,
                holder.manifest_digest if holder else None,
                signed=True,
                consistent=_pointer_content(registry, pointer.digest if pointer else None)
                == (holder.manifest_digest if holder else None),
            )
        )
    return out


def _pointer_content(registry: Registry, digest: str | None) -> str | None:
    """The content digest of the manifest a pointer names (what the signed state signs)."""
    if digest is None:
        return None
    try:
        return read_manifest(registry, digest)[1].content_digest()
    except AvatarReleaseError:
        return None  # a pointer at nothing readable disagrees with any signed holder


def build_verdicts(registry: Registry, build_id: str, policy: TrustPolicy) -> list[Verdict]:
    """Every gate result of the build: the signed ones (as the policy verifies them) and the ones
    no trusted signature backs (listed, never promoted), oldest first by their own time."""
    _, manifest = read_manifest(registry, build_id)
    signed, _ = signed_verdicts(registry, build_id, manifest, policy)
    rows = {
        v.digest: Verdict(v.digest, v.result.status, describe_comparison(v), v.result.created_at, True) for v in signed
    }
    for ref in result_refs(registry, build_id):
        try:
            r = get_result(registry, ref)
        except AvatarReleaseError:
            continue  # damaged: `verify` names it; a listing goes on
        digest = sha256_digest(canonical_json(r.model_dump(mode="json")))
        if digest not in rows:
            against = (
                "compared with nothing (--baseline none)"
                if r.baseline is None
                else f"compared with {r.baseline.build_id}"
            )
            rows[digest] = Verdict(digest, r.status, against, r.created_at, False)
    return sorted(rows.values(), key=lambda v: v.created_at)


def release_status(registry: Registry, *, verdicts: bool = False) -> ReleaseStatus:
    signed = state_exists(registry)
    policy = load_policy() if verdicts or signed else None
    checks = channel_checks(registry, load_state(registry, policy) if signed and policy is not None else None)
    on: dict[str, list[str]] = {}  # build id -> the channels it holds
    for c in checks:
        if c.holder is not None:
            on.setdefault(c.holder, []).append(c.channel)
    builds = []
    for b in registry.list_builds():
        compiled = load_compile_gate(registry, b.build_id)
        gate, result, _ = effective_status(registry, b.build_id)
        against = None if result is None else (result.baseline.build_id if result.baseline else "nothing")
        revoked = revocations(registry, b.build_id, None, None)
        builds.append(
            BuildStatus(
                build_id=b.build_id,
                digest=b.digest,
                published_at=b.published_at,
                channels=sorted(on.get(b.build_id, [])),
                gate=gate,
                compile_gate=compiled.status if compiled else None,
                compared_with=against,
                revoked=revoked[0].describe() if revoked else None,
                verdicts=build_verdicts(registry, b.build_id, policy) if verdicts and policy is not None else None,
            )
        )
    return ReleaseStatus(registry.uri, builds, checks)
