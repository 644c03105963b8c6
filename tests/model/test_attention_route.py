"""Which attention calls a build routes where: the DiT lever moves the unmasked calls only."""

from __future__ import annotations

import pytest

from model.routing import AttentionRoute
from avatar_release.compile._overrides import apply_overrides
from avatar_release.errors import InputError
from model.config import get_config


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
    for r in (_route("tiny", attention_kernel="blocksparse"), _route("tiny", **{"dit.attention": "flash",
                                                                              "attention_kernel": "bounded"})):
        assert r.via_kernels(masked=True) and r.via_kernels(masked=False)


def test_production_configs_default_to_flash_and_the_small_ones_do_not():
    assert {n: get_config(n).dit.attention for n in ("tiny", "small", "avatar-720p", "avatar-1080p")} == {
        "tiny": "xla", "small": "xla", "avatar-720p": "flash", "avatar-1080p": "flash"}
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
    r = _route("tiny", **{"dit.heads": "16", "dit.dim": "128", "sr.heads": "16", "sr.dim": "128", "ulysses_groups": "2"})
    assert (r.groups_for(masked=True), r.groups_for(masked=False)) == (2, 2)
    r = _route("tiny", **{"sr.heads": "16", "sr.dim": "128", "sr.ulysses_groups": "2"})
    assert (r.groups_for(masked=True), r.groups_for(masked=False)) == (2, 1) and not r.default
    assert r.via_kernels(masked=True)
    with pytest.raises(InputError, match="sr.ulysses_groups"):
        _route("avatar-720p", **{"sr.ulysses_groups": "2"})  # 24 heads do not make 2 groups of 8
