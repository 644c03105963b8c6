"""`analyze build` on a synthetic tpu-v6e-8 manifest (no compile): per stage the bound, the share
of the compute floor and the hidden / exposed all-to-alls, always labelled a compiler estimate."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

import avatar_release.cli._analyze_cmds as analyze_cmds
from avatar_release.cli import cli
from avatar_release.records import Manifest, ScheduleRecord
from tests.helpers import cpu_manifest

PEAK, BW = 918e12, 1640e9  # manifests/targets/tpu-v6e-8.toml


def _schedule(hidden: int, exposed: int) -> ScheduleRecord:
    return ScheduleRecord(
        all_to_alls=hidden + exposed, async_pairs=hidden + exposed, synchronous=0, hidden=hidden, exposed=exposed
    )


def _retargeted_manifest() -> Manifest:
    """The stored tiny manifest, retargeted: dit compute-bound (10 ms vs 2 ms), sr memory-bound
    (1 ms vs 10 ms) with 4 GB of its collectives exposed (10 ms at 400 GB/s), vae with no
    schedule recorded."""
    m = cpu_manifest()
    synthetic = {
        "dit": ({"flops": PEAK * 0.010 / 4, "bytes accessed": BW * 0.002 / 4}, 4.0, _schedule(6, 2)),
        "sr": (
            {
                "flops": PEAK * 0.001,
                "bytes accessed": BW * 0.010,
                "optimal_seconds": -1.0,
                "collective bytes per run": 8e9,
                "exposed collective bytes per run": 4e9,
            },
            1.0,
            _schedule(0, 4),
        ),
        "vae": ({"flops": PEAK * 1e-4, "bytes accessed": BW * 5e-5}, 1.0, None),
    }
    entries = [
        e.model_copy(update=dict(zip(("cost", "cost_loop_scale", "schedule"), synthetic[e.stage])))
        for e in m.executables
    ]
    return m.model_copy(update={"target": "tpu-v6e-8", "executables": entries})


@pytest.fixture
def analyze(monkeypatch):
    m = _retargeted_manifest()
    # Where the command looks them up (its module's header imports them).
    monkeypatch.setattr(analyze_cmds, "open_registry", lambda uri, create=False: object())
    monkeypatch.setattr(analyze_cmds, "read_manifest", lambda reg, ref: (None, m))

    def run(*extra):
        res = CliRunner().invoke(
            cli, ["analyze", "build", "dev", "--registry", "memory://analyze", *extra], catch_exceptions=False
        )
        assert res.exit_code == 0, res.output
        return res.output

    return run


def test_json_gives_each_stage_its_bound_compute_floor_share_and_all_to_alls(analyze):
    out = json.loads(analyze("--json"))
    assert "compiler estimate" in out["label"] and "not a measurement" in out["label"]
    (chunk,) = out["chunks"]
    assert "not a measurement" in chunk["label"]
    dit, sr, vae = (next(s for s in chunk["stages"] if s["key"] == f"{k}/f8") for k in ("dit", "sr", "vae"))
    assert dit["bound"] == "compute" and dit["compute_share"] == pytest.approx(1.0)
    assert dit["compute_seconds"] == pytest.approx(0.010) and dit["memory_seconds"] == pytest.approx(0.002)
    assert (dit["all_to_alls"], dit["all_to_alls_hidden"], dit["all_to_alls_exposed"]) == (8, 6, 2)
    # The SR waits 10 ms on memory, then 10 ms on the wire for what its schedule leaves exposed.
    assert sr["bound"] == "memory" and sr["roofline_seconds"] == pytest.approx(0.010)
    assert sr["exposed_collective_seconds"] == pytest.approx(4e9 / 400e9) and sr["seconds"] == pytest.approx(0.020)
    assert sr["compute_share"] == pytest.approx(0.001 / 0.020)
    assert (sr["all_to_alls_hidden"], sr["all_to_alls_exposed"]) == (0, 4)
    assert dit["exposed_collective_seconds"] is None  # not recorded: nothing added
    assert vae["all_to_alls"] is None and vae["bound"] == "compute"
    assert chunk["estimated_seconds"] == pytest.approx(0.0301)
    assert chunk["compute_seconds"] == pytest.approx(0.0111)
    assert chunk["compute_share"] == pytest.approx(0.0111 / 0.0301)
    assert (chunk["all_to_alls_hidden"], chunk["all_to_alls_exposed"]) == (6, 6)
    # Beside XLA's counts, the config's analytic floor (tiny: far below anything XLA counts).
    assert set(chunk["analytic_floors"]) == {"dit", "sr", "vae"}
    assert chunk["analytic_floors"]["dit"]["flops"] > 0


def test_human_output_keeps_the_label_and_names_bound_share_and_exposure_per_stage(analyze):
    text = analyze()
    assert "compiler estimate" in text and "not a measurement" in text
    assert "compute floor 11.1 ms = 0.37 of the estimate; all-to-alls 6 hidden, 6 exposed" in text
    dit = next(line for line in text.splitlines() if line.strip().startswith("dit/f8"))
    assert (
        "10.00 ms = roofline 10.00 ms (compute-bound: compute 10.00 ms, memory 2.00 ms); compute-floor share 1.00"
        in dit
    )
    assert "all-to-alls: 6 hidden, 2 exposed of 8" in dit
    sr = next(line for line in text.splitlines() if line.strip().startswith("sr/f8"))
    assert "20.00 ms = roofline 10.00 ms (memory-bound" in sr
    assert "+ exposed collectives 10.00 ms (4.00 of 8.00 GB arriving)" in sr
    assert "compute-floor share 0.05" in sr and "0 hidden, 4 exposed of 4" in sr
    vae = next(line for line in text.splitlines() if line.strip().startswith("vae/f8"))
    assert "no schedule recorded" in vae
    assert "not a usable estimate" in text  # XLA's negative optimal_seconds is shown as such
