"""``avatar-release specs``: the formats of the files a project writes under ``manifests/``.

``specs schema [KIND]`` prints the JSON Schema of a pipeline, target, flag profile, lever list or
band, generated from the models the loaders validate with (the docs site's "Reference > Spec
formats" page is rendered from the same models).
"""

from __future__ import annotations

import json

import click

from ..specs import SPEC_KINDS, spec_schema
from ._app import cli


@cli.group("specs")
def specs_group() -> None:
    """The formats of the project's files under manifests/ (pipelines, targets, flags, levers, bands)."""


@specs_group.command("schema")
# A plain argument, not click.Choice: a mistyped kind gets "did you mean" and the list (exit 2).
@click.argument(
    "kind",
    required=False,
    shell_complete=lambda ctx, param, incomplete: [k for k in SPEC_KINDS if k.startswith(incomplete)],
)
def schema_cmd(kind: str | None) -> None:
    """Print the JSON Schema of KIND (pipeline, target, flags, levers, band); without KIND, every kind's
    schema, keyed by kind.

    \b
    Examples:
      avatar-release specs schema pipeline
      avatar-release specs schema > specs.schema.json
    """
    doc = spec_schema(kind) if kind else {k: spec_schema(k) for k in SPEC_KINDS}
    click.echo(json.dumps(doc, indent=2, sort_keys=True))
