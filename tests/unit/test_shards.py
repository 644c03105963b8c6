"""Sharded gates without rendering: the slices, the coverage checks of the merge, the signed
partials it reads, and what a pipeline sees (exit 13 for needs-review, the step summary)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from avatar_release.errors import EnvironmentMismatch, GateInfraError, InputError, NeedsReview, Refusal
from avatar_release.gates.metrics import frame_sha256
from avatar_release.gates.shards import _cover, _reassemble, parse_shard, shard_requests
from avatar_release.gates.steps import GateInputs, compare
from avatar_release.gates.store import put_frames
from avatar_release.records import GateShard, parse_record
from avatar_release.records.gate import ZeroRecompileDetails
from avatar_release.registry import MemoryRegistry, Resolved
from tests.helpers import cpu_manifest

DATA = Path(__file__).resolve().parents[1] / "data"


def _example() -> GateShard:
    return parse_record(GateShard, (DATA / "gate-shard.v1.json").read_bytes(), where="stored example")


def _shard(index: int, count: int, twins=(1, 2), **changes) -> tuple[GateShard, str]:
    ex = _example()
    gs = ex.gate_set
    run = ex.runs[0]
    runs = [run.model_copy(update={"twin": t, "host": f"pod-{index}-{t}"}) for t in twins]
    s = ex.model_copy(
        update={"index": index, "count": count, "requests": shard_requests(gs, index, count), "runs": runs, **changes}
    )
    return s, f"sha256:{index}{count}{''.join(map(str, twins))}"


def test_shard_notation_counts_from_zero_like_a_job_completion_index():
    assert parse_shard("0/3") == (0, 3) and parse_shard("2/3") == (2, 3)
    for bad in ("3/3", "1/0", "a/b", "1", "-1/2"):
        with pytest.raises(InputError, match="--shard"):
            parse_shard(bad)


def test_requests_are_dealt_round_robin_and_cover_the_set_exactly_once():
    gs = _example().gate_set
    names = [r.name for r in gs.requests]
    slices = [shard_requests(gs, k, 3) for k in range(3)]
    assert slices == [[names[0], names[3]], [names[1]], [names[2]]]
    with pytest.raises(InputError, match="use at most 4 shards"):
        shard_requests(gs, 0, 5)


def test_the_merge_takes_the_newest_run_of_each_shard_and_twin():
    gs, digest = _example().gate_set, _example().build_digest
    shards = [_shard(0, 2), _shard(1, 2, twins=(1,)), _shard(1, 2, twins=(2,)), _shard(0, 2, twins=(2,))]
    chosen = _cover(shards, gs, digest)
    assert chosen[1][1][1].host == "pod-1-1" and chosen[1][2][1].host == "pod-1-2"
    assert chosen[0][2][2] == shards[3][1]  # the rerun of shard 0's twin #2 replaced it


@pytest.mark.parametrize(
    "shards, message",
    [
        (lambda: [_shard(0, 2), _shard(1, 2, twins=(1,))], r"missing 1/2 twin #2"),
        (lambda: [_shard(0, 3), _shard(1, 2), _shard(0, 2)], r"split 3 ways, the newest shard 2 ways"),
        (lambda: [_shard(0, 2), _shard(1, 2, build_digest="sha256:" + "0" * 64)], r"ran build sha256:0000"),
        (lambda: [_shard(0, 2), _shard(1, 2, requests=["image0-audio0"])], r"rendered \['image0-audio0'\], its slice"),
    ],
)
def test_a_merge_refuses_shards_that_do_not_cover_one_build_once(shards, message):
    ex = _example()
    with pytest.raises(GateInfraError, match=message):
        _cover(shards(), ex.gate_set, ex.build_digest)


def test_a_merge_refuses_another_gate_set_and_another_environment():
    ex = _example()
    gs2 = ex.gate_set.model_copy(update={"digest": "sha256:" + "1" * 64})
    with pytest.raises(GateInfraError, match="run every shard with one version"):
        _cover([_shard(0, 2), _shard(1, 2, gate_set=gs2)], ex.gate_set, ex.build_digest)
    a, da = _shard(0, 2)
    b, db = _shard(1, 2)
    env = b.runs[0].environment.model_copy(update={"device_kind": "TPU v6 lite", "fingerprint": "sha256:" + "e" * 64})
    b = b.model_copy(update={"runs": [r.model_copy(update={"environment": env}) for r in b.runs]})
    with pytest.raises(EnvironmentMismatch, match="device_kind") as e:
        _cover([(a, da), (b, db)], ex.gate_set, ex.build_digest)
    assert "pod-0-1" in str(e.value) and "pod-1-1" in str(e.value)


def _rendered(reg: MemoryRegistry, shard: GateShard, twin_frames: dict[int, np.ndarray]) -> GateShard:
    """``shard`` with each twin's frames stored and hashed (one value per request, so the order shows)."""
    runs = []
    for r in shard.runs:
        frames = twin_frames[r.twin]
        hashes, at = [], 0
        for name in shard.requests:
            n = next(q.frames for q in shard.gate_set.requests if q.name == name)
            hashes.append([frame_sha256(f) for f in frames[at : at + n]])
            at += n
        runs.append(r.model_copy(update={"frames_blob": put_frames(reg, frames), "frame_sha256": hashes}))
    return shard.model_copy(update={"runs": runs})


def test_a_merge_reassembles_both_twins_in_gate_set_order_and_names_every_process():
    """The merged twins are the whole gate set in order; zero-recompile lists each shard process, where it
    ran and the signed partial behind it."""
    reg, ex = MemoryRegistry("merge"), _example()
    gs, frames_of = ex.gate_set, {r.name: r.frames for r in ex.gate_set.requests}
    shards = []
    for k in range(2):
        s, d = _shard(k, 2)
        n = sum(frames_of[name] for name in s.requests)
        slice_frames = np.stack([np.full((2, 2, 3), 10 * k + i % 7, np.uint8) for i in range(n)])
        shards.append((_rendered(reg, s, {1: slice_frames, 2: slice_frames}), d))
    twins = _reassemble(reg, gs, _cover(shards, gs, ex.build_digest))
    # gate-set order interleaves the round-robin slices: image0-audio1 is shard 1's first request
    assert [r.name for r in gs.requests][1] == shards[1][0].requests[0]
    assert (twins.a.frames[24:48] == 10).sum() > 0 and (twins.a.frames[:24] < 10).all()
    assert twins.a.frame_sha256[1] == shards[1][0].runs[0].frame_sha256[0]
    manifest = cpu_manifest()
    inputs = GateInputs(
        Resolved(ex.build_id, ex.build_id, ex.build_digest, "build-id"),
        manifest,
        ex.runs[0].environment,
        gs,
        None,
        None,
        None,
        tier=None,
    )
    comparison = compare(reg, inputs, twins)
    assert comparison.status == "passed" and [g.status for g in comparison.gates] == ["passed", "passed"]
    zr = comparison.gates[0].details_as(ZeroRecompileDetails)
    labels = [f"shard {k}/2 twin #{t}" for t in (1, 2) for k in range(2)]
    assert zr.runs == labels and zr.hosts == {
        f"shard {k}/2 twin #{t}": f"pod-{k}-{t}" for k in range(2) for t in (1, 2)
    }
    assert zr.partials == {label: shards[int(label[6])][1] for label in labels}
    assert zr.imports == sorted(set(ex.runs[0].heavy_modules))


def test_needs_review_is_a_refusal_with_its_own_exit_code():
    assert issubclass(NeedsReview, Refusal) and NeedsReview.exit_code == 13 != Refusal.exit_code
    from avatar_release import errors

    assert "NeedsReview                 exit 13" in errors.__doc__


def test_the_step_summary_has_the_verdict_table_worst_frames_report_and_next_step(tmp_path, monkeypatch):
    from avatar_release.cli._summary import append_step_summary, gate_summary
    from avatar_release.records import GateEvidence, GateResult

    result = GateResult.model_validate(json.loads((DATA / "gate-result.v1.json").read_text()))
    frames = [
        {"frame": i, "label": f"image0-audio0 frame {i}", "max_abs_diff": 9 - i, "psnr_db": 30.0 + i} for i in range(8)
    ]
    result = result.model_copy(
        update={
            "status": "failed",
            "gates": [
                *result.gates,
                GateEvidence(
                    name="bit-exact",
                    status="failed",
                    summary="8 of 96 frames | differ",
                    details={"frames": frames[::-1]},
                ),
            ],
        }
    )
    md = gate_summary(result, "sha256:abc", "gate-reports/x/index.html", None)
    assert f"`failed`: `{result.build_id}`" in md and "| bit-exact | failed | 8 of 96 frames \\| differ |" in md
    assert md.index("frame 0 | 30.0 | 9") < md.index("frame 4 | 34.0 | 5") and "frame 5 |" not in md
    assert "gate-reports/x/index.html" in md and "next:" not in md
    monkeypatch.delenv("GITHUB_STEP_SUMMARY", raising=False)
    assert append_step_summary(md) is None
    monkeypatch.setenv("GITHUB_STEP_SUMMARY", str(tmp_path / "s.md"))
    append_step_summary("one")
    append_step_summary("two")
    assert (tmp_path / "s.md").read_text() == "one\n\ntwo\n\n"


def test_a_shard_refuses_the_merges_options_as_one_json_document_on_stdout(tmp_path):
    from click.testing import CliRunner

    from avatar_release.cli import cli

    res = CliRunner().invoke(
        cli,
        [
            "gate",
            "no-such-build",
            "--shard",
            "0/2",
            "--baseline",
            "none",
            "--registry",
            str(tmp_path / "reg"),
            "--json",
        ],
    )
    assert res.exit_code == 2, res.output
    doc = json.loads(res.stdout)
    assert doc["error"] == "InputError" and "--baseline with --shard" in doc["message"]
    assert "error:" in res.stderr


def test_shard_runs_are_listed_from_an_oci_store_too(tmp_path):
    """``gate merge`` reads a build's shard runs through the registry protocol alone: an OCI store
    (which has no record_namespaces) lists none before any shard was stored (it used to crash)."""
    from avatar_release.gates.store import shard_envelopes
    from avatar_release.registry import OciRegistry
    from avatar_release.registry.oci import RetryPolicy
    from tests.oci_memory import MemoryDistribution

    reg = OciRegistry(
        "oci+http://registry.test/t/shards",
        session=MemoryDistribution(),
        retry=RetryPolicy(attempts=1, base_delay=0.001, max_delay=0.001),
        lock_dir=tmp_path,
    )
    assert shard_envelopes(reg, "tiny-cpu-8-" + "a" * 12) == []
