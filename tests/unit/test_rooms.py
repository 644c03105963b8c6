"""The package's rooms hold their line: no module imports another room's private module, and
the lower rooms (records, machine, registry and the helpers under them) import nothing above."""

from __future__ import annotations

import ast
from pathlib import Path

PKG = Path(__file__).resolve().parents[2] / "avatar_release"
# Rooms every other room may use; they import only each other.
LOWER = {"errors", "_digest", "_dtypes", "_atomic", "records", "machine", "registry", "specs", "identity"}


def _imports(path: Path):
    """(line, dotted target inside avatar_release as a list of parts) for each import in ``path``."""
    rel = path.relative_to(PKG).with_suffix("")
    package = list(rel.parts[:-1])
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = package[: len(package) - (node.level - 1)]
                mod = base + (node.module.split(".") if node.module else [])
            elif node.module and node.module.split(".")[0] == "avatar_release":
                mod = node.module.split(".")[1:]
            else:
                continue
            yield node.lineno, mod
            for alias in node.names:
                yield node.lineno, mod + [alias.name]
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] == "avatar_release":
                    yield node.lineno, alias.name.split(".")[1:]


def _room(path: Path) -> str:
    return path.relative_to(PKG).with_suffix("").parts[0]


def _violations() -> list[str]:
    bad = []
    for path in sorted(PKG.rglob("*.py")):
        room = _room(path)
        for line, target in _imports(path):
            if not target or target[0] == room:
                continue
            where = f"{path.relative_to(PKG.parent)}:{line}"
            private = [p for p in target[1:] if p.startswith("_") and not p.startswith("__")]
            if private:
                bad.append(f"{where}: imports {'.'.join(target)}, a private module of room {target[0]}; "
                           f"export the name from avatar_release.{target[0]} and import that")
            is_room = (PKG / target[0]).is_dir() or (PKG / f"{target[0]}.py").is_file()
            if room in LOWER and is_room and target[0] not in LOWER:
                bad.append(f"{where}: lower room {room} imports {'.'.join(target)} (a room above it)")
    return bad


def test_no_private_module_of_another_room_is_imported_and_no_arrow_points_up():
    assert _violations() == []


def test_the_check_sees_a_violation(tmp_path):
    """The checker itself: a private import across rooms and an upward arrow are both reported."""
    fake = tmp_path / "avatar_release"
    (fake / "records").mkdir(parents=True)
    (fake / "gates").mkdir()
    (fake / "records" / "__init__.py").write_text("from ..gates import store\n")
    (fake / "gates" / "__init__.py").write_text("from ..runtime._stream import plan_chunks\n")
    (fake / "runtime").mkdir()
    globals()["PKG"], saved = fake, PKG
    try:
        found = _violations()
    finally:
        globals()["PKG"] = saved
    assert any("lower room records imports gates.store" in v for v in found)
    assert any("private module of room runtime" in v for v in found)
