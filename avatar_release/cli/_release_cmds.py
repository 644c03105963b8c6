"""Commands that move channels and keep the store: promote, approve, revoke, rollback, history, gc, keys."""

from __future__ import annotations

from typing import TYPE_CHECKING

import click

from ..ops import collect_garbage
from ..promote import MoveResult, promote, rollback
from ..promote.actions import approve, refresh_timestamp, revoke_build, sign_channel
from ..promote.dry_run import plan_promotion, plan_rollback
from ..promote.signed import SignedChannels
from ..records import CHANNELS
from ..registry import open_registry
from ..trust.keys import generate_keypair, load_private_key
from ..trust.policy import load_policy
from ..trust.state_read import load_state
from ._app import _emit, _next_step, cli, json_option
from ._options import channel_choice, complete_ref, nonempty_ref, project_option, registry_option, signing_options
from ._summary import append_step_summary, promote_summary

if TYPE_CHECKING:
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey


# ---------------------------------------------------------------------------------- promotion
def _signing_key(path: str | None) -> Ed25519PrivateKey | None:
    if not path:
        return None

    return load_private_key(path)


def _move_human(r: MoveResult, verb: str) -> str:
    d, e = r.decision, r.entry
    if e is None:  # not r.changed
        return f"{d.channel} already points at {d.build_id}: nothing changed"
    gate = f"; gate result {d.gate_result_digest}" if d.gate_result_digest else ""
    signed = (
        f"\n  signed statement #{r.statement.payload.sequence}, expires {r.statement.payload.expires_at}"
        if r.statement
        else ""
    )
    approved = f"\n  release approved by {', '.join(d.approvals)}" if d.approvals else ""
    if r.approved_here is not None:
        approved += " (signed now with this machine's release key: on one machine it holds both roles)"
    return (
        f"{verb}: {d.channel} {r.previous or '(empty)'} -> {d.build_id}\n"
        f"  history #{e.sequence} by {e.who} at {e.when}{gate}{signed}{approved}"
    )


@cli.command("promote")
@click.argument("ref", shell_complete=complete_ref, callback=nonempty_ref)
@click.option("--to", "channel", required=True, type=channel_choice)
@click.option("--reason", default="", help="Recorded in the history.")
@click.option("--dry-run", is_flag=True, help="Show the decision, its evidence and what would move; write nothing.")
@signing_options
@registry_option
@project_option
@json_option
def promote_cmd(
    ref: str,
    channel: str,
    reason: str,
    dry_run: bool,
    sign_key: str | None,
    valid_days: float,
    registry_uri: str | None,
    as_json: bool,
) -> None:
    """Move a channel to REF if the policy allows it (exit 1 with the reason if not)."""
    if dry_run:
        plan = plan_promotion(open_registry(registry_uri, create=False), ref, channel)
        _emit(as_json, {"ok": True, **plan.to_json()}, plan.text())
        return
    r = promote(
        open_registry(registry_uri, create=False),
        ref,
        channel,
        reason=reason,
        signing_key=_signing_key(sign_key),
        valid_days=valid_days,
    )
    after = {"dev": "staging", "staging": "prod"}.get(channel)  # the channel this build goes to next
    nxt = f"avatar-release promote {r.decision.build_id} --to {after}" if after else None
    append_step_summary(promote_summary(r, nxt))
    _emit(
        as_json,
        {"ok": True, **r.to_json(), "next": nxt},
        _move_human(r, "promoted") + (f"\n{_next_step(nxt)}" if nxt else ""),
    )


@cli.command("approve")
@click.argument("ref", shell_complete=complete_ref, callback=nonempty_ref)
@click.option(
    "--key",
    "key_path",
    default=None,
    envvar="AVATAR_RELEASE_APPROVER_KEY",
    help="The approver's Ed25519 private key (default: this machine's release key).",
)
@click.option("--as", "approver", default=None, help="The approver's name in the trust policy (default: the key's).")
@click.option("--note", default="", help="Recorded in the signed approval.")
@registry_option
@project_option
@json_option
def approve_cmd(
    ref: str, key_path: str | None, approver: str | None, note: str, registry_uri: str | None, as_json: bool
) -> None:
    """Sign a release approval of REF for prod: the second role, by a key other than the gate's.

    It approves the signed gate result that lets REF into prod now; a re-gate needs a new one."""
    a = approve(
        open_registry(registry_uri, create=False), ref, private_key=_signing_key(key_path), approver=approver, note=note
    )
    nxt = f"avatar-release promote {a.build_id} --to prod"
    _emit(
        as_json,
        {"ok": True, "approval": a.to_json(), "next": nxt},
        f"approved {a.build_id} for prod as {a.approver} (gate result {a.gate_result_digest})\n"
        f"  approval {a.digest}\n{_next_step(nxt)}",
    )


@cli.command("revoke")
@click.argument("ref", shell_complete=complete_ref, callback=nonempty_ref)
@click.option("--reason", required=True, help="Why: shown to everyone the revocation refuses.")
@click.option(
    "--key",
    "key_path",
    default=None,
    envvar="AVATAR_RELEASE_REVOKE_KEY",
    help="An Ed25519 private key the trust policy names (default: this machine's release key). Pods "
    "with --trust-key count a revocation signed by that key.",
)
@registry_option
@json_option
def revoke_cmd(ref: str, reason: str, key_path: str | None, registry_uri: str | None, as_json: bool) -> None:
    """Revoke REF for good: promotion, rollback and pods refuse it from now on.

    A channel that holds it keeps it until you move it (a following pod says it serves a revoked
    build in its log, /healthz and metrics): roll back or promote a fixed build next."""
    reg = open_registry(registry_uri, create=False)
    r = revoke_build(reg, ref, reason=reason, private_key=_signing_key(key_path))
    holding = [c for c in CHANNELS if (s := reg.get_channel(c)) is not None and s.build_id == r.build_id]
    nxt = f"avatar-release rollback {holding[-1]}" if holding else None
    hold = f"\n  still in {', '.join(holding)}: move it" if holding else ""
    _emit(
        as_json,
        {"ok": True, "revocation": r.to_json(), "channels": holding, "next": nxt},
        f"revoked {r.build_id}: {r.reason}\n  revocation {r.envelope_digest}{hold}"
        + (f"\n{_next_step(nxt)}" if nxt else ""),
    )


@cli.command("rollback")
@click.argument("channel", type=channel_choice)
@click.option("--to", "to", default=None, help="Build to return to (default: the one before the current).")
@click.option("--reason", default="", help="Recorded in the history.")
@click.option(
    "--dry-run",
    is_flag=True,
    help="Show the decision, the move it undoes and where the channel would go; write nothing.",
)
@signing_options
@registry_option
@project_option
@json_option
def rollback_cmd(
    channel: str,
    to: str | None,
    reason: str,
    dry_run: bool,
    sign_key: str | None,
    valid_days: float,
    registry_uri: str | None,
    as_json: bool,
) -> None:
    """Move CHANNEL back to an earlier build that passed its gates."""
    reg = open_registry(registry_uri, create=False)
    plan = plan_rollback(reg, channel, to=to)  # the same decision as the move, and which move it undoes
    if dry_run:
        _emit(as_json, {"ok": True, **plan.to_json()}, plan.text())
        return
    r = rollback(reg, channel, to=to, reason=reason, signing_key=_signing_key(sign_key), valid_days=valid_days)
    u = plan.undoes
    undid = (
        f"\n  undid #{u.sequence} ({u.action} {u.from_build} -> {u.to_build} by {u.who} at {u.when})"
        if u is not None and r.changed
        else ""
    )
    _emit(
        as_json,
        {"ok": True, **r.to_json(), "undid": u.sequence if u is not None and r.changed else None},
        _move_human(r, "rolled back") + undid,
    )


@cli.command("history")
@click.argument("channel", required=False, type=channel_choice)
@registry_option
@json_option
def history_cmd(channel: str | None, registry_uri: str | None, as_json: bool) -> None:
    """The history of channel moves (all channels, or one), as the signed release state records it."""
    reg = open_registry(registry_uri, create=False)
    signed = SignedChannels(reg, load_state(reg, load_policy()))
    entries = sorted(
        (e for ch in ([channel] if channel else CHANNELS) for e in signed.history(ch)), key=lambda e: e.when
    )
    human = (
        "\n".join(
            f"#{e.sequence:<4} {e.when[:19]}  {e.channel:<8} {e.action:<8} {(e.from_build or '-'):<26} -> "
            f"{e.to_build:<26} {e.who}  {e.reason}"
            for e in entries
        )
        or "no history"
    )
    _emit(as_json, {"ok": True, "entries": [e.model_dump(mode="json") for e in entries]}, human)


@cli.command("gc")
@click.option("--prune-builds", is_flag=True, help="Also drop builds no channel points at and staging/prod never held.")
@click.option(
    "--min-age",
    "min_age_s",
    default=3600.0,
    show_default=True,
    type=float,
    help="Seconds an unreferenced blob must be old before it is deleted (publishes in flight).",
)
@click.option("--dry-run", is_flag=True, help="Report what would go; delete nothing.")
@registry_option
@json_option
def gc_cmd(prune_builds: bool, min_age_s: float, dry_run: bool, registry_uri: str | None, as_json: bool) -> None:
    """Delete unreferenced blobs (never anything a channel or a rollback can reach)."""
    r = collect_garbage(
        open_registry(registry_uri, create=False), prune_builds=prune_builds, min_age_s=min_age_s, dry_run=dry_run
    )
    verb = "would delete" if dry_run else "deleted"
    _emit(
        as_json,
        {"ok": True, **r.to_json()},
        f"{verb} {r.deleted_blobs} blobs ({r.freed_bytes / 1e6:.2f} MB) and {len(r.pruned_builds)} builds; "
        f"kept {len(r.kept_builds)} builds, {r.kept_blobs} blobs ({r.young_blobs} too young to judge)",
    )


# ---------------------------------------------------------------------------------- keys
@cli.group("keys")
def keys_group() -> None:
    """Ed25519 keys for signed promotions."""


@keys_group.command("generate")
@click.option("--out", "out_dir", default="keys", show_default=True, help="Folder for NAME.key and NAME.pub.")
@click.option("--name", default="release", show_default=True)
@json_option
def keys_generate_cmd(out_dir: str, name: str, as_json: bool) -> None:
    """Create a signing key (0600) and its public key; never overwrites."""
    priv, pub, kid = generate_keypair(out_dir, name)
    _emit(
        as_json,
        {"ok": True, "private_key": str(priv), "public_key": str(pub), "key_id": kid},
        f"key {kid}\n  private {priv} (keep it on the release machine)\n  public  {pub} (give it to serving pods)",
    )


@keys_group.command("sign")
@click.argument("channel", type=channel_choice)
@click.option("--key", "key_path", required=True, envvar="AVATAR_RELEASE_SIGNING_KEY")
@click.option("--valid-days", default=30.0, show_default=True, type=float)
@registry_option
@json_option
def keys_sign_cmd(channel: str, key_path: str, valid_days: float, registry_uri: str | None, as_json: bool) -> None:
    """(Re-)sign the statement for where CHANNEL points now (e.g. before it expires)."""
    st = sign_channel(
        open_registry(registry_uri, create=False), channel, load_private_key(key_path), valid_days=valid_days
    )
    p = st.payload
    _emit(
        as_json,
        {"ok": True, "statement": st.model_dump(mode="json")},
        f"signed {channel} -> {p.build_id} (sequence {p.sequence}), expires {p.expires_at}",
    )


@keys_group.command("refresh")
@click.argument("channel", type=channel_choice)
@click.option("--key", "key_path", required=True, envvar="AVATAR_RELEASE_SIGNING_KEY")
@click.option(
    "--valid-hours",
    default=None,
    type=float,
    help="How long the timestamp vouches for the channel's newest statement (default: the trust "
    "policy's [timestamps] validity_hours, 1 h unless set).",
)
@registry_option
@json_option
def keys_refresh_cmd(
    channel: str, key_path: str, valid_hours: float | None, registry_uri: str | None, as_json: bool
) -> None:
    """Re-sign the short-lived timestamp of CHANNEL's newest signed move (run it on a schedule)."""
    ts = refresh_timestamp(
        open_registry(registry_uri, create=False), channel, load_private_key(key_path), valid_hours=valid_hours
    )
    p = ts.payload
    _emit(
        as_json,
        {"ok": True, "timestamp": p.model_dump(mode="json")},
        f"timestamp {channel} -> {p.build_id} (sequence {p.sequence}), expires {p.expires_at}",
    )
