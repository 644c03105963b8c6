"""The entry points that must stay light load without the heavy stack: the CLI without JAX or torch
(``--help`` answers at once), the runtime and the gate worker without torch or the compiler, the
media room without Pillow or ffmpeg. Each is imported in a fresh process, as a user starts it.

The rooms' import rules (no private import across rooms, layers, no circle, the toolchain never
importing the bundled pipeline) are import-linter's contracts in pyproject.toml, run by ``lint-imports``
in .ci/run; this is what those rules are for, seen from a process.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_the_entry_points_stay_light():
    heavy = (
        "jax",
        "jaxlib",
        "torch",
        "torchax",
        "PIL",
        "imageio_ffmpeg",
        "avatar_release.compile",
        "avatar_release.pipeline",
        "model",
        "kernels",
    )
    code = (
        "import importlib, json, sys; importlib.import_module(sys.argv[1]); "
        f"print(json.dumps(sorted(m for m in {heavy!r} if m in sys.modules)))"
    )

    def pulled(module: str) -> list[str]:
        out = subprocess.run(
            [sys.executable, "-c", code, module], capture_output=True, text=True, cwd=ROOT, timeout=120, check=True
        )
        return json.loads(out.stdout.strip().splitlines()[-1])

    assert pulled("avatar_release.media") == []
    assert pulled("avatar_release.runtime") == []
    assert pulled("avatar_release.gates._worker") == []  # a gate run imports what a pod imports
    cli = pulled("avatar_release.cli")
    assert not {"jax", "jaxlib", "torch", "torchax", "model", "kernels"} & set(cli), cli
