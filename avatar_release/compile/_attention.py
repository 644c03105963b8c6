"""Head-sharded attention while tracing: the Ulysses layout, expressed to GSPMD.

The model calls one attention entry point (``F.scaled_dot_product_attention`` via
``model.attention.attention``). While a stage is traced for a multi-device mesh, torchax's
definition of that op is overridden by one that constrains q, k and v to be sharded over
the heads axis. Each device then computes whole heads over the full sequence, and XLA
inserts the all-to-alls that trade sequence shards for head shards (and back), instead of
every device computing every head. The math is torchax's own reference implementation,
unchanged, so per-head results are the same as unsharded.
"""

from __future__ import annotations

import contextlib

__all__ = ["head_sharded_attention"]


@contextlib.contextmanager
def head_sharded_attention(mesh, axis: str):
    import jax
    import torch.nn.functional as F
    import torchax
    from jax.sharding import NamedSharding, PartitionSpec
    from torchax import interop
    from torchax.ops import jtorch

    size = mesh.shape[axis]

    def constrain(t):
        heads_dim = t.ndim - 3  # (..., heads, S, head_dim)
        if heads_dim < 0 or t.shape[heads_dim] % size:
            return t
        spec = [None] * t.ndim
        spec[heads_dim] = axis
        j = interop.jax_view(t)
        return interop.torch_view(jax.lax.with_sharding_constraint(j, NamedSharding(mesh, PartitionSpec(*spec))))

    def routed(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False):
        q, k, v = constrain(query), constrain(key), constrain(value)
        return constrain(jtorch._sdpa_reference(q, k, v, attn_mask, dropout_p, is_causal, scale, enable_gqa))

    env = torchax.default_env()
    op = F.scaled_dot_product_attention
    previous = env._ops.get(op)
    env.override_op_definition(op, routed)
    try:
        yield
    finally:
        if previous is None:
            env._ops.pop(op, None)
        else:
            env._ops[op] = previous
