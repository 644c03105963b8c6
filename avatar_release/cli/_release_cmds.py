"""Commands that move channels and keep the store: promote, rollback, history, gc, keys."""

from __future__ import annotations


import click

from ..ops import collect_garbage
from ..promote import promote, rollback
from ..promote.actions import refresh_timestamp, sign_channel
from ..registry import open_registry
from ..trust.keys import generate_keypair, load_private_key
from ._app import _emit, _next_step, channel_choice, cli, json_option, project_option, registry_option, signing_options
from ._summary import append_step_summary, promote_summary


# ---------------------------------------------------------------------------------- promotion
def _signing_key(path):
    if not path:
        return None

    return load_private_key(path)


def _move_human(r, verb: str) -> str:
    d = r.decision
    if not r.changed:
        return f"{d.channel} already points at {d.build_id}: nothing changed"
    e = r.entry
    gate = f"; gate result {d.gate_result_digest}" if d.gate_result_digest else ""
    signed = f"\n  signed statement #{r.statement.payload.sequence}, expires {r.statement.payload.expires_at}" \
        if r.statement else ""
    return (f"{verb}: {d.channel} {r.previous or '(empty)'} -> {d.build_id}\n"
            f"  history #{e.sequence} by {e.who} at {e.when}{gate}{signed}")


@cli.command("promote")
@click.argument("ref")
@click.option("--to", "channel", required=True, type=channel_choice)
@click.option("--reason", default="", help="Recorded in the history.")
@signing_options
@registry_option
@project_option
@json_option
def promote_cmd(ref, channel, reason, sign_key, valid_days, registry_uri, as_json):
    """Move a channel to REF if the policy allows it (exit 1 with the reason if not)."""
    r = promote(open_registry(registry_uri, create=False), ref, channel, reason=reason,
                signing_key=_signing_key(sign_key), valid_days=valid_days)
    after = {"dev": "staging", "staging": "prod"}.get(channel)  # the channel this build goes to next
    nxt = f"avatar-release promote {r.decision.build_id} --to {after}" if after else None
    append_step_summary(promote_summary(r, nxt))
    _emit(as_json, {"ok": True, **r.to_json(), "next": nxt},
          _move_human(r, "promoted") + (f"\n{_next_step(nxt)}" if nxt else ""))


@cli.command("rollback")
@click.argument("channel", type=channel_choice)
@click.option("--to", "to", default=None, help="Build to return to (default: the one before the current).")
@click.option("--reason", default="", help="Recorded in the history.")
@signing_options
@registry_option
@project_option
@json_option
def rollback_cmd(channel, to, reason, sign_key, valid_days, registry_uri, as_json):
    """Move CHANNEL back to an earlier build that passed its gates."""
    r = rollback(open_registry(registry_uri, create=False), channel, to=to, reason=reason,
                 signing_key=_signing_key(sign_key), valid_days=valid_days)
    _emit(as_json, {"ok": True, **r.to_json()}, _move_human(r, "rolled back"))


@cli.command("history")
@click.argument("channel", required=False, type=channel_choice)
@registry_option
@json_option
def history_cmd(channel, registry_uri, as_json):
    """The append-only history of channel moves (all channels, or one)."""
    entries = open_registry(registry_uri, create=False).history(channel)
    human = "\n".join(
        f"#{e.sequence:<4} {e.when[:19]}  {e.channel:<8} {e.action:<8} {(e.from_build or '-'):<26} -> "
        f"{e.to_build:<26} {e.who}  {e.reason}" for e in entries) or "no history"
    _emit(as_json, {"ok": True, "entries": [e.model_dump(mode="json") for e in entries]}, human)



@cli.command("gc")
@click.option("--prune-builds", is_flag=True,
              help="Also drop builds no channel points at and staging/prod never held.")
@click.option("--min-age", "min_age_s", default=3600.0, show_default=True, type=float,
              help="Seconds an unreferenced blob must be old before it is deleted (publishes in flight).")
@click.option("--dry-run", is_flag=True, help="Report what would go; delete nothing.")
@registry_option
@json_option
def gc_cmd(prune_builds, min_age_s, dry_run, registry_uri, as_json):
    """Delete unreferenced blobs (never anything a channel or a rollback can reach)."""
    r = collect_garbage(open_registry(registry_uri, create=False), prune_builds=prune_builds,
                        min_age_s=min_age_s, dry_run=dry_run)
    verb = "would delete" if dry_run else "deleted"
    _emit(as_json, {"ok": True, **r.to_json()},
          f"{verb} {r.deleted_blobs} blobs ({r.freed_bytes / 1e6:.2f} MB) and {len(r.pruned_builds)} builds; "
          f"kept {len(r.kept_builds)} builds, {r.kept_blobs} blobs ({r.young_blobs} too young to judge)")


# ---------------------------------------------------------------------------------- keys
@cli.group("keys")
def keys_group() -> None:
    """Ed25519 keys for signed promotions."""


@keys_group.command("generate")
@click.option("--out", "out_dir", default="keys", show_default=True, help="Folder for NAME.key and NAME.pub.")
@click.option("--name", default="release", show_default=True)
@json_option
def keys_generate_cmd(out_dir, name, as_json):
    """Create a signing key (0600) and its public key; never overwrites."""
    priv, pub, kid = generate_keypair(out_dir, name)
    _emit(as_json, {"ok": True, "private_key": str(priv), "public_key": str(pub), "key_id": kid},
          f"key {kid}\n  private {priv} (keep it on the release machine)\n  public  {pub} (give it to serving pods)")


@keys_group.command("sign")
@click.argument("channel", type=channel_choice)
@click.option("--key", "key_path", required=True, envvar="AVATAR_RELEASE_SIGNING_KEY")
@click.option("--valid-days", default=30.0, show_default=True, type=float)
@registry_option
@json_option
def keys_sign_cmd(channel, key_path, valid_days, registry_uri, as_json):
    """(Re-)sign the statement for where CHANNEL points now (e.g. before it expires)."""
    st = sign_channel(open_registry(registry_uri, create=False), channel, _signing_key(key_path),
                      valid_days=valid_days)
    p = st.payload
    _emit(as_json, {"ok": True, "statement": st.model_dump(mode="json")},
          f"signed {channel} -> {p.build_id} (sequence {p.sequence}), expires {p.expires_at}")


@keys_group.command("refresh")
@click.argument("channel", type=channel_choice)
@click.option("--key", "key_path", required=True, envvar="AVATAR_RELEASE_SIGNING_KEY")
@click.option("--valid-hours", default=None, type=float,
              help="How long the timestamp vouches for the channel's newest statement (default: the trust "
                   "policy's [timestamps] validity_hours, 1 h unless set).")
@registry_option
@json_option
def keys_refresh_cmd(channel, key_path, valid_hours, registry_uri, as_json):
    """Re-sign the short-lived timestamp of CHANNEL's newest signed move (run it on a schedule)."""
    ts = refresh_timestamp(open_registry(registry_uri, create=False), channel, _signing_key(key_path),
                           valid_hours=valid_hours)
    p = ts.payload
    _emit(as_json, {"ok": True, "timestamp": p.model_dump(mode="json")},
          f"timestamp {channel} -> {p.build_id} (sequence {p.sequence}), expires {p.expires_at}")
