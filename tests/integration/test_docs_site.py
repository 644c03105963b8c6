"""The documentation site and the examples it points to.

The site (mkdocs.yml, docs/) builds with every warning an error, and its CLI reference, generated
from the click commands by docs/hooks.py, has a section for every command with every option the
command takes; the list of commands comes from the click group here, so a new command cannot be
left off the page. The request examples are valid shell and Python, every `avatar-release`
command the walkthrough and the pages tell a reader to type parses (options included), and the
sample media are still what their script makes.

Without mkdocs the build test skips, unless AVATAR_RELEASE_REQUIRE_DOCS is set (CI), where it
fails.
"""

from __future__ import annotations

import os
import py_compile
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import click
import pytest
from click.testing import CliRunner

from avatar_release.cli import cli
from tests.tools import need_extra

ROOT = Path(__file__).resolve().parents[2]
REQUESTS = ROOT / "examples" / "requests"
MEDIA = ROOT / "examples" / "media"
# Pages whose ```bash blocks a reader copies: each `avatar-release ...` in them must parse.
COMMAND_PAGES = [
    ROOT / "README.md",
    ROOT / "benchmarks" / "README.md",
    ROOT / "examples" / "local-oci-registry.md",
    ROOT / "examples" / "README.md",
    *sorted((ROOT / "docs").rglob("*.md")),
]


def _commands() -> list[tuple[tuple[str, ...], click.Command]]:
    """(its path, the command) for every command and subcommand, from the click group itself."""
    found = []

    def visit(group: click.Group, path: tuple[str, ...]) -> None:
        ctx = click.Context(group)
        for name in group.list_commands(ctx):
            cmd = group.get_command(ctx, name)
            if cmd is None or cmd.hidden:
                continue
            found.append(((*path, name), cmd))
            if isinstance(cmd, click.Group):
                visit(cmd, (*path, name))

    visit(cli, ())
    return found


def _section(page: str, anchor: str) -> str:
    """The HTML of one command's section: from its heading to the next command's."""
    start = page.index(f'id="{anchor}"')
    after = re.compile(r"<h[23] id=").search(page, start + 1)
    return page[start : after.start() if after else len(page)]


@pytest.mark.slow  # seconds long (tests/conftest.py: FAST_LANE_LIMIT_S)
def test_the_site_builds_strict_and_its_cli_page_covers_every_command(tmp_path):
    need_extra("docs")
    site = tmp_path / "site"
    run = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "-d", str(site)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert run.returncode == 0, run.stdout + run.stderr
    assert "WARNING" not in run.stderr, run.stderr

    for page in (
        "getting-started",
        "how-to/registries",
        "how-to/local-oci-registry",
        "reference/http-api",
        "reference/examples",
        "reference/cli",
        "reference/specs",
        "reference/pipeline-contract",
        "concepts/architecture",
        "concepts/release-guarantee",
        "concepts/production-shapes",
    ):
        assert (site / page / "index.html").is_file(), page
    assert not list(site.rglob("*.py")), "the hook scripts under docs/ must not be published"
    # A pipe escaped for a Markdown table (`\|`) inside a code span is printed as typed: `a | b`
    # needs no escape there, and a reader must never see the backslash.
    shown = {str(p.relative_to(site)) for p in site.rglob("*.html") if "\\|" in p.read_text(encoding="utf-8")}
    assert not shown, f"a literal \\| in {sorted(shown)}"

    html = (site / "reference" / "cli" / "index.html").read_text(encoding="utf-8")
    commands = _commands()
    top_level = [path[0] for path, _ in commands if len(path) == 1]
    assert {"compile", "gate", "promote", "serve", "registries", "copy"} <= set(top_level)
    for path, cmd in commands:
        anchor = "-".join(path)
        assert f'href="#{anchor}"' in html, f"{anchor}: not in the page's list of commands"
        section = _section(html, anchor)
        assert "avatar-release " + " ".join(path) in section, anchor
        assert "Exit codes:" in section, f"{anchor}: no exit codes"
        for param in cmd.params:
            if isinstance(param, click.Option) and not param.hidden:
                assert max(param.opts, key=len) in section, f"{anchor}: option {param.opts} missing"


def test_request_examples_are_valid_shell_and_python(tmp_path):
    scripts = sorted(REQUESTS.glob("*.sh"))
    assert [p.name for p in scripts] == ["render-json.sh", "render-multipart.sh"]
    bash = shutil.which("bash")
    assert bash is not None
    for script in scripts:
        check = subprocess.run([bash, "-n", str(script)], capture_output=True, text=True)
        assert check.returncode == 0, f"{script.name}: {check.stderr}"
        assert os.access(script, os.X_OK), f"{script.name} is not executable (the walkthrough runs it directly)"
    py_compile.compile(str(REQUESTS / "render.py"), cfile=str(tmp_path / "render.pyc"), doraise=True)
    # render.py promises the standard library only: nothing it imports may come from site-packages.
    imported = re.findall(r"^(?:import|from) ([\w.]+)", (REQUESTS / "render.py").read_text(), re.M)
    assert {name.split(".")[0] for name in imported} <= set(sys.stdlib_module_names) | {"__future__"}, imported


def _typed_commands(page: Path) -> list[list[str]]:
    """Each `avatar-release ...` invocation in the page's ```bash blocks, as its words up to the
    shell's next operator (pipe, &&, &, ;, redirection, the `)` closing a `$(...)`); comments left out."""
    found = []
    for block in re.findall(r"```bash\n(.*?)```", page.read_text(encoding="utf-8"), re.S):
        for line in block.replace("\\\n", " ").splitlines():  # a line continued with a backslash is one
            lexer = shlex.shlex(line, posix=True, punctuation_chars=True)
            lexer.whitespace_split = True
            tokens = list(lexer)
            for i, token in enumerate(tokens):
                if token != "avatar-release":
                    continue
                words = []
                for word in tokens[i:]:
                    if set(word) <= set("|&;<>()"):
                        break
                    words.append(word)
                found.append(words)
    return found


def test_every_command_the_pages_tell_you_to_type_exists():
    runner = CliRunner()
    checked = 0
    for page in COMMAND_PAGES:
        for words in _typed_commands(page):
            # --help after the words: click parses them (an unknown command or option is exit 2), then
            # prints help instead of running anything.
            result = runner.invoke(cli, [*words[1:], "--help"])
            assert result.exit_code == 0, f"{page.relative_to(ROOT)}: `{shlex.join(words)}`: {result.output}"
            checked += 1
    assert checked >= 15  # the walkthrough alone names more than that


def test_sample_media_are_what_their_script_makes():
    sizes = {p.name: p.stat().st_size for p in (MEDIA / "face.png", MEDIA / "speech.wav")}
    assert sum(sizes.values()) < 200_000, sizes
    check = subprocess.run(
        [sys.executable, str(MEDIA / "make_samples.py"), "--check"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert check.returncode == 0, check.stderr
