"""Reference pictures: every PNG variant, JPEG, WebP, EXIF orientation, the fit rules, the pixel
bound, and refusals that say what was found and how to fix it with this tool."""

from __future__ import annotations

import hashlib
import io
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from avatar_release import media
from avatar_release.errors import InputError
from avatar_release.media import samples
from avatar_release.media._geometry import cover_box
from tests.media.helpers import adam7_png, encode_still, ffmpeg, gradient, png_header_only

ROOT = Path(__file__).resolve().parents[2]


def _write(tmp_path: Path, name: str, data: bytes) -> Path:
    p = tmp_path / name
    p.write_bytes(data)
    return p


def _psnr(a: np.ndarray, b: np.ndarray) -> float:
    mse = float(np.mean((a.astype(np.float64) - b.astype(np.float64)) ** 2))
    return float("inf") if mse == 0 else 10 * np.log10(255.0**2 / mse)


# ---------------------------------------------------------------------------------- PNG out


def test_png_round_trip_is_bit_exact_and_leaves_no_temp_file(tmp_path):
    img = samples.sample_image(48, 80)
    path = tmp_path / "face.png"
    media.write_png(path, img)
    assert path.read_bytes().startswith(b"\x89PNG\r\n\x1a\n")
    back = media.read_image(path)
    assert back.dtype == np.uint8 and back.shape == (48, 80, 3) and np.array_equal(back, img)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["face.png"]
    assert media.encode_png(img) == media.encode_png(img.copy())  # same bytes every time


def test_written_png_is_what_ffmpeg_reads(tmp_path):
    img = gradient(21, 35)
    media.write_png(tmp_path / "g.png", img)
    out = ffmpeg("-i", str(tmp_path / "g.png"), "-f", "rawvideo", "-pix_fmt", "rgb24", "-")
    assert np.array_equal(np.frombuffer(out, np.uint8).reshape(21, 35, 3), img)


def test_encode_png_refuses_what_is_not_rgb8():
    with pytest.raises(InputError, match="float32.*uint8"):
        media.encode_png(np.zeros((4, 4, 3), np.float32))
    with pytest.raises(InputError, match=r"\(4, 4\)"):
        media.encode_png(np.zeros((4, 4), np.uint8))


def test_bad_output_path_is_an_input_error(tmp_path):
    (tmp_path / "a-file").write_text("x")
    with pytest.raises(InputError, match="cannot write"):
        media.write_png(tmp_path / "a-file" / "frame.png", np.zeros((2, 2, 3), np.uint8))
    with pytest.raises(InputError, match="is a directory"):
        media.write_png(tmp_path, np.zeros((2, 2, 3), np.uint8))


# ---------------------------------------------------------------------------------- PNG in, every variant


@pytest.mark.parametrize("pred", ["none", "sub", "up", "avg", "paeth", "mixed"])
def test_png_every_filter_type(tmp_path, pred):
    rng = np.random.default_rng(7)
    src = rng.integers(0, 256, (13, 17, 3), dtype=np.uint8)
    src[:, :8] = gradient(13, 8)
    path = _write(tmp_path, "x.png", encode_still(src.tobytes(), "rgb24", 17, 13, "png", "-pred", pred))
    assert np.array_equal(media.read_image(path), src)


def _variants():
    """(name, PNG bytes, the RGB a reader must produce), from ffmpeg's encoder or the spec."""
    h, w = 6, 7
    rgb = gradient(h, w)
    gray = rgb[:, :, 0].copy()
    alpha = np.full((h, w, 1), 77, np.uint8)
    wide = (np.arange(h * w * 3, dtype=np.uint32).reshape(h, w, 3) * 977 % 65536).astype(np.uint16)
    wide_gray = wide[:, :, 0].copy()
    idx = (np.arange(h * w) % 3).astype(np.uint8).reshape(h, w)
    bgra = np.zeros((256, 4), np.uint8)
    bgra[:3] = [[30, 20, 10, 255], [60, 50, 40, 255], [200, 150, 100, 128]]  # ffmpeg's pal8: B, G, R, A
    palette_rgb = bgra[:, 2::-1][idx]
    mono = np.array([[1, 0, 1, 1, 0, 0, 1]] * h, np.uint8)
    mono_bits = np.packbits(np.pad(mono, ((0, 0), (0, 1))), axis=1)
    return [
        ("rgb8", encode_still(rgb.tobytes(), "rgb24", w, h, "png"), rgb),
        ("rgba8, alpha dropped", encode_still(np.concatenate([rgb, alpha], 2).tobytes(), "rgba", w, h, "png"), rgb),
        ("gray8", encode_still(gray.tobytes(), "gray", w, h, "png"), np.repeat(gray[:, :, None], 3, 2)),
        (
            "gray+alpha8",
            encode_still(np.stack([gray, alpha[:, :, 0]], 2).tobytes(), "ya8", w, h, "png"),
            np.repeat(gray[:, :, None], 3, 2),
        ),
        (
            "rgb16, high byte",
            encode_still(wide.astype(">u2").tobytes(), "rgb48be", w, h, "png"),
            (wide >> 8).astype(np.uint8),
        ),
        (
            "gray16, high byte",
            encode_still(wide_gray.astype(">u2").tobytes(), "gray16be", w, h, "png"),
            np.repeat((wide_gray >> 8).astype(np.uint8)[:, :, None], 3, 2),
        ),
        ("palette with alpha", encode_still(idx.tobytes() + bgra.tobytes(), "pal8", w, h, "png"), palette_rgb),
        ("1-bit", encode_still(mono_bits.tobytes(), "monob", w, h, "png"), np.repeat(mono[:, :, None] * 255, 3, 2)),
        ("interlaced (Adam7)", adam7_png(rgb), rgb),
    ]


@pytest.mark.parametrize("name,data,want", _variants(), ids=[v[0] for v in _variants()])
def test_png_variants_decode_to_the_expected_rgb(tmp_path, name, data, want):
    got = media.read_image(_write(tmp_path, "v.png", data))
    assert got.dtype == np.uint8 and got.shape == want.shape
    assert np.array_equal(got, want), name


# ---------------------------------------------------------------------------------- JPEG, WebP, EXIF, npy


def test_jpeg_and_webp_decode(tmp_path):
    src = gradient(72, 96)
    jpeg = _write(
        tmp_path, "a.jpg", encode_still(src.tobytes(), "rgb24", 96, 72, "mjpeg", "-q:v", "2", "-pix_fmt", "yuvj444p")
    )
    assert _psnr(media.read_image(jpeg), src) > 30  # lossy, but the same picture
    webp = _write(tmp_path, "a.webp", encode_still(src.tobytes(), "rgb24", 96, 72, "libwebp", "-lossless", "1"))
    assert np.array_equal(media.read_image(webp), src)
    gray_jpeg = _write(
        tmp_path,
        "g.jpg",
        encode_still(src[:, :, 0].tobytes(), "gray", 96, 72, "mjpeg", "-q:v", "2", "-pix_fmt", "gray"),
    )
    g = media.read_image(gray_jpeg)
    assert g.shape == (72, 96, 3) and np.array_equal(g[:, :, 0], g[:, :, 2])


def test_exif_orientation_stands_a_phone_photo_up(tmp_path):
    from PIL import Image

    stored = np.zeros((20, 40, 3), np.uint8)  # stored landscape: left half red, right half blue
    stored[:, :20] = (255, 0, 0)
    stored[:, 20:] = (0, 0, 255)
    exif = Image.Exif()
    exif[0x0112] = 6  # "rotate 90 degrees clockwise to display"
    buf = io.BytesIO()
    Image.fromarray(stored).save(buf, format="JPEG", quality=95, exif=exif)
    path = _write(tmp_path, "phone.jpg", buf.getvalue())
    shown = media.read_image(path)
    assert shown.shape == (40, 20, 3)  # portrait, as a viewer shows it
    assert shown[5, 10, 0] > 200 and shown[5, 10, 2] < 60  # the stored left (red) is now on top
    assert shown[35, 10, 2] > 200 and shown[35, 10, 0] < 60
    loaded = media.load_image(path, height=40, width=20)
    assert loaded.fit.orientation == 6 and loaded.fit.source_size == (20, 40) and loaded.fit.resample == "none"


def test_npy_arrays_and_their_refusals(tmp_path):
    img = gradient(6, 5)
    np.save(tmp_path / "ok.npy", img)
    assert np.array_equal(media.read_image(tmp_path / "ok.npy", height=6, width=5), img)
    np.save(tmp_path / "rgba.npy", np.concatenate([img, np.zeros((6, 5, 1), np.uint8)], 2))
    assert np.array_equal(media.read_image(tmp_path / "rgba.npy"), img)
    np.save(tmp_path / "float.npy", img.astype(np.float32) / 255)
    with pytest.raises(InputError, match="float32.*uint8"):
        media.read_image(tmp_path / "float.npy")
    # A header promising 30 GB: refused from the header, before anything is allocated.
    np.save(tmp_path / "small.npy", np.zeros((2, 2, 3), np.uint8))
    data = (tmp_path / "small.npy").read_bytes().replace(b"(2, 2, 3)", b"(99999, 99999, 3)")
    with pytest.raises(InputError, match="9999.8 MP"):
        media.read_image(_write(tmp_path, "huge.npy", data))
    with pytest.raises(InputError, match="header promises"):
        media.read_image(_write(tmp_path, "short.npy", (tmp_path / "ok.npy").read_bytes()[:-7]))


# ---------------------------------------------------------------------------------- fit rules


def _framed(width: int, height: int, band: int) -> np.ndarray:
    """Gray picture with ``band`` pixels of pure red at the left and right edges."""
    img = np.full((height, width, 3), 128, np.uint8)
    img[:, :band] = (255, 0, 0)
    img[:, width - band :] = (255, 0, 0)
    return img


def test_cover_crops_the_centre_and_records_the_box(tmp_path):
    path = tmp_path / "wide.png"
    media.write_png(path, _framed(1280, 720, 40))  # 16:9; the 5:3 target drops 40 px each side
    loaded = media.load_image(path, height=48, width=80, fit="cover")
    assert loaded.pixels.shape == (48, 80, 3)
    assert loaded.fit.box == (40, 0, 1240, 720) and loaded.fit.placed == (0, 0, 80, 48)
    assert loaded.fit.resample == media.FIT_RESAMPLE and loaded.fit.source_format == "PNG"
    assert int(loaded.pixels[:, :, 0].max()) - int(loaded.pixels[:, :, 1].min()) < 8  # no red left


def test_contain_letterboxes_on_black_and_keeps_everything(tmp_path):
    path = tmp_path / "wide.png"
    media.write_png(path, _framed(1280, 720, 40))
    loaded = media.load_image(path, height=48, width=80, fit="contain")
    assert loaded.fit.box == (0, 0, 1280, 720) and loaded.fit.placed == (0, 1, 80, 46)  # 80x45 centred
    px = loaded.pixels
    assert not px[0].any() and not px[46:].any()  # bars are black
    assert px[20, 0, 0] > 200 and px[20, 0, 1] < 60  # the red edge survives
    tall = media.fit_image(_framed(300, 900, 1), height=48, width=80, rule="contain")[1]
    assert tall.placed == (32, 0, 48, 48)  # pillarboxed: 16x48 in the middle


def test_exact_refuses_another_size_and_names_the_fix(tmp_path):
    path = tmp_path / "a.png"
    media.write_png(path, np.zeros((64, 64, 3), np.uint8))
    with pytest.raises(InputError) as exc:
        media.read_image(path, height=48, width=80, pipeline="tiny", fit="exact")
    msg = str(exc.value)
    assert str(path) in msg and "64x64" in msg and "80x48" in msg and "tiny" in msg
    assert "--fit cover" in msg and "--fit contain" in msg
    with pytest.raises(InputError, match="fit rule 'stretch'"):
        media.read_image(path, height=48, width=80, fit="stretch")


def test_every_rule_is_the_identity_at_the_pipelines_size():
    img = samples.sample_image(48, 80)
    for rule in media.FIT_RULES:
        out, fit = media.fit_image(img, height=48, width=80, rule=rule)
        assert np.array_equal(out, img) and fit.resample == "none" and fit.box == (0, 0, 80, 48)


@settings(max_examples=200, deadline=None, database=None)
@given(w=st.integers(1, 5000), h=st.integers(1, 5000), tw=st.integers(1, 2000), th=st.integers(1, 2000))
def test_cover_box_is_centred_inside_and_has_the_target_shape(w, h, tw, th):
    left, top, right, bottom = cover_box(w, h, tw, th)
    cw, ch = right - left, bottom - top
    assert 0 <= left and 0 <= top and right <= w and bottom <= h and cw >= 1 and ch >= 1
    assert cw == w or ch == h  # one side is kept whole
    assert abs(left - (w - right)) <= 1 and abs(top - (h - bottom)) <= 1  # centred
    assert abs(cw * th - ch * tw) <= max(tw, th)  # the target's aspect, to within a pixel


def test_fitting_is_deterministic_across_processes(tmp_path):
    src = tmp_path / "src.png"
    media.write_png(src, gradient(333, 517))
    code = (
        "import hashlib, sys; from avatar_release import media; "
        "print(hashlib.sha256(media.read_image(sys.argv[1], height=48, width=80).tobytes()).hexdigest())"
    )
    out = subprocess.run(
        [sys.executable, "-c", code, str(src)], capture_output=True, text=True, check=True, cwd=ROOT
    ).stdout.strip()
    assert out == hashlib.sha256(media.read_image(src, height=48, width=80).tobytes()).hexdigest()


def test_a_large_jpeg_is_decoded_small_and_still_fitted_the_same_way(tmp_path):
    """A photo many times the pipeline's size is decoded at 1/2, 1/4 or 1/8 by libjpeg's DCT scaling:
    the record says so, the box stays in the photo's own pixels, EXIF orientation still applies,
    and the picture matches fitting the fully decoded photo."""
    from PIL import Image

    stored = np.zeros((960, 1280, 3), np.uint8)  # stored landscape: left half red, right half blue
    stored[:, :640] = (255, 0, 0)
    stored[:, 640:] = (0, 0, 255)
    stored[:, :, 1] = gradient(960, 1280)[:, :, 1]
    exif = Image.Exif()
    exif[0x0112] = 6  # shown portrait, 960 wide: the stored left (red) on top
    buf = io.BytesIO()
    Image.fromarray(stored).save(buf, format="JPEG", quality=95, exif=exif)
    path = _write(tmp_path, "phone.jpg", buf.getvalue())
    loaded = media.load_image(path, height=48, width=80)
    fit = loaded.fit
    assert fit.decode_scale == 4 and fit.orientation == 6 and fit.resample == media.FIT_RESAMPLE
    assert fit.source_size == (960, 1280) and fit.box == (0, 352, 960, 928)  # 5:3 from the middle
    assert loaded.pixels[5, 40, 0] > 200 and loaded.pixels[42, 40, 2] > 200  # red above, blue below
    full, _ = media.fit_image(media.read_image(path), height=48, width=80)
    assert _psnr(loaded.pixels, full) > 35
    assert media.load_image(path, height=48, width=80, fit="contain").fit.decode_scale == 8  # fills 36x48
    assert media.load_image(path, height=720, width=540).fit.decode_scale == 1  # too close to scale down


# ---------------------------------------------------------------------------------- bounds and refusals


def test_a_60000x60000_header_is_refused_at_once(tmp_path):
    # Only the header is there: had the reader gone past it to decode, it would have failed on the
    # missing pixel data with another error, not refused the size the header declares.
    path = _write(tmp_path, "bomb.png", png_header_only(60000, 60000))
    with pytest.raises(InputError) as exc:
        media.read_image(path, height=48, width=80)
    msg = str(exc.value)
    assert str(path) in msg and "3600.0 MP" in msg and "50 MP" in msg


def test_the_pixel_bound_is_checked_from_the_header_and_is_configurable(tmp_path):
    path = _write(tmp_path, "big.png", png_header_only(9000, 6000))  # 54 MP: our bound, not Pillow's
    with pytest.raises(InputError, match=r"PNG of 9000x6000 = 54.0 MP, more than the bound of 50 MP"):
        media.read_image(path)
    small = tmp_path / "small.png"
    media.write_png(small, gradient(100, 100))
    with pytest.raises(InputError, match="100x100 = 0.0 MP, more than the bound of 0.005 MP"):
        media.read_image(small, max_pixels=5000)
    assert media.read_image(small, max_pixels=10000).shape == (100, 100, 3)
    with pytest.raises(InputError, match="max_pixels"):
        media.read_image(small, max_pixels=media.MAX_PIXELS_CEILING + 1)


def test_refusals_say_what_was_found_and_never_send_the_user_to_ffmpeg(tmp_path):
    good = media.encode_png(gradient(8, 8))
    cases = {
        "anim.gif": (b"GIF89a" + bytes(40), "found a GIF image"),
        "notes.png": (b"hello, this is text\n", "found text"),
        "crc.png": (good[:40] + bytes([good[40] ^ 0xFF]) + good[41:], "damaged"),
        "cut.png": (good[: len(good) // 2], "damaged or truncated"),
        "empty.png": (b"", "empty"),
    }
    for name, (data, words) in cases.items():
        path = _write(tmp_path, name, data)
        with pytest.raises(InputError) as exc:
            media.read_image(path, height=8, width=8)
        msg = str(exc.value)
        assert str(path) in msg and words in msg, (name, msg)
        assert "ffmpeg" not in msg, msg
        if name != "empty.png":
            assert "PNG or JPEG" in msg, msg
    with pytest.raises(InputError, match="not found"):
        media.read_image(tmp_path / "missing.png")
    with pytest.raises(InputError, match="is a directory"):
        media.read_image(tmp_path)


def test_image_bytes_from_a_request(tmp_path):
    jpeg = encode_still(gradient(30, 40).tobytes(), "rgb24", 40, 30, "mjpeg")
    loaded = media.load_image_bytes(jpeg, height=48, width=80, where="request image")
    assert loaded.pixels.shape == (48, 80, 3) and loaded.fit.source_format == "JPEG"
    with pytest.raises(InputError, match="request image: found text"):
        media.load_image_bytes(b"{not an image}", height=48, width=80, where="request image")


def test_media_modules_import_neither_pillow_nor_ffmpeg_nor_jax():
    code = (
        "import sys; import avatar_release.media, avatar_release.media.samples; "
        "bad = sorted(m for m in sys.modules if m.split('.')[0] in "
        "('torch', 'jax', 'jaxlib', 'torchax', 'PIL', 'imageio_ffmpeg')); print(','.join(bad))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT)
    assert out.stdout.strip() == ""


def test_the_converter_writes_the_picture_a_render_would_see(tmp_path, capsys):
    from avatar_release.media.__main__ import main

    src = tmp_path / "photo.jpg"
    src.write_bytes(encode_still(gradient(90, 160).tobytes(), "rgb24", 160, 90, "mjpeg"))
    assert main(["image", str(src), str(tmp_path / "seen.png"), "--size", "80x48", "--fit", "contain"]) == 0
    assert '"rule": "contain"' in capsys.readouterr().out
    want = media.load_image(src, height=48, width=80, fit="contain").pixels
    assert np.array_equal(media.read_image(tmp_path / "seen.png"), want)
    assert main(["image", str(tmp_path / "nope.jpg"), str(tmp_path / "x.png"), "--size", "80x48"]) == 2
    assert "not found" in capsys.readouterr().err


def test_a_picture_over_the_default_bound_can_be_fitted_once_with_the_converter(tmp_path):
    from avatar_release.media.__main__ import main

    big = tmp_path / "big.png"
    media.write_png(big, gradient(120, 200))
    with pytest.raises(InputError) as exc:
        media.read_image(big, height=48, width=80, max_pixels=20000)
    assert "--max-pixels 24000" in str(exc.value)  # the fix names the bound this picture needs
    assert main(["image", str(big), str(tmp_path / "fitted.png"), "--size", "80x48", "--max-pixels", "24000"]) == 0
    assert media.read_image(tmp_path / "fitted.png", height=48, width=80, max_pixels=20000).shape == (48, 80, 3)
