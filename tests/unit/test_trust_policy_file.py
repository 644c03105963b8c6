"""A trust policy is read into pydantic models: every section and value is checked, and a mistake is
answered as a spec mistake is (the file, the field path, the closest allowed name, the fix)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from avatar_release.errors import InputError
from avatar_release.trust.keys import generate_keypair
from avatar_release.trust.policy import load_policy

D = "sha256:" + "d" * 64
BASE = 'schema_version = 1\n[keys]\nci = "keys/ci.pub"\nana = "keys/ana.pub"\n[gate]\n"*" = ["ci"]\n'


def _write(tmp_path: Path, text: str) -> Path:
    if not (tmp_path / "keys" / "ci.pub").exists():
        generate_keypair(tmp_path / "keys", "ci")
        generate_keypair(tmp_path / "keys", "ana")
    path = tmp_path / "trust.toml"
    path.write_text(BASE + text)
    os.chmod(path, 0o600)
    return path


def test_every_section_is_read_with_its_values(tmp_path):
    path = _write(
        tmp_path,
        '[review]\nreviewers = ["ana"]\nprod_approvals = 2\n[release]\napprovers = ["ana"]\n'
        'roles = 1\n[timestamps]\nvalidity_hours = 3\n[state]\nroot = ["ana", "ci"]\n'
        'root_threshold = 2\nonline = ["ci"]\ntimestamp_minutes = 30\n[state.channels]\n'
        f'prod = ["ana"]\n[gate_inputs]\nbands = []\n[gate_inputs.targets]\n"cpu-8" = "{D}"\n',
    )
    p = load_policy(path)
    assert (p.reviewers, p.prod_approvals, p.approvers, p.roles, p.timestamp_hours) == (["ana"], 2, ["ana"], 1, 3.0)
    assert (p.state.root, p.state.root_threshold, p.state.online) == (("ana", "ci"), 2, ("ci",))
    assert p.state.channels == {"prod": ("ana",)} and p.state.timestamp_minutes == 30.0
    assert (p.gate_inputs.bands, p.gate_inputs.targets, p.gate_inputs.levers) == ((), {"cpu-8": (D,)}, None)


@pytest.mark.parametrize(
    "section, message",
    [
        (
            "[timestamp]\nvalidity_hours = 2\n",
            r"timestamp: unknown key \(got \{'validity_hours': 2\}\); did you mean "
            r"'timestamps'\?; allowed here: gate, gate_inputs, keys, release, review, "
            r"schema_version, state, timestamps",
        ),
        ('[state]\nroots = ["ci"]\n', r"state\.roots: unknown key \(got \['ci'\]\); did you mean 'root'\?"),
        ('[review]\nprod_approvals = "1"\n', r"review\.prod_approvals: Input should be a valid integer \(got '1'\)"),
        ("[review]\nprod_approvals = 0\n", r"review\.prod_approvals: Input should be greater than or equal to 1"),
        ("[release]\nroles = true\n", r"release\.roles: Input should be a valid integer \(got True\)"),
        ("[release]\nroles = 3\n", r"release\.roles: Input should be less than or equal to 2"),
        (
            "[timestamps]\nvalidity_hours = 200\n",
            r"timestamps\.validity_hours: Input should be less than or equal to 168",
        ),
        (
            '[state.channels]\nqa = ["ci"]\n',
            r"state\.channels\.qa: Input should be 'dev', 'staging' or 'prod' \(got 'qa'\)",
        ),
        (
            '[state]\nroot = ["ci"]\nroot_threshold = 2\n',
            r"state\.root_threshold must be an integer from 1 to the number "
            r"of root keys \(1\), got 2",
        ),
        (
            '[review]\nreviewers = ["anna"]\n',
            r"review\.reviewers names \['anna'\], which \[keys\] does not define; did you "
            r"mean 'ana'\?",
        ),
    ],
)
def test_a_mistake_names_the_file_the_field_path_and_the_closest_name(tmp_path, section, message):
    path = _write(tmp_path, section)
    with pytest.raises(InputError, match=rf"trust policy {path}: {message}") as err:
        load_policy(path)
    assert err.value.exit_code == 2


def test_a_policy_of_another_schema_version_names_both_versions(tmp_path):
    path = _write(tmp_path, "")
    path.write_text(path.read_text().replace("schema_version = 1", "schema_version = 2"))
    with pytest.raises(InputError, match=rf"trust policy {path}: schema_version 2, this avatar-release reads 1"):
        load_policy(path)
