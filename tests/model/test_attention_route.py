"""Which attention calls a build routes where: the DiT lever moves the unmasked calls only."""

from __future__ import annotations

import pytest

from avatar_release.compile._overrides import apply_overrides
from avatar_release.errors import InputError
from model.config import get_config
from model.routing import AttentionRoute


def _route(name: str, **overrides: str) -> AttentionRoute:
    config, _ = apply_overrides(get_config(name), overrides)
    return AttentionRoute.from_config(config)


def test_the_default_route_sends_every_call_to_gspmd():
    r = _route("tiny")
    assert r.default and r.dit_kernel == "xla"
    assert not r.via_kernels(masked=True) and not r.via_kernels(masked=False)


def test_the_dit_lever_moves_the_unmasked_calls_and_leaves_the_sr_on_gspmd():
    r = _route("tiny", **{"dit.attention": "flash"})
    assert not r.default and r.dit_kernel == "flash"
    assert r.via_kernels(masked=False) and not r.via_kernels(masked=True)


def test_an_sr_kernel_or_head_groups_send_both_through_the_kernels_as_before():
    for r in (
        _route("tiny", attention_kernel="blocksparse"),
        _route("tiny", **{"dit.attention": "flash", "attention_kernel": "bounded"}),
    ):
        assert r.via_kernels(masked=True) and r.via_kernels(masked=False)


def test_production_configs_default_to_flash_and_the_small_ones_do_not():
    assert {n: get_config(n).dit.attention for n in ("tiny", "small", "avatar-720p", "avatar-1080p")} == {
        "tiny": "xla",
        "small": "xla",
        "avatar-720p": "flash",
        "avatar-1080p": "flash",
    }
    assert _route("avatar-720p", **{"dit.attention": "xla"}).dit_kernel == "xla"  # the lever turns it off


def test_an_unknown_dit_kernel_is_refused_with_the_choices():
    with pytest.raises(InputError, match=r"dit.attention must be one of \('xla', 'flash'\)"):
        apply_overrides(get_config("tiny"), {"dit.attention": "splash"})


def test_the_sr_has_its_own_head_groups_and_the_dit_keeps_the_pipelines():
    """24 SR heads split into 3 groups of one head per device; the DiT's 40 cannot, and keeps 1."""
    for name in ("avatar-720p", "avatar-1080p"):
        r = _route(name)
        assert (r.groups_for(masked=True), r.groups_for(masked=False)) == (3, 1)
    r = _route("tiny")
    assert (r.groups_for(masked=True), r.groups_for(masked=False)) == (1, 1) and r.default
    # Unset (0), the SR follows ulysses_groups, as before the SR had its own.
    r = _route(
        "tiny", **{"dit.heads": "16", "dit.dim": "128", "sr.heads": "16", "sr.dim": "128", "ulysses_groups": "2"}
    )
    assert (r.groups_for(masked=True), r.groups_for(masked=False)) == (2, 2)
    r = _route("tiny", **{"sr.heads": "16", "sr.dim": "128", "sr.ulysses_groups": "2"})
    assert (r.groups_for(masked=True), r.groups_for(masked=False)) == (2, 1) and not r.default
    assert r.via_kernels(masked=True)
    with pytest.raises(InputError, match="sr.ulysses_groups"):
        _route("avatar-720p", **{"sr.ulysses_groups": "2"})  # 24 heads do not make 2 groups of 8


def test_on_a_gpu_the_mosaic_only_kernels_give_way_to_xla_with_the_reason_and_the_triton_ones_stay():
    config, _ = apply_overrides(
        get_config("tiny"), {"dit.attention": "flash", "attention_kernel": "blocksparse", "fused_preattn": "true"}
    )
    gpu, replaced = AttentionRoute.from_config(config, platform="gpu").for_platform()
    # flash and block-sparse have Triton forms; the fused pre-attention runs as its reference
    assert gpu.kernel == "blocksparse" and gpu.dit_kernel == "flash" and gpu.fused_preattn
    assert set(replaced) == {"pre-attention"} and "Mosaic" in replaced["pre-attention"]
    bounded, _ = apply_overrides(get_config("tiny"), {"attention_kernel": "bounded"})
    gpu, replaced = AttentionRoute.from_config(bounded, platform="gpu").for_platform()
    assert gpu.kernel == "xla" and set(replaced) == {"attention (frame-window mask)"}
    assert "no Triton form" in replaced["attention (frame-window mask)"]
    assert "kernels/window_gpu.py" in replaced["attention (frame-window mask)"]  # the way to a kernel
    for platform in ("cpu", "tpu"):  # there every kernel compiles (interpreter or Mosaic): nothing replaced
        same, none = AttentionRoute.from_config(config, platform=platform).for_platform()
        assert none == {} and same.kernel == "blocksparse"
    assert AttentionRoute(platform="tpu").lowered_as() == "pallas-mosaic"
    assert AttentionRoute(platform="cpu").lowered_as() == "pallas-interpret"
    assert AttentionRoute(platform="gpu").lowered_as() == "pallas-triton"


def test_the_triton_flash_kernel_takes_power_of_two_blocks_dividing_the_dit_sequence():
    from kernels.flash_gpu import cost_bytes, cost_flops, estimate, gpu_blocks

    def dit_tokens(name: str, frames: int) -> int:
        return get_config(name).dit_tokens_per_frame * frames

    assert gpu_blocks(dit_tokens("avatar-720p", 16)) == 128  # 14,720 tokens: 115 query blocks
    assert gpu_blocks(dit_tokens("avatar-1080p", 24)) == 16  # 12,240 = 16 x 765
    assert gpu_blocks(dit_tokens("tiny", 8)) == 32
    assert gpu_blocks(24) is None and gpu_blocks(8) is None  # then the call keeps XLA's attention
    one = 5 * 14720 * 128 * 2  # 720p per GPU: 5 heads x S x head_dim, bf16
    assert cost_bytes(heads=5, seq=14720, head_dim=128) == 4 * one
    assert cost_bytes(heads=5, seq=14720, head_dim=128, l2_reuse=False) == 2 * one + 2 * one * 115
    est = estimate(heads=5, seq=14720, head_dim=128)
    assert est["flops"] == cost_flops(heads=5, seq=14720, head_dim=128) == 4 * 5 * 14720**2 * 128
