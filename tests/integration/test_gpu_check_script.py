"""benchmarks/gpu_check.sh is what the H200 would run, and gpu_check.py's preflight names what would
block the H200's toolchain.

The GPU figures need the H200 (not run yet: see docs/how-to/gpu-builds.md, "The H200 check"). The same
steps end to end for cpu-8 (``--smoke``: preflight, the session's build read by the compile step, the gate
in fresh processes, serve, and the JIT path twice with one JAX cache) are a row of
tests/integration/test_benchmarks.py.
"""

from __future__ import annotations

import importlib.util
import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def _module(monkeypatch):
    monkeypatch.syspath_prepend(str(REPO / "benchmarks"))  # as when run as a script: _out.py beside it
    spec = importlib.util.spec_from_file_location("gpu_check", REPO / "benchmarks" / "gpu_check.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_the_script_for_the_h200_is_valid_bash_marked_not_yet_run_and_within_its_time():
    script = (REPO / "benchmarks" / "gpu_check.sh").read_text()
    subprocess.run(["bash", "-n", str(REPO / "benchmarks" / "gpu_check.sh")], check=True)
    assert "NOT YET RUN" in script and "--target gpu-h200-1" in script
    assert "timeout 470" in script  # under the 8 minutes the machine is lent for


def test_the_preflight_names_each_blocker_of_the_h200_toolchain(monkeypatch):
    mod = _module(monkeypatch)
    versions = {"jax": "0.11.2", "jaxlib": "0.11.2", "torch": "2.11.0", "torchax": None, "jax-cuda13-plugin": "0.11.2"}
    monkeypatch.setattr(mod, "_version", lambda dist: versions.get(dist))
    monkeypatch.setattr(mod.platform, "python_version", lambda: "3.12.7")
    out = mod.step_preflight(None)
    text = "\n".join(out["blockers"])
    assert "python 3.12.7: pyproject.toml requires >=3.11,<3.12" in text
    assert "jax 0.11.2: the toolchain pins 0.10.2" in text and "jaxlib 0.11.2" in text
    assert "class list recorded for jax 0.11" in text  # the unpickler would take its executables
    assert "torchax is not installed" in text
    assert out["plugins"]["jax-cuda13-plugin"] == "0.11.2"


def test_each_step_has_a_limit_inside_the_runs_and_a_hung_step_leaves_a_record_not_a_lost_run(monkeypatch):
    mod = _module(monkeypatch)
    assert set(mod.STEP_TIMEOUT_S) == set(mod.STEPS) and {"autotune", "kernels"} <= set(mod.STEPS)
    # preflight, compile, gate, serve, jit twice, autotune, kernels: inside the script's `timeout 470`
    limits = mod.STEP_TIMEOUT_S
    assert sum(limits[s] for s in ("preflight", "compile", "gate", "serve", "jit", "jit", "autotune", "kernels")) < 470

    def hangs(cmd, **kw):
        raise subprocess.TimeoutExpired(cmd, kw["timeout"], stderr=b"still measuring")

    monkeypatch.setattr(mod.subprocess, "run", hangs)
    args = type(
        "A",
        (),
        {"target": "gpu-h200-1", "pipeline": "tiny", "chunks": 2, "registry": "r", "jax_cache": "c", "compiled": False},
    )
    out = mod._run("autotune", args)
    assert out == {"failed": True, "timed_out_s": limits["autotune"], "stderr": "still measuring"}
