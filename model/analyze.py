"""``avatar-release analyze attention``: what the attention kernels face for one pipeline config.

* the SR stage's geometry: tokens per frame, frames per chunk (+ the reference frame), window;
* the mask's live fraction, and full / partial / empty block counts at 128-token tiles (a
  stock block-sparse kernel, padded) vs the frame-aligned block size (0 partial by design);
* the share of heads eligible for the bounded softmax, on real pipeline activations: the SR
  q and k of every layer while rendering the first gate-set request (only for configs whose
  weights can be materialized here; production configs are abstract shapes only);
* all-to-all bytes per layer per Ulysses group, read from the compiled HLO of the grouped
  attention for G = 1, 2, 4 where the heads allow it, next to the analytic figure.
"""

from __future__ import annotations

__all__ = ["analyze_attention", "attention_text"]

_MATERIALIZABLE = ("tiny", "small")


def _sr_eligibility(config) -> dict:
    """Run the eager model on the first gate-set request's first chunk, capturing SR q and k."""
    import jax.numpy as jnp
    import numpy as np
    import torch

    import model.attention as attention_mod
    from avatar_release.media import sample_audio, sample_image
    from kernels.bounded_softmax import eligible_heads
    from model.noise import chunk_noise
    from model.weights import init_pipeline

    pipe = init_pipeline(config, seed=0)
    captured: list[tuple[np.ndarray, np.ndarray]] = []
    original = attention_mod.attention

    def capture(q, k, v, mask=None):
        if mask is not None:  # the SR attention is the masked one
            captured.append((q.float().numpy(), k.float().numpy()))
        return original(q, k, v, mask)

    image = torch.from_numpy(sample_image(config.height, config.width, 0))
    audio = torch.from_numpy(
        sample_audio(config.frames_per_chunk / config.fps, config.sample_rate, 0)[: config.chunk_samples()].copy()
    )
    prev = torch.zeros(config.latent_channels, *config.dit_grid)
    noise = torch.from_numpy(chunk_noise(config, 0, 0))
    attention_mod.attention = capture
    try:
        with torch.no_grad():
            latents, _ = pipe.dit(image, audio, prev, noise)
            pipe.sr(latents, image)
    finally:
        attention_mod.attention = original
    t = config.sr_tokens_per_frame
    per_layer = []
    for q, k in captured:
        flags, share = eligible_heads(
            jnp.asarray(q), jnp.asarray(k), frames=q.shape[1] // t, tokens_per_frame=t, window=config.sr.window
        )
        per_layer.append(round(float(share), 4))
    heads = sum(len(q) for q, _ in captured)
    eligible = sum(s * len(q) for s, (q, _) in zip(per_layer, captured))
    return {
        "layers": len(captured),
        "per_layer_share": per_layer,
        "share": round(eligible / heads, 4) if heads else None,
        "inputs": "gate set request image0-audio0, chunk 0, stand-in weights (seed 0)",
    }


def _alltoall(config, groups: tuple[int, ...], mesh_size: int) -> list[dict]:
    import jax
    import jax.numpy as jnp

    from kernels.ulysses import FrameWindow, alltoall_bytes, hlo_all_to_alls, ulysses_attention

    heads, hd = config.sr.heads, config.sr.dim // config.sr.heads
    t, frames = config.sr_tokens_per_frame, config.frames_per_chunk + 1
    s = frames * t
    mesh = jax.make_mesh((mesh_size,), ("fsdp",))
    out = []
    for g in groups:
        if heads % (mesh_size * g):
            out.append({"groups": g, "skipped": f"{heads} heads do not split into {g} groups over {mesh_size} devices"})
            continue
        spec = jax.ShapeDtypeStruct(
            (heads, s, hd),
            jnp.bfloat16,
            sharding=jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec(None, "fsdp", None)),
        )
        fn = jax.jit(
            lambda q, k, v, g=g: ulysses_attention(
                q, k, v, mesh=mesh, groups=g, mask=FrameWindow(frames, t, config.sr.window)
            )
        )
        ops = hlo_all_to_alls(fn.lower(spec, spec, spec).compile().as_text())
        a = alltoall_bytes(heads, s, hd, jnp.bfloat16, mesh_size, g)
        out.append(
            {
                "groups": g,
                "all_to_alls": len(ops),
                "compiled_bytes_total": sum(o.bytes for o in ops),
                "compiled_bytes_per_group": sum(o.bytes for o in ops) // g,
                "analytic_bytes_per_group": a.per_group,
                "analytic_bytes_total": a.total,
            }
        )
    return out


def analyze_attention(
    pipeline: str, *, groups: tuple[int, ...] = (1, 2, 3, 4), eligibility: bool = True, collectives: bool = True
) -> dict:
    from avatar_release.specs import load_pipeline
    from kernels import masks
    from model.config import MESH_SIZE, get_config

    spec = load_pipeline(pipeline)
    config = get_config(spec.config)
    t, frames, window = config.sr_tokens_per_frame, config.frames_per_chunk + 1, config.sr.window
    aligned = masks.default_block(t)
    tiled, fitted = masks.tile_counts(frames, t, window, 128), masks.tile_counts(frames, t, window, aligned)
    report = {
        "pipeline": pipeline,
        "config": spec.config,
        "sr": {
            "tokens_per_frame": t,
            "frames": frames,
            "window": window,
            "sequence": frames * t,
            "heads": config.sr.heads,
            "head_dim": config.sr.dim // config.sr.heads,
        },
        "live_fraction": round(masks.live_fraction(frames, window), 4),
        "blocks": {
            "tile_128": {**tiled._asdict(), "partial_share": round(tiled.partial_share, 4)},
            f"aligned_{aligned}": {**fitted._asdict(), "partial_share": round(fitted.partial_share, 4)},
        },
        "aligned_block_sizes": masks.aligned_block_sizes(t),
    }
    if eligibility and spec.config in _MATERIALIZABLE:
        report["bounded_softmax_eligible"] = _sr_eligibility(config)
    else:
        report["bounded_softmax_eligible"] = {
            "share": None,
            "why": "production weights are not materialized here (abstract shapes only); measured for tiny and small",
        }
    if collectives:
        report["all_to_all"] = _alltoall(config, groups, MESH_SIZE)
    return report


def attention_text(r: dict) -> str:
    """The report of ``analyze_attention`` as terminal lines."""
    sr = r["sr"]
    lines = [
        f"{r['pipeline']} ({r['config']}): SR {sr['frames']} frames x {sr['tokens_per_frame']} tokens = "
        f"{sr['sequence']}, window {sr['window']}, {sr['heads']} heads x {sr['head_dim']}",
        f"  live fraction of the mask: {r['live_fraction']:.3f}",
    ]
    for name, b in r["blocks"].items():
        lines.append(
            f"  {name:<12} full {b['full']:>7}  partial {b['partial']:>6}  empty {b['empty']:>7}  "
            f"(partial share {b['partial_share']:.3f}, padded to {b['padded_length']})"
        )
    e = r["bounded_softmax_eligible"]
    lines.append(
        f"  heads eligible for the bounded softmax: {e['share'] if e.get('share') is not None else 'n/a'}"
        + (f" over {e['layers']} layers ({e['inputs']})" if e.get("layers") else f" ({e.get('why')})")
    )
    for a in r.get("all_to_all", []):
        if "skipped" in a:
            lines.append(f"  G={a['groups']}: {a['skipped']}")
        else:
            lines.append(
                f"  G={a['groups']}: {a['all_to_alls']} all-to-alls, {a['compiled_bytes_per_group']} B per "
                f"group per layer (analytic {a['analytic_bytes_per_group']}), total {a['compiled_bytes_total']} B"
            )
    return "\n".join(lines)
