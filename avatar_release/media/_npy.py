"""A picture given as a .npy uint8 array: its header read and checked before anything is allocated.

:mod:`.image` checks the header's pixel count against its bound between the two steps here, so
a huge array is refused from its header alone, like a huge PNG or JPEG.
"""

from __future__ import annotations

import io

import numpy as np
from numpy.lib import format as npy

from ..errors import InputError

__all__ = ["NPY_MAGIC", "npy_header", "npy_rgb"]

NPY_MAGIC = b"\x93NUMPY"


def npy_header(data: bytes, where: str) -> tuple[tuple[int, ...], bool, int]:
    """(shape, Fortran order, offset of the pixels) of a .npy picture: uint8, (H, W) or (H, W, 1 to 4)."""
    bio = io.BytesIO(data)
    try:
        version = npy.read_magic(bio)
        if version == (1, 0):
            shape, fortran, dtype = npy.read_array_header_1_0(bio)
        elif version in ((2, 0), (3, 0)):
            shape, fortran, dtype = npy.read_array_header_2_0(bio)
        else:
            raise ValueError(f"format version {version}")
    except Exception as exc:  # ValueError for damage and unknown versions
        raise InputError(
            f"image {where}: cannot read as a .npy array ({exc}); save it with "
            "numpy.save(path, uint8_array_of_shape_HxWx3)"
        ) from None
    if dtype != np.uint8:
        raise InputError(
            f"image {where}: dtype {dtype}, expected uint8 (0..255 per channel); convert it, "
            "e.g. numpy.save(path, numpy.clip(a * 255, 0, 255).round().astype(numpy.uint8)) "
            "for floats in [0, 1]"
        )
    if len(shape) not in (2, 3) or (len(shape) == 3 and shape[2] not in (1, 2, 3, 4)) or 0 in shape:
        raise InputError(
            f"image {where}: array shape {tuple(shape)}, expected (height, width, 3) RGB "
            "(or (height, width) gray, (height, width, 4) RGBA)"
        )
    return shape, fortran, bio.tell()


def npy_rgb(body: bytes, shape: tuple[int, ...], fortran: bool, where: str) -> np.ndarray:
    """The (H, W, 3) uint8 RGB pixels of a checked header's ``body``: gray repeated, alpha dropped."""
    count = int(np.prod(shape))
    if len(body) != count:
        raise InputError(
            f"image {where}: .npy holds {len(body)} bytes of pixels, its header promises {count}; "
            "the file is damaged, save it again"
        )
    arr = np.frombuffer(body, np.uint8).reshape(shape, order="F" if fortran else "C")
    if arr.ndim == 2:
        arr = arr[:, :, None]
    c = arr.shape[2]
    if c in (1, 2):  # gray, gray+alpha
        arr = np.repeat(arr[:, :, :1], 3, axis=2)
    return np.ascontiguousarray(arr[:, :, :3])
