"""Cutting latents and the photo into per-token patches, and putting latents back together.

Token order everywhere: frame-major, then patch row, then patch column.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def patchify(x: torch.Tensor, p: int) -> torch.Tensor:
    """(N, C, h, w) -> (N, (h/p)(w/p), C p p)."""
    n, c, h, w = x.shape
    x = x.reshape(n, c, h // p, p, w // p, p).permute(0, 2, 4, 1, 3, 5)  # (N, h/p, w/p, C, p, p)
    return x.reshape(n, (h // p) * (w // p), c * p * p)


def unpatchify(tokens: torch.Tensor, p: int, grid: tuple[int, int]) -> torch.Tensor:
    """(N, (h/p)(w/p), C p p) -> (N, C, h, w) for grid = (h, w)."""
    n, _, cpp = tokens.shape
    h, w = grid
    c = cpp // (p * p)
    x = tokens.reshape(n, h // p, w // p, c, p, p).permute(0, 3, 1, 4, 2, 5)  # (N, C, h/p, p, w/p, p)
    return x.reshape(n, c, h, w)


def upsample_nearest(x: torch.Tensor, s: int) -> torch.Tensor:
    """(N, C, h, w) -> (N, C, h s, w s), each cell repeated s x s times (exact on every backend)."""
    n, c, h, w = x.shape
    return x[:, :, :, None, :, None].expand(n, c, h, s, w, s).reshape(n, c, h * s, w * s)


def image_tokens(image_u8: torch.Tensor, block: int, size: tuple[int, int]) -> torch.Tensor:
    """The photo as one block x block pixel square per token: (H, W, 3) uint8 -> (T, 3 block^2).

    Pixels map to [-1, 1]; the photo is zero-padded (mid grey) at the bottom/right to `size`, the
    VAE's output size before its crop (1080 -> 1088 rows at 1080p).
    """
    x = image_u8.float() / 127.5 - 1.0  # (H, W, 3)
    x = x.permute(2, 0, 1)[None]  # (1, 3, H, W)
    x = F.pad(x, (0, size[1] - x.shape[-1], 0, size[0] - x.shape[-2]))  # (1, 3, Hp, Wp)
    return patchify(x, block)[0]  # (T, 3 block^2)
