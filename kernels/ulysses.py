"""Ulysses sequence-parallel attention with head groups, written with ``jax.shard_map``.

Layout. q, k and v arrive as (heads, S, head_dim) sharded over the tokens of one mesh axis of
size P: every device holds S / P tokens of every head. An all-to-all trades that for whole heads
over the full sequence, attention runs locally per head, and a second all-to-all trades back.

Head groups. A single chain all-to-all -> attention -> all-to-all gives XLA nothing to schedule
the transfer behind, so it stays synchronous and fully exposed. Splitting the heads into G
independent groups, each with its own chain, gives every group's transfer sibling attention work
to hide behind (on TPU, with async all-to-all enabled, XLA turns them into start/done pairs).
The total bytes moved are the same for every G; only the number of (smaller) launches grows.

Exactness. The token order is never permuted (each group's all-to-all concatenates the sequence
shards in device order), so a mask defined over the original token order (the frame-aligned
window mask of the super-resolution stage) holds unchanged for every group. Per-head math does
not depend on which group or device computes a head, so G = 1, 2, 4 agree bit for bit. The
heads of a device run as one batched computation: on XLA:CPU that is bit-exact against any other
batching (checked by the tests, also against a single-device reference). ``head_loop=True`` runs
them one at a time (``lax.map``) instead, for a backend whose dot or reduction strategy ever
turned out to depend on the batch of heads: one compiled body then serves every grouping.

Counting. ``alltoall_bytes`` gives the analytic bytes per layer, per group and in total, and
``hlo_all_to_alls`` reads the all-to-alls back out of compiled HLO text, so tests can check the
compiled program is the one this module claims to build.
"""

from __future__ import annotations

import dataclasses
import math
import re
from collections.abc import Callable

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from .target import interpret_default

__all__ = [
    "AllToAllBytes",
    "AttentionFn",
    "CollectiveOp",
    "FrameWindow",
    "MaskSpec",
    "alltoall_bytes",
    "frame_window_mask",
    "hlo_all_to_alls",
    "pack_groups",
    "reference_attention",
    "ulysses_attention",
    "ulysses_attention_packed",
    "ulysses_attention_ungrouped",
]

# attention_fn(q, k, v, mask) with q, k, v (heads, S, head_dim) and mask (S, S) bool or None.
AttentionFn = Callable[[jax.Array, jax.Array, jax.Array, jax.Array | None], jax.Array]
# mask_fn(q_idx (S, 1) int32, k_idx (1, S) int32) -> (S, S) bool, True = may attend.
MaskFn = Callable[[jax.Array, jax.Array], jax.Array]


def _shard_map() -> Callable:
    """``jax.shard_map`` where this jax has it, else the experimental one (older releases)."""
    if hasattr(jax, "shard_map"):
        return jax.shard_map
    from jax.experimental.shard_map import shard_map  # pragma: no cover - older jax

    return shard_map  # pragma: no cover


def _place(x: jax.Array, mesh: Mesh, spec: PartitionSpec) -> jax.Array:
    """Put x in the layout shard_map is about to be told it has.

    On a mesh with Explicit axes (``jax.make_mesh``'s default) shard_map refuses an argument
    whose type-level sharding differs from its in_spec, so move it there with ``jax.reshard``
    (a no-op when it already is). On Auto axes shard_map reshards by itself.
    """
    kinds = dict(zip(mesh.axis_names, mesh.axis_types))
    named = [a for entry in spec if entry is not None for a in (entry if isinstance(entry, tuple) else (entry,))]
    if any(kinds[a] == jax.sharding.AxisType.Explicit for a in named):
        return jax.reshard(x, NamedSharding(mesh, spec))
    return x


# ---- masks ----------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class FrameWindow:
    """The super-resolution mask by its parameters: (frames x tokens) tokens, frame 0 the reference.

    Video frame i may attend to video frames j with |i - j| <= window and to the reference frame;
    the reference frame attends only to itself (model/sr.py ``frame_window_mask``). Passed instead
    of an (S, S) array, the mask is built on each device from iotas rather than shipped as an
    S x S operand.
    """

    frames: int
    tokens: int
    window: int

    @property
    def seq_len(self) -> int:
        return self.frames * self.tokens

    def __call__(self, q_idx: jax.Array, k_idx: jax.Array) -> jax.Array:
        fq, fk = q_idx // self.tokens, k_idx // self.tokens
        video = (jnp.abs(fq - fk) <= self.window) | (fk == 0)
        return jnp.where(fq == 0, fk == 0, video)


MaskSpec = jax.Array | np.ndarray | MaskFn | FrameWindow | None


def frame_window_mask(frames: int, tokens: int, window: int) -> jax.Array:
    """(S, S) bool frame-window mask, S = frames * tokens; the array form of ``FrameWindow``."""
    return _mask_from_fn(FrameWindow(frames, tokens, window), frames * tokens)


def _mask_from_fn(fn: MaskFn, seq_len: int) -> jax.Array:
    idx = jnp.arange(seq_len, dtype=jnp.int32)
    return fn(idx[:, None], idx[None, :])


# ---- the attention math ---------------------------------------------------------------------


def reference_attention(q: jax.Array, k: jax.Array, v: jax.Array, mask: jax.Array | None = None) -> jax.Array:
    """Softmax attention, q, k, v (heads, S, head_dim) -> (heads, S, head_dim) in q's dtype.

    bf16 operands with float32 accumulation for both matmuls (what the MXU computes), logits and
    softmax in float32, the probabilities rounded to v's dtype for the second matmul. Masked
    logits are -inf, so a fully masked row would be NaN; the model's masks never produce one.
    """
    scale = 1.0 / math.sqrt(q.shape[-1])
    logits = jnp.einsum("hqd,hkd->hqk", q, k, preferred_element_type=jnp.float32) * scale
    if mask is not None:
        logits = jnp.where(mask, logits, -jnp.inf)
    p = jax.nn.softmax(logits, axis=-1)
    out = jnp.einsum("hqk,hkd->hqd", p.astype(v.dtype), v, preferred_element_type=jnp.float32)
    return out.astype(q.dtype)


def _per_head(attention_fn: AttentionFn) -> AttentionFn:
    """Run ``attention_fn`` one head at a time, so its numerics cannot depend on the head count.

    A backend could pick a different dot or reduction strategy for a (4, S, S) batch than for a
    (2, S, S) one; a loop over single heads compiles one body for every grouping, making the
    grouped path bit-exact against any other grouping by construction. It serialises the heads,
    so it is opt-in (XLA:CPU is exact without it).
    """

    def run(q: jax.Array, k: jax.Array, v: jax.Array, mask: jax.Array | None) -> jax.Array:
        def one(qkv: tuple[jax.Array, jax.Array, jax.Array]) -> jax.Array:
            qh, kh, vh = qkv
            return attention_fn(qh[None], kh[None], vh[None], mask)[0]

        return jax.lax.map(one, (q, k, v))

    return run


# ---- layouts --------------------------------------------------------------------------------


def pack_groups(q: jax.Array, k: jax.Array, v: jax.Array, groups: int) -> jax.Array:
    """(heads, S, hd) x 3 -> (G, 3, heads / G, S, hd): per group, the one all-to-all operand.

    Group g holds the contiguous heads [g * heads / G, (g + 1) * heads / G). Stacking q, k and v
    means one all-to-all per group carries all three instead of three smaller launches.
    """
    heads = q.shape[0]
    if heads % groups:
        raise ValueError(f"heads={heads} not divisible by groups={groups}")
    qkv = jnp.stack([q, k, v])  # (3, H, S, hd)
    qkv = qkv.reshape(3, groups, heads // groups, *q.shape[1:])
    return jnp.swapaxes(qkv, 0, 1)


def _check(heads: int, seq_len: int, groups: int, size: int) -> None:
    if groups < 1 or heads % groups or (heads // groups) % size:
        raise ValueError(
            f"heads / groups must be a multiple of the axis size: heads={heads}, groups={groups}, P={size}"
        )
    if seq_len % size:
        raise ValueError(f"sequence length {seq_len} not divisible by the axis size {size}")


def _resolve_mask(mask: MaskSpec, seq_len: int) -> tuple[jax.Array | None, MaskFn | None]:
    """Split a mask argument into (array operand, callable built per device)."""
    if mask is None:
        return None, None
    if isinstance(mask, FrameWindow) and mask.seq_len != seq_len:
        raise ValueError(f"{mask} covers {mask.seq_len} tokens, the sequence has {seq_len}")
    if callable(mask):
        return None, mask
    arr = jnp.asarray(mask)
    if arr.shape != (seq_len, seq_len) or arr.dtype != jnp.bool_:
        raise ValueError(f"mask must be ({seq_len}, {seq_len}) bool, got {arr.shape} {arr.dtype}")
    return arr, None


# ---- Ulysses --------------------------------------------------------------------------------


def _all_to_all_bits(x: jax.Array, axis: str, split_axis: int, concat_axis: int) -> jax.Array:
    """A tiled all-to-all that moves x's raw bits (floats as same-width unsigned ints).

    An all-to-all is pure data movement, but XLA:CPU has no bf16 collectives and wraps a bf16
    all-to-all in converts to and from f32: twice the bytes, and an extra pass on each side.
    Moving the bit pattern avoids that. A TPU has bf16 collectives, and there the bitcasts were
    not free: XLA gave each its own layout copy (measured on avatar-720p's DiT: about 0.5 GB per
    layer and step per chip), so a build for TPU moves the floats as they are.
    """
    if not jnp.issubdtype(x.dtype, jnp.floating) or not interpret_default():  # TPU moves bf16 as it is
        return jax.lax.all_to_all(x, axis, split_axis, concat_axis, tiled=True)
    wire = jnp.dtype(f"uint{8 * x.dtype.itemsize}")
    moved = jax.lax.all_to_all(jax.lax.bitcast_convert_type(x, wire), axis, split_axis, concat_axis, tiled=True)
    return jax.lax.bitcast_convert_type(moved, x.dtype)


def _group_chain(qkv: jax.Array, axis: str, mask: jax.Array | None, attend: AttentionFn) -> jax.Array:
    """One group: (3, Hg, S/P, hd) -> all-to-all -> attention over S -> all-to-all -> (Hg, S/P, hd)."""
    # Split heads into P chunks (chunk d to device d), concatenate the received sequence shards
    # in device order: the full sequence in its original token order.
    full = _all_to_all_bits(qkv, axis, split_axis=1, concat_axis=2)  # (3, Hg/P, S, hd)
    out = attend(full[0], full[1], full[2], mask)  # (Hg/P, S, hd)
    return _all_to_all_bits(out, axis, split_axis=1, concat_axis=0)  # (Hg, S/P, hd)


def ulysses_attention_packed(
    qkv: jax.Array,
    *,
    mesh: Mesh,
    axis: str = "fsdp",
    mask: MaskSpec = None,
    attention_fn: AttentionFn = reference_attention,
    head_loop: bool = False,
) -> jax.Array:
    """Grouped Ulysses attention on the packed layout (G, 3, heads / G, S, hd), tokens sharded.

    This is the layout ``kernels.preattn`` writes, so each group's all-to-all reads its operand
    with no repacking. Returns (heads, S, hd), sequence-sharded over ``axis`` like the input.
    """
    groups, three, hg, seq_len, hd = qkv.shape
    if three != 3:
        raise ValueError(f"packed qkv must be (G, 3, heads/G, S, hd), got {qkv.shape}")
    size = mesh.shape[axis]
    _check(groups * hg, seq_len, groups, size)
    mask_arr, mask_fn = _resolve_mask(mask, seq_len)
    attend = _per_head(attention_fn) if head_loop else attention_fn

    def body(qkv_local: jax.Array, *maybe_mask: jax.Array) -> jax.Array:
        m = maybe_mask[0] if maybe_mask else (_mask_from_fn(mask_fn, seq_len) if mask_fn else None)
        outs = [_group_chain(qkv_local[g], axis, m, attend) for g in range(groups)]
        return jnp.concatenate(outs, axis=0) if groups > 1 else outs[0]

    seq = PartitionSpec(None, None, None, axis, None)
    in_specs = (seq,) if mask_arr is None else (seq, PartitionSpec())
    qkv = _place(qkv, mesh, seq)
    args = (qkv,) if mask_arr is None else (qkv, mask_arr)
    fn = _shard_map()(body, mesh=mesh, in_specs=in_specs, out_specs=PartitionSpec(None, axis, None), check_vma=False)
    return fn(*args)


def ulysses_attention(
    q: jax.Array,
    k: jax.Array,
    v: jax.Array,
    *,
    mesh: Mesh,
    axis: str = "fsdp",
    groups: int = 1,
    mask: MaskSpec = None,
    attention_fn: AttentionFn = reference_attention,
    head_loop: bool = False,
) -> jax.Array:
    """Ulysses attention with ``groups`` head groups; q, k, v (heads, S, hd) sharded on S.

    ``mask``: None, an (S, S) bool array (replicated to every device), a callable
    ``(q_idx, k_idx) -> bool`` or a ``FrameWindow``. ``attention_fn(q, k, v, mask)`` is the
    per-device math over the full sequence; ``head_loop`` runs it one head at a time (see the
    module docstring). Returns (heads, S, hd) sharded on S.
    """
    heads, seq_len, _ = q.shape
    _check(heads, seq_len, groups, mesh.shape[axis])
    if groups == 1 and not head_loop and not interpret_default():
        # One group on TPU: three all-to-alls read q, k and v where they are; packing them into
        # one operand first is a copy of all three (on avatar-720p's DiT, ~0.4 GB per layer and
        # step per chip) to save two collective launches. Pure data movement either way.
        return ulysses_attention_ungrouped(q, k, v, mesh=mesh, axis=axis, mask=mask, attention_fn=attention_fn)
    spec = PartitionSpec(None, None, None, axis, None)
    pack = _shard_map()(
        lambda a, b, c: pack_groups(a, b, c, groups),
        mesh=mesh,
        in_specs=(PartitionSpec(None, axis, None),) * 3,
        out_specs=spec,
        check_vma=False,
    )
    q, k, v = (_place(t, mesh, PartitionSpec(None, axis, None)) for t in (q, k, v))
    return ulysses_attention_packed(
        pack(q, k, v), mesh=mesh, axis=axis, mask=mask, attention_fn=attention_fn, head_loop=head_loop
    )


def ulysses_attention_ungrouped(
    q: jax.Array,
    k: jax.Array,
    v: jax.Array,
    *,
    mesh: Mesh,
    axis: str = "fsdp",
    mask: MaskSpec = None,
    attention_fn: AttentionFn = reference_attention,
) -> jax.Array:
    """The plain Ulysses chain: one all-to-all per operand, attention, one all-to-all back.

    The baseline the grouped path is checked against: written independently (no packing, no
    groups, no bit-moving, bf16 all-to-alls as they come), so G = 1 agreeing with it bit for
    bit is evidence, not tautology.
    """
    heads, seq_len, _ = q.shape
    _check(heads, seq_len, 1, mesh.shape[axis])
    mask_arr, mask_fn = _resolve_mask(mask, seq_len)

    def body(ql: jax.Array, kl: jax.Array, vl: jax.Array, *maybe_mask: jax.Array) -> jax.Array:
        m = maybe_mask[0] if maybe_mask else (_mask_from_fn(mask_fn, seq_len) if mask_fn else None)
        to_heads = lambda t: jax.lax.all_to_all(t, axis, split_axis=0, concat_axis=1, tiled=True)  # noqa: E731
        out = attention_fn(to_heads(ql), to_heads(kl), to_heads(vl), m)
        return jax.lax.all_to_all(out, axis, split_axis=1, concat_axis=0, tiled=True)

    seq = PartitionSpec(None, axis, None)
    in_specs = (seq,) * 3 + (() if mask_arr is None else (PartitionSpec(),))
    args = tuple(_place(t, mesh, seq) for t in (q, k, v)) + (() if mask_arr is None else (mask_arr,))
    return _shard_map()(body, mesh=mesh, in_specs=in_specs, out_specs=seq, check_vma=False)(*args)


# ---- byte accounting ------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class AllToAllBytes:
    """Per-device all-to-all bytes of one attention layer.

    ``*_in``/``*_out``: operand bytes of the forward (q, k, v packed) and backward (attention
    output) all-to-all; ``per_group`` their sum; ``total`` = G * per_group, the same for every G.
    ``wire_total`` is the part that leaves the device: (P - 1) / P of the operand bytes, since
    each device keeps the 1/P slice addressed to itself.
    """

    groups: int
    per_group_in: int
    per_group_out: int
    per_group: int
    total: int
    wire_total: int


def alltoall_bytes(heads: int, seq_len: int, head_dim: int, dtype, P: int, G: int) -> AllToAllBytes:
    """Analytic per-device all-to-all bytes per layer for heads split into G groups over P devices."""
    _check(heads, seq_len, G, P)
    shard = (heads // G) * (seq_len // P) * head_dim * np.dtype(dtype).itemsize  # one (Hg, S/P, hd) slab
    per_in, per_out = 3 * shard, shard
    per_group = per_in + per_out
    total = G * per_group
    return AllToAllBytes(G, per_in, per_out, per_group, total, total * (P - 1) // P)


# ---- reading all-to-alls back out of HLO ----------------------------------------------------

_DTYPE_BYTES = {
    "pred": 1, "s8": 1, "u8": 1, "s16": 2, "u16": 2, "f16": 2, "bf16": 2,
    "s32": 4, "u32": 4, "f32": 4, "s64": 8, "u64": 8, "f64": 8, "c64": 8, "c128": 16,
}  # fmt: skip
_SHAPE = re.compile(r"\b(pred|[suf]\d+|bf16|c64|c128)\[([\d,]*)\]")
# "%name = <result shape> all-to-all(" or "all-to-all-start(" in HLO text; the result shape sits
# between "=" and the op name (a tuple for the tuple form / the async start).
_OP = re.compile(r"^\s*(?:ROOT\s+)?%?([\w.\-]+)\s*=\s*(.*?)\s(all-to-all(?:-start)?)\(")


@dataclasses.dataclass(frozen=True)
class CollectiveOp:
    """One all-to-all in HLO text: its name, op kind, result shapes, element count and bytes."""

    name: str
    kind: str
    shapes: tuple[str, ...]
    elements: int
    bytes: int


def _shape_size(dims: str) -> int:
    n = 1
    for d in filter(None, dims.split(",")):
        n *= int(d)
    return n


def _leading_tuple(result: str) -> str:
    """The first element of a tuple type string: "((a, b), c, u32[])" -> "(a, b)"."""
    inner = result.strip()[1:]
    if not inner.startswith("("):
        return inner.split(",")[0]
    depth = 0
    for i, ch in enumerate(inner):
        depth += {"(": 1, ")": -1}.get(ch, 0)
        if depth == 0:
            return inner[: i + 1]
    return inner


def hlo_all_to_alls(hlo_text: str) -> list[CollectiveOp]:
    """All all-to-all ops (sync, or the start of an async pair) in HLO text, with their sizes.

    Sizes are per device: an all-to-all's result is as large as its operand, whether it is
    written as one array (``dimensions={d}``) or as the tuple form XLA:CPU compiles to (one
    operand per peer). An ``all-to-all-start`` (async) result is ((operands), outputs, context):
    only its operand tuple is counted, and ``-done`` ops, which pair with a start, not at all.
    Verified on XLA:CPU's synchronous forms; the async form is parsed from its documented shape
    and has not been seen in a TPU dump here.
    Works on ``Lowered.as_text(dialect="hlo")`` and on ``Compiled.as_text()``. (XLA:CPU compiles
    a bf16 all-to-all as f32, doubling its bytes; the grouped path here moves raw bits as u16,
    so its compiled bytes equal the analytic ones.)
    """
    ops = []
    for line in hlo_text.splitlines():
        m = _OP.match(line)
        if not m:
            continue
        name, result, kind = m.groups()
        if kind.endswith("-start"):
            result = _leading_tuple(result)
        found = _SHAPE.findall(result)
        elements = [_shape_size(dims) for _, dims in found]
        ops.append(
            CollectiveOp(
                name=name,
                kind=kind,
                shapes=tuple(f"{dt}[{dims}]" for dt, dims in found),
                elements=sum(elements),
                bytes=sum(n * _DTYPE_BYTES[dt] for n, (dt, _) in zip(elements, found)),
            )
        )
    return ops
