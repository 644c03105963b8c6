"""Schedule checks without hardware: are the Ulysses all-to-alls hidden behind compute?

The write-up's claim: splitting a layer's heads into G independent groups (all-to-all ->
attention -> all-to-all per group) lets the compiler run one group's collectives while
another group computes. On TPU, with the flag profile's async all-to-all option, XLA emits
``all-to-all-start`` / ``all-to-all-done`` pairs and schedules independent work between them;
a pair with nothing between is turned back into a synchronous all-to-all.

``probe_schedule`` compiles one super-resolution attention layer at the pipeline's geometry
(qkv projection -> grouped Ulysses attention with the frame-aligned Pallas kernel -> output
projection) for the target's topology under its pinned flag profile, once per G, and reads
the scheduled HLO (``compile._evidence.schedule_of``). Where the model's heads do not split
into G groups per device, the probe uses the next head count that does, at the same head
size, and says so. Compiler evidence, not a measurement.
"""

from __future__ import annotations

import math
import time
from dataclasses import asdict, dataclass

__all__ = ["ScheduleProbe", "probe_schedule", "schedule_text"]


@dataclass
class ScheduleProbe:
    groups: int
    heads: int
    head_dim: int
    sequence: int
    all_to_alls: int
    async_pairs: int
    synchronous: int
    hidden: int
    exposed: int
    compile_seconds: float
    note: str = ""

    def to_json(self) -> dict:
        return asdict(self)


def _probe_heads(heads: int, size: int, groups: tuple[int, ...]) -> int:
    step = size * math.lcm(*groups)
    return heads if heads % step == 0 else -(-heads // step) * step


def probe_schedule(
    pipeline: str, target: str, groups: tuple[int, ...] = (1, 2, 4), *, progress=lambda msg: None
) -> list[ScheduleProbe]:
    import jax
    import jax.numpy as jnp
    from jax.sharding import NamedSharding, PartitionSpec

    from avatar_release.compile import make_mesh, schedule_of, target_devices
    from avatar_release.specs import load_flag_profile, load_pipeline, load_target
    from kernels.blocksparse import blocksparse_attention
    from kernels.target import kernel_target
    from kernels.ulysses import FrameWindow, ulysses_attention
    from model.config import get_config

    spec, tgt = load_pipeline(pipeline), load_target(target)
    flags = load_flag_profile(tgt.flag_profile)
    config = get_config(spec.config)
    mesh = make_mesh(target_devices(tgt), tgt)
    axis, size = tgt.mesh_axes[0], tgt.mesh_shape[0]
    t, frames, window = config.sr_tokens_per_frame, config.frames_per_chunk + 1, config.sr.window
    hd = config.sr.dim // config.sr.heads
    heads = _probe_heads(config.sr.heads, size, groups)
    note = (
        ""
        if heads == config.sr.heads
        else (
            f"the model's {config.sr.heads} heads ({config.sr.heads // size} per device) do not split into "
            f"{', '.join(map(str, groups))} groups; probed with {heads} heads of {hd}"
        )
    )
    dim, seq = heads * hd, frames * t

    def attend(q, k, v, m):
        return blocksparse_attention(q, k, v, frames=frames, tokens_per_frame=t, window=window)

    def shard(*dims):
        return NamedSharding(mesh, PartitionSpec(*dims))

    x = jax.ShapeDtypeStruct((seq, dim), jnp.bfloat16, sharding=shard(axis, None))
    w_qkv = jax.ShapeDtypeStruct((3 * dim, dim), jnp.bfloat16, sharding=shard(axis, None))
    w_o = jax.ShapeDtypeStruct((dim, dim), jnp.bfloat16, sharding=shard(axis, None))
    out = []
    for g in groups:

        def layer(x, w_qkv, w_o, g=g):
            qkv = jnp.dot(x, w_qkv.T, preferred_element_type=jnp.float32).astype(jnp.bfloat16)
            q, k, v = qkv.reshape(seq, 3, heads, hd).transpose(1, 2, 0, 3)  # 3 x (heads, S, hd)
            o = ulysses_attention(
                q, k, v, mesh=mesh, axis=axis, groups=g, mask=FrameWindow(frames, t, window), attention_fn=attend
            )
            return jnp.dot(o.transpose(1, 0, 2).reshape(seq, dim), w_o.T, preferred_element_type=jnp.float32)

        with kernel_target(tgt.platform, flags.kernel_flags):
            lowered = jax.jit(layer, out_shardings=shard(axis, None)).lower(x, w_qkv, w_o)
        t0 = time.perf_counter()
        compiled = lowered.compile(compiler_options=dict(flags.compiler_options))
        seconds = time.perf_counter() - t0
        s = schedule_of(compiled.as_text())
        progress(
            f"G={g}: {s.all_to_alls} all-to-alls, {s.async_pairs} async pairs, {s.hidden} hidden, "
            f"{s.exposed} exposed ({seconds:.1f}s)"
        )
        out.append(
            ScheduleProbe(
                g,
                heads,
                hd,
                seq,
                s.all_to_alls,
                s.async_pairs,
                s.synchronous,
                s.hidden,
                s.exposed,
                round(seconds, 3),
                note,
            )
        )
    return out


def schedule_text(r: dict) -> str:
    """The probes of ``probe_schedule`` (as JSON) as terminal lines."""
    probes = r["probes"]
    lines = [
        f"{r['pipeline']} on {r['target']}: one SR attention layer, {probes[0]['sequence']} tokens, "
        f"{probes[0]['heads']} heads x {probes[0]['head_dim']} (compiler schedule, not a measurement)"
    ]
    if probes[0]["note"]:
        lines.append(f"  note: {probes[0]['note']}")
    lines += [
        f"  G={p['groups']}: {p['all_to_alls']} all-to-alls, {p['async_pairs']} async pairs, {p['hidden']} "
        f"hidden behind compute, {p['exposed']} exposed"
        for p in probes
    ]
    return "\n".join(lines)
