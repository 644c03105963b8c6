"""The shape of the house, measured: the figures issue 27 names, in one JSON document.

* the largest class and the largest module, in lines (goal: no class over 300, no module over
  500 outside ``model/`` and ``kernels/``);
* functions over 60 lines in ``avatar_release/`` (goal: 0);
* unannotated parameters of public functions and methods in ``avatar_release/`` — the seams
  other rooms call (goal: 0), beside the count over every function;
* how many modules, classes and functions were read.

Read from the source with :mod:`ast` (no import, no side effects), so it takes a second.

    python benchmarks/bench_house.py [--out benchmarks/results/house.json]
    python benchmarks/bench_house.py --smoke --out /tmp/house.json   # the same figures; what the tests run
"""

from __future__ import annotations

import argparse
import ast
import sys
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _out import ROOT, out_path, write_results  # noqa: E402

PACKAGE = ROOT / "avatar_release"
BUNDLED = ("model", "kernels")  # the bundled pipeline: measured, not held to the module goal
GOALS = {"class_lines": 300, "module_lines": 500, "function_lines": 60, "unannotated_public": 0}


@dataclass(frozen=True)
class Span:
    where: str  # path:line name
    lines: int


def _lines(node: ast.AST) -> int:
    return int(node.end_lineno or node.lineno) - int(node.lineno) + 1  # type: ignore[attr-defined]


def _params(fn: ast.FunctionDef | ast.AsyncFunctionDef) -> list[ast.arg]:
    a = fn.args
    out = a.posonlyargs + a.args + a.kwonlyargs + ([a.vararg] if a.vararg else []) + ([a.kwarg] if a.kwarg else [])
    return [p for p in out if p.arg not in ("self", "cls")]


def _walk(tree: ast.Module, rel: str) -> tuple[list[Span], list[Span], list[str], list[str]]:
    """(classes, functions, unannotated public params, all unannotated params) of one module."""
    classes: list[Span] = []
    functions: list[Span] = []
    public: list[str] = []
    every: list[str] = []

    def visit(node: ast.AST, scope: str, exposed: bool) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.ClassDef):
                classes.append(Span(f"{rel}:{child.lineno} {scope}{child.name}", _lines(child)))
                visit(child, f"{scope}{child.name}.", exposed and not child.name.startswith("_"))
            elif isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                functions.append(Span(f"{rel}:{child.lineno} {scope}{child.name}", _lines(child)))
                shown = exposed and (not child.name.startswith("_") or child.name == "__init__")
                for p in _params(child):
                    if p.annotation is None:
                        name = f"{rel}:{child.lineno} {scope}{child.name}({p.arg})"
                        every.append(name)
                        if shown:
                            public.append(name)
                visit(child, f"{scope}{child.name}.<locals>.", False)  # nested functions are not seams
            else:
                visit(child, scope, exposed)

    visit(tree, "", True)
    return classes, functions, public, every


def measure(root: Path = ROOT) -> dict:
    modules: list[Span] = []
    classes: list[Span] = []
    functions: list[Span] = []
    public: list[str] = []
    every: list[str] = []
    for path in sorted((root / "avatar_release").rglob("*.py")) + sorted(
        p for d in BUNDLED for p in (root / d).rglob("*.py")
    ):
        rel = str(path.relative_to(root))
        text = path.read_text()
        bundled = rel.split("/", 1)[0] in BUNDLED
        modules.append(Span(rel + (" (bundled pipeline)" if bundled else ""), len(text.splitlines())))
        if bundled:
            continue
        c, f, pub, all_ = _walk(ast.parse(text, rel), rel)
        classes, functions, public, every = classes + c, functions + f, public + pub, every + all_
    held = [m for m in modules if "(bundled pipeline)" not in m.where]
    over = lambda spans, limit: sorted((s for s in spans if s.lines > limit), key=lambda s: -s.lines)  # noqa: E731
    largest = lambda spans: max(spans, key=lambda s: s.lines) if spans else Span("-", 0)  # noqa: E731
    figures = {
        "largest_class": vars(largest(classes)),
        "largest_module": vars(largest(held)),
        "largest_bundled_module": vars(largest([m for m in modules if m not in held])),
        "classes_over_goal": [vars(s) for s in over(classes, GOALS["class_lines"])],
        "modules_over_goal": [vars(s) for s in over(held, GOALS["module_lines"])],
        "functions_over_goal": [vars(s) for s in over(functions, GOALS["function_lines"])],
        "unannotated_public_params": len(public),
        "unannotated_params": len(every),
        "params": sum(
            len(_params(n))
            for p in sorted((root / "avatar_release").rglob("*.py"))
            for n in ast.walk(ast.parse(p.read_text()))
            if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))
        ),
        "unannotated_public_examples": public[:20],
        "read": {"modules": len(modules), "classes": len(classes), "functions": len(functions)},
    }
    return {
        "goals": GOALS,
        "figures": figures,
        "met": {
            "class_lines": not figures["classes_over_goal"],
            "module_lines": not figures["modules_over_goal"],
            "function_lines": not figures["functions_over_goal"],
            "unannotated_public": len(public) <= GOALS["unannotated_public"],
        },
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", help="where the JSON goes (default: benchmarks/results/house.json)")
    ap.add_argument("--smoke", action="store_true", help="the same figures, written only to --out")
    args = ap.parse_args(argv)
    write_results(measure(), out_path(args.out, "house", smoke=args.smoke), smoke=args.smoke)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
