"""The per-run cost: XLA's own analysis with every while loop counted as often as it turns.

Each test compares against what XLA itself reports for the same work written out without a loop,
so the figure a stage estimate is made of can be checked by a reader, not only by this module.
"""

from __future__ import annotations

import json

import pytest

from avatar_release.analysis import estimate_chunks
from avatar_release.compile._loopcost import PER_RUN_KEYS, _kernel_costs, _Module, run_cost


def _compiled(fn, *shapes):
    import jax
    import jax.numpy as jnp

    args = [jax.ShapeDtypeStruct(s, jnp.float32) for s in shapes]
    return jax.jit(fn).lower(*args).compile()


def _xla(compiled) -> dict:
    ca = compiled.cost_analysis()
    return ca[0] if isinstance(ca, (list, tuple)) else ca


def _layers(x, ws):
    import jax.numpy as jnp

    for i in range(ws.shape[0]):
        x = jnp.tanh(x @ ws[i])
    return x


def _scanned(x, ws):
    import jax
    import jax.numpy as jnp

    return jax.lax.scan(lambda h, w: (jnp.tanh(h @ w), None), x, ws)[0]


@pytest.mark.parametrize("depth", [3, 12])
def test_a_scan_costs_what_the_same_layers_cost_written_out(depth):
    unrolled = _xla(_compiled(_layers, (64, 128), (depth, 128, 128)))
    scanned = _compiled(_scanned, (64, 128), (depth, 128, 128))
    once = _xla(scanned)
    run = run_cost(scanned.as_text())
    assert once["flops"] < unrolled["flops"] / 2  # XLA's own figure counts the body once
    assert run.flops == pytest.approx(unrolled["flops"], rel=0.02)
    assert run.transcendentals == pytest.approx(unrolled["transcendentals"], rel=0.02)
    # Bytes differ a little between a loop and straight-line code (the carry, the slicing), but
    # scale with the depth as the layers' reads do.
    assert run.bytes_accessed == pytest.approx(unrolled["bytes accessed"], rel=0.25)
    assert [trips for _, trips in run.loops] == [depth] and run.unknown_loops == []


def test_nested_loops_multiply_and_work_outside_the_loop_is_counted_once():
    import jax
    import jax.numpy as jnp

    def nested(x, w):
        y = x @ w @ w  # outside any loop: 2 matmuls, once
        inner = lambda h, _: (h @ w, None)  # noqa: E731
        outer = lambda h, _: (jax.lax.scan(inner, h, None, length=5)[0], None)  # noqa: E731
        return jax.lax.scan(outer, y, None, length=7)[0] + jnp.sum(x)

    run = run_cost(_compiled(nested, (32, 64), (64, 64)).as_text())
    matmul = 2 * 32 * 64 * 64
    assert run.flops == pytest.approx((2 + 7 * 5) * matmul, rel=0.02)
    assert sorted(t for _, t in run.loops) == [5, 7]


def test_a_loop_whose_trip_count_cannot_be_read_is_counted_once_and_named():
    import jax
    import jax.numpy as jnp

    def data_dependent(x, n):
        return jax.lax.while_loop(lambda c: c[1] < n[0, 0], lambda c: (jnp.tanh(c[0] @ c[0]), c[1] + 1.0), (x, 0.0))[0]

    compiled = _compiled(data_dependent, (64, 64), (1, 1))
    run = run_cost(compiled.as_text())
    assert len(run.unknown_loops) == 1
    assert run.flops == pytest.approx(_xla(compiled)["flops"], rel=0.02)


def test_pallas_cost_estimates_are_added_once_per_call_site_and_multiplied_by_their_loop():
    estimate = {"flops": "1000", "transcendentals": "10", "bytes_accessed": "500", "remote_bytes_transferred": "0"}
    config = json.dumps({"custom_call_config": {"cost_estimate": estimate}}).replace('"', '\\"')
    line = (
        f'  %k = f32[8]{{0}} custom-call(f32[8]{{0}} %p), custom_call_target="tpu_custom_call", '
        f'backend_config="{config}"'
    )
    module = _Module(
        f"HloModule m\n\nENTRY %main (p: f32[8]) -> f32[8] {{\n  %p = f32[8]{{0}} parameter(0)\n{line}\n}}\n"
    )
    total, n = _kernel_costs(module, "main")
    assert n == 1 and total == {"flops": 1000.0, "bytes accessed": 500.0, "transcendentals": 10.0}


def test_a_stage_estimate_prefers_the_per_run_figures_over_the_scaled_ones():
    class _B:
        name, frames = "f8", 8

    class _E:
        key, bucket, cost_loop_scale, schedule = "dit/f8", "f8", 36.0, None
        cost = {
            "flops": 1e12,
            "bytes accessed": 1e10,
            PER_RUN_KEYS["flops"]: 2e13,
            PER_RUN_KEYS["bytes accessed"]: 3.28e11,
        }

    class M:
        class program:
            fps = 25

        buckets, executables = [_B], [_E]

    (c,) = estimate_chunks(M, peak_flops=1e15, bandwidth=1.64e12)
    (st,) = c.stages
    assert st.flops == 2e13 and st.bytes_accessed == 3.28e11 and st.counted.startswith("per-run")
    assert st.roofline_seconds == pytest.approx(0.2) and st.bound == "memory"
    _E.cost = {"flops": 1e12, "bytes accessed": 1e10}  # an older manifest: the scaled figures
    (st,) = estimate_chunks(M, peak_flops=1e15, bandwidth=1.64e12)[0].stages
    assert st.flops == 36e12 and st.counted.startswith("loop-scaled")


def test_collectives_in_a_loop_are_counted_per_trip_and_synchronous_ones_are_exposed():
    """On CPU every collective is synchronous: each layer's weight gather brings 7/8 of the
    layer's weight to each of 8 devices, once per trip, all of it exposed."""
    import jax
    import jax.numpy as jnp
    from jax.sharding import NamedSharding, PartitionSpec

    mesh = jax.sharding.Mesh(jax.devices()[:8], ("x",))  # GSPMD's automatic partitioning
    whole = NamedSharding(mesh, PartitionSpec())

    def layers(x, ws):
        body = lambda h, w: (jnp.tanh(h @ jax.lax.with_sharding_constraint(w, whole)), None)  # noqa: E731
        return jax.lax.scan(body, x, ws)[0]

    ws = jax.ShapeDtypeStruct((5, 256, 256), jnp.float32, sharding=NamedSharding(mesh, PartitionSpec(None, "x", None)))
    x = jax.ShapeDtypeStruct((64, 256), jnp.float32, sharding=NamedSharding(mesh, PartitionSpec("x", None)))
    run = run_cost(jax.jit(layers).lower(x, ws).compile().as_text(), devices=8)
    per_layer = 256 * 256 * 4 * 7 / 8
    assert run.collective_bytes >= 5 * per_layer  # at least the five gathers (the partitioner may add more)
    assert run.exposed_collective_bytes == run.collective_bytes  # synchronous: nothing beside them
    assert run_cost(jax.jit(layers).lower(x, ws).compile().as_text()).collective_bytes == 0  # one device: none


_SCHEDULED = """HloModule m

%gather (p: bf16[128,64]) -> bf16[1024,64] {
  %p = bf16[128,64]{1,0} parameter(0)
  ROOT %all-gather = bf16[1024,64]{1,0} all-gather(%p), dimensions={0}
}, execution_thread="sparsecore"

ENTRY %main (a: bf16[128,64], b: f32[64,64]) -> f32[64,64] {
  %a = bf16[128,64]{1,0} parameter(0)
  %b = f32[64,64]{1,0} parameter(1)
  %ag-start = (bf16[128,64]{1,0}, bf16[1024,64]{1,0}) all-gather-start(%a), dimensions={0}
  %ag-done = bf16[1024,64]{1,0} all-gather-done(%ag-start)
  %cs = ((bf16[128,64]{1,0}), bf16[1024,64]{1,0}) call-start(%a), async_execution_thread="sparsecore", to_apply=%gather
  %f = f32[64,64]{1,0} fusion(%b), kind=kLoop, calls=%gather
  %cd = bf16[1024,64]{1,0} call-done(%cs)
  ROOT %r = f32[64,64]{1,0} add(%f, %b)
}
"""


def test_an_async_pair_with_compute_inside_is_hidden_and_one_without_is_exposed():
    from avatar_release.compile._loopcost import _async_results, _collective_bytes

    module = _Module(_SCHEDULED)
    gathered = 1024 * 64 * 2 * 7 / 8
    total, exposed = _collective_bytes(module, "main", 8)
    # The all-gather pair has nothing between start and done: exposed. The SparseCore call has
    # a fusion between its start and done: hidden.
    assert total == pytest.approx(2 * gathered) and exposed == pytest.approx(gathered)
    # XLA counts an async call's result at its start and again at its done: once is taken back.
    assert _async_results(module, "main") == 1024 * 64 * 2
