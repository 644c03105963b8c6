"""The write-up's attention kernels (Pallas and shard_map), each with a plain-JAX reference.

blocksparse      frame-aligned block-sparse attention for the SR stage (one pass over live blocks)
bounded_softmax  the same grid with a precomputed per-row bound instead of the running max
flash            dense (DiT) attention with the online softmax over key blocks, no S x S logits
ulysses          Ulysses all-to-all attention with independent head groups
preattn          fused norm + rotary + projection + head packing, in the all-to-all's layout
flash_gpu        the DiT's attention through JAX's Pallas flash kernel for Triton (GPU targets)
window_gpu       the SR's frame-window attention as a Pallas kernel for Triton (GPU targets): no table,
                 each program's key runs computed from its position
masks           block tables and tile counts (numpy only)

Nothing is imported here: importing a kernel module never touches a device.
"""
