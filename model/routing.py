"""The model's attention call, routed while tracing: Ulysses layout and the attention kernels.

The model chooses its kernels: the toolchain hands the pipeline its target (platform, mesh, axis,
kernel flags) through ``avatar_release.pipeline.TargetContext``, and ``model.release`` enters
``head_sharded_attention`` for the duration of each stage's trace.

The model calls one attention entry point (``F.scaled_dot_product_attention`` via
``model.attention.attention``). While a stage is traced for a multi-device mesh, torchax's
definition of that op is overridden:

* default (``attention_kernel = "xla"``, ``ulysses_groups = 1``): q, k and v are constrained to
  be sharded over the heads axis, so GSPMD inserts the all-to-alls that trade sequence shards
  for head shards (the Ulysses layout) and each device computes whole heads. The math is
  torchax's own reference implementation, unchanged.
* with ``fused_preattn``, the model's ``avatar::pre_attention`` op (qkv projection, q/k RMS
  norm, rotary) runs as the fused Pallas kernel ``kernels.preattn`` on each device's tokens;
* otherwise the call goes through ``kernels.ulysses.ulysses_attention`` (``shard_map``: G
  independent all-to-all -> attention -> all-to-all groups) with the chosen attention body:
  ``kernels.blocksparse`` (frame-aligned block-sparse Pallas kernel) or
  ``kernels.bounded_softmax`` for the masked super-resolution attention, the plain reference
  for unmasked (DiT) attention. The SR mask is passed by its parameters (frames, tokens per
  frame, window), which the model builds it from, never as an S x S array.
* with ``dit_kernel = "flash"`` (the config's ``dit.attention``), the unmasked (DiT) attention
  goes through the same shard_map Ulysses chain with ``kernels.flash`` as its body: online
  softmax over key blocks, no S x S logits. The masked (SR) attention keeps its own route, so a
  build that sets only this lever changes the DiT's program and nothing else.

Pallas kernels run in interpret mode on CPU targets and compile through Mosaic on TPU. On a GPU
target two attention kernels lower for Triton: the DiT's flash attention (JAX's own,
``kernels.flash_gpu``) and the SR's block-sparse attention (``kernels.window_gpu``: the frame
window computed from each program's position, where the Mosaic kernel prefetches a table); the
bounded-softmax kernel and the fused pre-attention are written for Mosaic only, so there those
calls keep XLA's attention and unfused ops.
Every call site declares what it asked for and what it got (``declare``: the toolchain's
``TargetContext.declare_route``, recorded in the build's manifest as ``kernel_routes``).
"""

from __future__ import annotations

import contextlib
import dataclasses
import importlib
from collections.abc import Callable
from dataclasses import dataclass

from kernels.target import kernel_target

__all__ = ["AttentionRoute", "RoutingError", "head_sharded_attention"]


class RoutingError(ValueError):
    """An attention call the kernels cannot take (the message names the shape and why)."""


@dataclass(frozen=True)
class AttentionRoute:
    kernel: str = "xla"  # "xla" | "blocksparse" | "bounded": the masked (SR) attention
    dit_kernel: str = "xla"  # "xla" | "flash": the unmasked (DiT) attention
    groups: int = 1
    sr_groups: int = 0  # head groups of the masked (SR) attention; 0: `groups`
    sr_tokens_per_frame: int = 0  # the masked (SR) attention's frame geometry
    sr_window: int = 0
    fused_preattn: bool = False  # route the model's `avatar::pre_attention` op to kernels.preattn
    # What the Pallas kernels are built for (kernels.target): "tpu" lowers them through Mosaic
    # with these compiler flags; any other platform runs them in the Pallas interpreter.
    platform: str = "cpu"
    kernel_flags: tuple[tuple[str, object], ...] = ()

    @property
    def default(self) -> bool:
        return (
            self.kernel == "xla" and self.dit_kernel == "xla" and self.groups_for(True) == self.groups_for(False) == 1
        )

    def via_kernels(self, masked: bool) -> bool:
        """Does a call go through the shard_map chain (kernels.ulysses) rather than GSPMD?

        Any non-default SR kernel or head grouping sends every call there, as before the DiT
        lever existed; the DiT lever alone sends only the unmasked calls.
        """
        if self.kernel == "xla" and self.groups_for(True) == self.groups_for(False) == 1:
            return not masked and self.dit_kernel == "flash"
        return True

    def groups_for(self, masked: bool) -> int:
        return (self.sr_groups or self.groups) if masked else self.groups

    def lowered_as(self) -> str:
        """How a Pallas kernel of this route is compiled: Mosaic on TPU, Triton on GPU (the kernels
        that have a Triton form; ``for_platform`` routes the others away), the interpreter elsewhere."""
        return {"tpu": "pallas-mosaic", "gpu": "pallas-triton"}.get(self.platform, "pallas-interpret")

    def for_platform(self) -> tuple[AttentionRoute, dict[str, str]]:
        """The route this platform can compile, and why a requested kernel was replaced (by what
        it was asked for). On a GPU the Mosaic-only kernels give way to XLA's ops; the DiT's flash
        attention (JAX's Triton kernel) and the SR's block-sparse attention (``kernels.window_gpu``)
        stay, each decided per call (``_body``)."""
        if self.platform != "gpu":
            return self, {}
        why = {}
        kernel = self.kernel
        if self.kernel == "bounded":
            why["attention (frame-window mask)"] = (
                "kernels/bounded_softmax.py is written for Mosaic (a scalar-prefetch grid, VMEM scratch) and has "
                "no Triton form, so XLA's masked attention runs instead (the logits of each head written to HBM); "
                'attention_kernel = "blocksparse" has one (kernels/window_gpu.py)'
            )
            kernel = "xla"
        if self.fused_preattn:
            why["pre-attention"] = (
                "kernels/preattn.py is written for Mosaic (VMEM scratch, TPU compiler "
                "parameters): the same chain runs as XLA ops (kernels.preattn.preattn_reference)"
            )
        return dataclasses.replace(self, kernel=kernel), why

    @classmethod
    def from_config(cls, config, platform: str = "cpu", kernel_flags: dict | None = None) -> AttentionRoute:
        return cls(
            kernel=config.attention_kernel,
            dit_kernel=config.dit.attention,
            groups=config.ulysses_groups,
            sr_groups=config.sr.ulysses_groups,
            sr_tokens_per_frame=config.sr_tokens_per_frame,
            sr_window=config.sr.window,
            fused_preattn=config.fused_preattn,
            platform=platform,
            kernel_flags=tuple(sorted((kernel_flags or {}).items())),
        )


Declare = Callable[..., None]  # (kernel, *, requested, used, reason="", program_kernel="", estimate=None) -> None


def _body(route: AttentionRoute, seq_len: int, masked: bool, declare: Declare):
    """(attention_fn, mask spec) for one call site."""
    from kernels import ulysses

    if not masked:
        if route.dit_kernel == "flash" and route.platform == "gpu":
            from kernels.flash_gpu import flash_attention_gpu, gpu_blocks

            if gpu_blocks(seq_len) is None:
                declare(
                    "attention (unmasked)",
                    requested="flash",
                    used="xla",
                    reason=f"JAX's Triton flash kernel needs a power-of-two block of 16..128 tokens dividing "
                    f"the sequence; none divides {seq_len}",
                )
                return ulysses.reference_attention, None

            def flash_gpu(q, k, v, m):  # per device, inside the Ulysses chain: (heads here, S, head_dim)
                from kernels.flash_gpu import NAME, estimate

                declare(
                    "attention (unmasked)",
                    requested="flash",
                    used="pallas-triton",
                    program_kernel=NAME,
                    estimate=estimate(heads=q.shape[0], seq=q.shape[1], head_dim=q.shape[2], itemsize=q.dtype.itemsize),
                )
                return flash_attention_gpu(q, k, v)

            return flash_gpu, None
        if route.dit_kernel == "flash":
            from kernels.flash import flash_attention

            declare("attention (unmasked)", requested="flash", used=route.lowered_as())
            return (lambda q, k, v, m: flash_attention(q, k, v)), None
        declare("attention (unmasked)", requested="xla", used="xla")
        return ulysses.reference_attention, None
    t = route.sr_tokens_per_frame
    if t <= 0 or seq_len % t:
        raise RoutingError(
            f"masked attention over {seq_len} tokens is not a whole number of {t}-token frames; "
            "the attention kernels only know the SR frame-window mask"
        )
    frames, window = seq_len // t, route.sr_window
    mask = ulysses.FrameWindow(frames, t, window)
    if route.kernel == "blocksparse" and route.platform == "gpu":

        def window_gpu(q, k, v, m):  # per device, inside the Ulysses chain: (heads here, S, head_dim)
            from kernels.window_gpu import NAME, estimate, window_attention_gpu

            declare(
                "attention (frame-window mask)",
                requested="blocksparse",
                used="pallas-triton",
                program_kernel=NAME,
                estimate=estimate(
                    heads=q.shape[0],
                    head_dim=q.shape[2],
                    frames=frames,
                    tokens_per_frame=t,
                    window=window,
                    itemsize=q.dtype.itemsize,
                ),
            )
            return window_attention_gpu(q, k, v, frames=frames, tokens_per_frame=t, window=window)

        return window_gpu, mask
    if route.kernel == "blocksparse":
        from kernels.blocksparse import blocksparse_attention

        return (
            lambda q, k, v, m: blocksparse_attention(q, k, v, frames=frames, tokens_per_frame=t, window=window),
            mask,
        )
    if route.kernel == "bounded":
        from kernels.bounded_softmax import bounded_softmax_attention

        return (
            lambda q, k, v, m: bounded_softmax_attention(q, k, v, frames=frames, tokens_per_frame=t, window=window),
            mask,
        )
    return ulysses.reference_attention, mask


def _no_declare(kernel: str, **_) -> None:
    return None


@contextlib.contextmanager
def head_sharded_attention(mesh, axis: str, route: AttentionRoute | None = None, declare: Declare = _no_declare):
    import jax
    import torch
    import torch.nn.functional as F
    import torchax
    from jax.sharding import NamedSharding, PartitionSpec
    from torchax import interop
    from torchax.ops import jtorch

    requested = route or AttentionRoute()
    route, replaced = requested.for_platform()
    size = mesh.shape[axis]

    def declare_masked() -> None:
        name = "attention (frame-window mask)"
        if name in replaced:
            declare(name, requested=requested.kernel, used="xla", reason=replaced[name])
        else:  # a Triton kernel declares itself again, with its cost, per device call (_body)
            declare(name, requested=route.kernel, used="xla" if route.kernel == "xla" else route.lowered_as())

    def constrain(t):
        heads_dim = t.ndim - 3  # (..., heads, S, head_dim)
        if heads_dim < 0 or t.shape[heads_dim] % size:
            return t
        spec = [None] * t.ndim
        spec[heads_dim] = axis
        j = interop.jax_view(t)
        return interop.torch_view(jax.lax.with_sharding_constraint(j, NamedSharding(mesh, PartitionSpec(*spec))))

    def gspmd(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False):
        q, k, v = constrain(query), constrain(key), constrain(value)
        return constrain(jtorch._sdpa_reference(q, k, v, attn_mask, dropout_p, is_causal, scale, enable_gqa))

    def kernels(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False):
        from kernels.ulysses import ulysses_attention

        if query.ndim != 3 or is_causal or dropout_p or scale is not None:
            raise RoutingError(
                "the attention kernels take (heads, S, head_dim) inputs with the default scale, "
                f"no dropout, not causal; got shape {tuple(query.shape)}"
            )
        q, k, v = (interop.jax_view(t) for t in (query, key, value))
        fn, mask = _body(route, q.shape[1], attn_mask is not None, declare)
        out = ulysses_attention(
            q, k, v, mesh=mesh, axis=axis, groups=route.groups_for(attn_mask is not None), mask=mask, attention_fn=fn
        )
        return interop.torch_view(out)

    def fused_preattn(x, w_qkv, b_qkv, q_norm, k_norm, cos, sin, heads, eps):
        from kernels.preattn import PreAttnParams, preattn_sharded, unpack_qkv

        j = interop.jax_view
        params = PreAttnParams(j(w_qkv), None if b_qkv is None else j(b_qkv), j(q_norm), j(k_norm))
        if "pre-attention" in replaced:  # the kernel does not lower here: its reference, as XLA ops
            from kernels.preattn import preattn_reference

            declare("pre-attention", requested="fused", used="xla", reason=replaced["pre-attention"])
            packed = preattn_reference(j(x), params, j(cos), j(sin), heads=heads, groups=1, eps=eps)
            return interop.torch_view(unpack_qkv(packed))
        declare("pre-attention", requested="fused", used=route.lowered_as())
        packed = preattn_sharded(j(x), params, j(cos), j(sin), mesh=mesh, axis=axis, heads=heads, groups=1, eps=eps)
        return interop.torch_view(unpack_qkv(packed))

    def routed(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False):
        masked = attn_mask is not None
        if masked:
            declare_masked()
        elif not route.via_kernels(False):
            declare("attention (unmasked)", requested=route.dit_kernel, used="xla")
        impl = kernels if route.via_kernels(masked) else gspmd
        return impl(query, key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa)

    env = torchax.default_env()
    overrides = {F.scaled_dot_product_attention: routed}
    if route.fused_preattn:
        importlib.import_module("model.attention")  # registers the avatar::pre_attention op

        overrides[torch.ops.avatar.pre_attention.default] = fused_preattn
    previous = {op: env._ops.get(op) for op in overrides}
    for op, impl in overrides.items():
        env.override_op_definition(op, impl)
    try:
        with kernel_target(route.platform, dict(route.kernel_flags)):
            yield
    finally:
        for op, old in previous.items():
            if old is None:
                env._ops.pop(op, None)
            else:
                env._ops[op] = old
