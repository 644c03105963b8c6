"""The house's shape (benchmarks/bench_house.py --smoke), in the fast lane: the figures issue 27
names, and the goals held — a class over 300 lines, a module over 500 (outside the bundled
pipeline), a function over 60 or an unannotated public parameter fails here, naming it."""

from __future__ import annotations

from tests.helpers import run_smoke


def test_the_house_keeps_its_goals(tmp_path):
    out = tmp_path / "house.json"
    doc = run_smoke("bench_house.py", out=out, timeout=120)
    f = doc["figures"]
    assert doc["goals"] == {"class_lines": 300, "module_lines": 500, "function_lines": 60, "unannotated_public": 0}
    assert f["read"]["modules"] > 100 and f["read"]["functions"] > 500 and f["params"] > 1000  # it read the tree
    assert f["largest_class"]["lines"] > 50 and f["largest_module"]["where"].startswith("avatar_release/")
    assert f["largest_bundled_module"]["where"].startswith(("model/", "kernels/"))
    assert f["classes_over_goal"] == [], f["classes_over_goal"]
    assert f["modules_over_goal"] == [], f["modules_over_goal"]
    assert f["functions_over_goal"] == [], f["functions_over_goal"]
    assert f["unannotated_public_params"] == 0, f["unannotated_public_examples"]
    assert all(doc["met"].values())
