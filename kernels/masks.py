"""Numpy bookkeeping for the SR frame-window mask: token mask, block live maps, live-block tables.

The SR stage attends over (F + 1) frames x T tokens; frame 0 is the reference frame. The mask
(model/sr.py `frame_window_mask`) is a function of the *frames* of the query and key tokens only:

    query frame 0      -> key frame 0 only
    query frame q > 0  -> key frames k with |q - k| <= window, plus key frame 0

Because the mask is constant on every (query frame, key frame) cell, everything here works on the
tiny (frames x frames) frame mask and never materialises the (S x S) token mask, except in
`token_mask`, which exists for tests at small shapes. A block whose edges are frame edges is wholly
live or wholly dead; a 128-token tile on a T that is not a multiple of 128 straddles frame edges
and comes out partial. The functions below count exactly that.

Everything is plain numpy so that the tables a kernel needs are static (built once at trace time)
and so that nothing here touches a device.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

EMPTY, PARTIAL, FULL = 0, 1, 2  # codes of `block_live_map`
SUBLANE_BF16 = 16  # finest bf16 tiling along the sequence: block sizes are multiples of this


def frame_mask(frames: int, window: int) -> np.ndarray:
    """(frames, frames) bool, True = query frame may attend to key frame (same rule as model/sr.py)."""
    if frames < 1 or window < 0:
        raise ValueError(f"need frames >= 1 and window >= 0, got frames={frames}, window={window}")
    q = np.arange(frames)[:, None]
    k = np.arange(frames)[None, :]
    video = (np.abs(q - k) <= window) | (k == 0)
    return np.where(q == 0, k == 0, video)


def token_mask(frames: int, tokens: int, window: int) -> np.ndarray:
    """(S, S) bool token mask, S = frames * tokens: model/sr.py `frame_window_mask` in numpy.

    Materialises S^2 booleans, so meant for tests and small shapes only.
    """
    f = np.arange(frames * tokens) // tokens
    return frame_mask(frames, window)[f[:, None], f[None, :]]


def live_fraction(frames: int, window: int) -> float:
    """Share of the (S, S) token mask that is True.

    Every frame has the same number of tokens, so this is the share of live frame cells.
    """
    return float(frame_mask(frames, window).mean())


def live_frames(frames: int, window: int) -> list[list[int]]:
    """For each query frame, the sorted key frames it attends to."""
    m = frame_mask(frames, window)
    return [np.flatnonzero(row).tolist() for row in m]


def aligned_block_sizes(tokens: int) -> list[int]:
    """Block sizes that are multiples of 16 and divide the per-frame token count, ascending.

    Such blocks have their edges on frame edges, so every block of the frame mask is wholly live
    or wholly empty: no partial blocks, no mask predicates, no padding.
    """
    return [b for b in range(SUBLANE_BF16, tokens + 1, SUBLANE_BF16) if tokens % b == 0]


def default_block(tokens: int, limit: int = 512) -> int:
    """The largest aligned block size <= `limit` (fewest grid steps that still fit VMEM easily).

    At head_dim 128 a 512 x 128 bf16 block is 128 KiB, so q, k, v, out and the f32 accumulator of
    the kernels stay well inside a TensorCore's VMEM. Raises if T has no aligned block size.
    """
    sizes = [b for b in aligned_block_sizes(tokens) if b <= limit]
    if not sizes:
        raise ValueError(
            f"tokens per frame ({tokens}) has no block size that is a multiple of "
            f"{SUBLANE_BF16}, divides it and is <= {limit}"
        )
    return sizes[-1]


def default_query_block(tokens: int, limit: int = 2048) -> int:
    """The largest aligned query block size <= `limit` (the SR kernel's rows per grid step).

    A query block stays resident while the kernel streams its live key blocks past it, so every
    key block is read once per query block: larger query blocks, fewer re-reads. At head_dim 128
    a 2048-row block with a 512-key tile keeps q, the f32 accumulator and the (2048, 512) f32
    logits under 8 MiB of VMEM.
    """
    return default_block(tokens, limit)


def _block_frame_ranges(length: int, tokens: int, block: int) -> tuple[np.ndarray, np.ndarray]:
    """First and last frame touched by each block of a sequence of `length` tokens (padded or not).

    Padding tokens (index >= length of the real sequence) belong to a pseudo-frame handled by the
    caller; here frame = token // tokens for every token, so padding lands in frame `frames`.
    """
    starts = np.arange(0, length, block)
    ends = np.minimum(starts + block, length) - 1
    return starts // tokens, ends // tokens


def block_live_map(frames: int, tokens: int, window: int, block: int, q_block: int | None = None) -> np.ndarray:
    """(nq, nb) int8 of EMPTY / PARTIAL / FULL for blocks of `q_block` query tokens (default:
    `block`, square) by `block` key tokens.

    The sequence is padded to a multiple of `block` as a stock tiled kernel would; padding tokens
    attend to nothing and are attended by nothing (a pseudo-frame with an all-False row and
    column). A block spans a contiguous range of frames and contains at least one token of each, so
    it is FULL iff every (query frame, key frame) cell in its range is live, EMPTY iff none is.
    Computed with a 2-D prefix sum over the (frames + 1)^2 frame mask: O(nb^2), never O(S^2).
    """
    q_block = block if q_block is None else q_block
    if block < 1 or q_block < 1:
        raise ValueError(f"block sizes must be >= 1, got {q_block} x {block}")
    seq = frames * tokens
    m = np.zeros((frames + 1, frames + 1), np.int64)  # last row/column: the padding pseudo-frame
    m[:frames, :frames] = frame_mask(frames, window)
    csum = np.zeros((frames + 2, frames + 2), np.int64)
    csum[1:, 1:] = m.cumsum(0).cumsum(1)

    def ranges(size: int) -> tuple[np.ndarray, np.ndarray]:
        lo, hi = _block_frame_ranges(-(-seq // size) * size, tokens, size)
        return np.minimum(lo, frames), np.minimum(hi, frames)  # every padding token -> pseudo-frame

    (qlo, qhi), (klo, khi) = ranges(q_block), ranges(block)
    q0, q1 = qlo[:, None], qhi[:, None] + 1
    k0, k1 = klo[None, :], khi[None, :] + 1
    live = csum[q1, k1] - csum[q0, k1] - csum[q1, k0] + csum[q0, k0]
    cells = (q1 - q0) * (k1 - k0)
    out = np.full(live.shape, PARTIAL, np.int8)
    out[live == 0] = EMPTY
    out[live == cells] = FULL
    return out


class TileCounts(NamedTuple):
    """How a square tiling of the padded SR sequence meets the frame mask."""

    tile: int
    padded_length: int  # sequence length rounded up to a multiple of the tile
    full: int
    partial: int
    empty: int

    @property
    def live(self) -> int:
        """Blocks a block-sparse kernel must visit (full + partial)."""
        return self.full + self.partial

    @property
    def partial_share(self) -> float:
        """Share of visited blocks that need mask predicates."""
        return self.partial / self.live if self.live else 0.0


def tile_counts(frames: int, tokens: int, window: int, tile: int) -> TileCounts:
    """Counts of full / partial / empty blocks for `tile`-token square blocks.

    With a stock 128 tile and T % 128 != 0 some blocks straddle frame edges (partial) and the
    sequence is padded; with an aligned size from `aligned_block_sizes` partial is 0 by
    construction and no padding is needed.
    """
    codes = block_live_map(frames, tokens, window, tile)
    return TileCounts(
        tile=tile,
        padded_length=codes.shape[0] * tile,
        full=int((codes == FULL).sum()),
        partial=int((codes == PARTIAL).sum()),
        empty=int((codes == EMPTY).sum()),
    )


class LiveTable(NamedTuple):
    """Flattened list of live (query block, key block) pairs, grouped by query block."""

    q_block: np.ndarray  # (n_pairs,) int32, non-decreasing: a query block's pairs are consecutive
    k_block: np.ndarray  # (n_pairs,) int32, ascending within a query block
    block: int  # key block size (and query block size unless q_size says otherwise)
    n_blocks: int  # key blocks along the (unpadded) sequence
    q_size: int | None = None  # query block size (None: square, = block)

    @property
    def n_pairs(self) -> int:
        return int(self.q_block.shape[0])

    @property
    def query_block(self) -> int:
        return self.block if self.q_size is None else self.q_size


def live_block_table(frames: int, tokens: int, window: int, block: int, q_block: int | None = None) -> LiveTable:
    """The live (q, k) block pairs of the frame mask for aligned block sizes, in visit order.

    Requires `block` (keys) and `q_block` (queries, default `block`) in
    `aligned_block_sizes(tokens)`: then every block pair is FULL or EMPTY (both edges fall on
    frame edges), the sequence needs no padding, and a kernel that visits exactly these pairs
    needs no mask at all. Every query block has at least one live pair (frame 0 is always
    visible), so every output block is written.
    """
    for size in (block, block if q_block is None else q_block):
        if size not in aligned_block_sizes(tokens):
            raise ValueError(
                f"block {size} is not a multiple of {SUBLANE_BF16} dividing tokens "
                f"per frame {tokens}; aligned sizes: {aligned_block_sizes(tokens)}"
            )
    codes = block_live_map(frames, tokens, window, block, q_block)
    assert not (codes == PARTIAL).any(), "aligned blocks cannot be partial"
    qi, ki = np.nonzero(codes == FULL)  # row-major: grouped by q, ascending k
    return LiveTable(
        q_block=qi.astype(np.int32),
        k_block=ki.astype(np.int32),
        block=block,
        n_blocks=codes.shape[1],
        q_size=None if q_block in (None, block) else q_block,
    )


def kv_fetches(table: LiveTable) -> int:
    """Key (or value) block copies a pipelined grid over `table` makes for one head.

    A Pallas pipeline re-copies an input block only when its block index changes between
    consecutive grid steps, so this counts index changes along the flattened table (+1 for the
    first step).
    """
    k = table.k_block
    return int(1 + np.count_nonzero(k[1:] != k[:-1])) if k.size else 0
