"""The serving-pod loader: verify before unpickling, refuse mismatches, stream with zero compiles."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest
from click.testing import CliRunner

from avatar_release.cli import cli
from avatar_release.errors import EnvironmentMismatch, IntegrityError, NotFoundError, RecompileError
from avatar_release.media import sample_audio, sample_image
from avatar_release.records import Manifest
from avatar_release.registry import LocalRegistry
from tests.helpers import manifest_of, resealed

pytestmark = pytest.mark.slow


def _blob_path(root, digest):
    return root / "blobs" / "sha256" / digest.split(":")[1]


def _sealed(data: dict) -> Manifest:
    """A manifest whose identity, build id and seal agree with its fields: what a genuine
    build with these fields (e.g. compiled for another machine) would carry."""
    return resealed(Manifest.model_validate(data))


def _republish(reg, manifest: Manifest, **platform_changes) -> Manifest:
    """Publish a variant manifest, consistently sealed (a foreign-build stand-in)."""
    data = manifest.model_dump(mode="json")
    data["platform"].update(platform_changes.pop("platform", {}))
    for k, v in platform_changes.items():
        data[k] = v
    m = _sealed(data)
    reg.put_build(m.build_id, m.to_json_bytes())
    return m


def test_stream_yields_chunks_with_zero_compiles_and_deadlines(built_registry):
    from avatar_release.runtime import load, stream

    root, result = built_registry
    build = load("dev", LocalRegistry(root, create=False))
    image, audio = sample_image(48, 80), sample_audio(0.5)  # 12.5 frames -> 13 frames, 2 chunks
    chunks = list(stream(build, image, audio))
    assert [c.frames.shape for c in chunks] == [(8, 48, 80, 3), (5, 48, 80, 3)]
    assert all(c.frames.dtype == np.uint8 for c in chunks)
    assert build.guard.count == 0 and all(c.compiles == 0 for c in chunks)
    assert [c.deadline for c in chunks] == [pytest.approx(8 / 25), pytest.approx(5 / 25)]
    # Rendering is deterministic: the same build, inputs and seed give the same pixels.
    again = list(stream(build, image, audio))
    assert all(np.array_equal(a.frames, b.frames) for a, b in zip(chunks, again))
    # The picture follows the reference image (VAE skip), not noise.
    assert np.abs(chunks[0].frames[0].astype(int) - image.astype(int)).mean() < 64


def test_strict_guard_raises_naming_the_stage(built_registry):
    """A compile during serving (here: forced by a stray jit inside a stage call) is fatal."""
    import jax
    import jax.numpy as jnp

    from avatar_release.runtime import load, stream

    root, _ = built_registry
    build = load("dev", LocalRegistry(root, create=False))
    ls = build.stages[("sr", "f8")]
    real = ls.executable

    def compiling(params, *args):
        jax.jit(lambda x: x * 3 + 1)(jnp.arange(7.0))  # a fresh program: one backend compile
        return real(params, *args)

    ls.executable = compiling
    with pytest.raises(RecompileError, match=r"stage sr/f8 .*latents\(8, 8, 6, 10\)"):
        list(stream(build, sample_image(48, 80), sample_audio(0.2)))
    assert build.guard.count >= 1


def test_runtime_never_imports_torch(built_registry, tmp_path):
    root, _ = built_registry
    code = f"""
import os, sys, json
os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=8"
from avatar_release.runtime import load, render
from avatar_release.media import sample_image, sample_audio
b = load("dev", {str(root)!r})
frames, report = render(b, sample_image(48, 80), sample_audio(0.3))
print(json.dumps({{"torch": "torch" in sys.modules, "torchax": "torchax" in sys.modules,
                  "compile": "avatar_release.compile" in sys.modules, "frames": int(frames.shape[0]),
                  "compiles": b.guard.count}}))
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    info = json.loads(out.stdout.strip().splitlines()[-1])
    assert info == {"torch": False, "torchax": False, "compile": False, "frames": 8, "compiles": 0}


def test_corrupted_blob_is_refused_before_unpickling(registry_copy):
    from avatar_release.runtime import load

    root, _ = registry_copy
    reg = LocalRegistry(root, create=False)
    m = manifest_of(reg)
    p = _blob_path(root, m.executable("sr", "f8").blob.digest)
    data = bytearray(p.read_bytes())
    data[len(data) // 2] ^= 0x01
    p.write_bytes(bytes(data))
    with pytest.raises(IntegrityError, match="content hashes to"):
        load("dev", reg)


def test_a_revoked_build_is_refused_before_any_executable_is_deserialized(registry_copy, monkeypatch):
    """The revocation check runs beside the load, but an executable is code: a revoked build's
    bytes may be fetched and verified beside it, never handed to XLA's deserializer."""
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    import avatar_release.runtime._load as loader
    from avatar_release.errors import Revoked
    from avatar_release.runtime import load
    from avatar_release.trust.revocation import revoke

    root, build = registry_copy
    reg = LocalRegistry(root, create=False)
    m = manifest_of(reg, build.build_id)
    revoke(reg, build.build_id, m.content_digest(), Ed25519PrivateKey.generate(), reason="leaked key", by="sec")
    deserialized = []
    real = loader.deserialize_and_load
    monkeypatch.setattr(loader, "deserialize_and_load", lambda *a, **k: deserialized.append(a) or real(*a, **k))
    with pytest.raises(Revoked, match="leaked key"):
        load(build.build_id, reg)
    assert deserialized == []


def test_truncated_zstd_frame_is_refused(registry_copy):
    """A manifest whose digest matches a truncated frame: caught at decompression."""
    from avatar_release.runtime import load

    root, _ = registry_copy
    reg = LocalRegistry(root, create=False)
    m = manifest_of(reg)
    e = m.executable("vae", "f8")
    good = _blob_path(root, e.blob.digest).read_bytes()
    cut = good[: len(good) // 2]
    d = reg.put_blob(cut)
    data = m.model_dump(mode="json")
    for x in data["executables"]:
        if x["key"] == "vae/f8":
            x["blob"] = {"digest": d, "size": len(cut), "media_type": x["blob"]["media_type"]}
    bad = _sealed(data)  # the same build id: replace the build's reference with the bad manifest
    (root / "builds" / bad.build_id).unlink()
    reg.put_build(bad.build_id, bad.to_json_bytes())
    with pytest.raises(IntegrityError, match="zstd frame is corrupt or truncated"):
        load(bad.build_id, reg)


@pytest.mark.parametrize(
    "change, field",
    [
        ({"platform": {"device_count": 4, "mesh_shape": [4]}}, "device_count"),
        ({"platform": {"backend": "tpu", "device_kind": "TPU v6 lite"}}, "backend"),
        ({"toolchain": None}, "jaxlib"),
    ],
)
def test_environment_mismatch_lists_every_field(registry_copy, change, field):
    from avatar_release.runtime import load

    root, _ = registry_copy
    reg = LocalRegistry(root, create=False)
    m = manifest_of(reg)
    if "toolchain" in change:
        change = {"toolchain": {**m.toolchain.model_dump(), "jaxlib": "0.9.0"}}
    foreign = _republish(reg, m, **change)
    with pytest.raises(EnvironmentMismatch) as ei:
        load(foreign.build_id, reg)
    assert field in ei.value.differences
    assert "expected" in str(ei.value) and "actual" in str(ei.value)


def test_unknown_and_empty_references(built_registry):
    from avatar_release.runtime import load

    root, _ = built_registry
    with pytest.raises(NotFoundError, match="channel 'prod' is empty"):
        load("prod", LocalRegistry(root, create=False))
    with pytest.raises(NotFoundError, match="unknown build or channel"):
        load("tiny-cpu-8-000000000000", LocalRegistry(root, create=False))


def test_cli_render_writes_video_frames_and_summary(built_registry, tmp_path):
    from avatar_release.media import probe_mp4, read_image

    root, result = built_registry
    out = tmp_path / "out.mp4"
    frames_dir = tmp_path / "frames"
    res = CliRunner().invoke(
        cli,
        [
            "render",
            "--registry",
            str(root),
            "--seconds",
            "0.4",
            "--out",
            str(out),
            "--frames-dir",
            str(frames_dir),
            "--json",
        ],
    )
    assert res.exit_code == 0, res.output
    summary = json.loads(res.stdout)
    assert summary["build_id"] == result.build_id
    assert summary["compiles"] == 0 and summary["frames"] == 10 and summary["chunks"] == 2
    assert set(summary["cold_start"]) >= {"imports", "resolve", "verify", "decompress", "deserialize", "first_chunk"}
    # --json keeps stdout to the one document; each chunk is reported on stderr as it completes.
    chunks = [line.strip() for line in res.stderr.splitlines() if line.strip().startswith("chunk ")]
    assert [c.split(":")[0] for c in chunks] == ["chunk 0", "chunk 1"]
    assert all("deadline" in c and "0 compiles" in c for c in chunks)
    # 8 virtual CPU devices: a chunk over its playback time says the host is slow, not that a deadline was missed
    pace = summary["pace"]
    assert pace["emulated"] is True and pace["misses_on_target"] == 0 and "8 emulated cpu devices" in pace["where"]
    per_chunk = summary["per_chunk"]
    media, spent = sum(c["deadline"] for c in per_chunk), sum(c["seconds"] for c in per_chunk)
    assert pace["realtime_factor"] == pytest.approx(media / spent, rel=1e-2)
    assert pace["chunks_over_deadline"] == sum(c["missed"] for c in per_chunk)
    assert "MISSED" not in res.stderr
    probe = probe_mp4(out)
    assert probe.video_codec == "h264" and probe.audio_codec == "aac" and probe.frames == 10
    assert len(list(frames_dir.glob("*.png"))) == 10 and read_image(frames_dir / "frame_00000.png").shape == (48, 80, 3)


def test_cli_render_takes_a_photo_of_any_size_and_an_mp3_and_reports_how_it_read_them(built_registry, tmp_path):
    """A 1280x720 JPEG and a 44.1 kHz stereo MP3 render on the 80x48, 16 kHz tiny pipeline; the
    summary says how the picture was cropped and what the audio was; --fit exact refuses (exit 2)."""
    from avatar_release.media import ffmpeg_exe

    root, _ = built_registry
    photo, speech = tmp_path / "photo.jpg", tmp_path / "speech.mp3"
    subprocess.run(
        [ffmpeg_exe(), "-v", "error", "-f", "lavfi", "-i", "testsrc=size=1280x720", "-frames:v", "1", str(photo)],
        check=True,
    )
    subprocess.run(
        [
            ffmpeg_exe(),
            "-v",
            "error",
            "-f",
            "lavfi",
            "-i",
            "sine=frequency=220:duration=0.4:sample_rate=44100",
            "-ac",
            "2",
            "-c:a",
            "libmp3lame",
            str(speech),
        ],
        check=True,
    )
    args = ["render", "--registry", str(root), "--image", str(photo), "--audio", str(speech), "--json"]
    res = CliRunner().invoke(cli, args + ["--out", str(tmp_path / "out.mp4")])
    assert res.exit_code == 0, res.output
    summary = json.loads(res.stdout)
    fit = summary["inputs"]["image"]["fit"]
    assert fit["rule"] == "cover" and fit["source_format"] == "JPEG"
    assert fit["source_size"] == [1280, 720] and fit["target_size"] == [80, 48]
    assert fit["box"] == [40, 0, 1240, 720]  # 5:3 of a 16:9 picture, centred: 40 px off each side
    audio = summary["inputs"]["audio"]
    assert (audio["container"], audio["codec"], audio["source_rate"], audio["channels"]) == (
        "MP3",
        "mp3",
        44100,
        "stereo",
    )
    assert audio["sample_rate"] == 16000 and 0.4 <= audio["seconds"] < 0.5
    assert summary["compiles"] == 0 and summary["frames"] == -(-audio["samples"] // 640)  # 25 fps at 16 kHz
    refused = CliRunner().invoke(cli, args + ["--fit", "exact", "--out", str(tmp_path / "exact.mp4")])
    assert refused.exit_code == 2
    assert "1280x720" in refused.output and "80x48" in refused.output and "--fit cover" in refused.output
    assert not (tmp_path / "exact.mp4").exists()


def test_cli_refusals_have_distinct_exit_codes(registry_copy, tmp_path):
    root, _ = registry_copy
    r = CliRunner().invoke(
        cli, ["render", "--registry", str(root), "--channel", "prod", "--out", str(tmp_path / "a.mp4")]
    )
    assert r.exit_code == 3 and "empty" in r.output
    reg = LocalRegistry(root, create=False)
    m = manifest_of(reg)
    p = _blob_path(root, m.weights.chunks[0].blob.digest)
    p.write_bytes(p.read_bytes()[:-10])
    r = CliRunner().invoke(cli, ["render", "--registry", str(root), "--out", str(tmp_path / "b.mp4")])
    assert r.exit_code == 4 and "size" in r.output
    assert not (tmp_path / "b.mp4").exists()
    r = CliRunner().invoke(cli, ["verify", "dev", "--registry", str(root)])
    assert r.exit_code == 4 and "weights" in r.output


def test_served_frames_match_the_eager_pytorch_pipeline(built_registry):
    """The whole serving path (8-device sharded executables, carry, noise recipe) reproduces
    the plain-PyTorch model. Not bit-exact: torch CPU and XLA CPU sum bf16 products in
    different orders (measured per stage in tests/model); frames agree within a few levels."""
    from avatar_release.runtime import load, render
    from model.config import get_config
    from model.weights import init_pipeline

    root, _ = built_registry
    build = load("dev", LocalRegistry(root, create=False))
    image, audio = sample_image(48, 80, variant=1), sample_audio(0.5, variant=1)  # 13 frames, 2 chunks
    served, _ = render(build, image, audio, seed=3)
    eager = init_pipeline(get_config("tiny"), 0).render(image, audio, seed=3)
    assert served.shape == eager.shape == (13, 48, 80, 3)
    diff = np.abs(served.astype(int) - eager.astype(int))
    assert diff.max() <= 6 and diff.mean() < 0.6, (diff.max(), diff.mean())


def test_runtime_noise_recipe_matches_the_model():
    from avatar_release.runtime import chunk_noise as runtime_noise
    from model.config import get_config
    from model.noise import chunk_noise as model_noise

    c = get_config("tiny")
    for seed, idx in [(0, 0), (3, 5)]:
        expected = model_noise(c, seed, idx)
        assert np.array_equal(runtime_noise(seed, idx, expected.shape), expected)


def test_executables_stream_from_the_store_and_are_never_held_compressed(registry_copy):
    """A chunked build's executables come through ``stream_blob`` (pieces into their raw buffers),
    never as a whole compressed blob, and the cold start still splits fetch / verify / decompress."""
    from avatar_release.runtime import load

    root, _ = registry_copy

    class NoWholeExecutables(LocalRegistry):
        streamed: list[str] = []

        def get_blob(self, digest, size):
            assert digest not in exe_digests, f"executable {digest} fetched whole"
            return super().get_blob(digest, size)

        def stream_blob(self, digest, size, sink):
            self.streamed.append(digest)
            return super().stream_blob(digest, size, sink)

    reg = NoWholeExecutables(root, create=False)
    m = manifest_of(reg)
    exe_digests = {e.blob.digest for e in m.executables}
    b = load("dev", reg)
    assert exe_digests <= set(reg.streamed) and len(b.stages) == len(m.executables)
    t = b.timings
    assert t.fetch > 0 and t.verify > 0 and t.decompress > 0


def test_verify_without_programs_never_starts_jax_and_still_names_a_damaged_blob(registry_copy):
    """``verify --no-programs``: every blob's digests, in a process that never imports JAX (so its
    memory is the store's pieces, not the runtime's), and a damaged executable still fails. (The
    peak is read from VmHWM: ru_maxrss would carry the test process's own peak over the exec.)"""
    root, _ = registry_copy
    program = (
        "import json, sys\n"
        "from avatar_release.cli import main\n"
        "try:\n"
        "    main(['verify', 'dev', '--no-programs', '--json', '--registry', sys.argv[1]])\n"
        "except SystemExit as e:\n"
        "    code = e.code\n"
        "hwm = next(int(l.split()[1]) for l in open('/proc/self/status') if l.startswith('VmHWM'))\n"
        "print(json.dumps({'code': code, 'jax': 'jax' in sys.modules, 'peak_mb': hwm // 1024}))\n"
    )

    def run() -> tuple[dict, dict]:
        out = subprocess.run([sys.executable, "-c", program, str(root)], capture_output=True, text=True, timeout=300)
        *report, tail = out.stdout.strip().splitlines()
        return json.loads("\n".join(report)), json.loads(tail)

    report, proc = run()
    assert proc["code"] in (0, None) and report["ok"] and report["programs"] is False
    assert not proc["jax"] and proc["peak_mb"] < 150, proc
    human = CliRunner().invoke(cli, ["verify", "dev", "--no-programs", "--registry", str(root)])
    assert human.exit_code == 0 and "no executable was deserialized" in human.output
    exe = manifest_of(LocalRegistry(root, create=False)).executables[0]
    p = _blob_path(root, exe.blob.digest)
    p.write_bytes(p.read_bytes()[:-1] + bytes([p.read_bytes()[-1] ^ 1]))
    report, proc = run()
    assert proc["code"] == 4 and [r["what"] for r in report["blobs"] if not r["ok"]] == [exe.key]
