"""Every benchmark keeps working: one row per benchmark's smoke mode, run as a user runs it
(``python benchmarks/SCRIPT --smoke ... --out OUT``, tests.helpers.run_smoke), and what its JSON
must show. A row says what the benchmark needs (a copy of the session's tiny build passed as
``--registry``, an extra, a binary) and its lane; each row runs on its own (an xdist group of its
own), so the slow ones spread over the workers.

The rows assert what the figures mean (a bomb refused, a served build that never compiles, bytes
flat with history), never how many seconds something took: speed goals are the benchmarks' own,
printed beside their figures.
"""

from __future__ import annotations

import ast
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.helpers import BENCHMARKS, run_smoke
from tests.tools import binary, binary_if_present


@dataclass(frozen=True)
class Smoke:
    script: str  # under benchmarks/
    check: Callable[[Any, Any], None]  # (the JSON it wrote, the build given with --registry or None)
    args: tuple[str, ...] = ()
    build: bool = False  # --registry: a private copy of the session's tiny build (dev holds it, ungated)
    gated: bool = False  # with build: that build gated once for the session (--baseline none: gated_copy)
    # --registry: a private copy of the session's TPU build of tiny (tpu_registry, compiled once for the
    # TPU target's tests), handed over rather than compiled again by the row
    tpu_build: bool = False
    # (flag, overrides): another build of tiny from the session's build cache, published beside it
    # (dev stays) and named to the benchmark by its build id after FLAG (None: found there by the benchmark)
    candidate: tuple[str | None, dict[str, str]] | None = None
    slow: bool = True  # compiles, gates, serves or runs fresh processes for seconds
    extras: tuple[str, ...] = ()  # optional extras it needs (tests/tools.py: skip, or fail under the switch)
    binaries: tuple[str, ...] = ()  # external programs it needs (likewise)
    optional: tuple[str, ...] = ()  # programs it leaves a part out without (absent: fails only under the switch)
    timeout: float = 600


# ---------------------------------------------------------------------------------------------- the checks


def _attacks(doc: Any, build: Any) -> None:
    """A real build loaded in a fresh process; two zstd bombs planted in copies, both refused before the
    loader allocates."""
    assert doc["build_id"] == build.build_id and doc["runs"] == 1
    bombs = doc["bombs"]
    assert "at most 100x allowed" in bombs["honest 16 GiB"]["refused"]
    assert "decompresses to more than" in bombs["lying: 1 GiB under the real raw size"]["refused"]
    for name in bombs:  # refused before allocating: less than a normal load holds, far from the 16 GiB
        assert 0 < doc["ratios"][f"peak RSS: {name} / normal load"] < 2
    assert {"dit/f8", "sr/f8", "vae/f8"} <= set(doc["compression_ratios"])
    assert all(1 < r <= 100 for k, r in doc["compression_ratios"].items() if "/" in k)
    assert doc["cold_load_s"] > 0 and 0 < doc["ratios"]["added verification / cold load"] < 1


def _checkouts(doc: Any, build: Any) -> None:
    """This checkout, one round: compile, then a pod ready and rendering with zero compiles."""
    (row,) = doc["runs"]["after"]
    assert row["compiles"] == 0 and row["build_id"].startswith("tiny-cpu-8-")
    assert row["time_to_ready_seconds"] > 0 and row["steady_chunk_seconds"] > 0
    assert set(doc["medians"]["after"]) == {"compile_process_seconds", "time_to_ready_seconds", "steady_chunk_seconds"}


def _cli(doc: Any, build: Any) -> None:
    """The CLI's no-work answers (help, a typo, no registry) exit as documented without importing JAX."""
    cases = doc["cases"]
    assert set(cases) == {"help", "command help", "mistyped command", "mistyped channel", "no registry"}
    for name, c in cases.items():
        assert c["exit_codes"] == [c["expected_exit_code"]] and not c["imports_jax"], (name, c)
    assert cases["help"]["heavy_imports"] == cases["mistyped command"]["heavy_imports"] == []


def _compile_wall(doc: Any, build: Any) -> None:
    """This checkout, the example project, one round: compile alone through the CLI, its figures."""
    entry = doc["projects"]["puppet-tiny"]
    (row,) = entry["runs"]["after"]
    assert row["build_id"].startswith("puppet-tiny-cpu-8-") and row["compiled"] == row["executables"] == 2
    assert entry["medians"]["after"]["process_seconds"] > entry["medians"]["after"]["compile_wall_seconds"] > 0


def _flash(doc: Any, build: Any) -> None:
    """Dense and flash attention of tiny's DiT compiled for TPU (compiler estimates, not measurements)."""
    (row,) = doc
    assert row["pipeline"] == "tiny" and row["label"] == "compiler estimates, not measurements"
    assert row["heads_per_chip"] * 8 == row["heads"] and row["calls_per_chunk"] > 0
    for name in ("dense", "flash"):
        r = row[name]
        assert r["xla_flops_per_chip_chunk"] > 0 and r["xla_bytes_per_chip_chunk"] > 0 and r["compile_seconds"] > 0
        assert r["memory_floor_s"] > 0 and r["compute_floor_s"] > 0
    bq, bk = row["flash"]["blocks"]
    assert row["seq"] % bq == 0 and row["seq"] % bk == 0 and row["flash"]["estimate_flops_per_chip_chunk"] > 0
    assert row["dense"]["floor_bytes_per_chip_chunk"] > 0 and row["deadline_s"] > 0


def _gates(doc: Any, build: Any) -> None:
    """The gate set rendered once as a plain render, then the build gated alone, the two side by side."""
    assert doc["build_id"] == build.build_id and doc["gate_alone_status"] == "passed"
    assert doc["gate_set"]["requests"] >= 1 and doc["gate_set"]["frames"] >= doc["gate_set"]["requests"]
    assert doc["plain_render_s"] > 0 and doc["gate_alone_s"] > 0
    assert {"twin_1", "twin_2", "total"} <= set(doc["gate_breakdown_s"])
    assert doc["gate_vs_baseline_s"] is None  # --smoke: no tier-2 candidate
    (ratio,) = doc["ratios"].values()
    assert ratio["value"] > 0 and ratio["goal_max"] == 3.0


def _gpu(doc: Any, build: Any) -> None:
    """tiny compiled for gpu-h100-8 on this CPU host, each stage estimated against the deadline."""
    assert "not measurements" in doc["label"]
    (row,) = doc["compiles"]
    assert row["exit_code"] == 0 and row["build_id"].startswith("tiny-gpu-h100-8-") and row["peak_rss_gib"] > 0
    assert row["memory_fit"]["fits"] and row["memory_fit"]["capacity_bytes"] == 84942979072  # the description's
    (chunk,) = row["chunks"]
    assert {s["key"] for s in chunk["stages"]} == set(row["compile_seconds"]) == {"dit/f8", "sr/f8", "vae/f8"}
    assert 0 < chunk["estimated_seconds"] < chunk["deadline_seconds"] == 8 / 25


def _gpu_check(doc: Any, build: Any) -> None:
    """Every step of the H200 check, for cpu-8, on the session's build: the served build never compiles."""
    assert doc["run_on_gpu"] is False and doc["preflight"]["blockers"] == []
    assert doc["compile"]["build_id"].startswith("tiny-cpu-8-")
    assert doc["compile"]["build_id"] == build.build_id and doc["compile"]["compiled_here"] is False  # --compiled
    assert doc["gate"]["exit_code"] == 0 and doc["gate"]["result"]["status"] == "passed"
    assert doc["serve"]["compiles_after_load"] == 0 and doc["serve"]["chunks"] == 2
    assert doc["jit_warm_cache"]["cache_entries"] > 0
    kernels = doc["kernels"]  # both Triton kernels, through the Pallas interpreter here
    assert kernels["interpreted"] and kernels["window"]["max_abs_err"] < 2e-2 and kernels["flash"]["max_abs_err"] < 2e-2
    assert "kernel_ms" not in kernels["window"]  # no time is claimed for the interpreter
    assert set(doc["ratios"]) == {
        "time_to_first_chunk_artifact_over_jit_warm_cache",
        "steady_chunk_over_deadline",
        "compiles_after_load",
    }


def _house(doc: Any, build: Any) -> None:
    """The house's shape (issue 27): no class over 300 lines, no module over 500 outside the bundled
    pipeline, no function over 60; a miss names the class, module or function."""
    f = doc["figures"]
    assert doc["goals"] == {"class_lines": 300, "module_lines": 500, "function_lines": 60, "unannotated_public": 0}
    assert f["read"]["modules"] > 100 and f["read"]["functions"] > 500 and f["params"] > 1000  # it read the tree
    assert f["largest_class"]["lines"] > 50 and f["largest_module"]["where"].startswith("avatar_release/")
    assert f["largest_bundled_module"]["where"].startswith(("model/", "kernels/"))
    assert f["classes_over_goal"] == [], f["classes_over_goal"]
    assert f["modules_over_goal"] == [], f["modules_over_goal"]
    assert f["functions_over_goal"] == [], f["functions_over_goal"]
    assert f["unannotated_public_params"] == 0, f["unannotated_public_examples"]
    assert all(doc["met"].values())


def _kernels(doc: Any, build: Any) -> None:
    """Every kernel timed (3 frames, 2 heads); the head groups move equal bytes in more, smaller all-to-alls."""
    assert doc["sr"]["frames"] == 3 and doc["sr"]["heads"] == 2 and 0 < doc["live_fraction"] < 1
    assert all(s > 0 for s in doc["seconds"].values()) and set(doc["seconds"]) >= {"dense", "blocksparse", "tiled_128"}
    assert all(r["value"] > 0 for r in doc["ratios"].values())
    assert doc["bounded"]["max_abs_error_f32"] <= 2e-6  # the bounded softmax is exact enough, at any size
    groups = doc["groups"]
    assert [g["G"] for g in groups] == [1, 2]
    assert all(g["bytes"] == g["analytic_bytes"] == groups[0]["bytes"] for g in groups)
    assert [g["all_to_alls"] for g in groups] == [2, 4]


def _media(doc: Any, build: Any) -> None:
    """A 320x180 picture decoded and fitted, a 4 s MP3 to 16 kHz mono in fresh processes, a bomb's header refused."""
    pic = doc["picture"]
    assert pic["source"] == "320x180" and set(pic["files"]) == {"p.jpg", "p.png", "p-paeth.png"}
    for f in pic["files"].values():
        assert f["bytes"] > 0
        assert all(f[k]["wall_ms"] > 0 for k in ("decode_fit_720p_ms", "decode_fit_80x48_ms", "decode_no_resize_ms"))
    speech = doc["mp3_to_16k_mono"]
    assert speech["stream"]["samples"] == speech["read"]["samples"] == 4 * 16000  # streamed or whole: every sample
    assert speech["stream"]["ffmpeg_peak_rss_mb"] > 0
    assert doc["bomb"]["header"] == "60000x60000" and doc["bomb"]["refused_ms"]["wall_ms"] > 0
    assert "render_feed" not in doc


def _media_render(doc: Any, build: Any) -> None:
    """A track and twice it rendered end to end through the stand-in stages, in about the same memory."""
    feed = doc["render_feed"]
    short, long = feed["short"], feed["long"]
    assert feed["copies"] == 2 and short["chunks"] > 0 and short["mp4_mb"] > 0
    assert 1.8 < feed["ratio_long_to_short"]["frames"] < 2.2  # twice the audio, twice the frames
    assert long["python_peak_rss_mb"] > 0 and feed["ratio_long_to_short"]["python_peak_rss_mb"] < 1.5


def _node_cache(doc: Any, build: Any) -> None:
    """A stand-in build pulled from docker-registry into an empty node cache (1 and 8 at a time), read
    back by a pod of a warm node with no request at all, beside a cacheless pull and plain files."""
    modes = doc["modes"]
    assert set(modes) == {"direct", "first pull, 1 at a time", "first pull, 8 at a time", "warm node", "plain files"}
    assert modes["first pull, 1 at a time"]["blob_pulls"] == modes["first pull, 8 at a time"]["blob_pulls"] == [8]
    assert modes["warm node"]["blob_pulls"] == [0] and modes["warm node"]["requests"] == [0]
    assert modes["direct"]["requests"][0] >= 8 and modes["plain files"]["requests"] == [0]
    assert all(0 < m["min_s"] <= m["median_s"] <= m["max_s"] for m in modes.values())
    assert doc["bytes"] == 2 << 20 and all(r > 0 for r in doc["ratios"].values())


def _policy(doc: Any, build: Any) -> None:
    """A real build, gated once for the session, promoted to prod; the policy's share of each promotion,
    and a pod's checks."""
    assert doc["build_id"] == build.build_id and doc["gate_wall_seconds"] is None  # --gated: not gated again
    for channel in ("staging", "prod"):
        row = doc["promote"][channel]
        assert 0 < row["policy_seconds"] < row["cli_wall_seconds"]  # a part of the whole command
    pod = doc["pod"]["swap_load"]
    assert pod["statement_seconds"] > 0 and pod["revocation_seconds"] > 0 and pod["load_seconds"] > 0


def _probes(doc: Any, build: Any) -> None:
    """A real pod flooded from another address: the probe port answers every probe."""
    own, shared = doc["own"], doc["shared"]
    assert own["probe_port"]["probes"] > 10 and own["probe_port"]["failures"] == 0
    assert own["render_port"]["failures"] == 0  # the per-client cap kept the flooder to its share
    assert own["flood"]["opened"] >= 2 * doc["connections"] and own["flood"]["closed_by_pod"] > 0
    # the flood is real: with the old behaviour (no probe port, no cap) /livez fails under it
    assert shared["render_port"]["failures"] > 0


def _promote(doc: Any, build: Any) -> None:
    """A stand-in build promoted to staging and prod by moving pointers; its blobs through the local store
    and a real OCI registry beside a plain file copy."""
    promotion = doc["promotion"]
    assert promotion["channels"] == {"staging": doc["build_id"], "prod": doc["build_id"]}
    # Pointers and signed records only (prod's release approval is a small attestation), never the build's bytes
    assert 0 <= promotion["blob_bytes_written"] < 16 << 10 and promotion["seconds_for_two_moves"] > 0
    assert doc["bytes"] > 0 and doc["plain_copy_s"] > 0
    assert doc["local"]["push_s"] > 0 and doc["local"]["pull_s"] > 0
    oci = doc["oci"]
    if isinstance(oci, str):  # no docker-registry here: said so, not crashed
        assert oci.startswith("skipped")
    else:
        assert oci["push_MBps"] > 0 and oci["pull_MBps"] > 0


def _registry(doc: Any, build: Any) -> None:
    """A 1 MiB blob pushed and pulled by us and by skopeo, byte-identical; a build copied between registries."""
    blob = doc["blob"]
    if isinstance(blob, str):  # skopeo absent: said so, not crashed
        assert blob.startswith("skipped")
    else:
        assert blob["size_bytes"] == 1 << 20 and blob["push"]["ours"]["digest"] == blob["digest"]
        assert blob["pull"]["ours_byte_identical"] and blob["pull"]["skopeo_byte_identical"]
        for op in ("push", "pull"):
            assert blob[op]["ratio"] > 0 and blob[op]["ours"]["requests"] >= 1 and blob[op]["ours"]["peak_rss_mb"] > 0
    copy = doc["copy"]
    assert copy["compiled"] is False and copy["blobs"] >= 1 and copy["records"] >= 1
    assert all(copy["round_trip_identical"].values()), copy["round_trip_identical"]
    assert 0 < copy["a_to_b_again"]["requests"] < copy["a_to_b"]["requests"]  # nothing left to copy


def _serving(doc: Any, build: Any) -> None:
    """Real `avatar-release serve` pods: first fragment before the whole, concurrent clients, a burst past
    the queue told when to retry, hostile input refused, a --follow swap under load, flat memory."""
    assert 0 < doc["ttff"]["ttff_s"] < doc["ttff"]["whole_s"] and 0 < doc["ttff"]["ratio"] < 1
    c = doc["concurrent"]
    assert (c["clients"], c["requests"], c["ok"], c["failed"]) == (2, 2, 2, 0)
    b = doc["burst"]  # 3 at once against a queue of 1: the one past it is told when to retry, nobody fails
    assert b["ok"] + b["rejected_429"] == 3 and b["ok"] >= 1 and b["rejected_429"] >= 1
    assert b["with_retry_after"] == b["rejected_429"] and b["other"] == 0
    for label in ("png_bomb", "seconds_1e6"):
        h = doc["hostile"][label]
        assert 400 <= h["status"] < 500 and h["answer_s"] > 0
    p = doc["promotion_under_load"]
    assert p["failed"] == 0 and p["swap_seconds"] is not None and p["served_new"] >= 1
    assert doc["flat_memory"]["peak_ratio"] > 0 and doc["rss_mib"]["VmHWM"] >= doc["rss_mib"]["VmRSS"] > 0


def _shards(doc: Any, build: Any) -> None:
    """A real build gated as two shards run side by side, then merged."""
    assert doc["build_id"] == build.build_id and doc["unsharded_s"] is None
    ((n, row),) = doc["sharded"].items()
    assert n == "2" and row["vs_unsharded"] is None
    assert 0 < row["slowest_shard_worker_s"] <= row["shards_wall_s"] < row["total_s"]  # parts of the whole
    assert row["merge_s"] > 0 and row["merge_share_of_one_shard"] > 0


def _spine(doc: Any, build: Any) -> None:
    """Compile, serve, JIT and eager paths for one chunk: the served build never compiles."""
    s = doc["scenarios"]
    assert set(s) == {"compile", "serve", "serve_glibc_defaults", "jit", "eager"} and doc["chunks"] == 1
    compiled = s["compile"]
    assert compiled["build_id"].startswith("tiny-cpu-8-")
    assert {e["key"] for e in compiled["per_executable"]} == {"dit/f8", "sr/f8", "vae/f8"}
    assert all(0 < e["zstd_bytes"] < e["raw_bytes"] and e["compile_s"] > 0 for e in compiled["per_executable"])
    assert compiled["compile_wall_serial_s"] is None  # --smoke skips the serial compile
    served = s["serve"]
    assert served["compiles"] == 0 and served["torch_imported"] is False
    assert s["serve_glibc_defaults"]["compiles"] == 0  # the allocator's defaults, the same zero compiles
    assert 0 < served["load"]["total"] < compiled["trace_lower_compile_s"]
    assert s["jit"]["steady_chunk_s"] > 0 and s["eager"]["chunk_s"] > 0
    ratios = {name: r["value"] for name, r in doc["ratios"].items()}
    assert ratios.pop("concurrent / serial compile wall") is None
    assert len(ratios) == 9 and all(v > 0 for v in ratios.values()), ratios


def _swap(doc: Any, build: Any) -> None:
    """A pod serving the session's build swaps to a second one (the same weights, another program)
    with zero compiles, taking every tensor from the served build; the JIT path ran with JAX's
    persistent cache on (--smoke: no unmeasured run fills it first); a fresh pod's ready line carries
    its load timings."""
    (swap,) = doc["runs_by_mode"]["swap"]
    assert swap["from"] == build.build_id and swap["to"] != build.build_id and swap["compiles"] == 0
    assert swap["load"]["shared"]["tensors"] > 0 and swap["load"]["weight_path"] is None
    assert 0 < swap["swap_load_s"] < swap["swap_s"]
    (jit,) = doc["runs_by_mode"]["jit"]
    assert jit["cache_entries"] > 0 and jit["compile_s"] > 0 and jit["warm_chunk_s"] > 0
    (ready,) = doc["runs_by_mode"]["ready"]
    assert 0 < ready["deserialize_and_weights_s"] < ready["ready_s"]
    assert ready["load"]["total"] >= ready["deserialize_and_weights_s"]
    assert doc["versions"]["ml_dtypes"] and all(r["value"] > 0 for r in doc["ratios"].values())


def _state(doc: Any, build: Any) -> None:
    """A short and a longer signed history: promote and a pod's poll timed; the poll's bytes do not grow."""
    assert doc["smoke"] and doc["long"]["moves"] == 30 and doc["short"]["moves"] == 3
    assert doc["long"]["prod_history_moves"] == 10 and doc["short"]["prod_history_moves"] == 1
    for size in ("short", "long"):
        assert doc[size]["promote_s"]["median"] > 0 and doc[size]["poll_s"]["median"] > 0
    # A poll reads the timestamp, snapshot and (prod) its two evidence envelopes: the same bytes
    # whatever the history (a version number's digits aside).
    assert doc["long"]["poll_bytes"]["max"] <= doc["short"]["poll_bytes"]["max"] + 64
    assert doc["meets_goals"]["poll_bytes_flat"]


def _tpu(doc: Any, build: Any) -> None:
    """The session's TPU build of tiny (every kernel on Mosaic) read with --compiled, its evidence from
    its manifest; tiny's schedule probed through libtpu."""
    (row,) = doc["compiles"]
    assert row["exit_code"] == 0 and row["build_id"] == build.build_id and row["compiled_here"] is False
    assert row["wall_seconds"] is None and row["peak_rss_gib"] is None  # no compile ran here to time
    assert row["memory_fit"]["fits"] and 0 < row["memory_fit"]["total_bytes"] < row["memory_fit"]["capacity_bytes"]
    (chunk,) = row["chunks"][:1]
    assert {s["key"] for s in chunk["stages"]} == set(row["compile_seconds"]) == {"dit/f8", "sr/f8", "vae/f8"}
    assert all(s > 0 for s in row["compile_seconds"].values())  # as its manifest recorded them
    assert 0 < chunk["estimated_seconds"] and chunk["deadline_seconds"] > 0
    assert set(row["kernels"]) == {"dit/f8", "sr/f8"}  # the Pallas kernels the build routes to
    assert [p["groups"] for p in doc["schedule"]["tiny"]] == [1, 2]


def _trust(doc: Any, build: Any) -> None:
    """A real build promoted with a signed statement; a pod's cold load with and without the trust key."""
    assert doc["build_id"] == build.build_id and doc["runs"] == 1
    assert 0 < doc["signature_s"] < doc["cold_load_s"]["with_key"] and doc["cold_load_s"]["without_key"] > 0
    assert doc["evidence_sign_s"] > 0 and doc["evidence_verify_s"] > 0
    ratios = doc["ratios"]
    assert 0 < ratios["signature / cold load"] <= ratios["pre-load verification / cold load"] < 1
    assert doc["gate_s"] is None and ratios["evidence signing / gate"] is None  # --smoke: a stand-in gate result


def _weights(doc: Any, build: Any) -> None:
    """16 MiB of chunked weights written and loaded by the streaming loader in a fresh process, beside the
    safetensors and one-thread zstd anchors."""
    (row,) = doc["sizes"]
    assert row["raw_bytes"] == 16 << 20 and row["chunks"] >= 1
    assert row["stored_bytes"] == row["raw_bytes"] > row["zstd_bytes"]  # raw chunks by default; zstd saves bytes
    modes = row["modes"]
    assert set(modes) == {"ours", "ours-zstd", "safetensors", "zstd-1-thread"}
    ours = modes["ours"]["runs"][0]["steps"]
    assert ours["raw_bytes"] == row["raw_bytes"] and ours["workers"] >= 1
    assert (ours["compression"], ours["read"], ours["decompress"]) == ("none", "node", 0.0) and ours["hash"] > 0
    assert modes["ours-zstd"]["runs"][0]["steps"]["compression"] == "zstd"
    for m in modes.values():
        assert m["seconds"]["min"] <= m["seconds"]["median"] <= m["seconds"]["max"] and m["seconds"]["min"] > 0
        assert all(r["peak_rss_bytes"] > 0 for r in m["runs"])
    assert row["ratios_of_medians"]["ours_vs_safetensors"] > 0 and row["one_layer_change"]["uploaded_bytes"] > 0


# ----------------------------------------------------------------------------------------------- the table

SMOKES: dict[str, Smoke] = {
    "attacks": Smoke("bench_attacks.py", _attacks, build=True),
    "checkouts": Smoke("bench_checkouts.py", _checkouts),
    "cli": Smoke("bench_cli.py", _cli, slow=False, timeout=300),
    "compile_wall": Smoke("bench_compile_wall.py", _compile_wall),  # one compile of the example project
    # two libtpu compiles of one attention layer: seconds, in the fast lane
    "flash": Smoke("bench_flash.py", _flash, slow=False, extras=("tpu",)),
    "gates": Smoke("bench_gates.py", _gates, build=True, timeout=900),
    "gpu": Smoke("bench_gpu.py", _gpu, extras=("gpu",)),
    # the session's build read, not compiled again (--compiled); the gate in fresh processes, the JIT path twice
    "gpu_check": Smoke("gpu_check.py", _gpu_check, args=("--target", "cpu-8", "--compiled"), build=True, timeout=900),
    "house": Smoke("bench_house.py", _house, slow=False, timeout=120),
    "kernels": Smoke("bench_kernels.py", _kernels),  # seven XLA compiles of interpret-mode Pallas kernels
    "media": Smoke("bench_media.py", _media, args=("--no-render",), slow=False, timeout=300),
    "media_render": Smoke("bench_media.py", _media_render, timeout=300),  # two fresh rendering processes
    "node_cache": Smoke(
        "bench_node_cache.py", _node_cache, binaries=("docker-registry",), timeout=300
    ),  # 5 fresh processes
    "policy": Smoke("bench_policy.py", _policy, args=("--gated",), build=True, gated=True),
    "probes": Smoke("bench_probes.py", _probes, build=True, timeout=300),
    # the bench leaves the OCI half out without docker-registry; under the switch that fails
    "promote": Smoke("bench_promote.py", _promote, slow=False, optional=("docker-registry",), timeout=300),
    # three registry servers, four child processes; skopeo's half is left out without it
    "registry": Smoke("bench_registry.py", _registry, binaries=("docker-registry",), optional=("skopeo",)),
    "serving": Smoke(
        "bench_serving.py", _serving, build=True, candidate=("--candidate", {"matmul_k_split": "2"}), timeout=900
    ),
    "shards": Smoke("bench_shards.py", _shards, build=True, timeout=900),
    "spine": Smoke("bench_spine.py", _spine, timeout=900),  # two compiles of tiny (the compile and JIT scenarios)
    "state": Smoke("bench_state.py", _state, slow=False, timeout=300),
    # a pod's swap, the JIT path (once: it fills its own cache), a fresh pod and bare JAX
    # B, beside the session's build in --registry: found by bench_swap, not compiled there
    "swap": Smoke("bench_swap.py", _swap, build=True, candidate=(None, {"matmul_k_split": "2"}), timeout=900),
    # the session's TPU build of tiny read (--compiled), not compiled a second time; its schedule probed
    "tpu": Smoke("bench_tpu.py", _tpu, args=("--compiled",), tpu_build=True, extras=("tpu",), timeout=900),
    "trust": Smoke("bench_trust.py", _trust, build=True),
    "weights": Smoke("bench_weights.py", _weights),
}


def _marks(name: str, smoke: Smoke) -> list[pytest.MarkDecorator]:
    assert smoke.slow or not (smoke.build or smoke.tpu_build), f"{name}: a row given the session's build is slow"
    assert not (smoke.build and smoke.tpu_build), f"{name}: one --registry"
    assert smoke.build or smoke.candidate is None, f"{name}: a candidate is published beside the session's build"
    assert smoke.build or not smoke.gated, f"{name}: the gated build is the session's build"
    marks = [pytest.mark.xdist_group(f"smoke-{name}")]  # a row of its own under --dist loadgroup
    if smoke.slow:
        marks.append(pytest.mark.slow)
    if smoke.extras:
        marks.append(pytest.mark.extra(*smoke.extras))
    return marks


@pytest.mark.parametrize("name", [pytest.param(n, id=n, marks=_marks(n, s)) for n, s in SMOKES.items()])
def test_smoke_mode(name, request, tmp_path):
    smoke = SMOKES[name]
    for program in smoke.binaries:
        binary(program)
    for program in smoke.optional:
        binary_if_present(program)
    args, build = list(smoke.args), None
    if smoke.tpu_build:
        source, build, _ = request.getfixturevalue("tpu_registry")
        shutil.copytree(source, tmp_path / "tpu-reg")
        args += ["--registry", str(tmp_path / "tpu-reg")]
    if smoke.build:
        root, build, *_ = request.getfixturevalue("gated_copy" if smoke.gated else "registry_copy")
        args += ["--registry", str(root)]
        if smoke.candidate is not None:
            from avatar_release.registry import LocalRegistry

            flag, overrides = smoke.candidate
            other = request.getfixturevalue("build_cache").compile(
                "tiny", "cpu-8", registry=LocalRegistry(root), overrides=overrides, move_dev=False
            )
            if flag is not None:
                args += [flag, other.build_id]
    doc = run_smoke(smoke.script, *args, out=tmp_path / f"{name}.json", timeout=smoke.timeout)
    smoke.check(doc, build)


def _flags(script: Path) -> set[str]:
    tree = ast.parse(script.read_text(), str(script))
    return {
        arg.value
        for node in ast.walk(tree)
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "add_argument"
        for arg in node.args
        if isinstance(arg, ast.Constant) and isinstance(arg.value, str)
    }


@pytest.mark.parametrize("script", sorted(BENCHMARKS.glob("bench_*.py")), ids=lambda p: p.stem)
def test_every_benchmark_has_a_smoke_mode_and_a_row_here(script):
    assert {"--smoke", "--out"} <= _flags(script), f"{script.name}: needs --smoke and --out"
    assert script.name in {s.script for s in SMOKES.values()}, (
        f"{script.name} has no smoke test: add a row for it to SMOKES in tests/integration/test_benchmarks.py "
        "(the script, a check of the JSON its --smoke run writes, and what it needs)"
    )
