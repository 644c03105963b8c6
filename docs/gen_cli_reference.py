"""The CLI reference page, written from the click commands themselves.

Every command and subcommand of ``avatar_release.cli.cli`` gets a section: its usage line, its help
text, its option tables and the exit codes its ``--help`` ends with. The tables are the rows click
itself writes for ``--help`` (a formatter that records them instead of laying them out), so a
command that shows extra rows, as ``gate`` shows ``gate run``'s options, shows them here too.
Nothing is typed by hand, so the page cannot drift from the commands: the docs site makes it on
every build (``docs/hooks.py``), and this script writes it for reading without a site:

    python3 docs/gen_cli_reference.py              # writes docs/reference/cli.md
    python3 docs/gen_cli_reference.py --out -      # prints it

The page depends on the commands only: contexts get a fixed terminal width, commands come in
click's sorted order, and no callback runs (``resilient_parsing``: no registry or environment
is read).
"""

from __future__ import annotations

import argparse
import inspect
import re
import sys
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

import click

ROOT = Path(__file__).resolve().parents[1]
WIDTH = 100  # the terminal width every context is given: the same page on every machine
PROG = "avatar-release"
_EXIT_CODES = re.compile(r"Exit codes: (.*)\.\s*$", re.S)
_CODE = re.compile(r"(\d+) (.+)")


def _root() -> click.Group:
    if str(ROOT) not in sys.path:  # this checkout's commands, installed or not
        sys.path.insert(0, str(ROOT))
    from avatar_release.cli import cli  # imported on first use, not when the hook loads this file

    return cli


def _context(command: click.Command, name: str, parent: click.Context | None) -> click.Context:
    return click.Context(
        command, info_name=name, parent=parent, terminal_width=WIDTH, max_content_width=WIDTH, resilient_parsing=True
    )


def _subcommands(ctx: click.Context) -> list[tuple[str, click.Command]]:
    """A group's commands as its ``--help`` lists them (hidden ones left out)."""
    group = ctx.command
    if not isinstance(group, click.Group):
        return []
    found = ((n, group.get_command(ctx, n)) for n in group.list_commands(ctx))
    return [(n, c) for n, c in found if c is not None and not c.hidden]


def walk(group: click.Group | None = None) -> Iterator[tuple[click.Context, click.Command]]:
    """Every command under ``group`` (default: the CLI) as (its context, the command), depth first,
    each group before its subcommands."""
    stack = [_context(group or _root(), PROG, None)]
    while stack:
        ctx = stack.pop()
        if ctx.parent is not None:
            yield ctx, ctx.command
        stack.extend(_context(c, n, ctx) for n, c in reversed(_subcommands(ctx)))


def top_level_commands() -> list[str]:
    """The CLI's own commands (``compile``, ``gate``, ...), as ``avatar-release --help`` lists them."""
    root = _root()
    return [n for n, _ in _subcommands(_context(root, PROG, None))]


def anchor(ctx: click.Context) -> str:
    """``gate-run`` for ``avatar-release gate run``: the section's id on the page."""
    return "-".join(ctx.command_path.split()[1:])


# ------------------------------------------------------------------------------------ click's rows
class _Rows(click.HelpFormatter):
    """A help formatter that keeps the definition lists click writes, under their section names,
    instead of laying them out as text."""

    def __init__(self) -> None:
        super().__init__(width=WIDTH, max_width=WIDTH)
        self.sections: list[tuple[str, list[tuple[str, str]]]] = []

    @contextmanager
    def section(self, name: str) -> Iterator[None]:
        self.sections.append((name, []))
        yield

    def write_dl(self, rows: Sequence[tuple[str, str]], col_max: int = 30, col_spacing: int = 2) -> None:
        if not self.sections:
            self.sections.append(("", []))
        self.sections[-1][1].extend(rows)


def option_sections(ctx: click.Context) -> list[tuple[str, list[tuple[str, str]]]]:
    """(section name, rows) as the command's ``--help`` shows them, its "Commands" list aside."""
    rows = _Rows()
    ctx.command.format_options(ctx, rows)
    return [(name, found) for name, found in rows.sections if name != "Commands" and found]


def exit_codes(ctx: click.Context) -> list[tuple[int, str]]:
    """The codes the command's ``--help`` ends with, read from click's own rendering of it."""
    formatter = click.HelpFormatter(width=10_000)  # one line: nothing wrapped mid-meaning
    ctx.command.format_epilog(ctx, formatter)
    found = _EXIT_CODES.search(formatter.getvalue())
    if found is None:
        raise SystemExit(f"{ctx.command_path}: its --help does not end with 'Exit codes: ...'")
    codes = []
    for item in re.split(r"; (?=\d+ )", found.group(1)):  # a meaning may hold "; " itself
        m = _CODE.fullmatch(item.strip())
        if m is None:
            raise SystemExit(f"{ctx.command_path}: cannot read exit code {item!r}")
        codes.append((int(m.group(1)), m.group(2)))
    return codes


# ------------------------------------------------------------------------------------ Markdown
def _escape(text: str, *, cell: bool = False) -> str:
    """Markdown-safe prose: backtick spans kept as code, everything else escaped."""
    pieces = text.split("`")
    if len(pieces) % 2 == 0:  # an unmatched backtick: no code spans at all
        pieces = [text.replace("`", "\\`")]
    out = []
    for i, piece in enumerate(pieces):
        if i % 2:
            out.append(f"`{piece}`")
            continue
        piece = piece.replace("\\", "\\\\").replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
        out.append(re.sub(r"([*_\[\]])", r"\\\1", piece))
    joined = "".join(out)
    return joined.replace("|", "\\|") if cell else joined


def _code(text: str) -> str:
    """An inline code span for ``text`` (a longer fence when it holds backticks)."""
    fence = "``" if "`" in text else "`"
    return f"{fence}{text}{fence}"


def _paragraphs(doc: str | None) -> list[str]:
    """A click help text as Markdown blocks: ``\\b`` paragraphs (kept as typed) become text blocks,
    the others one line of prose each, as click rewraps them."""
    if not doc:
        return []
    blocks = []
    for para in re.split(r"\n\s*\n", inspect.cleandoc(doc).split("\f", 1)[0]):
        if para.startswith("\b"):
            blocks.append("```text\n" + para[1:].strip("\n") + "\n```")
        elif para.strip():
            blocks.append(_escape(" ".join(line.strip() for line in para.splitlines())))
    return blocks


def _usage(ctx: click.Context) -> list[str]:
    return ["```text", " ".join([ctx.command_path, *ctx.command.collect_usage_pieces(ctx)]), "```", ""]


def _tables(ctx: click.Context) -> list[str]:
    lines = []
    for name, rows in option_sections(ctx):
        lines += [
            f"**{_escape(name)}**",
            "",
            "| option | what it does |",
            "| --- | --- |",
            *(f"| {_code(term)} | {_escape(text, cell=True)} |" for term, text in rows),
            "",
        ]
    return lines


def _section(ctx: click.Context, cmd: click.Command) -> list[str]:
    depth = len(ctx.command_path.split())  # avatar-release X: ##, avatar-release X Y: ###
    lines = [f"{'#' * depth} {ctx.command_path} {{#{anchor(ctx)}}}", "", *_usage(ctx)]
    for block in _paragraphs(cmd.help):
        lines += [block, ""]
    subs = _subcommands(ctx)
    if subs:
        lines += ["Subcommands: " + ", ".join(f"[{n}](#{anchor(ctx)}-{n})" for n, _ in subs) + ".", ""]
    lines += _tables(ctx)
    for block in _paragraphs(cmd.epilog):
        lines += [block, ""]
    codes = " · ".join(f"**{code}** {_escape(meaning)}" for code, meaning in exit_codes(ctx))
    return lines + [f"Exit codes: {codes}.", ""]


def render() -> str:
    """The whole page (Markdown), the same for the same commands."""
    root = _root()
    root_ctx = _context(root, PROG, None)
    lines = [
        "# CLI reference",
        "",
        "<!-- Generated from the click commands by docs/gen_cli_reference.py; do not edit by hand. -->",
        "",
        f"`{PROG}`: {_paragraphs(root.help)[0]}",
        "",
        (
            "Each section below is made from the command itself: its usage line, its help, its options as "
            f"`{PROG} COMMAND --help` lists them (defaults and ranges included) and the exit codes it can end with."
        ),
        "",
        *_usage(root_ctx),
        *_tables(root_ctx),
        "| command | what it does |",
        "| --- | --- |",
    ]
    meanings: dict[int, str] = {}
    for ctx, cmd in walk(root):
        summary = cmd.get_short_help_str(limit=10_000)
        name = ctx.command_path.split(" ", 1)[1]
        lines.append(f"| [{_code(name)}](#{anchor(ctx)}) | {_escape(summary, cell=True)} |")
        meanings.update(exit_codes(ctx))
    lines += [
        "",
        "Every exit code a command can end with (each section lists its own):",
        "",
        "| exit code | meaning |",
        "| --- | --- |",
        *(f"| {code} | {_escape(meanings[code], cell=True)} |" for code in sorted(meanings)),
        "",
    ]
    for ctx, cmd in walk(root):
        lines += _section(ctx, cmd)
    return "\n".join(lines).rstrip("\n") + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Write the CLI reference page from the click commands.")
    parser.add_argument(
        "--out",
        default=str(Path(__file__).resolve().parent / "reference" / "cli.md"),
        help="where to write it ('-': stdout); default docs/reference/cli.md",
    )
    args = parser.parse_args(argv)
    page = render()
    if args.out == "-":
        sys.stdout.write(page)
    else:
        Path(args.out).write_text(page, encoding="utf-8")
        print(f"wrote {args.out} ({len(page.splitlines())} lines)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
