"""``avatar-release diff A B``: what differs between two builds, as a table or ``--json``."""

from __future__ import annotations

from typing import Any

import click

from ..errors import Refusal
from ..promote.diff import SECTIONS, BuildDiff, diff_builds
from ..registry import open_registry
from ._app import _finish, cli, json_option
from ._options import complete_ref, nonempty_ref, registry_option

_WIDTH = 36  # a value wider than this is cut in the table (never in --json)


def _cell(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if isinstance(value, int) and not isinstance(value, bool):
        return f"{value:,}"
    if isinstance(value, list):
        value = ", ".join(map(str, value)) or "[]"
    text = str(value)
    return text if len(text) <= _WIDTH else text[: _WIDTH - 1] + "…"


def _change(a: Any, b: Any) -> str:
    """``+11.7%`` between two numbers (nothing for anything else, or from zero)."""
    numbers = all(isinstance(v, int | float) and not isinstance(v, bool) for v in (a, b))
    return f"{(b - a) / abs(a):+.1%}" if numbers and a else ""


def diff_table(d: BuildDiff, sections: tuple[str, ...]) -> str:
    """The human table: one row per differing field, then the sections that agree entirely."""
    rows = [r for r in d.differences if r.section in sections]
    head = [f"A {d.a.build_id} ({d.a.digest[:19]})", f"B {d.b.build_id} ({d.b.digest[:19]})"]
    if not rows:
        return "\n".join([*head, "no differences" + ("" if sections == SECTIONS else " in " + ", ".join(sections))])
    kw = max(len("FIELD"), *(len(r.key) for r in rows))
    sw = max(len("SECTION"), *(len(r.section) for r in rows))
    lines = [*head, "", f"{'SECTION':<{sw}}  {'FIELD':<{kw}}  {'A':<{_WIDTH}}  {'B':<{_WIDTH}}  CHANGE".rstrip()]
    lines += [
        f"{r.section:<{sw}}  {r.key:<{kw}}  {_cell(r.a):<{_WIDTH}}  {_cell(r.b):<{_WIDTH}}  "
        f"{_change(r.a, r.b)}".rstrip()
        for r in rows
    ]
    agree = [s for s in sections if d.same.get(s) and not any(r.section == s for r in rows)]
    if agree:
        lines += ["", "the same: " + ", ".join(f"{s} ({d.same[s]} fields)" for s in agree)]
    if d.identical:
        lines.append("the same binary and inputs: only bookkeeping and gate verdicts differ")
    return "\n".join(lines)


@cli.command("diff")
@click.argument("a", metavar="A", shell_complete=complete_ref, callback=nonempty_ref)
@click.argument("b", metavar="B", shell_complete=complete_ref, callback=nonempty_ref)
@click.option(
    "--section",
    "sections",
    multiple=True,
    type=click.Choice(SECTIONS),
    help="Show only these sections (repeatable; default: all).",
)
@click.option(
    "--exit-code",
    is_flag=True,
    help="Exit 1 when the builds differ in more than bookkeeping (as git diff "
    "--exit-code): for a CI step that expects a rebuild to be the same build.",
)
@registry_option
@json_option
def diff_cmd(
    a: str, b: str, sections: tuple[str, ...], exit_code: bool, registry_uri: str | None, as_json: bool
) -> None:
    """What differs between builds A and B (channels, build ids or digests): toolchain, platform, flags,
    overrides, config, source and weights digests, executables (HLO digests, sizes, cost estimates,
    memory) and gate verdicts with what they were compared with."""
    d = diff_builds(open_registry(registry_uri, create=False), a, b)
    chosen = sections or SECTIONS
    payload = d.to_json()
    payload["differences"] = [r for r in payload["differences"] if r["section"] in chosen]
    failure = None
    if exit_code and not d.identical:
        failure = Refusal(
            f"{d.a.build_id} and {d.b.build_id} differ in {len(d.substantive)} fields beyond "
            "bookkeeping and gate verdicts"
        )
    _finish(as_json, payload, diff_table(d, chosen), failure)
