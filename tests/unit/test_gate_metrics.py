"""The frame metrics the gates decide with: digests that see one flipped bit, PSNR and the
largest difference without uint8 wrap-around."""

from __future__ import annotations

import hashlib
import math

import numpy as np
import pytest

from avatar_release.errors import InputError
from avatar_release.gates.metrics import frame_sha256, max_abs_diff, psnr
from avatar_release.media import sample_image


def test_frame_sha256_psnr_and_max_abs_diff():
    a = sample_image(32, 32)
    assert frame_sha256(a) == hashlib.sha256(a.tobytes()).hexdigest()
    assert frame_sha256(np.asfortranarray(a)) == frame_sha256(a)  # layout does not matter
    b = a.copy()
    b[0, 0, 0] ^= 1
    assert frame_sha256(b) != frame_sha256(a)
    assert psnr(a, a) == math.inf and max_abs_diff(a, a) == 0
    assert 60 < psnr(a, b) < math.inf and max_abs_diff(a, b) == 1
    noisy = np.clip(a.astype(np.int16) + 20, 0, 255).astype(np.uint8)
    assert psnr(a, noisy) < psnr(a, b)
    assert max_abs_diff(np.zeros(3, np.uint8), np.full(3, 255, np.uint8)) == 255  # no uint8 wrap


def test_metrics_refuse_what_cannot_be_compared():
    a = sample_image(32, 32)
    with pytest.raises(InputError, match="shapes differ"):
        psnr(a, a[:10])
    with pytest.raises(InputError, match="uint8"):
        psnr(a.astype(np.float32), a.astype(np.float32))
    with pytest.raises(InputError, match="uint8"):
        frame_sha256(a.astype(np.int16))
