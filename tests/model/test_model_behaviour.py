"""What the stages do, in eager torch: mask, audio features, continuity, shapes, determinism."""

import numpy as np
import pytest

from tests.tools import module

torch = module("torch")  # the [compile] extra

from model.chunks import audio_chunks, num_chunks, num_frames  # noqa: E402
from model.dit import log_mel  # noqa: E402
from model.noise import chunk_noise  # noqa: E402
from model.pipeline import STAGES, stage_inputs, stage_module, stage_outputs  # noqa: E402
from model.sr import frame_window_mask  # noqa: E402

# ---- the SR mask ---------------------------------------------------------------------------------


def test_frame_window_mask_matches_the_definition():
    frames, tokens, window = 6, 4, 1  # frame 0 is the reference
    mask = frame_window_mask(frames, tokens, window, torch.device("cpu")).numpy()
    assert mask.shape == (24, 24) and mask.dtype == bool
    for q in range(24):
        for k in range(24):
            fq, fk = q // tokens, k // tokens
            want = fk == 0 if fq == 0 else (fk == 0 or abs(fq - fk) <= window)
            assert mask[q, k] == want, (q, k)


def test_frame_window_mask_is_frame_aligned(tiny):
    """Every (frame x frame) tile of T x T tokens is wholly live or wholly dead."""
    T, n = tiny.sr_tokens_per_frame, tiny.frames_per_chunk + 1
    mask = frame_window_mask(n, T, tiny.sr.window, torch.device("cpu")).numpy()
    tiles = mask.reshape(n, T, n, T).transpose(0, 2, 1, 3).reshape(n, n, T * T)
    assert np.all(tiles.all(-1) | ~tiles.any(-1))
    live = tiles.all(-1)
    assert live[0].tolist() == [True] + [False] * (n - 1)  # reference sees only itself
    assert live[1:, 0].all()  # every video frame sees the reference
    assert live[4].tolist() == [True, False, False, True, True, True, False, False, False]


# ---- audio features ------------------------------------------------------------------------------


def test_log_mel_is_deterministic_and_shaped(tiny, make_speech):
    audio = torch.from_numpy(make_speech(tiny.chunk_samples()))
    a = log_mel(audio, tiny.frames_per_chunk, tiny.sample_rate, tiny.n_mels)
    b = log_mel(audio.clone(), tiny.frames_per_chunk, tiny.sample_rate, tiny.n_mels)
    assert a.shape == (tiny.frames_per_chunk, tiny.n_mels) and a.dtype == torch.float32
    assert torch.equal(a, b) and torch.isfinite(a).all()


def test_log_mel_hears_pitch_and_silence(tiny):
    n, spf = tiny.frames_per_chunk, tiny.samples_per_frame
    t = torch.arange(n * spf) / tiny.sample_rate
    low = log_mel(0.5 * torch.sin(2 * torch.pi * 200 * t), n, tiny.sample_rate, tiny.n_mels)
    high = log_mel(0.5 * torch.sin(2 * torch.pi * 3000 * t), n, tiny.sample_rate, tiny.n_mels)
    assert low.argmax(-1).max() < high.argmax(-1).min()  # a higher tone peaks in a higher band
    silence = log_mel(torch.zeros(n * spf), n, tiny.sample_rate, tiny.n_mels)
    assert torch.allclose(silence, torch.full_like(silence, float(np.log(1e-6))))


# ---- stage signatures ----------------------------------------------------------------------------


@pytest.mark.slow  # seconds long (tests/conftest.py: FAST_LANE_LIMIT_S)
def test_stage_signatures_match_eager_outputs(tiny, tiny_eager_stages, tiny_chunk_inputs):
    ins, outs = stage_inputs(tiny), stage_outputs(tiny)
    assert list(ins) == list(outs) == list(STAGES)
    assert [(s, d) for _, s, d in ins["dit"]] == [(a.shape, a.dtype.name) for a in tiny_chunk_inputs]
    assert [(s, d) for _, s, d in ins["sr"]][0] == (tiny_eager_stages["dit"][0].shape, "float32")
    assert [(s, d) for _, s, d in ins["vae"]][0] == (tiny_eager_stages["sr"][0].shape, "float32")
    for stage in STAGES:
        assert [(s, d) for _, s, d in outs[stage]] == [(a.shape, a.dtype.name) for a in tiny_eager_stages[stage]]
    assert stage_inputs(tiny, 16)["dit"][3][1] == (16, 8, 6, 10)
    with pytest.raises(ValueError, match="unknown stage 'decoder'"):
        stage_module(None, "decoder")


def test_frames_look_like_the_photo(tiny_eager_stages, tiny_chunk_inputs):
    frames, image = tiny_eager_stages["vae"][0].astype(float), tiny_chunk_inputs[0].astype(float)
    assert np.abs(frames - image).mean() < 40  # the photo, moved by at most 64 levels a pixel
    assert np.abs(frames - image).mean() > 1  # ...but the decoder does move it
    assert np.abs(np.diff(frames, axis=0)).mean() > 0.5  # and the frames differ: it is video


# ---- continuity, residual dtype ------------------------------------------------------------------


def test_prev_latent_changes_the_chunk(tiny_pipeline, tiny_chunk_inputs, tiny_eager_stages):
    image, audio, prev, noise = (torch.from_numpy(a) for a in tiny_chunk_inputs)
    with torch.no_grad():
        latents, _ = tiny_pipeline.dit(image, audio, torch.ones_like(prev), noise)
    assert np.abs(latents.numpy() - tiny_eager_stages["dit"][0]).mean() > 1e-2
    assert np.array_equal(tiny_eager_stages["dit"][1], tiny_eager_stages["dit"][0][-1])


def test_audio_changes_the_chunk(tiny_pipeline, tiny_chunk_inputs, tiny_eager_stages, make_speech):
    image, audio, prev, noise = (torch.from_numpy(a) for a in tiny_chunk_inputs)
    with torch.no_grad():
        latents, _ = tiny_pipeline.dit(image, torch.from_numpy(make_speech(audio.shape[0], seed=5)) * 0.1, prev, noise)
    # The stand-in weights are contractive (weights.INIT_GAIN), so the audio's pull is modest,
    # but far above float rounding (a reordered sum moves the latents by ~1e-8).
    assert np.abs(latents.numpy() - tiny_eager_stages["dit"][0]).mean() > 1e-4


def test_bf16_residual_stream_is_close_but_not_equal(tiny, tiny_pipeline, tiny_chunk_inputs, tiny_eager_stages):
    from model.dit import MotionDiT

    dit = MotionDiT(tiny.replace(residual_dtype="bfloat16"))
    dit.load_state_dict(tiny_pipeline.dit.state_dict())
    with torch.no_grad():
        latents, _ = dit(*(torch.from_numpy(a) for a in tiny_chunk_inputs))
    diff = np.abs(latents.numpy() - tiny_eager_stages["dit"][0])
    assert 0 < diff.mean() < 0.1 * np.abs(tiny_eager_stages["dit"][0]).mean()


def test_matmul_k_split_reorders_sums_without_changing_the_math(
    tiny, tiny_pipeline, tiny_chunk_inputs, tiny_eager_stages
):
    from model.dit import MotionDiT

    dit = MotionDiT(tiny.replace(matmul_k_split=2))
    dit.load_state_dict(tiny_pipeline.dit.state_dict())
    for m in dit.modules():
        if hasattr(m, "k_split"):
            m.k_split = 2
    with torch.no_grad():
        latents, _ = dit(*(torch.from_numpy(a) for a in tiny_chunk_inputs))
    ref = tiny_eager_stages["dit"][0]
    diff = np.abs(latents.numpy() - ref)
    assert diff.max() > 0  # a different reduction order rounds differently...
    assert diff.mean() < 1e-5 * np.abs(ref).mean()  # ...at float32 rounding level, no more


@pytest.mark.slow  # seconds on 2 cores
def test_the_fused_pre_attention_op_is_the_same_math_in_eager(
    tiny, tiny_pipeline, tiny_chunk_inputs, tiny_eager_stages
):
    from model.dit import MotionDiT

    dit = MotionDiT(tiny.replace(fused_preattn=True))
    dit.load_state_dict(tiny_pipeline.dit.state_dict())
    for m in dit.modules():
        if hasattr(m, "fused_preattn"):
            m.fused_preattn = True
    with torch.no_grad():
        latents, _ = dit(*(torch.from_numpy(a) for a in tiny_chunk_inputs))
    assert np.array_equal(latents.numpy(), tiny_eager_stages["dit"][0])


# ---- whole-track rendering -----------------------------------------------------------------------


@pytest.fixture(scope="module")
def track(tiny, tiny_image, make_speech):
    audio = make_speech(int(1.25 * tiny.chunk_samples()) - 100)  # 10 frames, the last one partial
    return tiny_image, audio


@pytest.fixture(scope="module")
def rendered(tiny_pipeline, track, seed):
    return tiny_pipeline.render(*track, seed=seed)


@pytest.mark.slow  # two eager renders of a 10-frame track (seconds on 2 cores)
def test_render_twin_runs_are_identical_and_carry_the_last_latent(
    tiny, tiny_pipeline, track, rendered, seed, monkeypatch
):
    assert rendered.shape == (10, tiny.height, tiny.width, 3) and rendered.dtype == np.uint8
    calls = []
    original = tiny_pipeline.render_chunk

    def spy(image, audio, prev, noise):
        frames, last = original(image, audio, prev, noise)
        calls.append((audio.numpy(), prev.numpy(), noise.numpy(), last.numpy()))
        return frames, last

    monkeypatch.setattr(tiny_pipeline, "render_chunk", spy)
    assert np.array_equal(tiny_pipeline.render(*track, seed=seed), rendered)  # twin runs: identical
    assert len(calls) == 2
    chunks = audio_chunks(tiny, track[1])
    for i, (audio, _prev, noise, _) in enumerate(calls):
        assert np.array_equal(audio, chunks[i]) and np.array_equal(noise, chunk_noise(tiny, seed, i))
    assert not calls[0][1].any()  # the first chunk continues from zeros
    assert np.array_equal(calls[1][1], calls[0][3])  # the second from the first chunk's last latent


def test_render_rejects_a_wrong_image(tiny_pipeline):
    with pytest.raises(ValueError, match=r"image must have shape \(48, 80, 3\)"):
        tiny_pipeline.render(np.zeros((80, 48, 3), np.uint8), np.zeros(640, np.float32), seed=0)


# ---- noise and chunking (torch-free) -------------------------------------------------------------


def test_chunk_noise_is_a_function_of_seed_and_chunk(tiny):
    a = chunk_noise(tiny, 7, 3)
    assert a.shape == (8, 8, 6, 10) and a.dtype == np.float32
    assert np.array_equal(a, chunk_noise(tiny, 7, 3))
    assert not np.array_equal(a, chunk_noise(tiny, 7, 4))
    assert not np.array_equal(a, chunk_noise(tiny, 8, 3))
    assert chunk_noise(tiny, 7, 3, frames=2).shape == (2, 8, 6, 10)


def test_audio_chunking(tiny):
    assert (num_frames(tiny, 0), num_frames(tiny, 1), num_frames(tiny, 640), num_frames(tiny, 641)) == (0, 1, 1, 2)
    assert (num_chunks(tiny, 640 * 8), num_chunks(tiny, 640 * 8 + 1)) == (1, 2)
    audio = np.arange(1, 6000, dtype=np.float32)
    chunks = audio_chunks(tiny, audio)
    assert chunks.shape == (2, 5120) and chunks.dtype == np.float32
    assert np.array_equal(chunks.reshape(-1)[: audio.size], audio) and not chunks.reshape(-1)[audio.size :].any()


def test_layout_hints_are_the_identity_in_eager_pytorch():
    """The contract's layout hints only tell a compiler where a tensor should live; eager code sees the same tensor."""
    import torch

    from avatar_release.pipeline import layout_hints, replicated

    x = torch.arange(6.0).reshape(2, 3)
    assert replicated(x) is x
    seen = []
    with layout_hints(lambda t, layout: seen.append(layout) or t):
        assert replicated(x) is x
    assert seen == ["replicated"] and replicated(x) is x  # uninstalled again


@pytest.mark.parametrize("groups,channels", [(8, 32), (32, 128), (1, 16)])
def test_per_channel_norm_statistics_are_group_norm_in_another_order(groups, channels):
    """vae.norm_stats=per_channel: per-channel means, then the group's mean of them, for the mean
    and for the variance around it: F.group_norm to float32 rounding, on shifted, scaled inputs."""
    import torch.nn.functional as F

    from model.vae import GroupNorm

    gen = torch.Generator().manual_seed(groups)
    norm = GroupNorm(groups, channels)
    norm.weight.data = torch.randn(channels, generator=gen)
    norm.bias.data = torch.randn(channels, generator=gen)
    x = torch.randn(2, channels, 9, 14, generator=gen) * 5 + torch.randn(1, channels, 1, 1, generator=gen) * 20
    norm.stats = "per_channel"
    ours = norm(x)
    ref = F.group_norm(x, groups, norm.weight, norm.bias, norm.eps)
    assert torch.allclose(ours, ref, atol=2e-5, rtol=1e-5)
    assert not torch.equal(ours, ref)  # summed in another order: a lever, not a free change


def test_the_dits_per_frame_modulation_is_the_one_stationary_layer_of_a_block(tiny):
    """A compiler gathering a block's weights layer by layer leaves these sharded (compile/_scan.py)."""
    from avatar_release.pipeline import stationary_params
    from model.dit import DiTBlock
    from model.sr import SRBlock

    assert stationary_params(DiTBlock(64, 8, 4)) == {"modulation.weight", "modulation.bias"}
    assert stationary_params(SRBlock(64, 8, 4)) == set()
