"""The package's rooms hold their line (the checks of tools/rooms.py, kept here so CI needs no copy):

* no module imports another room's private module (``avatar_release.X._y`` from outside X);
* the lower rooms (records, machine, registry, specs and the helpers under them) import nothing above;
* rooms do not import each other in a circle (imports inside functions count: they are still
  dependencies, only hidden from the module's header);
* the toolchain never imports the bundled pipeline (top-level ``model`` or ``kernels``);
* an in-package import inside a function says why on its own line or the line above (a real
  cycle, or a module that must stay light); everything else sits in the module's header.

A room is a top-level subpackage or module of avatar_release. The entry points that must stay
light (the CLI without JAX, the runtime and the gate worker without torch or the compiler, the
media room without Pillow or ffmpeg) are checked in fresh processes.
"""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PKG = ROOT / "avatar_release"
# Rooms every other room may use; they import only each other.
LOWER = {"errors", "_digest", "_dtypes", "_atomic", "_paths", "_suggest", "records", "machine", "registry", "specs"}
# The pipeline a toolchain releases reaches it through its entry point, never the other way round.
PIPELINE_PACKAGES = {"model", "kernels"}


class _Import:
    """One import statement: where it is, what it names inside the package, whether it sits in a function."""

    def __init__(self, path: Path, node: ast.stmt, targets: list[list[str]], external: list[str], inner: bool,
                 commented: bool):
        self.path, self.line, self.targets, self.external = path, node.lineno, targets, external
        self.inner, self.commented = inner, commented


def _imports(pkg: Path, path: Path):
    """Every import statement of ``path`` (a module of the package at ``pkg``)."""
    rel = path.relative_to(pkg).with_suffix("")
    package = list(rel.parts[:-1])
    text = path.read_text()
    lines = text.splitlines()
    tree = ast.parse(text, str(path))
    inner = {id(n) for fn in ast.walk(tree) if isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef))
             for n in ast.walk(fn) if isinstance(n, (ast.Import, ast.ImportFrom))}
    for node in ast.walk(tree):
        targets, external = [], []
        if isinstance(node, ast.ImportFrom):
            if node.level:
                if node.level - 1 > len(package):
                    continue
                base = package[: len(package) - (node.level - 1)]
                mod = base + (node.module.split(".") if node.module else [])
                targets.append(mod)
                targets += [mod + [a.name] for a in node.names]  # a name may be a module (or private)
            elif node.module and node.module.split(".")[0] == "avatar_release":
                mod = node.module.split(".")[1:]
                targets.append(mod)
                targets += [mod + [a.name] for a in node.names]
            elif node.module:
                external.append(node.module.split(".")[0])
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] == "avatar_release":
                    targets.append(alias.name.split(".")[1:])
                else:
                    external.append(alias.name.split(".")[0])
        else:
            continue
        span = lines[max(node.lineno - 2, 0): node.end_lineno]  # the line above and the statement itself
        commented = any("#" in line for line in span)
        yield _Import(path, node, [t for t in targets if t], external, id(node) in inner, commented)


def _is_room(pkg: Path, name: str) -> bool:
    return (pkg / name).is_dir() or (pkg / f"{name}.py").is_file()


def _cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one room (Tarjan)."""
    index, low, stack, on, out = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in sorted(edges.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(set(edges) | {w for ws in edges.values() for w in ws}):
        if v not in index:
            visit(v)
    return out


def _check(pkg: Path) -> tuple[list[str], list[str]]:
    """(violations, in-package imports inside functions) of the package at ``pkg``."""
    bad, hidden = [], []
    edges: dict[str, set[str]] = {}
    why: dict[tuple[str, str], str] = {}
    for path in sorted(pkg.rglob("*.py")):
        room = path.relative_to(pkg).with_suffix("").parts[0]
        for imp in _imports(pkg, path):
            where = f"{path.relative_to(pkg.parent)}:{imp.line}"
            for root in imp.external:
                if root in PIPELINE_PACKAGES:
                    bad.append(f"{where}: imports the bundled pipeline ({root}); a pipeline reaches the toolchain "
                               "through its entry point, never the other way round")
            if imp.inner and imp.targets:
                hidden.append(where)
                if not imp.commented:
                    bad.append(f"{where}: an in-package import inside a function without a comment saying why; "
                               "move it to the module's header (or say on the line above what cycle or weight "
                               "keeps it here)")
            for target in imp.targets:
                if target[0] in PIPELINE_PACKAGES:
                    bad.append(f"{where}: imports avatar_release.{target[0]}: the toolchain must not import the "
                               "pipeline it releases")
                if target[0] == room:
                    continue
                private = [p for p in target[1:] if p.startswith("_") and not p.startswith("__")]
                if private:
                    bad.append(f"{where}: imports {'.'.join(target)}, a private module of room {target[0]}; "
                               f"export the name from avatar_release.{target[0]} and import that")
                if not _is_room(pkg, target[0]):
                    continue
                if room in LOWER and target[0] not in LOWER:
                    bad.append(f"{where}: lower room {room} imports {'.'.join(target)} (a room above it)")
                edges.setdefault(room, set()).add(target[0])
                why.setdefault((room, target[0]), where)
    for comp in _cycles(edges):
        links = [f"{a} -> {b} ({why[(a, b)]})" for a in comp for b in comp if (a, b) in why]
        bad.append(f"rooms import each other in a circle: {', '.join(comp)}: " + "; ".join(links))
    return sorted(set(bad)), sorted(set(hidden))


def test_the_rooms_hold_their_line():
    bad, _ = _check(PKG)
    assert bad == []


def test_function_level_in_package_imports_are_few_and_each_says_why():
    """Each one names its reason (checked above); this pins where they are, so a new one is a visible change."""
    _, hidden = _check(PKG)
    # gates/band.py: the gate worker imports the gates package and must import neither the
    # pipeline nor the compiler, so calibrate() imports them when it runs. cli/_app.py: the
    # machine room (and records under it) loads with the first command, not for --help.
    assert sorted({h.rsplit(":", 1)[0] for h in hidden}) == ["avatar_release/cli/_app.py",
                                                            "avatar_release/gates/band.py"], hidden
    assert len(hidden) == 3, hidden


def test_the_check_sees_each_kind_of_violation(tmp_path):
    """The checker itself, on a fake package: a private import across rooms, an upward arrow, a circle
    closed by an import inside a function (uncommented), and imports of the bundled pipeline."""
    fake = tmp_path / "avatar_release"
    for room in ("records", "gates", "runtime", "ops", "serving", "media"):
        (fake / room).mkdir(parents=True)
    (fake / "records" / "__init__.py").write_text("from ..gates import store\n")
    (fake / "gates" / "__init__.py").write_text("from ..runtime._stream import plan_chunks\n")
    (fake / "runtime" / "__init__.py").write_text("def render():\n    from ..gates import gate_set\n")
    (fake / "ops" / "__init__.py").write_text("import model\nfrom kernels.masks import frame_mask\n")
    (fake / "serving" / "__init__.py").write_text(
        "def pod():\n    # Lazy: a reason given\n    from ..media import sample_image\n")
    (fake / "media" / "__init__.py").write_text("")
    bad, hidden = _check(fake)
    assert any("lower room records imports gates.store" in v for v in bad)
    assert any("private module of room runtime" in v for v in bad)
    assert any(v.startswith("rooms import each other in a circle: gates, runtime") and "runtime -> gates" in v
               for v in bad)
    assert any("runtime/__init__.py:2: an in-package import inside a function without a comment" in v for v in bad)
    assert any("ops/__init__.py:1: imports the bundled pipeline (model)" in v for v in bad)
    assert any("ops/__init__.py:2: imports the bundled pipeline (kernels)" in v for v in bad)
    assert not any("serving" in v for v in bad)  # a commented import inside a function is allowed
    assert hidden == ["avatar_release/runtime/__init__.py:2", "avatar_release/serving/__init__.py:3"]


def test_the_entry_points_stay_light():
    """Imports moved to the headers must not pull the heavy stack into the processes that avoid it."""
    heavy = ("jax", "jaxlib", "torch", "torchax", "PIL", "imageio_ffmpeg", "avatar_release.compile",
             "avatar_release.pipeline", "model", "kernels")
    code = ("import importlib, json, sys; importlib.import_module(sys.argv[1]); "
            f"print(json.dumps(sorted(m for m in {heavy!r} if m in sys.modules)))")

    def pulled(module: str) -> list[str]:
        out = subprocess.run([sys.executable, "-c", code, module], capture_output=True, text=True, cwd=ROOT,
                             timeout=120, check=True)
        return json.loads(out.stdout.strip().splitlines()[-1])

    assert pulled("avatar_release.media") == []
    assert pulled("avatar_release.runtime") == []
    assert pulled("avatar_release.gates._worker") == []  # a gate run imports what a pod imports
    cli = pulled("avatar_release.cli")
    assert not {"jax", "jaxlib", "torch", "torchax", "model", "kernels"} & set(cli), cli
