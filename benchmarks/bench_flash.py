"""The DiT's attention per chunk and per chip: dense (materialised logits) vs the flash kernel.

For each production pipeline, one DiT attention layer (Ulysses over the 8 chips, the chip's heads
over the whole chunk's sequence) is compiled for tpu-v6e-8 through libtpu's topology on this host,
twice: with the dense reference (``kernels.ulysses.reference_attention``, the body XLA fuses
itself) and with ``kernels.flash``. Printed per chip per chunk (x depth x sampler steps): XLA:TPU's
``cost_analysis()`` flops and bytes for each (labelled: compiler estimates, not measurements), the
analytic floor of a materialising formulation (``flash.dense_attention_bytes``), the kernel's own
CostEstimate, and the time floors at the v6e's published peaks. JSON to
benchmarks/results/flash.json.

    python benchmarks/bench_flash.py [--pipelines avatar-720p,avatar-1080p] [--out FILE]
    python benchmarks/bench_flash.py --smoke --out FILE   # the tiny pipeline's layer: seconds; the tests run it
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # the bundled pipeline (model/, kernels/) is a project beside the package

from _out import out_path, write_results  # noqa: E402 (benchmarks/_out.py, beside this file)


def measure(pipeline: str) -> dict:
    import jax
    import jax.numpy as jnp
    from jax.sharding import NamedSharding, PartitionSpec

    from avatar_release.compile import make_mesh, target_devices
    from avatar_release.machine import configure_compile_env
    from avatar_release.specs import load_flag_profile, load_pipeline, load_target
    from kernels import flash
    from kernels.target import kernel_target
    from kernels.ulysses import reference_attention, ulysses_attention
    from model.config import get_config

    tgt = load_target("tpu-v6e-8")
    configure_compile_env(tgt)
    flags = load_flag_profile(tgt.flag_profile)
    mesh = make_mesh(target_devices(tgt), tgt)
    chips = tgt.device_count
    config = get_config(load_pipeline(pipeline).config)
    frames = load_pipeline(pipeline).buckets[0].frames
    heads, seq = config.dit.heads, config.dit_sequence(frames)
    hd = config.dit.dim // heads
    calls = config.dit.depth * config.dit.steps  # attention calls per chunk
    local = heads // chips  # heads per chip after the Ulysses all-to-all
    x = jax.ShapeDtypeStruct(
        (heads, seq, hd), jnp.bfloat16, sharding=NamedSharding(mesh, PartitionSpec(None, "fsdp", None))
    )
    bodies = {"dense": reference_attention, "flash": lambda q, k, v, m: flash.flash_attention(q, k, v)}
    out = {
        "pipeline": pipeline,
        "frames": frames,
        "heads": heads,
        "heads_per_chip": local,
        "seq": seq,
        "head_dim": hd,
        "calls_per_chunk": calls,
        "label": "compiler estimates, not measurements",
    }
    for name, body in bodies.items():

        def layer(q, k, v, body=body):
            return ulysses_attention(q, k, v, mesh=mesh, axis="fsdp", attention_fn=body)

        t0 = time.perf_counter()
        with kernel_target("tpu", flags.kernel_flags):
            lowered = jax.jit(layer).lower(x, x, x)
        compiled = lowered.compile(compiler_options=dict(flags.compiler_options))
        cost = compiled.cost_analysis()
        mem = compiled.memory_analysis()
        out[name] = {
            "xla_flops_per_chip_chunk": cost["flops"] * calls,
            "xla_bytes_per_chip_chunk": cost["bytes accessed"] * calls,
            "temp_bytes_per_call": int(mem.temp_size_in_bytes),
            "compile_seconds": round(time.perf_counter() - t0, 2),
        }
    bq, bk = flash.default_blocks(seq)
    est = flash.cost_estimate(heads=local, seq=seq, head_dim=hd, block_q=bq, block_k=bk)
    out["flash"].update(
        blocks=[bq, bk],
        estimate_flops_per_chip_chunk=est.flops * calls,
        estimate_bytes_per_chip_chunk=est.bytes_accessed * calls,
    )
    out["dense"]["floor_bytes_per_chip_chunk"] = flash.dense_attention_bytes(heads=local, seq=seq, head_dim=hd) * calls
    for name in ("dense", "flash"):
        r = out[name]
        r["compute_floor_s"] = r["xla_flops_per_chip_chunk"] / tgt.peak_flops_per_second
        r["memory_floor_s"] = r["xla_bytes_per_chip_chunk"] / tgt.hbm_bytes_per_second
    out["deadline_s"] = frames / config.fps
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pipelines", default="avatar-720p,avatar-1080p")
    ap.add_argument("--smoke", action="store_true", help="the tiny pipeline's attention layer only")
    ap.add_argument("--out", help="write the JSON here (default benchmarks/results/flash.json; --smoke: nowhere)")
    args = ap.parse_args()
    os.environ.setdefault("AVATAR_RELEASE_PROJECT", str(ROOT))  # the bundled pipeline's specs, wherever it runs
    if args.smoke:
        args.pipelines = "tiny"
    results = [measure(p) for p in args.pipelines.split(",")]
    for r in results:
        d, f = r["dense"], r["flash"]
        print(
            f"{r['pipeline']}: {r['heads_per_chip']} heads x {r['seq']} tokens x {r['head_dim']} per chip, "
            f"{r['calls_per_chunk']} calls per chunk ({r['label']})"
        )
        print(
            f"  dense  {d['xla_bytes_per_chip_chunk'] / 1e12:8.3f} TB  {d['xla_flops_per_chip_chunk'] / 1e12:8.1f} TFLOP"
            f"  floor {d['floor_bytes_per_chip_chunk'] / 1e12:.3f} TB  time floor "
            f"{max(d['compute_floor_s'], d['memory_floor_s']):.3f} s"
        )
        print(
            f"  flash  {f['xla_bytes_per_chip_chunk'] / 1e12:8.3f} TB  {f['xla_flops_per_chip_chunk'] / 1e12:8.1f} TFLOP"
            f"  estimate {f['estimate_bytes_per_chip_chunk'] / 1e12:.3f} TB {f['estimate_flops_per_chip_chunk'] / 1e12:.1f}"
            f" TFLOP  time floor {max(f['compute_floor_s'], f['memory_floor_s']):.3f} s  (deadline {r['deadline_s']:.2f} s)"
        )
    write_results(results, out_path(args.out, "flash", smoke=args.smoke), smoke=args.smoke)


if __name__ == "__main__":
    main()
