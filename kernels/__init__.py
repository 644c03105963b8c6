"""Custom kernels (Pallas and shard_map) for the attention path: Ulysses all-to-all, fused pre-attention."""
