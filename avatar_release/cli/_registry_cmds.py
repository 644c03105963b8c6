"""Commands between registries: copy (mirror a build with everything that belongs to it)."""

from __future__ import annotations

import click

from ..ops.copy import CopyReport, copy_build
from ..registry import open_registry
from ._app import _emit, _progress, channel_choice, cli, json_option, registry_option


def _copy_human(r: CopyReport) -> str:
    lines = [
        f"copied {r.build_id}: {r.source} -> {r.destination}",
        f"  build {'published' if r.build_created else 'already there'} as {r.destination_digest}",
        f"  blobs: {r.blobs_copied} copied ({r.bytes_copied} bytes), {r.blobs_present} already there",
        f"  records: {len(r.records_copied)} copied, {r.records_present} already there",
    ]
    if r.channel:
        lines.append(f"  {r.channel} -> {r.build_id} ({'moved' if r.channel_moved else 'already there'})"
                     f"{'; signed statement copied' if r.statement_copied else '; no signed statement for it'}")
    if r.statement_binds_store_digest:
        lines.append(f"  the statement binds the source store's digest: re-sign it here "
                     f"(avatar-release keys sign {r.channel} --key KEY) before a trusting pod serves it")
    lines.append(f"  {r.seconds:.2f}s")
    return "\n".join(lines)


@cli.command("copy")
@click.argument("ref")
@click.option("--to", "to_uri", required=True, help="Destination registry (same forms as --registry).")
@click.option("--channel", default=None, type=channel_choice,
              help="Also point this channel at the build in the destination (with its signed statement).")
@registry_option
@json_option
def copy_cmd(ref: str, to_uri: str, channel: str | None, registry_uri: str | None, as_json: bool) -> None:
    """Mirror build REF (channel, build id or digest) from --registry into --to: blobs, manifest and
    every record of the build, verified on the way; re-running skips what is already there."""
    report = copy_build(open_registry(registry_uri, create=False), open_registry(to_uri), ref, channel=channel,
                        progress=_progress())
    _emit(as_json, {"ok": True, **report.to_dict()}, _copy_human(report))
