"""Finding the registry as git finds a repository: --registry, $AVATAR_RELEASE_REGISTRY, the project's
then the user's config file, then the nearest .avatar-release/ upward; nothing found is exit 3 naming
every place looked and the command that makes one."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from avatar_release.errors import InputError, NotFoundError
from avatar_release.registry import LocalRegistry, find_registry
from tests.helpers import cli, cpu_manifest, put_stand_in_build


def _registry_with_a_build(root: Path) -> str:
    m = cpu_manifest()
    put_stand_in_build(LocalRegistry(root), m)
    return m.build_id


def _env(tmp_path: Path, **extra: str) -> dict[str, str]:
    """No user config unless a test writes one: the user's config directory is the test's own."""
    return {"AVATAR_RELEASE_CONFIG_DIR": str(tmp_path / "user-config"), **extra}


def _write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def test_the_nearest_registry_upward_is_found_from_a_subdirectory(tmp_path):
    LocalRegistry(tmp_path / "proj" / ".avatar-release")
    deep = tmp_path / "proj" / "src" / "deep"
    deep.mkdir(parents=True)
    choice = find_registry(cwd=deep, environ=_env(tmp_path))
    assert choice.uri == str(tmp_path / "proj" / ".avatar-release")
    assert "upward" in choice.source and str(tmp_path / "proj") in choice.source


def test_an_empty_dot_directory_is_not_a_registry(tmp_path):
    (tmp_path / ".avatar-release").mkdir()  # no builds/: not one, keep looking (and find nothing)
    with pytest.raises(NotFoundError):
        find_registry(cwd=tmp_path, environ=_env(tmp_path))


def test_nothing_found_is_exit_3_naming_every_place_looked_and_the_fix(tmp_path):
    with pytest.raises(NotFoundError) as err:
        find_registry(cwd=tmp_path, environ=_env(tmp_path))
    msg = str(err.value)
    assert err.value.exit_code == 3
    for place in (
        "--registry",
        "$AVATAR_RELEASE_REGISTRY",
        "avatar-release.toml",
        str(tmp_path / "user-config"),
        ".avatar-release/",
    ):
        assert place in msg, place
    assert "avatar-release compile" in msg and len(err.value.details["looked"]) == 4


def test_a_command_that_creates_gets_a_new_registry_here(tmp_path):
    choice = find_registry(create=True, cwd=tmp_path, environ=_env(tmp_path))
    assert choice.uri == str(tmp_path / ".avatar-release") and not choice.found


def test_the_order_is_flag_then_environment_then_project_config_then_user_config_then_upward(tmp_path):
    LocalRegistry(tmp_path / ".avatar-release")
    _write(tmp_path / "user-config" / "config.toml", 'default = "u"\n[registries.u]\nuri = "/srv/user-reg"\n')
    env = _env(tmp_path)
    assert find_registry(cwd=tmp_path, environ=env).uri == "/srv/user-reg"
    _write(tmp_path / "avatar-release.toml", 'default = "p"\n[registries.p]\nuri = "oci://localhost:5000/p"\n')
    assert find_registry(cwd=tmp_path, environ=env).uri == "oci://localhost:5000/p"
    env["AVATAR_RELEASE_REGISTRY"] = "memory://from-env"
    assert find_registry(cwd=tmp_path, environ=env).uri == "memory://from-env"
    choice = find_registry("u", cwd=tmp_path, environ=env)  # a name from either file
    assert choice.uri == "/srv/user-reg" and choice.name == "u" and "[registries.u]" in choice.source


def test_a_project_file_without_a_default_falls_through_to_the_user_default(tmp_path):
    _write(tmp_path / "avatar-release.toml", '[registries.p]\nuri = "oci://localhost:5000/p"\n')
    _write(tmp_path / "user-config" / "config.toml", 'default = "u"\n[registries.u]\nuri = "/srv/u"\n')
    assert find_registry(cwd=tmp_path, environ=_env(tmp_path)).uri == "/srv/u"


def test_paths_in_a_config_file_are_relative_to_the_file_and_ca_joins_the_uri(tmp_path):
    _write(
        tmp_path / "proj" / "avatar-release.toml",
        'default = "local"\n[registries.local]\nuri = "regs/main"\n'
        '[registries.team]\nuri = "oci+https://reg.example.com/avatar"\nca = "certs/ca.pem"\n',
    )
    (tmp_path / "proj" / "sub").mkdir()
    env = _env(tmp_path)
    assert find_registry(cwd=tmp_path / "proj" / "sub", environ=env).uri == str(tmp_path / "proj" / "regs" / "main")
    team = find_registry("team", cwd=tmp_path / "proj" / "sub", environ=env)
    assert team.uri == f"oci+https://reg.example.com/avatar?ca={tmp_path / 'proj' / 'certs' / 'ca.pem'}"


@pytest.mark.parametrize(
    "text, expected",
    [
        ('default = "tem"\n[registries.team]\nuri = "/x"\n', "did you mean 'team'"),
        ('[registries.team]\nurl = "/x"\n', "registries.team.url: unknown key (got '/x'); did you mean 'uri'?"),
        (
            '[registries.team]\nca = "ca.pem"\n',
            "missing required field registries.team.uri; registries.team "
            "(RegistryEntry) takes required: uri; optional: ca",
        ),
        ('registry = "x"\n', "did you mean 'registries'"),
        ('[registries.team]\nuri = ""\n', "registries.team.uri: expected a non-empty string"),
        ("[registries.team]\nuri = 3\n", "registries.team.uri: Input should be a valid string (got 3)"),
        ('[registries]\nteam = "x"\n', "registries.team: expected a table (got 'x')"),
        ('[registries.team]\nuri = "/x"\nca = "ca.pem"\n', "ca applies to oci:// registries only"),
        ("default = \n", "not valid TOML"),
    ],
)
def test_a_malformed_config_file_names_the_file_the_key_and_the_fix(tmp_path, text, expected):
    path = _write(tmp_path / "avatar-release.toml", text)
    with pytest.raises(InputError) as err:
        find_registry(cwd=tmp_path, environ=_env(tmp_path))
    assert expected in str(err.value) and str(path) in str(err.value) and err.value.exit_code == 2


def test_a_mistyped_registry_name_is_not_found_with_a_suggestion(tmp_path):
    _write(tmp_path / "avatar-release.toml", '[registries.team]\nuri = "/x"\n')
    with pytest.raises(NotFoundError) as err:
        find_registry("tem", cwd=tmp_path, environ=_env(tmp_path))
    assert "did you mean 'team'" in str(err.value) and "configured names: team" in str(err.value)
    # A command that creates takes the word as a new directory here, as before.
    assert find_registry("tem", create=True, cwd=tmp_path, environ=_env(tmp_path)).uri == str(tmp_path / "tem")


def test_ls_from_outside_the_project_uses_the_registry_the_config_file_names(tmp_path, monkeypatch):
    build_id = _registry_with_a_build(tmp_path / "shared" / "reg")
    _write(
        tmp_path / "user-config" / "config.toml",
        f'default = "shared"\n[registries.shared]\nuri = "{tmp_path / "shared" / "reg"}"\n',
    )
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    monkeypatch.setenv("AVATAR_RELEASE_CONFIG_DIR", str(tmp_path / "user-config"))
    monkeypatch.delenv("AVATAR_RELEASE_REGISTRY", raising=False)
    res = cli("ls", "--json")
    assert res.exit_code == 0, res.output
    assert [b["build_id"] for b in json.loads(res.stdout)["builds"]] == [build_id]
    shown = cli("registries", "--json")
    doc = json.loads(shown.stdout)
    assert doc["current"]["uri"] == str(tmp_path / "shared" / "reg") and doc["current"]["name"] == "shared"
    assert doc["registries"] == [
        {
            "name": "shared",
            "uri": str(tmp_path / "shared" / "reg"),
            "file": str(tmp_path / "user-config" / "config.toml"),
            "default": True,
        }
    ]


def test_ls_with_no_registry_anywhere_is_exit_3_with_the_places_in_json(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("AVATAR_RELEASE_CONFIG_DIR", str(tmp_path / "user-config"))
    monkeypatch.delenv("AVATAR_RELEASE_REGISTRY", raising=False)
    res = cli("ls", "--json")
    assert res.exit_code == 3
    doc = json.loads(res.stdout)
    assert doc["error"] == "NotFoundError" and any(".avatar-release/" in w for w in doc["looked"])


def test_a_named_registry_path_that_does_not_exist_is_exit_3_with_the_fix(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    res = cli("ls", "--registry", str(tmp_path / "nope"))
    assert res.exit_code == 3 and "avatar-release compile" in res.stderr


def test_the_fix_for_no_registry_names_a_project_where_none_is_found(tmp_path):
    """`compile` needs a project: outside one the suggested command says --project DIR; inside, not."""
    with pytest.raises(NotFoundError) as err:
        find_registry(cwd=tmp_path, environ=_env(tmp_path))
    assert "avatar-release compile --project DIR --pipeline PIPELINE --target TARGET" in str(err.value)
    assert "manifests/" in str(err.value)
    (tmp_path / "proj" / "manifests").mkdir(parents=True)
    with pytest.raises(NotFoundError) as err:
        find_registry(cwd=tmp_path / "proj", environ=_env(tmp_path))
    assert "create one here with `avatar-release compile --pipeline PIPELINE --target TARGET`" in str(err.value)
    with pytest.raises(NotFoundError) as err:  # $AVATAR_RELEASE_PROJECT names one: no --project needed
        find_registry(cwd=tmp_path, environ=_env(tmp_path, AVATAR_RELEASE_PROJECT=str(tmp_path / "proj")))
    assert "--project DIR" not in str(err.value)
