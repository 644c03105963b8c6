"""A program's source locations do not depend on where its files lie (compile/_locations.py).

The same stage, its model file in two project folders of different name lengths and a helper
in two site-packages folders, lowers and compiles to the same program: file names relative to
the project, the installed helper's frames left out. Without the scope both folders are in it.
"""

from __future__ import annotations

import functools
import importlib.util
import re
from pathlib import Path
from types import ModuleType

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax._src import config as jax_config
from jax._src import source_info_util
from jax.sharding import Mesh

from avatar_release.compile._locations import location_pattern, portable_locations
from avatar_release.compile._stage import StagePlan, compile_stage, lower_stage
from avatar_release.records import ArraySpec

MODEL = """
def stage(helper, params, args):
    (x,) = args
    return helper.twice(x @ params["w"])
"""
HELPER = """
import jax.numpy as jnp


def twice(x):
    return jnp.tanh(x) * 2
"""


def _module(name: str, path: Path, text: str) -> ModuleType:
    path.parent.mkdir(parents=True)
    path.write_text(text)
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _lay_out(base: Path, tag: str, monkeypatch: pytest.MonkeyPatch) -> tuple[Path, Path, object]:
    """(project, site-packages, the stage function) with their files under ``base``."""
    project, site = base / "proj", base / "venv" / "lib" / "python3.11" / "site-packages"
    helper = _module(f"helper_{tag}", site / "helper.py", HELPER)
    model = _module(f"model_{tag}", project / "puppet" / "model.py", MODEL)
    monkeypatch.syspath_prepend(str(site))  # an installed package's folder, as a venv's is
    return project, site, functools.partial(model.stage, helper)


def _plan(fn: object) -> StagePlan:
    return StagePlan(
        stage="toy",
        bucket="f1",
        jax_func=fn,
        params=[ArraySpec(name="toy.w", shape=[4, 4], dtype="float32", sharding=[None, None])],
        param_keys=["w"],
        inputs=[ArraySpec(name="x", shape=[2, 4], dtype="float32", sharding=[None, None])],
        outputs=[ArraySpec(name="y", shape=[2, 4], dtype="float32", sharding=[None, None])],
    )


def _unscoped_text(fn: object) -> str:
    w, x = jax.ShapeDtypeStruct((4, 4), jnp.float32), jax.ShapeDtypeStruct((2, 4), jnp.float32)
    return jax.jit(lambda w, x: fn({"w": w}, (x,))).lower(w, x).as_text(debug_info=True)


def test_a_stage_lowers_and_compiles_to_the_same_program_from_two_folders(tmp_path, monkeypatch):
    mesh = Mesh(np.array(jax.devices()[:1]), ("fsdp",))
    seen = []
    for base, tag in ((tmp_path / "a", "a"), (tmp_path / "a-much-longer-folder-name" / "x", "b")):
        project, site, fn = _lay_out(base, tag, monkeypatch)
        unscoped = _unscoped_text(fn)  # what jax records by itself: both folders, absolute
        assert str(project / "puppet" / "model.py") in unscoped and str(site / "helper.py") in unscoped
        lowered = lower_stage(_plan(fn), mesh, project_root=project)
        text = lowered.lowered.as_text(debug_info=True)
        assert '"puppet/model.py"' in text and str(tmp_path) not in text and "helper.py" not in text
        evidence = compile_stage(lowered, {}).evidence
        seen.append((text, evidence.hlo_digest, evidence.fingerprint))
    assert seen[0] == seen[1]


def test_the_scope_gives_back_jax_options_and_frame_filter_as_they_were(tmp_path, monkeypatch):
    site = tmp_path / "venv" / "lib" / "python3.11" / "site-packages"
    site.mkdir(parents=True)
    monkeypatch.syspath_prepend(str(site))
    before = list(source_info_util._exclude_paths)
    with jax_config.traceback_in_locations_limit(7), jax_config.hlo_source_file_canonicalization_regex("x"):
        with portable_locations(tmp_path / "proj"):
            assert jax_config.traceback_in_locations_limit.value == 100
            assert not source_info_util.is_user_filename(str(site / "helper.py"))
            with portable_locations(tmp_path / "proj"):  # nested (or in another thread): held until the last exits
                pass
            assert not source_info_util.is_user_filename(str(site / "helper.py"))
        assert jax_config.traceback_in_locations_limit.value == 7
        assert jax_config.hlo_source_file_canonicalization_regex.value == "x"
    assert source_info_util._exclude_paths == before
    assert source_info_util.is_user_filename(str(site / "helper.py"))


@pytest.mark.parametrize(
    "name, portable",
    [
        ("/home/ann/proj/puppet/model.py", "puppet/model.py"),  # the project, deepest root first
        ("/home/ann/lib/util.py", "lib/util.py"),  # a shallower root
        ("/opt/elsewhere/kit/mod.py", "mod.py"),  # under no root: its base name
        ("puppet/model.py", "puppet/model.py"),  # already relative
    ],
)
def test_a_file_name_is_made_relative_to_the_deepest_root(name, portable):
    assert re.sub(location_pattern(["/home/ann/proj/", "/home/ann/"]), "", name) == portable
