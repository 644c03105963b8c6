"""Habits people bring from git, kubectl and docker: a mistyped name gets the closest one, usage
errors answer --json too, every --help ends with its exit codes, and render/serve take REF."""

from __future__ import annotations

import json
import re

import click
import pytest

from avatar_release import errors
from avatar_release.cli import cli as root
from avatar_release.cli._exit_codes import COMMAND_CODES, EXIT_MEANINGS, codes_for
from avatar_release.registry import LocalRegistry
from tests.helpers import DATA, cli, cpu_manifest, put_stand_in_build


def _published(tmp_path, channel: str | None = "dev") -> tuple[str, str]:
    reg = LocalRegistry(tmp_path / "reg")
    m = cpu_manifest()
    digest = put_stand_in_build(reg, m)
    if channel:
        reg.move_channel(channel, reg.resolve(digest), expected_digest=None, action="publish", who="t", reason="")
    return str(tmp_path / "reg"), m.build_id


@pytest.mark.parametrize("typed", ["production", "Prod", "prd"])
def test_a_mistyped_channel_option_suggests_the_channel(typed):
    res = cli("promote", "some-build", "--to", typed)
    assert res.exit_code == 2 and "did you mean 'prod'?" in res.stderr


def test_a_mistyped_command_suggests_the_command():
    res = cli("promot", "x")
    assert res.exit_code == 2 and "did you mean 'promote'?" in res.stderr


def test_a_mistyped_ref_suggests_the_channel_or_the_build(tmp_path):
    root_dir, build_id = _published(tmp_path)
    res = cli("inspect", "Dev", "--registry", root_dir)
    assert res.exit_code == 3 and "did you mean 'dev'?" in res.stderr
    typo = build_id[:-1] + ("0" if build_id[-1] != "0" else "1")
    res = cli("inspect", typo, "--registry", root_dir)
    assert res.exit_code == 3 and f"did you mean {build_id!r}" in res.stderr


def test_serve_on_an_empty_prod_names_the_channel_that_holds_a_build(tmp_path):
    root_dir, build_id = _published(tmp_path, "dev")
    res = cli("serve", "--registry", root_dir, "--port", "0")
    assert res.exit_code == 3, res.output
    assert "channel 'prod' is empty" in res.stderr and f"dev ({build_id})" in res.stderr
    assert "avatar-release serve dev" in res.stderr


def test_render_and_serve_take_one_ref_positionally_or_as_an_option(tmp_path):
    root_dir, _ = _published(tmp_path)
    for args in (
        ["render", "dev", "--channel", "dev"],
        ["render", "dev", "--build", "x"],
        ["serve", "dev", "--channel", "prod"],
    ):
        res = cli(*args, "--registry", root_dir)
        assert res.exit_code == 2 and "give one build reference, not 2" in res.stderr, args
    # REF alone resolves like --channel: an empty channel is "not found", with what holds a build
    res = cli("render", "prod", "--registry", root_dir, "--out", str(tmp_path / "o.mp4"))
    assert res.exit_code == 3 and "channel 'prod' is empty" in res.stderr


def test_a_usage_error_with_json_prints_one_document_on_stdout():
    res = cli("promote", "x", "--to", "production", "--json")
    assert res.exit_code == 2
    doc = json.loads(res.stdout)
    assert doc["ok"] is False and doc["error"] == "UsageError" and doc["exit_code"] == 2
    assert "did you mean 'prod'" in doc["message"] and doc["usage"].endswith("promote [OPTIONS] REF")
    res = cli("ls", "--no-such-flag", "--json")  # refused by the parser, before any option is read
    assert res.exit_code == 2 and json.loads(res.stdout)["error"] == "UsageError"


def test_without_json_a_usage_error_prints_nothing_on_stdout():
    res = cli("promote", "x", "--to", "production")
    assert res.exit_code == 2 and res.stdout == ""


def _commands(group: click.Group, prefix: str = "") -> list[tuple[str, click.Command]]:
    out = []
    for name, cmd in group.commands.items():
        path = f"{prefix}{name}"
        out.append((path, cmd))
        if isinstance(cmd, click.Group):
            out += _commands(cmd, path + " ")
    return out


def test_every_command_is_listed_once_in_the_lazy_table_with_its_module():
    from avatar_release.cli import COMMANDS, load_commands

    load_commands()
    assert sorted(root.commands) == sorted(COMMANDS)
    for name, (module, short) in COMMANDS.items():
        cmd = root.commands[name]
        assert (cmd.callback.__module__ if cmd.callback else "").endswith(module) or isinstance(cmd, click.Group)
        assert len(short) <= 90 and short.endswith(".") and "..." not in short  # one line in --help, never cut


def test_the_top_level_help_and_a_mistyped_command_import_no_room(tmp_path):
    import subprocess
    import sys

    probe = (
        "import sys, runpy; sys.argv = ['avatar-release'] + sys.argv[1:]\n"
        "try:\n    runpy.run_module('avatar_release', run_name='__main__')\n"
        "except SystemExit: pass\n"
        "print(sorted(m for m in sys.modules if m.startswith(('avatar_release.', 'jax', 'numpy', 'pydantic'))))"
    )
    for args in (["--help"], ["promot", "x"]):
        out = (
            subprocess.run(
                [sys.executable, "-c", probe, *args], capture_output=True, text=True, cwd=tmp_path, timeout=60
            )
            .stdout.strip()
            .splitlines()[-1]
        )
        loaded = set(eval(out))  # noqa: S307 - our own print of a list of module names
        assert not {m for m in loaded if m.split(".")[0] in ("jax", "numpy", "pydantic")}, (args, loaded)
        assert not {
            m
            for m in loaded
            if m.startswith(
                ("avatar_release.registry", "avatar_release.records", "avatar_release.gates", "avatar_release.promote")
            )
        }, args


def test_every_command_declares_its_exit_codes_and_every_code_has_a_meaning():
    from avatar_release.cli import load_commands

    load_commands()
    for path, _ in _commands(root):
        assert path in COMMAND_CODES or path.split(" ")[0] in COMMAND_CODES, f"{path}: no exit codes declared"
        assert set(codes_for(path)) <= set(EXIT_MEANINGS), path
    raised = {
        cls.exit_code
        for cls in vars(errors).values()
        if isinstance(cls, type) and issubclass(cls, errors.AvatarReleaseError)
    }
    assert raised - {10} <= set(EXIT_MEANINGS), "an error class's exit code has no meaning in the table"


@pytest.mark.parametrize("path", ["promote", "render", "gate run", "keys sign", "registries", "gate"])
def test_help_ends_with_the_exit_codes(path):
    res = cli(*path.split(), "--help")
    assert res.exit_code == 0
    tail = " ".join(res.stdout.split()[-120:])
    assert "Exit codes:" in tail
    listed = {int(c) for c in re.findall(r"(?:Exit codes:|;) (\d+) ", tail)}
    assert listed == set(codes_for(path)), (path, listed)


def test_gate_help_shows_the_common_paths_options():
    out = cli("gate", "--help").stdout
    head = out.split("Commands:")[0]
    assert "--baseline" in head and "--shard" in head and "gate REF" in head


def test_the_exit_codes_page_lists_the_same_exit_codes():
    page = (DATA.parent.parent / "docs" / "reference" / "exit-codes.md").read_text()
    line = page[page.index("Exit codes: 0 ok") :].split("\n\n")[0]
    assert {int(c) for c in re.findall(r"(?:·|:)\s+(\d+) ", line)} == set(EXIT_MEANINGS)
    table = dict(re.findall(r"^\| (\d+) \| (.+?) \|$", page, re.M))
    assert {int(c): meaning for c, meaning in table.items()} == EXIT_MEANINGS


def test_a_mistyped_set_key_or_spec_name_suggests_the_closest(tmp_path):
    res = cli("compile", "--set", "dit.stepz=2", "--registry", str(tmp_path / "r"))
    assert res.exit_code == 2 and "did you mean 'dit.steps'" in res.stderr
    res = cli("compile", "--set", "dit.steps=four", "--registry", str(tmp_path / "r"))
    assert res.exit_code == 2 and "expected an integer (current value" in res.stderr
    res = cli("compile", "--target", "tpu-v6e", "--registry", str(tmp_path / "r"))
    assert res.exit_code == 2 and "did you mean 'tpu-v6e-8'" in res.stderr
    res = cli("compile", "--pipeline", "tinny", "--registry", str(tmp_path / "r"))
    assert res.exit_code == 2 and "did you mean 'tiny'" in res.stderr


def test_ls_prints_a_table_with_a_header_and_other_outputs_on_request(tmp_path):
    root_dir, build_id = _published(tmp_path)
    lines = cli("ls", "--registry", root_dir).stdout.splitlines()
    assert lines[0].split() == ["BUILD", "CHANNELS", "GATE", "COMPARED", "WITH", "PUBLISHED"]
    assert lines[1].split()[:4] == [build_id, "dev", "ungated", "-"]
    assert cli("ls", "--registry", root_dir, "--no-headers").stdout.splitlines()[0].startswith(build_id)
    wide = cli("ls", "--registry", root_dir, "-o", "wide").stdout.splitlines()
    assert "DIGEST" in wide[0] and "COMPILE GATE" in wide[0] and "sha256:" in wide[1]
    assert cli("ls", "--registry", root_dir, "-o", "name").stdout.split() == [build_id]
    doc = json.loads(cli("ls", "--registry", root_dir, "-o", "json").stdout)
    assert [b["build_id"] for b in doc["builds"]] == [build_id]


def _complete(args: list[str], incomplete: str) -> list[str]:
    from click.shell_completion import BashComplete

    return [c.value for c in BashComplete(root, {}, "avatar-release", "_X").get_completions(args, incomplete)]


def test_shell_completion_offers_channels_and_build_ids_from_the_registry(tmp_path):
    root_dir, build_id = _published(tmp_path)
    assert _complete(["inspect", "--registry", root_dir], "") == ["dev", build_id]
    assert _complete(["diff", "--registry", root_dir, "dev"], "tiny") == [build_id]
    assert _complete(["promote", build_id, "--to"], "st") == ["staging"]
    assert _complete(["inspect", "--registry", str(tmp_path / "none")], "") == []  # no registry: quietly nothing
    script = cli("completion", "bash")
    assert script.exit_code == 0 and "_AVATAR_RELEASE_COMPLETE=bash_complete" in script.stdout


def test_a_mistyped_key_in_a_spec_file_names_the_closest_allowed_key(tmp_path, monkeypatch):
    import shutil

    from avatar_release.errors import SpecError
    from avatar_release.specs import load_target

    manifests = tmp_path / "manifests"
    shutil.copytree(DATA.parent.parent / "manifests", manifests)
    target = manifests / "targets" / "cpu-8.toml"
    target.write_text(target.read_text().replace("device_count = 8", "device_cont = 8"))
    monkeypatch.setenv("AVATAR_RELEASE_MANIFESTS", str(manifests))
    with pytest.raises(SpecError) as err:
        load_target("cpu-8")
    assert "device_cont" in str(err.value) and "did you mean 'device_count'?" in str(err.value)
    assert "allowed here:" in str(err.value) and str(target) in str(err.value)


@pytest.mark.parametrize(
    "args",
    [
        ["gate", ""],
        ["gate", "", "--registry", "REG"],
        ["gate", "--registry", "REG", ""],
        ["gate", "run", "  "],
        ["inspect", ""],
        ["verify", "", "--registry", "REG"],
    ],
)
def test_an_empty_ref_is_a_usage_error_naming_ref(tmp_path, args):
    root_dir, _ = _published(tmp_path)
    res = cli(*[root_dir if a == "REG" else a for a in args])
    assert res.exit_code == 2, res.output
    assert "REF" in res.stderr and "empty" in res.stderr and "No such option" not in res.stderr, res.stderr


def test_gate_takes_its_options_before_ref(tmp_path):
    root_dir, build_id = _published(tmp_path)
    res = cli("gate", "--registry", root_dir, "--baseline", "none", build_id + "x")
    assert res.exit_code == 3 and "No such option" not in res.stderr, res.stderr  # REF reached `gate run`
