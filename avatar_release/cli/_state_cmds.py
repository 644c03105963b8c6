"""``avatar-release registry``: the registry's signed release state (init, upgrade, refresh,
rotate, root, status), and ``migrate``, which moves an OCI repository to today's tag layout."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click

from .. import _atomic
from ..errors import NotFoundError
from ..registry import Registry, open_registry, read_manifest
from ..trust.evidence import attestation_refs
from ..trust.keys import load_private_key
from ..trust.policy import load_policy
from ..trust.revocation import revocations
from ..trust.state_files import NAMESPACE, versioned_name
from ..trust.state_read import ReleaseState, load_state
from ..trust.state_write import HistoryItem, init_state, refresh_state, rotate_state, upgrade_state
from ._app import _emit, cli, json_option
from ._options import registry_option


def _keys(paths: tuple[str, ...]) -> list[Any]:
    return [load_private_key(p) for p in paths]


def _state_json(state: ReleaseState) -> dict[str, Any]:
    out: dict[str, Any] = {
        "registry_id": state.registry_id,
        "sequence": state.sequence,
        "root_version": state.root.signed.version,
        "timestamp": {
            "version": state.timestamp.signed.version,
            "expires": state.timestamp.signed.expires.strftime("%Y-%m-%dT%H:%M:%SZ"),
        },
        "channels": {},
    }
    for channel in ("dev", "staging", "prod"):
        h = state.holder(channel)
        out["channels"][channel] = (
            None if h is None else {"build_id": h.build_id, "manifest_digest": h.manifest_digest, "version": h.version}
        )
    out["revoked"] = sorted(t.removeprefix("revoked/") for t in state.roles["revoked"].signed.targets)
    return out


def _state_human(verb: str, state: ReleaseState) -> str:
    j = _state_json(state)
    chans = ", ".join(f"{c} -> {v['build_id'] if v else '(empty)'}" for c, v in j["channels"].items())
    return (
        f"{verb}: root v{j['root_version']}, sequence {j['sequence']}, timestamp v{j['timestamp']['version']} "
        f"expires {j['timestamp']['expires']}\n  {chans}"
        + (f"\n  revoked: {', '.join(j['revoked'])}" if j["revoked"] else "")
    )


_key_option = click.option(
    "--sign-key",
    "sign_keys",
    multiple=True,
    metavar="KEY",
    help="A private key to sign with (repeat; also AVATAR_RELEASE_STATE_KEYS and this "
    "machine's first-use keys, where the trust policy names them).",
)


@cli.group("registry")
def registry_group() -> None:
    """The registry's signed release state: what every promote, rollback, revoke and pod decides from."""


@registry_group.command("init")
@_key_option
@registry_option
@json_option
def init_cmd(sign_keys: tuple[str, ...], registry_uri: str | None, as_json: bool) -> None:
    """Sign a first release state for a new registry, from the trust policy's keys (once)."""
    reg = open_registry(registry_uri)
    state = init_state(reg, load_policy(), given=_keys(sign_keys))
    _emit(as_json, {"ok": True, **_state_json(state)}, _state_human(f"initialised {reg.uri}", state))


def _unsigned_history(reg: Registry) -> dict[str, list[HistoryItem]]:
    out: dict[str, list[HistoryItem]] = {}
    for e in reg.history():
        m = read_manifest(reg, e.to_digest)[1]
        out.setdefault(e.channel, []).append(
            HistoryItem(
                e.channel,
                e.action,
                e.to_build,
                m.content_digest(),
                e.who,
                e.when,
                e.reason,
                e.from_build,
                None,
                e.gate_result_digest,
            )
        )
    return out


@registry_group.command("upgrade")
@_key_option
@registry_option
@json_option
def upgrade_cmd(sign_keys: tuple[str, ...], registry_uri: str | None, as_json: bool) -> None:
    """Sign the state an existing (unsigned) registry holds now: each channel's history and where it
    points, and its revocations. Run once, by whoever vouches for that state."""
    reg = open_registry(registry_uri, create=False)
    policy = load_policy()
    revoked = []
    for build_id in reg.list_records("attestations"):
        try:
            _, m = read_manifest(reg, build_id)
        except NotFoundError:  # a build id whose manifest is gone: nothing to revoke
            continue
        found = revocations(reg, build_id, m.content_digest(), policy.revoker_keys())
        if found:
            ref = next(r for r in attestation_refs(reg, build_id) if r.digest == found[0].envelope_digest)
            revoked.append(
                {
                    "build_id": build_id,
                    "manifest_digest": m.content_digest(),
                    "envelope": ref,
                    "reason": found[0].reason,
                    "by": found[0].by,
                    "at": found[0].at,
                }
            )
    state = upgrade_state(reg, policy, _unsigned_history(reg), revoked, given=_keys(sign_keys))
    _emit(as_json, {"ok": True, **_state_json(state)}, _state_human(f"signed the state of {reg.uri}", state))


@registry_group.command("migrate")
@registry_option
@json_option
def migrate_cmd(registry_uri: str | None, as_json: bool) -> None:
    """Move an OCI repository written before 2026-12-01 (tags _b.*, _r.*, _history, _pending) to the
    tag layout this avatar-release reads (_avr.*): the same manifests under today's names, so every
    digest and signature stays valid; nothing is deleted. Other registries have one layout: nothing to do."""
    reg = open_registry(registry_uri, create=False)
    migrate = getattr(reg, "migrate_tags", None)
    if migrate is None:
        _emit(
            as_json,
            {"ok": True, "moved": [], "present": [], "too_long": []},
            f"{reg.uri}: one layout only (not an OCI repository): nothing to migrate",
        )
        return
    done = migrate()
    lines = [
        f"{reg.uri}: {len(done.moved)} tag(s) moved to the current layout"
        + (f", {len(done.present)} already there" if done.present else "")
    ]
    lines += [f"  {old} -> {new}" for old, new in done.moved]
    if done.too_long:
        lines.append(
            f"  not moved, today's name would pass the 128 characters of an OCI tag: {', '.join(done.too_long)} "
            "(compile those builds again: their ids are too long for this layout)"
        )
    _emit(
        as_json,
        {
            "ok": True,
            "moved": [list(m) for m in done.moved],
            "present": list(done.present),
            "too_long": list(done.too_long),
        },
        "\n".join(lines),
    )


@registry_group.command("refresh")
@_key_option
@registry_option
@json_option
def refresh_cmd(sign_keys: tuple[str, ...], registry_uri: str | None, as_json: bool) -> None:
    """Re-sign the short-lived timestamp (run it on a schedule well within [state] timestamp_minutes:
    following pods turn not-ready when it expires)."""
    reg = open_registry(registry_uri, create=False)
    state = refresh_state(reg, load_policy(), given=_keys(sign_keys))
    _emit(as_json, {"ok": True, **_state_json(state)}, _state_human("refreshed", state))


@registry_group.command("rotate")
@click.option(
    "--old-root-key",
    "old_keys",
    multiple=True,
    required=True,
    metavar="KEY",
    help="The current root keys (their threshold) that vouch for the new root (repeat).",
)
@_key_option
@registry_option
@json_option
def rotate_cmd(old_keys: tuple[str, ...], sign_keys: tuple[str, ...], registry_uri: str | None, as_json: bool) -> None:
    """Move the signed state to the keys the trust policy names now: a new root signed by the old root
    keys and the new ones; every role re-signed. Pods follow the chain from the root they pinned."""
    reg = open_registry(registry_uri, create=False)
    state = rotate_state(reg, load_policy(), _keys(old_keys), given=_keys(sign_keys))
    _emit(as_json, {"ok": True, **_state_json(state)}, _state_human("rotated", state))


@registry_group.command("root")
@click.option(
    "--out",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    help="Write the root metadata here (what pods pin with --trust-root); default: print it.",
)
@click.option(
    "--version",
    "version",
    type=int,
    default=1,
    show_default=True,
    help="Which root version (a pod pinned to any version follows the chain to the newest).",
)
@registry_option
@json_option
def root_cmd(out: Path | None, version: int, registry_uri: str | None, as_json: bool) -> None:
    """Export the registry's root metadata, verified against the trust policy, for pods to pin."""
    reg = open_registry(registry_uri, create=False)
    state = load_state(reg, load_policy())
    data = reg.get_record(NAMESPACE, versioned_name("root", version))
    if data is None:
        raise click.BadParameter(
            f"the registry has root versions 1..{state.root.signed.version}", param_hint="--version"
        )
    if out is None:
        click.echo(data.decode())
        return
    _atomic.write_bytes(out, data)
    _emit(
        as_json,
        {"ok": True, "out": str(out), "version": version, "registry_id": state.registry_id},
        f"wrote root v{version} of {reg.uri} to {out}: pin it in pods with --trust-root {out}",
    )


@registry_group.command("status")
@registry_option
@json_option
def status_cmd(registry_uri: str | None, as_json: bool) -> None:
    """The signed state as this machine verifies it: versions, expiry, where each channel points."""
    reg = open_registry(registry_uri, create=False)
    state = load_state(reg, load_policy())
    _emit(as_json, {"ok": True, **_state_json(state)}, _state_human(reg.uri, state))
