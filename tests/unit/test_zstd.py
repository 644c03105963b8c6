"""The one bounded zstd decoder (avatar_release/_zstd.py) that every decode goes through: exact
output into a caller's buffer or a fresh one, a frame that inflates past its limit refused having
produced one byte more, a header that declares too much refused before decoding."""

from __future__ import annotations

import hashlib

import numpy as np
import pytest
import zstandard

from avatar_release._zstd import DecodeError, declared_size, decode

RAW = np.random.default_rng(0).integers(0, 4, 3 << 20, np.uint8).tobytes()  # compressible, several steps long
FRAME = zstandard.ZstdCompressor().compress(RAW)


def test_decode_writes_exactly_the_raw_bytes_into_the_callers_buffer_hashing_each_step():
    out = memoryview(bytearray(len(RAW) + 100))
    seen = hashlib.sha256()
    got = decode([FRAME[i : i + 4096] for i in range(0, len(FRAME), 4096)], len(RAW), out=out, seen=seen)
    assert got is not None and bytes(got) == RAW and seen.digest() == hashlib.sha256(RAW).digest()
    assert decode([FRAME], len(RAW), keep=False) is None  # check only: no output kept


def test_a_frame_larger_than_its_limit_is_refused_and_a_shorter_one_when_exact():
    with pytest.raises(DecodeError, match=f"more than the {len(RAW) - 1} bytes the manifest says"):
        decode([FRAME], len(RAW) - 1)
    with pytest.raises(DecodeError, match=f"decompresses to {len(RAW)} bytes, the manifest says {len(RAW) + 1}"):
        decode([FRAME], len(RAW) + 1)
    assert bytes(decode([FRAME], len(RAW) + 1, exact=False)) == RAW  # a bound, not a size
    with pytest.raises(DecodeError, match="corrupt or truncated"):
        decode([FRAME[: len(FRAME) // 2]], len(RAW))


def test_a_header_declaring_more_than_allowed_is_refused_before_any_decoding():
    bomb = zstandard.ZstdCompressor(level=19).compress(bytes(1 << 24))
    with pytest.raises(DecodeError, match=f"declares {1 << 24} bytes, more than the {1 << 20} allowed"):
        declared_size(bomb, 1 << 20)
    assert declared_size(FRAME, len(RAW)) == len(RAW)
    unsized = zstandard.ZstdCompressor(write_content_size=False).compress(RAW)
    with pytest.raises(DecodeError, match="declares no size"):
        declared_size(unsized, 1 << 30)
