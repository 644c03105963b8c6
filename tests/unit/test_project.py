"""The project: found upward from the current directory (as pytest finds its rootdir), or named by
--project / AVATAR_RELEASE_PROJECT; the entry is imported from it; errors say where they looked."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from avatar_release.compile._flops import pallas_kernels
from avatar_release.errors import ContractError, SpecError
from avatar_release.pipeline import load_entry
from avatar_release.specs import PROJECT_ENV, find_project, load_pipeline, use_project

REPO = Path(__file__).resolve().parents[2]

_SPEC = """schema_version = 1
name = "mine"
entry = "{entry}"
config = "tiny"
[[buckets]]
name = "f8"
frames = 8
"""


def _project(root: Path, entry: str = "mypkg.release:pipeline", code: str | None = None) -> Path:
    (root / "manifests" / "pipelines").mkdir(parents=True)
    (root / "manifests" / "pipelines" / "mine.toml").write_text(_SPEC.format(entry=entry))
    if code is not None:
        (root / "mypkg").mkdir()
        (root / "mypkg" / "__init__.py").write_text("")
        (root / "mypkg" / "release.py").write_text(code)
    return root


@pytest.fixture(autouse=True)
def _no_project_env(monkeypatch):
    monkeypatch.delenv(PROJECT_ENV, raising=False)
    monkeypatch.delenv("AVATAR_RELEASE_MANIFESTS", raising=False)


def test_the_project_is_the_nearest_directory_upward_that_holds_manifests(tmp_path, monkeypatch):
    root = _project(tmp_path / "proj")
    deep = root / "a" / "b"
    deep.mkdir(parents=True)
    monkeypatch.chdir(deep)
    p = find_project()
    assert p.root == root.resolve() and "upward from" in p.found_by
    assert load_pipeline("mine").entry == "mypkg.release:pipeline"


def test_no_project_names_every_place_it_looked_and_the_fix(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SpecError, match=r"no project found: none of .*holds a manifests/ folder.*--project DIR"):
        find_project()


def test_project_option_wins_over_the_current_directory_and_reaches_child_processes(tmp_path, monkeypatch):
    root = _project(tmp_path / "proj")
    monkeypatch.chdir(REPO)  # a project of its own: --project still wins
    monkeypatch.setenv(PROJECT_ENV, "")  # so that monkeypatch restores what use_project sets
    use_project(root)
    assert find_project().root == root.resolve()
    out = subprocess.run(
        [sys.executable, "-c", "from avatar_release.specs import find_project; print(find_project().root)"],
        capture_output=True,
        text=True,
        check=True,
        cwd=tmp_path,
    )
    assert out.stdout.strip() == str(root.resolve())
    with pytest.raises(SpecError, match="holds no manifests/ folder"):
        use_project(tmp_path / "nowhere")


def test_the_entry_is_imported_from_the_project_and_checked(tmp_path, monkeypatch):
    code = (
        "from avatar_release.pipeline import Pipeline\n"
        "pipeline = Pipeline(name='m', stages=('a',), configs={}, create=None, init_weights=None,\n"
        "                    load_weights=None, stage=None, signature=None, chunk_program=None)\n"
    )
    root = _project(tmp_path / "proj", code=code)
    monkeypatch.chdir(root)
    monkeypatch.setattr(sys, "path", list(sys.path))
    spec = load_pipeline("mine")
    with pytest.raises(
        ContractError, match=r"member 'configs' must be a mapping.*docs site: Reference > The pipeline contract"
    ):
        load_entry(spec)
    assert str(root.resolve()) in sys.path  # the project's packages were importable from its root


def test_an_entry_that_cannot_be_imported_says_from_which_project(tmp_path, monkeypatch):
    root = _project(tmp_path / "proj", entry="nosuchpkg.release:pipeline")
    monkeypatch.chdir(root)
    with pytest.raises(ContractError, match=rf"cannot be imported from project {root.resolve()}.*--project DIR"):
        load_entry(load_pipeline("mine"))


def test_pallas_kernels_are_named_by_the_traced_program_itself():
    """What the compiler records about kernels comes from the program, not from importing kernels/."""
    import jax
    import jax.numpy as jnp
    from jax.experimental import pallas as pl

    def double(x_ref, o_ref):
        o_ref[...] = x_ref[...] * 2

    def f(x):
        y = pl.pallas_call(
            double, out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype), interpret=True, name="my_team_kernel"
        )(x)
        return jax.lax.scan(lambda c, _: (c + y, None), y, None, length=2)[0]

    jaxpr = jax.make_jaxpr(f)(jnp.ones((8, 128), jnp.float32))
    assert pallas_kernels(jaxpr) == ("my_team_kernel",)
    assert pallas_kernels(jax.make_jaxpr(lambda x: x * 2)(jnp.ones(3))) == ()
