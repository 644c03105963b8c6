"""Attention kernels, side by side: the write-up's claims as ratios, measured where CPU can show them.

    python benchmarks/bench_kernels.py [--shape tiny|small] [--repeat 5] [--out benchmarks/results/kernels.json]
    python benchmarks/bench_kernels.py --smoke --out FILE    # 3 frames, 2 heads, G = 1, 2: seconds; the tests run it

On CPU the Pallas kernels run in interpret mode and there is no asynchronous all-to-all, so:
block-sparse vs dense and aligned vs 128-tiled (kernels/blocksparse_tiled.py: padded, mask
predicate in every step) are real (if interpreter-taxed) measurements; bounded vs online shows only the
error and the CPU cost (the gain is removing a serial dependency on accelerators); head groups
show equal bytes and the CPU overhead of more, smaller launches. Nothing is asserted.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from _out import out_path, write_results  # noqa: E402 (benchmarks/_out.py, beside this file)
from _timing import median_seconds  # noqa: E402 (benchmarks/_timing.py, beside this file)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--shape", default="tiny", choices=["tiny", "small"])
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument(
        "--smoke",
        action="store_true",
        help="the tiny shape cut to 3 frames and 2 heads, head groups G = 1, 2, one repeat",
    )
    ap.add_argument("--out", help="write the JSON here (default benchmarks/results/kernels.json; --smoke: nowhere)")
    args = ap.parse_args()
    os.environ.setdefault("AVATAR_RELEASE_PROJECT", str(ROOT))  # the bundled pipeline's specs, wherever it runs
    if args.smoke:
        args.shape, args.repeat = "tiny", 1

    from avatar_release.machine import configure_host_devices

    configure_host_devices(8)
    import jax
    import jax.numpy as jnp
    import numpy as np

    from kernels import masks
    from kernels.blocksparse import blocksparse_attention, frame_reference
    from kernels.bounded_softmax import bounded_softmax_attention, eligible_heads
    from kernels.ulysses import FrameWindow, alltoall_bytes, hlo_all_to_alls, ulysses_attention
    from model.config import get_config

    c = get_config(args.shape)
    t, frames, window = c.sr_tokens_per_frame, c.frames_per_chunk + 1, c.sr.window
    heads, hd = c.sr.heads, c.sr.dim // c.sr.heads
    group_counts = (1, 2, 4)
    if args.smoke:  # the same kernels and the same frame geometry per frame, on a fraction of the tokens
        frames, heads, group_counts = 3, 2, (1, 2)
    s = frames * t
    rng = np.random.default_rng(0)
    q, k, v = (jnp.asarray(rng.standard_normal((heads, s, hd)), jnp.bfloat16) for _ in range(3))
    geom = dict(frames=frames, tokens_per_frame=t, window=window)
    live = masks.live_fraction(frames, window)
    rows = []

    dense = jax.jit(lambda q, k, v: frame_reference(q, k, v, **geom))
    sparse = jax.jit(lambda q, k, v: blocksparse_attention(q, k, v, **geom))
    t_dense, t_sparse = (
        median_seconds(dense, q, k, v, repeat=args.repeat),
        median_seconds(sparse, q, k, v, repeat=args.repeat),
    )
    rows.append(("dense masked / aligned block-sparse (time)", t_dense / t_sparse, f">= {0.8 / live:.2f}"))

    aligned = masks.default_block(t)
    tiled, fitted = masks.tile_counts(frames, t, window, 128), masks.tile_counts(frames, t, window, aligned)
    work = (tiled.live * 128**2) / (fitted.live * aligned**2)
    from kernels.blocksparse_tiled import tiled_blocksparse_attention

    tiled_fn = jax.jit(lambda q, k, v: tiled_blocksparse_attention(q, k, v, **geom))
    t_tiled = median_seconds(tiled_fn, q, k, v, repeat=args.repeat)
    rows.append(("128-tiled / aligned block-sparse (time)", t_tiled / t_sparse, ">= 1.08"))
    rows.append(("128-tiled / aligned: token pairs visited", work, ""))

    f32 = [x.astype(jnp.float32) for x in (q, k, v)]
    flags, share = eligible_heads(f32[0], f32[1], **geom)
    bounded = jax.jit(lambda q, k, v: bounded_softmax_attention(q, k, v, **geom))
    online = jax.jit(lambda q, k, v: bounded_softmax_attention(q, k, v, eligible=jnp.zeros((heads,), bool), **geom))
    err = float(jnp.max(jnp.abs(bounded(*f32) - frame_reference(*f32, **geom))))
    t_b, t_o = median_seconds(bounded, q, k, v, repeat=args.repeat), median_seconds(online, q, k, v, repeat=args.repeat)
    rows.append(("bounded / online softmax (CPU time)", t_b / t_o, "<= 1.05"))

    groups = []
    mesh = jax.make_mesh((8,), ("fsdp",))
    gh = max(heads, 8 * max(group_counts))  # enough heads for the largest G over 8 devices
    qg, kg, vg = (jnp.asarray(rng.standard_normal((gh, s, hd)), jnp.bfloat16) for _ in range(3))
    sharding = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec(None, "fsdp", None))
    qg, kg, vg = (jax.device_put(x, sharding) for x in (qg, kg, vg))
    for g in group_counts:
        fn = jax.jit(
            lambda q, k, v, g=g: ulysses_attention(q, k, v, mesh=mesh, groups=g, mask=FrameWindow(frames, t, window))
        )
        ops = hlo_all_to_alls(fn.lower(qg, kg, vg).compile().as_text())
        groups.append(
            {
                "G": g,
                "all_to_alls": len(ops),
                "bytes": sum(o.bytes for o in ops),
                "analytic_bytes": alltoall_bytes(gh, s, hd, jnp.bfloat16, 8, g).total,
                "seconds": median_seconds(fn, qg, kg, vg, repeat=args.repeat),
            }
        )
    for g in groups[1:]:
        rows.append((f"G={g['G']} / G=1 wall time ({gh} heads)", g["seconds"] / groups[0]["seconds"], "<= 1.10"))

    result = {
        "shape": args.shape,
        "smoke": args.smoke,
        "repeat": args.repeat,
        "sr": {"tokens_per_frame": t, "frames": frames, "window": window, "heads": heads, "head_dim": hd},
        "live_fraction": live,
        "seconds": {"dense": t_dense, "blocksparse": t_sparse, "tiled_128": t_tiled, "bounded": t_b, "online": t_o},
        "tiles": {"tile_128": tiled._asdict(), f"aligned_{aligned}": fitted._asdict()},
        "bounded": {"max_abs_error_f32": err, "eligible_share_random_inputs": float(share)},
        "groups": groups,
        "ratios": {name: {"value": round(v, 3), "goal": goal} for name, v, goal in rows},
        "note": "CPU, Pallas interpret mode, no async collectives; see the module docstring",
    }
    print(f"SR {frames} x {t} tokens, window {window}, live fraction {live:.3f}, {heads} heads x {hd}")
    print(f"{'measure':<52} {'ratio':>7} {'goal':>8}")
    for name, v, goal in rows:
        print(f"{name:<52} {v:7.2f} {goal:>8}")
    print(
        f"bounded softmax max abs error (f32) {err:.2e} (goal <= 2e-6); eligible heads {float(share):.2%} "
        "on random inputs (see `avatar-release analyze attention` for pipeline activations)"
    )
    print("all-to-all bytes per G: " + ", ".join(f"G={g['G']}: {g['bytes']} ({g['all_to_alls']} ops)" for g in groups))
    write_results(result, out_path(args.out, "kernels", smoke=args.smoke), smoke=args.smoke)


if __name__ == "__main__":
    main()
