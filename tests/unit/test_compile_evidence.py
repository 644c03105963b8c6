"""What a compiled program's text and XLA's analyses are turned into: schedule, kernels,
memory fit, scan-corrected cost and the per-chunk estimate. Hand-written HLO, no compiles."""

from __future__ import annotations

import pytest

from avatar_release.analysis import estimate_chunks
from avatar_release.compile._evidence import host_callbacks, kernels_in, memory_fit, per_device_bytes, schedule_of
from avatar_release.records import ArraySpec

HLO = """HloModule jit_stage_fn, is_scheduled=true

%body (p: f32[8]) -> f32[8] {
  %p = f32[8]{0} parameter(0)
  %s = ((f32[8]{0}), f32[8]{0}) all-to-all-start(%p), channel_id=1
  %f = f32[8]{0} fusion(%p), kind=kLoop, calls=%x
  %d = f32[8]{0} all-to-all-done(%s)
  ROOT %r = f32[8]{0} add(%d, %f)
}

ENTRY %main (a: f32[8]) -> f32[8] {
  %a = f32[8]{0} parameter(0)
  %s2 = ((f32[8]{0}), f32[8]{0}) all-to-all-start(%a), channel_id=2
  %b = f32[8]{0} bitcast(%s2)
  %d2 = f32[8]{0} all-to-all-done(%s2)
  %sync = f32[8]{0:T(128)S(1)} all-to-all(%d2), channel_id=3, frontend_attributes={async_collective_name="all-to-all-start.9"}
  %k = bf16[1,8]{1,0} custom-call(%sync), custom_call_target="tpu_custom_call", metadata={op_name="jit(f)/shard_map/sr_blocksparse_attention/pallas_call"}, backend_config={"flag_configs":[{"flag_type":"XLA_TPU_FORCE_LP_LLO_SCHEDULER","value":{"boolean_value":true}}],"custom_call_config":{"body":"abc"}}
  %k2 = bf16[1,8]{1,0} custom-call(%k), custom_call_target="tpu_custom_call", metadata={op_name="jit(f)/preattn/pallas_call"}, backend_config={"custom_call_config":{"body":"abc"}}
  ROOT %c = f32[8]{0} custom-call(%k2), custom_call_target="xla_python_cpu_callback"
}
"""


def test_schedule_counts_hidden_pairs_exposed_pairs_and_synchronous_all_to_alls():
    s = schedule_of(HLO)
    assert (s.all_to_alls, s.async_pairs, s.synchronous) == (3, 2, 1)
    # body: a fusion between start and done (hidden); entry: only a bitcast (exposed), plus the sync one.
    assert (s.hidden, s.exposed) == (1, 2)


def test_kernels_are_found_by_name_with_the_flags_each_call_carries():
    ks = {k.name: k for k in kernels_in(HLO)}
    assert ks["sr_blocksparse_attention"].backend == "mosaic" and ks["sr_blocksparse_attention"].count == 1
    assert ks["sr_blocksparse_attention"].flags == {"XLA_TPU_FORCE_LP_LLO_SCHEDULER": True}
    assert ks["preattn"].flags == {}  # this call site requested nothing


def test_interpreted_kernels_are_found_by_their_name_scope():
    text = '  %w = f32[2]{0} while(%t), metadata={op_name="jit(f)/avatar::pre_attention/shard_map/preattn/while"}\n'
    (k,) = kernels_in(text, ("preattn",))
    assert kernels_in(text) == []  # a name scope alone is no kernel: the traced program names them
    assert k.name == "preattn" and k.backend == "interpret" and k.count is None


def test_host_callbacks_are_reported():
    assert host_callbacks(HLO) == ["xla_python_cpu_callback"]
    assert host_callbacks(HLO.replace("xla_python_cpu_callback", "foo")) == []


class _Entry:
    def __init__(self, key, params, memory, cost=None, scale=1.0):
        self.key, self.stage, self.bucket = key, key.split("/")[0], key.split("/")[1]
        self.params, self.memory, self.cost, self.cost_loop_scale = params, memory, cost or {}, scale


def _w(n_rows, sharded=True):
    return ArraySpec(
        name="w", shape=[n_rows, 1024], dtype="bfloat16", sharding=["fsdp", None] if sharded else [None, None]
    )


def test_memory_fit_keeps_every_stages_weights_resident_and_adds_the_largest_working_set():
    w = _w(8 * 1024)  # 16 MiB, 2 MiB per device
    assert per_device_bytes(w, 8) == 2 * 2**20 and per_device_bytes(_w(8 * 1024, False), 8) == 16 * 2**20
    a = _Entry("dit/f8", [w], {"argument_size": 2 * 2**20 + 100, "output_size": 10, "temp_size": 3 * 2**20})
    b = _Entry(
        "vae/f8",
        [w, w],
        {
            "argument_size": 4 * 2**20 + 100,
            "output_size": 10,
            "temp_size": 5 * 2**20,
            "alias_size": 0,
            "generated_code_size": 50,
        },
    )
    fit = memory_fit([a, b], capacity=16 * 2**20, mesh_size=8, weight_sharding="fsdp")
    assert fit.weights_bytes == 6 * 2**20 and fit.peak_stage == "vae/f8"
    assert fit.peak_working_bytes == 100 + 10 + 5 * 2**20 + 50
    assert fit.total_bytes == fit.weights_bytes + fit.peak_working_bytes and fit.fits
    assert not memory_fit([a, b], capacity=8 * 2**20, mesh_size=8, weight_sharding="fsdp").fits


def test_loop_scale_counts_each_scanned_block_once_per_trip():
    import jax
    import jax.numpy as jnp

    from avatar_release.compile._flops import loop_scale, traced_flops

    def f(x, ws):
        y, _ = jax.lax.scan(lambda h, w: (h @ w, None), x, ws)
        return y @ ws[0]

    jaxpr = jax.make_jaxpr(f)(jnp.ones((4, 16)), jnp.ones((32, 16, 16)))
    one = 2 * 4 * 16 * 16
    assert traced_flops(jaxpr, count_trips=False) == 2 * one
    assert traced_flops(jaxpr, count_trips=True) == 33 * one
    assert loop_scale(jaxpr) == pytest.approx(33 / 2)


def test_chunk_estimate_scales_xla_cost_and_compares_with_the_deadline():
    class M:
        class program:
            fps = 25

        class _B:
            name, frames = "f8", 8

        buckets = [_B]
        executables = [
            _Entry("dit/f8", [], {}, {"flops": 1e12, "bytes accessed": 1e9, "optimal_seconds": -3.0}, scale=4.0),
            _Entry("vae/f8", [], {}, {"flops": 1e10, "bytes accessed": 1.64e11, "optimal_seconds": 0.05}),
        ]

    (c,) = estimate_chunks(M, peak_flops=1e15, bandwidth=1.64e12)
    dit, vae = c.stages
    assert dit.roofline_seconds == pytest.approx(4e12 / 1e15) and dit.bound == "compute"
    assert dit.xla_optimal_seconds is None and "not a usable estimate" in dit.xla_optimal_note
    assert vae.roofline_seconds == pytest.approx(0.1) and vae.bound == "memory" and vae.xla_optimal_seconds == 0.05
    assert c.deadline_seconds == pytest.approx(0.32) and c.estimated_seconds == pytest.approx(0.104)
    assert c.ratio == pytest.approx(0.104 / 0.32) and "not a measurement" in c.label
    (none,) = estimate_chunks(M, None, None)  # no published peaks: XLA's own figure where usable, else none
    assert none.estimated_seconds is None
