"""Every benchmark keeps up with the package, in the fast lane, without running any of them.

Most smoke modes compile or gate (the slow lane runs them); what a rename breaks first is an
import. Each benchmark's imports, including those of the programs it runs in child processes (the
string constants that are Python), must name what the package, the bundled pipeline and the test
helpers hold now. A smoke run's figures never land in ``benchmarks/results/``. (That every benchmark
has a ``--smoke`` flag and a row in the smoke table: tests/integration/test_benchmarks.py.)
"""

from __future__ import annotations

import ast
import importlib
import importlib.util
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


def _bound_modules(tree: ast.Module) -> dict[str, str]:
    """Names a program binds to one of our modules (``import x.y as z``, ``from x import y`` where y is a module)."""
    bound = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                if a.name.split(".")[0] in OURS:
                    bound[a.asname or a.name.split(".")[0]] = a.name if a.asname else a.name.split(".")[0]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module.split(".")[0] in OURS:
            for a in node.names:
                if _is_module(f"{node.module}.{a.name}"):
                    bound[a.asname or a.name] = f"{node.module}.{a.name}"
    return bound


def _is_module(dotted: str) -> bool:
    try:
        return importlib.util.find_spec(dotted) is not None
    except (ImportError, ValueError):
        return False


def _attribute_uses(path: Path) -> list[tuple[str, str, list[str]]]:
    """(where, module, [attr, ...]) for every ``mod.a.b`` read through a name bound to one of our modules."""
    found = []
    for where, tree in _programs(path):
        bound = _bound_modules(tree)
        for node in ast.walk(tree):
            if not isinstance(node, ast.Attribute):
                continue
            chain, base = [], node
            while isinstance(base, ast.Attribute):
                chain.insert(0, base.attr)
                base = base.value
            if isinstance(base, ast.Name) and base.id in bound:
                found.append((f"{where}:{node.lineno}", bound[base.id], chain))
    return found


def _missing_attribute(module: str, chain: list[str]) -> str | None:
    """The first name in CHAIN that MODULE (then each submodule it leads to) does not hold; None when all resolve."""
    obj = importlib.import_module(module)
    dotted = module
    for attr in chain:
        if not hasattr(obj, attr):
            if not _is_module(f"{dotted}.{attr}"):
                return f"{dotted} has no {attr!r}"
            obj = importlib.import_module(f"{dotted}.{attr}")
        else:
            obj = getattr(obj, attr)
        if not isinstance(obj, type(importlib)):
            return None  # past the modules: a class or a function's own attributes are the program's business
        dotted = obj.__name__
    return None


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda p: p.stem)
def test_every_module_attribute_a_benchmark_reads_is_still_there(script):
    """``runtime._load._devices_for`` renamed since: the import resolves, the read does not."""
    missing = [
        f"{where}: {why}"
        for where, module, chain in _attribute_uses(script)
        if (why := _missing_attribute(module, chain))
    ]
    assert not missing, "renamed or removed since the benchmark was written:\n" + "\n".join(missing)


def test_the_attribute_check_finds_a_renamed_private_helper(tmp_path):
    bench = tmp_path / "bench_x.py"
    bench.write_text(
        "from avatar_release import runtime\nimport avatar_release.runtime._load as load\n"
        "def f():\n    runtime._load._devices_for()\n    load.devices_for\n    runtime.assemble.__doc__\n"
    )
    found = {(".".join([m, *c]), _missing_attribute(m, c)) for _, m, c in _attribute_uses(bench)}
    assert ("avatar_release.runtime._load._devices_for", "avatar_release.runtime._load has no '_devices_for'") in found
    assert all(why is None for name, why in found if "_devices_for" not in name), found


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda p: p.stem)
def test_every_import_of_a_benchmark_names_what_the_package_holds_now(script):
    missing = []
    for where, module, name in _imports(script):
        try:
            mod = importlib.import_module(module)
        except ImportError as e:
            missing.append(f"{where}: import {module}: {e}")
            continue
        if name is not None and (why := _missing_attribute(mod.__name__, [name])):  # an attribute or a submodule
            missing.append(f"{where}: {why}")
    assert not missing, "renamed or removed since the benchmark was written:\n" + "\n".join(missing)


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
