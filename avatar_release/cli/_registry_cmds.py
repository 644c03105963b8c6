"""Commands between registries: copy (mirror a build with everything that belongs to it), repair
(good bytes for a build's damaged blobs from a registry that holds the same build)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import click

from ..errors import NotFoundError
from ..ops.copy import CopyReport, copy_build
from ..ops.repair import repair_build
from ..registry import RegistryChoice, config_files, find_registry, load_config, open_registry
from ._app import _emit, _finish, _progress, cli, json_option
from ._options import channel_choice, complete_ref, nonempty_ref, registry_option


def _destination(ctx: click.Context, param: click.Parameter, value: str) -> str:
    return value if ctx.resilient_parsing else find_registry(value, create=True).uri


def _copy_human(r: CopyReport) -> str:
    lines = [
        f"copied {r.build_id}: {r.source} -> {r.destination}",
        f"  build {'published' if r.build_created else 'already there'} as {r.destination_digest}",
        f"  blobs: {r.blobs_copied} copied ({r.bytes_copied} bytes), {r.blobs_present} already there",
        f"  records: {len(r.records_copied)} copied, {r.records_present} already there",
    ]
    if r.channel:
        lines.append(
            f"  {r.channel} -> {r.build_id} ({'moved' if r.channel_moved else 'already there'})"
            f"{'; signed statement copied' if r.statement_copied else '; no signed statement for it'}"
        )
    if r.statement_binds_store_digest:
        lines.append(
            f"  the statement binds the source store's digest: re-sign it here "
            f"(avatar-release keys sign {r.channel} --key KEY) before a trusting pod serves it"
        )
    lines.append(f"  {r.seconds:.2f}s")
    return "\n".join(lines)


@cli.command("copy")
@click.argument("ref", shell_complete=complete_ref, callback=nonempty_ref)
@click.option(
    "--to",
    "to_uri",
    required=True,
    callback=_destination,
    metavar="URI|PATH|NAME",
    help="Destination registry (same forms as --registry; a new directory is created).",
)
@click.option(
    "--channel",
    default=None,
    type=channel_choice,
    help="Also point this channel at the build in the destination (with its signed statement).",
)
@registry_option
@json_option
def copy_cmd(ref: str, to_uri: str, channel: str | None, registry_uri: str | None, as_json: bool) -> None:
    """Mirror build REF (channel, build id or digest) from --registry into --to: blobs, manifest and
    every record of the build, verified on the way; re-running skips what is already there."""
    report = copy_build(
        open_registry(registry_uri, create=False), open_registry(to_uri), ref, channel=channel, progress=_progress()
    )
    _emit(as_json, {"ok": True, **report.to_dict()}, _copy_human(report))


@cli.command("repair")
@click.argument("ref", shell_complete=complete_ref, callback=nonempty_ref)
@click.option(
    "--from",
    "from_uri",
    required=True,
    metavar="URI|PATH|NAME",
    help="A registry holding the same build with good bytes (same forms as --registry).",
)
@registry_option
@json_option
def repair_cmd(ref: str, from_uri: str, registry_uri: str | None, as_json: bool) -> None:
    """Re-put every blob of build REF in --registry whose stored bytes fail verification, taking
    them from --from (verified there by digest first); blobs that pass, the build and its records
    are left as they are. Then `avatar-release verify REF` passes."""
    source = open_registry(find_registry(from_uri).uri, create=False)
    report = repair_build(open_registry(registry_uri, create=False), source, ref, progress=_progress())
    human = (
        f"{report.build_id}: {len(report.repaired)} of {report.checked} blobs repaired from {report.source}"
        + "".join(f"\n  {r['digest'][:19]}  was: {r['was']}" for r in report.repaired)
    )
    _emit(as_json, {"ok": True, **report.to_dict()}, human)


_CONFIG_HELP = """Show which registry commands run here use, why, and the registries config files name.

\b
The registry is found as git finds a repository, first match wins:
  1. --registry URI|PATH|NAME
  2. $AVATAR_RELEASE_REGISTRY (the same forms)
  3. `default` in the nearest avatar-release.toml (this directory or one above)
  4. `default` in the user's config.toml ($AVATAR_RELEASE_CONFIG, else
     $AVATAR_RELEASE_CONFIG_DIR, $XDG_CONFIG_HOME/avatar-release or ~/.config/avatar-release)
  5. the nearest .avatar-release/ holding builds, upward from here

\b
A config file (paths are relative to the file):
  default = "team"
  [registries.local]
  uri = ".avatar-release"
  [registries.team]
  uri = "oci+https://registry.example.com/avatar"
  ca = "certs/team-ca.pem"

Exit 3 when no registry is found (the places looked are listed), 2 for a malformed config file.
"""


@cli.command("registries", help=_CONFIG_HELP)
@click.option(
    "--registry",
    "registry_uri",
    default=None,
    metavar="URI|PATH|NAME",
    help="Resolve this value instead of the default.",
)
@json_option
def registries_cmd(registry_uri: str | None, as_json: bool) -> None:
    files = config_files(Path.cwd(), os.environ)
    configs = [load_config(f) for f in files]
    try:
        choice: RegistryChoice | None = find_registry(registry_uri, configs=configs)
        missing = None
    except NotFoundError as e:
        choice, missing = None, e
    named: list[dict[str, Any]] = [
        {"name": n.name, "uri": n.uri, "file": str(c.path), "default": c.default == n.name}
        for c in configs
        for n in c.registries.values()
    ]
    payload = {
        "current": choice.to_dict() if choice else None,
        "config_files": [str(f) for f in files],
        "registries": named,
    }
    lines = [f"current: {choice.uri}\n  because: {choice.source}" if choice else "current: none found"]
    lines.append("config files: " + (", ".join(str(f) for f in files) or "none"))
    width = max((len(n["name"]) for n in named), default=4)
    lines += [f"  {'*' if n['default'] else ' '} {n['name']:<{width}}  {n['uri']}  ({n['file']})" for n in named]
    if missing is not None:
        _finish(as_json, payload, "\n".join(lines), failure=missing)
        return
    _emit(as_json, {"ok": True, **payload}, "\n".join(lines))
