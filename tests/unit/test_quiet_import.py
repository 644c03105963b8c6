"""With the CUDA plugin installed on a host without a GPU (the [gpu] extra, to compile for GPU
targets), JAX's start logs "Could not find cuda drivers" three times past Python's stderr; a
command's output carries none of it, and everything else written meanwhile still arrives."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from avatar_release.machine._quiet import keep

REPO = Path(__file__).resolve().parents[2]
NOISE = (
    b"WARNING: All log messages before absl::InitializeLog() is called are written to STDERR\n",
    b"I0000 00:00:1796182187.942414   17999 cudart_stub.cc:31] Could not find cuda drivers on your machine, "
    b"GPU will not be used.\n",
)


def test_only_the_plugin_lines_are_dropped_and_the_rest_keeps_its_order():
    lines = [
        b"first\n",
        *NOISE,
        b"W1201 10:08:06.669259 5184 spmd_partitioner.cc:656] a real warning\n",
        NOISE[0],
        b"a line of our own after absl's notice\n",
        *NOISE,
    ]
    assert keep(lines) == [b"first\n", lines[3], NOISE[0], b"a line of our own after absl's notice\n"]


@pytest.mark.slow  # seconds long (tests/conftest.py: FAST_LANE_LIMIT_S)
@pytest.mark.extra("gpu")  # the CUDA plugin
def test_a_process_that_starts_jax_shows_none_of_the_plugin_lines():
    code = (
        "import sys\nfrom avatar_release.machine import configure_host_devices\nconfigure_host_devices(2)\n"
        "print('before', file=sys.stderr, flush=True)\nimport jax\nprint(len(jax.devices()))\n"
        "print('after', file=sys.stderr)\n"
    )
    env = {**os.environ, "JAX_PLATFORMS": "cpu", "PYTHONPATH": str(REPO)}
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert proc.returncode == 0 and proc.stdout.strip() == "2"
    assert proc.stderr.splitlines() == ["before", "after"], proc.stderr
