"""The trust policy: which keys may sign which evidence. A file the promoter controls, never
read from the registry.

    schema_version = 1
    [keys]                       # name -> public key (PEM file, relative to this file)
    ci-gate  = "keys/ci-gate.pub"
    ana      = "keys/ana.pub"
    [gate]                       # target -> key names that may sign gate evidence ("*": any target)
    "tpu-v6e-8" = ["ci-gate"]
    [review]
    reviewers = ["ana"]          # who may answer blind reviews and decide them
    prod_approvals = 1           # approvals by distinct reviewers a reviewed build needs for prod
    [release]
    approvers = ["ana"]          # keys whose signed release approval (``avatar-release approve``) prod needs
    roles = 2                    # prod needs gate evidence AND an approval by another key (1: gate alone)
    [timestamps]
    validity_hours = 1           # how long a signed timestamp vouches (pods cap it too: --max-timestamp-age)
    [gate_inputs]                # the project files that may decide a verdict that promotes, by digest
    bands = ["sha256:..."]       # band files a verdict judged by the band may have used ([]: bit-exact only)
    levers = ["sha256:..."]      # lever lists (manifests/levers.toml) that may have sent it to the band
    [gate_inputs.targets]        # target -> its spec digest (or a list of them)
    "tpu-v6e-8" = "sha256:..."

``[gate_inputs]`` pins what the project could otherwise change under a verdict: a band with a
lower floor, a lever list that lets the band judge more, a redefined target. Each gate result
names the digests of the band, target spec and lever list it was decided by (inside the signed
evidence); staging, prod and rollbacks refuse a verdict decided by any other. A key left out pins
nothing of its kind; the band and lever list count only where the band judged (a bit-exact
verdict holds whatever they say), the target spec for every verdict, and a target missing from
``targets`` promotes nothing. ``avatar-release gate inputs`` prints the section for the files in
force. Without the section (the first-use policy below, or an older one) the project's files in
force decide, as before: on one laptop the project and the policy have the same owner.

Where it is read from, in order: ``--trust-policy`` / ``AVATAR_RELEASE_TRUST_POLICY``; else the
user's own ``<config>/trust.toml``. On first use (no such file) a machine gets its own gate key,
reviewer key and release key under ``<config>/keys/`` and a local policy trusting exactly those
(this one machine holds every role), so the embedded default (compile -> gate -> promote on one
laptop) needs no key setup, while evidence
from any other machine's key, or unsigned, never promotes. CI and shared registries point
``AVATAR_RELEASE_TRUST_POLICY`` at a policy in the repository and take keys from secrets.
"""

from __future__ import annotations

import getpass
import os
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Literal

from pydantic import AfterValidator, BeforeValidator, Field

from .. import _atomic
from .._config_files import ConfigModel, parse_model, read_toml
from .._digest import is_digest
from .._paths import config_dir
from .._suggest import did_you_mean
from ..errors import InputError
from .keys import (
    generate_keypair,
    key_id,
    load_private_key,
    load_public_key,
    refuse_loose_permissions,
    write_public_key,
)

if TYPE_CHECKING:
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

__all__ = [
    "TrustPolicy",
    "StateSection",
    "GateInputPins",
    "UnpinnedInput",
    "LocalIdentity",
    "config_dir",
    "local_identity",
    "load_policy",
    "POLICY_SCHEMA_VERSION",
]

POLICY_SCHEMA_VERSION = 1


@dataclass(frozen=True)
class LocalIdentity:
    """This machine's own keys, made on first use: one signs gate evidence, one is its reviewer,
    one approves releases to prod (the second role prod needs; on one laptop, the same person)."""

    gate_key_path: Path
    reviewer_key_path: Path
    reviewer: str
    release_key_path: Path

    def gate_key(self) -> Ed25519PrivateKey:
        return load_private_key(self.gate_key_path)

    def reviewer_key(self) -> Ed25519PrivateKey:
        return load_private_key(self.reviewer_key_path)

    def release_key(self) -> Ed25519PrivateKey:
        return load_private_key(self.release_key_path)


def local_identity() -> LocalIdentity:
    """This machine's gate and reviewer keys (created 0600 on first use) and the local policy."""
    d = config_dir()
    keys = d / "keys"
    reviewer = os.environ.get("AVATAR_RELEASE_REVIEWER") or _user()
    ident = LocalIdentity(keys / "gate.key", keys / "reviewer.key", reviewer, keys / "release.key")
    for name in ("gate", "reviewer", "release"):
        if not (keys / f"{name}.key").is_file():
            try:
                generate_keypair(keys, name)
            except InputError:  # a concurrent first use made it: use theirs
                pass
        if not (keys / f"{name}.pub").is_file():  # a concurrent first use between its key and its .pub
            write_public_key(keys / f"{name}.key")
    policy = d / "trust.toml"
    if not policy.is_file():
        _atomic.write_text(policy, _local_policy_text(reviewer))
    else:
        _upgrade_local_policy(policy)
    return ident


_LOCAL_MARK = "# Made by avatar-release on first use"


def _upgrade_local_policy(path: Path) -> None:
    """A first-use policy made before prod needed a release approval gets this machine's release
    key as its approver (a policy someone wrote themselves is never touched)."""
    try:
        text = path.read_text()
    except OSError:
        return
    if text.startswith(_LOCAL_MARK) and "[release]" not in text:
        _atomic.write_text(
            path,
            text.rstrip("\n").replace("[gate]", 'local-release = "keys/release.pub"\n\n[gate]', 1)
            + "\n\n"
            + _LOCAL_RELEASE,
        )


def _user() -> str:
    try:
        return getpass.getuser()
    except Exception:  # noqa: BLE001 - no user database in some containers
        return "local"


def _local_policy_text(reviewer: str) -> str:
    return (
        f"{_LOCAL_MARK}: trusts this machine's own keys only.\n"
        "# Shared registries and CI: point AVATAR_RELEASE_TRUST_POLICY at a policy in your repository.\n"
        f"schema_version = {POLICY_SCHEMA_VERSION}\n\n"
        "[keys]\n"
        'local-gate = "keys/gate.pub"\n'
        f'{_toml_key(reviewer)} = "keys/reviewer.pub"\n'
        'local-release = "keys/release.pub"\n\n'
        "[gate]\n"
        '"*" = ["local-gate"]\n\n'
        "[review]\n"
        f"reviewers = [{_toml_str(reviewer)}]\n"
        "prod_approvals = 1\n\n" + _LOCAL_RELEASE
    )


# Prod takes gate evidence and a release approval by another key; on one laptop this machine's
# release key is that second key, and `promote --to prod` signs the approval with it.
_LOCAL_RELEASE = '[release]\napprovers = ["local-release"]\nroles = 2\n'


def _toml_str(s: str) -> str:
    return '"' + s.replace("\\", "\\\\").replace('"', '\\"') + '"'


def _toml_key(s: str) -> str:
    return s if s.replace("-", "").replace("_", "").isalnum() else _toml_str(s)


# --------------------------------------------------------------------------- the file, as written
# Where a policy error sends the user: a page of the docs site.
_POLICY_PAGE = "every section and field: docs site, Reference > Trust policy"

_DIGEST_FORMAT = "'sha256:' + 64 lowercase hex, as `avatar-release gate inputs` prints them"


def _check_digest(v: str) -> str:
    if not is_digest(v):
        raise ValueError(f"expected a digest ({_DIGEST_FORMAT})")
    return v


_Digest = Annotated[str, AfterValidator(_check_digest)]


def _one_or_many(v: object) -> object:
    if not isinstance(v, (str, list)):
        raise ValueError(f"expected a digest or a list of digests ({_DIGEST_FORMAT})")
    return [v] if isinstance(v, str) else v


_Digests = Annotated[list[_Digest], BeforeValidator(_one_or_many)]  # one digest or a list of them


class _ReviewFile(ConfigModel):
    reviewers: list[str] = Field([], description="key names that may answer blind reviews and decide them")
    prod_approvals: int = Field(1, ge=1, description="approvals by distinct reviewers a reviewed build needs for prod")


class _ReleaseFile(ConfigModel):
    approvers: list[str] = Field([], description="key names whose signed release approval prod needs")
    roles: int = Field(
        2, ge=1, le=2, description="2: prod needs gate evidence and an approval by another key; 1: gate evidence alone"
    )


class _TimestampsFile(ConfigModel):
    validity_hours: float = Field(1.0, gt=0, le=24 * 7, description="how long a signed timestamp vouches")


class _StateFile(ConfigModel):
    root: list[str] = Field([], description="keys that sign root.json and the top-level targets")
    root_threshold: int = Field(1, ge=1, description="root signatures needed (at most the number of root keys)")
    online: list[str] = Field([], description="keys that sign snapshot and timestamp on every move and refresh")
    timestamp_minutes: float = Field(60, ge=1, le=7 * 24 * 60, description="how long a timestamp vouches")
    channels: dict[Literal["dev", "staging", "prod"], list[str]] = Field(
        {}, description="who may sign each channel's metadata"
    )


class _GateInputsFile(ConfigModel):
    bands: list[_Digest] | None = Field(None, description="band file digests ([]: bit-exact verdicts only)")
    levers: list[_Digest] | None = Field(None, description="lever list (manifests/levers.toml) digests")
    targets: dict[str, _Digests] | None = Field(None, description="target -> its spec digest, or a list of them")


class _PolicyFile(ConfigModel):
    """A trust policy file (see the module's docstring)."""

    schema_version: int = Field(description=f"{POLICY_SCHEMA_VERSION}")
    keys: dict[str, str] = Field({}, description="key name -> public key file (relative to the policy)")
    gate: dict[str, list[str]] = Field({}, description='target or "*" -> key names that may sign gate evidence')
    review: _ReviewFile = _ReviewFile()
    release: _ReleaseFile = _ReleaseFile()
    timestamps: _TimestampsFile = _TimestampsFile()
    state: _StateFile = _StateFile()
    gate_inputs: _GateInputsFile | None = None


@dataclass(frozen=True)
class StateSection:
    """``[state]``: the keys of the signed release state's roles (``trust.state_roles`` fills what
    is left out: root = the release approvers; online and channels = the gate keys and approvers).

        [state]
        root = ["root-a", "root-b"]   # sign root.json and the top-level targets (keep them offline)
        root_threshold = 2
        online = ["ci-state"]         # sign snapshot and timestamp on every move and refresh
        timestamp_minutes = 60        # how long a timestamp vouches: a frozen registry is noticed after it
        [state.channels]              # who may sign each channel's metadata (a move into it)
        prod = ["ana", "ci-gate"]
    """

    root: tuple[str, ...] = ()
    root_threshold: int = 1
    online: tuple[str, ...] = ()
    channels: dict[str, tuple[str, ...]] = field(default_factory=dict)
    timestamp_minutes: float = 60.0


def _state_section(p: Path, doc: _StateFile, keys: dict[str, Ed25519PublicKey]) -> StateSection:
    """The ``[state]`` section, every name checked against ``[keys]``."""
    _defined(
        p,
        keys,
        [
            ("state.root", doc.root),
            ("state.online", doc.online),
            *((f"state.channels.{c}", v) for c, v in doc.channels.items()),
        ],
    )
    if not doc.root_threshold <= max(len(doc.root), 1):
        raise InputError(
            f"trust policy {p}: state.root_threshold must be an integer from 1 to the number of root "
            f"keys ({len(doc.root) or 1}), got {doc.root_threshold!r}"
        )
    return StateSection(
        root=tuple(doc.root),
        root_threshold=doc.root_threshold,
        online=tuple(doc.online),
        channels={c: tuple(v) for c, v in doc.channels.items()},
        timestamp_minutes=float(doc.timestamp_minutes),
    )


def _defined(p: Path, keys: dict[str, Ed25519PublicKey], uses: Iterable[tuple[str, list[str]]]) -> None:
    """Every key name a section uses is one ``[keys]`` defines."""
    for where, names in uses:
        missing = [n for n in names if n not in keys]
        if missing:
            raise InputError(
                f"trust policy {p}: {where} names {missing}, which [keys] does not define"
                f"{did_you_mean(missing[0], keys)}"
            )


@dataclass(frozen=True)
class TrustPolicy:
    path: Path
    keys: dict[str, Ed25519PublicKey]  # name -> public key
    gate: dict[str, list[str]]  # target or "*" -> key names
    reviewers: list[str]
    prod_approvals: int = 1
    key_names: dict[str, str] = field(default_factory=dict)  # key id -> name
    timestamp_hours: float = 1.0  # [timestamps] validity_hours: how long a signed timestamp vouches
    approvers: list[str] = field(default_factory=list)  # [release] approvers: who approves releases to prod
    roles: int = 2  # [release] roles: 2 = prod needs a release approval by a key other than the gate's
    state: StateSection = field(default_factory=lambda: StateSection())  # [state]: who signs the release state
    # [gate_inputs]: the band, target specs and lever lists that may decide a verdict that promotes
    gate_inputs: GateInputPins = field(default_factory=lambda: GateInputPins())

    def gate_keys(self, target: str) -> dict[str, Ed25519PublicKey]:
        """{key id: public key} allowed to sign gate evidence for ``target``."""
        names = self.gate.get(target, []) + self.gate.get("*", [])
        return {key_id(self.keys[n]): self.keys[n] for n in names}

    def reviewer_keys(self) -> dict[str, Ed25519PublicKey]:
        return {key_id(self.keys[n]): self.keys[n] for n in self.reviewers}

    def approver_keys(self) -> dict[str, Ed25519PublicKey]:
        """{key id: public key} whose signed release approval counts for prod."""
        return {key_id(self.keys[n]): self.keys[n] for n in self.approvers}

    def revoker_keys(self) -> dict[str, Ed25519PublicKey]:
        """Every key the policy names: a revocation can only hold a build back, so any role may sign one."""
        return {key_id(k): k for k in self.keys.values()}

    def name_of(self, kid: str) -> str:
        return self.key_names.get(kid, kid)

    def owns_name(self, name: object, key_ids: Iterable[str]) -> bool:
        """Whether this policy gives ``name`` to one of the keys that signed: the one signer check of
        reviewers and release approvers. A name written into signed evidence (or typed on the command
        line) proves nothing; the key that signs it does."""
        return isinstance(name, str) and name in {self.name_of(k) for k in key_ids}

    def describe(self) -> str:
        return str(self.path)


def load_policy(path: str | os.PathLike | None = None) -> TrustPolicy:
    """The policy from ``path``, ``AVATAR_RELEASE_TRUST_POLICY``, or this user's (made on first use)."""
    explicit = path or os.environ.get("AVATAR_RELEASE_TRUST_POLICY")
    if explicit:
        p = Path(explicit)
        if not p.is_file():
            raise InputError(f"trust policy {p}: no such file (AVATAR_RELEASE_TRUST_POLICY / --trust-policy)")
    else:
        local_identity()
        p = config_dir() / "trust.toml"
    refuse_loose_permissions(p, "trust policy")
    raw = read_toml(p, what="trust policy", error=InputError, footer=_POLICY_PAGE)
    if raw.get("schema_version") != POLICY_SCHEMA_VERSION:
        raise InputError(
            f"trust policy {p}: schema_version {raw.get('schema_version')!r}, this avatar-release "
            f"reads {POLICY_SCHEMA_VERSION}"
        )
    doc = parse_model(_PolicyFile, raw, where=f"trust policy {p}", error=InputError, footer=_POLICY_PAGE)
    keys = {
        name: load_public_key(Path(rel) if os.path.isabs(rel) else p.parent / rel) for name, rel in doc.keys.items()
    }
    _defined(
        p,
        keys,
        [
            *((f"gate.{t}", v) for t, v in doc.gate.items()),
            ("review.reviewers", doc.review.reviewers),
            ("release.approvers", doc.release.approvers),
        ],
    )
    return TrustPolicy(
        path=p,
        keys=keys,
        gate={t: list(v) for t, v in doc.gate.items()},
        reviewers=list(doc.review.reviewers),
        prod_approvals=doc.review.prod_approvals,
        key_names={key_id(k): n for n, k in keys.items()},
        timestamp_hours=float(doc.timestamps.validity_hours),
        approvers=list(doc.release.approvers),
        roles=doc.release.roles,
        state=_state_section(p, doc.state, keys),
        gate_inputs=_gate_inputs_section(doc.gate_inputs),
    )


# --------------------------------------------------------------------------- [gate_inputs]
@dataclass(frozen=True)
class UnpinnedInput:
    """A project file that decided a verdict and that ``[gate_inputs]`` does not allow."""

    kind: str  # "band", "target spec" or "lever list"
    key: str  # where the policy pins it: 'bands', 'targets."tpu-v6e-8"', 'levers'
    found: str | None  # the digest the signed evidence names; None: it names none (an older gate result)
    allowed: tuple[str, ...]  # what [gate_inputs] allows there (empty: nothing)

    def describe(self) -> str:
        found = self.found or "no digest (a gate result written before results named it)"
        allowed = ", ".join(self.allowed) if self.allowed else "none"
        return f"{self.kind} {found}, where [gate_inputs] {self.key} allows {allowed}"


@dataclass(frozen=True)
class GateInputPins:
    """``[gate_inputs]``: by digest, the project files that may decide a verdict that promotes.

    A band, a target spec and a lever list are files in the project, which whoever can change the
    project can change: a band with a lower floor passes what the measured one sends to review, a
    lever list that declares more lets the band judge what had to be bit-exact, a redefined target
    is vouched for by the keys of its name. The gate names each in its signed result; these say
    which ones count. None: not pinned (the file in force decides, as before this section).
    """

    bands: tuple[str, ...] | None = None  # band file digests (GateResult.band_digest)
    targets: dict[str, tuple[str, ...]] | None = None  # target -> spec digests (GateResult.target_spec_digest)
    levers: tuple[str, ...] | None = None  # levers.toml digests (GateResult.levers_digest)

    @property
    def pinned(self) -> bool:
        return (self.bands, self.targets, self.levers) != (None, None, None)

    def unpinned(
        self, *, target: str, target_spec: str | None, band: str | None, levers: str | None, band_judged: bool
    ) -> list[UnpinnedInput]:
        """What a verdict was decided by that this section does not allow (empty: nothing).

        The target spec counts for every verdict (it decides which keys vouch); the band and the
        lever list only where the band judged (tier 2 and not bit-exact): a bit-exact verdict holds
        whatever they say, so re-measuring a band never holds back a bit-exact release."""
        out = []
        if self.targets is not None:
            allowed = self.targets.get(target, ())
            if target_spec is None or target_spec not in allowed:
                out.append(UnpinnedInput("target spec", f"targets.{_toml_key(target)}", target_spec, allowed))
        if band_judged:
            for kind, key, found, allowed_or_none in (
                ("band", "bands", band, self.bands),
                ("lever list", "levers", levers, self.levers),
            ):
                if allowed_or_none is not None and (found is None or found not in allowed_or_none):
                    out.append(UnpinnedInput(kind, key, found, allowed_or_none))
        return out


def _gate_inputs_section(doc: _GateInputsFile | None) -> GateInputPins:
    """The ``[gate_inputs]`` section; absent: nothing pinned. A key left out pins nothing of its kind;
    an empty list allows none (``bands = []``: only bit-exact verdicts)."""
    if doc is None:
        return GateInputPins()
    return GateInputPins(
        bands=None if doc.bands is None else tuple(doc.bands),
        targets=None if doc.targets is None else {t: tuple(d) for t, d in doc.targets.items()},
        levers=None if doc.levers is None else tuple(doc.levers),
    )
