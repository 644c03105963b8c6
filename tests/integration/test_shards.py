"""A sharded gate of a real tiny build: 3 shards as parallel processes, then one merge, give the
verdict and frame hashes of the unsharded gate; the CLI keeps JSON on stdout and progress on stderr.

The shards run as the parallel processes a CI matrix starts; a merge, which renders nothing, runs
in this process (``tests.helpers.cli``: stdout and stderr still apart)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from avatar_release.gates.store import get_frames, latest_result, shard_refs
from avatar_release.records.gate import ZeroRecompileDetails
from avatar_release.registry import LocalRegistry
from tests.helpers import cli


def _cli(*args, env=None):
    code = "import sys; from avatar_release.cli import main; sys.exit(main(sys.argv[1:]))"
    return subprocess.Popen(
        [sys.executable, "-c", code, *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, **(env or {})},
    )


def test_shards_in_parallel_merge_to_the_unsharded_verdict_and_hashes(gated_copy, tmp_path, monkeypatch):
    root, build, whole = gated_copy  # the unsharded gate of the same build (--baseline none), stored in it
    reg = LocalRegistry(root)
    assert whole.result.status == "passed" and latest_result(reg, build.build_id)[1] == whole.digest

    summary = tmp_path / "summary.md"
    procs = [
        _cli(
            "gate",
            build.build_id,
            "--shard",
            f"{k}/2",
            "--registry",
            str(root),
            "--json",
            env={"AVATAR_RELEASE_GATE_RUN_ID": "ci-7"},
        )
        for k in range(2)
    ]
    outs = [(p.wait(timeout=900), *p.communicate()) for p in procs]
    for k, (rc, out, err) in enumerate(outs):
        assert rc == 0, err
        doc = json.loads(out)  # stdout is one JSON document, nothing else
        assert doc["shard"]["index"] == k and doc["shard"]["run_id"] == "ci-7"
        assert [r["twin"] for r in doc["shard"]["runs"]] == [1, 2]
        assert f"shard {k}/2 twin #1" in err  # progress went to stderr even with --json
        assert doc["next"] == f"avatar-release gate merge {build.build_id} --run-id ci-7"
    assert len(shard_refs(reg, build.build_id)) == 2  # tiny's gate set: 2 requests, one a shard

    monkeypatch.setenv("GITHUB_STEP_SUMMARY", str(summary))
    res = cli(
        "gate",
        "merge",
        build.build_id,
        "--baseline",
        "none",
        "--registry",
        root,
        "--json",
        "--report",
        tmp_path / "rep",
    )
    assert res.exit_code == 0, res.stderr
    doc = json.loads(res.stdout)
    merged = doc["result"]
    assert doc["status"] == whole.result.status == "passed"
    assert merged["frame_sha256"] == whole.result.frame_sha256
    assert [(g["name"], g["status"]) for g in merged["gates"]] == [(g.name, g.status) for g in whole.result.gates]
    zr = merged["gates"][0]["details"]
    assert len(zr["hosts"]) == 4 and all(zr["hosts"].values())  # where each twin of each shard ran
    assert sorted(zr["partials"]) == sorted(f"shard {k}/2 twin #{t}" for k in range(2) for t in (1, 2))
    stored, digest = latest_result(reg, build.build_id)
    assert digest == doc["result_digest"] and stored.gate_set == whole.result.gate_set
    assert stored.evidence(ZeroRecompileDetails).partials == zr["partials"]  # the typed view of the same record
    assert (get_frames(reg, stored.frames_blob) == get_frames(reg, whole.result.frames_blob)).all()
    assert doc["next"] == f"avatar-release promote {build.build_id} --to staging"
    md = summary.read_text()
    assert "| zero-recompile | passed |" in md and "next: `avatar-release promote" in md


def test_a_merge_with_a_shard_missing_runs_nothing_and_says_which(registry_copy):
    root, build = registry_copy
    res = cli("gate", build.build_id, "--shard", "1/2", "--twin", "2", "--registry", root, "--run-id", "x")
    assert res.exit_code == 0, res.stderr
    assert "twin #2 on " in res.stdout and "twin #1" not in res.stdout
    res = cli("gate", "merge", build.build_id, "--baseline", "none", "--registry", root)
    assert res.exit_code == 12, res.stderr
    assert "missing 0/2 twin #1, 0/2 twin #2, 1/2 twin #1" in res.stderr


pytestmark = pytest.mark.slow
