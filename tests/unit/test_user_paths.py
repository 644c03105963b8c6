"""Where the user's config and this machine's state live: the platform's directories (platformdirs:
XDG on Linux), unless AVATAR_RELEASE_CONFIG_DIR / AVATAR_RELEASE_STATE_DIR name one; a pod's
accepted-statement file follows the state directory."""

from __future__ import annotations

from pathlib import Path

from avatar_release._paths import config_dir, state_dir
from avatar_release.cli._devices import trust_config
from avatar_release.trust.keys import generate_keypair


def test_the_documented_variables_name_the_directories(tmp_path):
    env = {"AVATAR_RELEASE_CONFIG_DIR": str(tmp_path / "c"), "AVATAR_RELEASE_STATE_DIR": str(tmp_path / "s")}
    assert config_dir(env) == tmp_path / "c"
    assert state_dir(env) == tmp_path / "s"


def test_without_them_the_xdg_directories_hold_an_avatar_release_folder(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "xdg-config"))
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "xdg-state"))
    assert config_dir({}) == tmp_path / "xdg-config" / "avatar-release"
    assert state_dir({}) == tmp_path / "xdg-state" / "avatar-release"


def test_without_xdg_they_sit_under_the_home_directory(tmp_path, monkeypatch):
    monkeypatch.delenv("XDG_CONFIG_HOME", raising=False)
    monkeypatch.delenv("XDG_STATE_HOME", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    assert config_dir({}) == tmp_path / ".config" / "avatar-release"
    assert state_dir({}) == tmp_path / ".local" / "state" / "avatar-release"


def test_a_pods_accepted_statements_default_to_the_state_directory(tmp_path, monkeypatch):
    monkeypatch.setenv("AVATAR_RELEASE_STATE_DIR", str(tmp_path / "state"))
    generate_keypair(tmp_path / "keys", "ci")
    trusted = trust_config(str(tmp_path / "keys" / "ci.pub"), None)
    assert (
        trusted is not None
        and trusted.state is not None
        and Path(trusted.state.path) == tmp_path / "state" / "accepted.json"
    )
    named = trust_config(str(tmp_path / "keys" / "ci.pub"), str(tmp_path / "vol" / "seen.json"))
    assert named is not None and named.state is not None and Path(named.state.path) == tmp_path / "vol" / "seen.json"
