"""Release approval and revocation through the CLI on a real build, and a pod that honours a
revocation: it refuses to swap to a revoked build, and says when the build it serves is revoked.

The gate itself is tested in test_gates.py; here a stored, signed passing result stands in for it.
"""

from __future__ import annotations

import json

import pytest

from avatar_release.errors import Revoked
from avatar_release.registry import LocalRegistry, read_manifest
from avatar_release.runtime import load
from avatar_release.serving import Pod, start_pod
from tests.helpers import cli
from tests.release_records import signed_gate_result
from tests.serving_fakes import fake_build

pytestmark = pytest.mark.slow


def test_approve_then_revoke_prod_through_the_cli_and_a_following_pod(registry_copy, tmp_path, capsys):
    root, result = registry_copy
    reg, bid, r = LocalRegistry(root), result.build_id, ["--registry", str(root)]
    _, m = read_manifest(reg, bid)
    signed_gate_result(reg, bid, reg.resolve(bid).digest, m)
    assert cli("promote", bid, "--to", "staging", *r).exit_code == 0
    # The first-use identity holds both roles: promote signs the release approval with this
    # machine's release key (not its gate key) and says so.
    done = cli("promote", "staging", "--to", "prod", *r, "--json")
    doc = json.loads(done.stdout)
    assert done.exit_code == 0 and doc["approved_here"]["approver"] == "local-release"
    assert doc["approvals"] == [f"local-release ({doc['approved_here']['digest']})"]

    pod = start_pod(reg, "prod")
    assert pod.check_channel() == "unchanged" and pod.health()["follow"]["revoked"] is None

    refused = cli("revoke", "prod", *r, "--json")
    assert refused.exit_code == 2 and "--reason" in refused.output  # a revocation says why
    out = cli("revoke", "prod", "--reason", "lip sync drifts after 30 s", *r, "--json")
    doc = json.loads(out.stdout)
    assert (
        out.exit_code == 0
        and doc["channels"] == ["dev", "staging", "prod"]
        and doc["next"] == "avatar-release rollback prod"
    )

    # The pod serving it keeps serving (the channel still points there) and says so: log, health, metrics.
    capsys.readouterr()
    assert pod.check_channel() == "unchanged"
    assert "lip sync drifts after 30 s" in pod.health()["follow"]["revoked"]
    assert "avatar_serve_build_revoked 1.0" in pod.metrics.exposition().decode()
    logged = [json.loads(x) for x in capsys.readouterr().err.splitlines() if x.startswith("{")]
    assert [x["event"] for x in logged] == ["serving_revoked"] and logged[0]["build"] == bid

    # Nothing loads it, nothing moves it.
    with pytest.raises(Revoked, match="lip sync drifts"):
        load("prod", reg)
    rendered = cli("render", "--channel", "prod", "--out", str(tmp_path / "o.mp4"), *r, "--json")
    assert rendered.exit_code == 1 and json.loads(rendered.stdout)["error"] == "Revoked"
    assert not (tmp_path / "o.mp4").exists()
    again = cli("promote", bid, "--to", "staging", *r)
    assert again.exit_code == 1 and f"{bid} is revoked by" in again.output
    listed = cli("ls", *r)
    assert "REVOKED" in listed.output and "lip sync drifts" in listed.output

    # A pod following prod from another build refuses to swap to the revoked one, by name.
    follower = Pod(reg, "prod", fake_build("fake-before"))
    assert follower.check_channel() == "refused"
    assert "Revoked" in follower.health()["follow"]["refused_reason"] and follower.build.build_id == "fake-before"
    assert 'avatar_serve_swaps_total{result="revoked"} 1.0' in follower.metrics.exposition().decode()
