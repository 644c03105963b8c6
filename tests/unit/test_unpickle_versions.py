"""The restricted unpickler's allow-list is recorded per jax minor version, and a jax whose list was
never recorded is refused rather than trusted (avatar_release/runtime/_unpickle.py)."""

from __future__ import annotations

import pytest

from avatar_release.errors import IntegrityError
from avatar_release.runtime._unpickle import ALLOWED, ALLOWED_BY_JAX, allowed_classes


def test_the_pinned_jax_uses_the_list_recorded_on_its_builds():
    assert allowed_classes("0.10.2") == ALLOWED == ALLOWED_BY_JAX["0.10"] and len(ALLOWED) == 19


def test_jax_0_11_adds_exactly_the_auto_layout_marker():
    """Recorded under jax 0.11.2 (the H200's): its executable pickles name every 0.10 class and one more."""
    assert allowed_classes("0.11.2") - ALLOWED == {("jax._src.layout", "AutoLayoutSingleton")}
    assert ALLOWED <= allowed_classes("0.11.0")


def test_an_unrecorded_jax_is_refused_naming_what_is_recorded_and_how_to_record_it():
    with pytest.raises(IntegrityError) as e:
        allowed_classes("0.12.0")
    msg = str(e.value)
    assert "jax 0.12.0" in msg and "recorded: 0.10, 0.11" in msg and "test_trust_loading.py" in msg
