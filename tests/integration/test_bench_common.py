"""Every benchmark keeps up with the package, in the fast lane, without running any of them.

Most smoke modes compile or gate (the slow lane runs them); what a rename breaks first is an
import. Each benchmark's imports, including those of the programs it runs in child processes (the
string constants that are Python), must name what the package, the bundled pipeline and the test
helpers hold now. And every benchmark has a ``--smoke`` flag and a smoke test of its own, whose
figures never land in ``benchmarks/results/``.
"""

from __future__ import annotations

import ast
import importlib
import json
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
BENCHMARKS = REPO / "benchmarks"
SCRIPTS = sorted(BENCHMARKS.glob("bench_*.py"))
OURS = ("avatar_release", "model", "kernels", "tests")  # the modules a rename in this repository can break


def _programs(path: Path) -> list[tuple[str, ast.Module]]:
    """The benchmark's module, and each string constant in it that parses as a program importing something."""
    tree = ast.parse(path.read_text(), str(path))
    out = [(path.name, tree)]
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and "import " in node.value:
            try:
                out.append((f"{path.name} (child program at line {node.lineno})", ast.parse(node.value)))
            except SyntaxError:
                pass  # prose, not a program
    return out


def _imports(path: Path) -> list[tuple[str, str, str | None]]:
    """(where, module, name or None) for every absolute import of one of ours."""
    found = []
    for where, tree in _programs(path):
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module.split(".")[0] in OURS:
                found += [(f"{where}:{node.lineno}", node.module, a.name) for a in node.names]
            elif isinstance(node, ast.Import):
                found += [(f"{where}:{node.lineno}", a.name, None) for a in node.names if a.name.split(".")[0] in OURS]
    return found


def test_the_benchmarks_are_found():
    assert len(SCRIPTS) >= 16, [p.name for p in SCRIPTS]


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda p: p.stem)
def test_every_import_of_a_benchmark_names_what_the_package_holds_now(script):
    missing = []
    for where, module, name in _imports(script):
        try:
            mod = importlib.import_module(module)
        except ImportError as e:
            missing.append(f"{where}: import {module}: {e}")
            continue
        if name is None or hasattr(mod, name):
            continue
        try:
            importlib.import_module(f"{module}.{name}")  # a submodule, not an attribute
        except ImportError:
            missing.append(f"{where}: {module} has no {name!r}")
    assert not missing, "renamed or removed since the benchmark was written:\n" + "\n".join(missing)


def _flags(script: Path) -> set[str]:
    tree = ast.parse(script.read_text(), str(script))
    return {arg.value for node in ast.walk(tree)
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "add_argument"
            for arg in node.args if isinstance(arg, ast.Constant) and isinstance(arg.value, str)}


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda p: p.stem)
def test_every_benchmark_has_a_smoke_mode_and_a_smoke_test(script):
    assert {"--smoke", "--out"} <= _flags(script), f"{script.name}: needs --smoke and --out"
    test = Path(__file__).with_name(f"test_{script.stem}.py")
    assert test.is_file(), f"{script.name} has no smoke test: write {test.relative_to(REPO)}"
    text = test.read_text()
    runs = "--smoke" in text or f'run_smoke("{script.name}"' in text  # tests.helpers.run_smoke adds --smoke
    assert runs, f"{test.name} does not run {script.name} --smoke"


@pytest.fixture
def out_module(monkeypatch):
    monkeypatch.syspath_prepend(str(BENCHMARKS))
    return importlib.import_module("_out")


def test_a_smoke_run_writes_only_where_it_is_told_never_into_the_committed_results(out_module, tmp_path):
    assert out_module.out_path(None, "spine", smoke=True) is None  # no --out: printed, not written
    assert out_module.out_path(None, "spine", smoke=False) == BENCHMARKS / "results" / "spine.json"
    committed = {p: p.read_bytes() for p in (BENCHMARKS / "results").glob("*.json")}
    with pytest.raises(SystemExit, match=r"--smoke run's figures are not results"):
        out_module.write_results({"x": 1}, BENCHMARKS / "results" / "weights.json", smoke=True)
    assert {p: p.read_bytes() for p in (BENCHMARKS / "results").glob("*.json")} == committed

    out = tmp_path / "deep" / "x.json"
    out_module.write_results({"ratio": 0.5}, out, smoke=True)
    assert json.loads(out.read_text()) == {"ratio": 0.5}
    assert [p.name for p in out.parent.iterdir()] == ["x.json"]  # written whole, no temporary left
