"""benchmarks/bench_cli.py keeps working: its smoke mode runs the CLI's no-work answers (help, a
typo, a usage error, no registry) in fresh processes, with the exit codes a user sees and no jax."""

from __future__ import annotations

from tests.helpers import run_smoke


def test_smoke_mode_answers_help_typos_and_missing_registries_without_jax(tmp_path):
    out = tmp_path / "cli.json"
    cases = run_smoke("bench_cli.py", out=out, timeout=300)["cases"]
    assert set(cases) == {"help", "command help", "mistyped command", "mistyped channel", "no registry"}
    for name, c in cases.items():
        assert c["exit_codes"] == [c["expected_exit_code"]] and not c["imports_jax"], (name, c)
    assert cases["help"]["heavy_imports"] == cases["mistyped command"]["heavy_imports"] == []
