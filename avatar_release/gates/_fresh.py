"""Fresh-process gate runs: start ``python -m avatar_release.gates._worker`` on a build and
read back what it rendered and counted. A run that cannot complete is a GateInfraError."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..errors import GateInfraError

__all__ = ["GateRun", "fresh_run"]

RUN_TIMEOUT_S = 1800


@dataclass
class GateRun:
    frames: np.ndarray  # (N, H, W, 3) uint8
    frame_sha256: list[list[str]]
    compiles: int
    compile_events: list[dict]
    chunks: list[dict]
    environment: dict
    heavy_modules: list[str]
    seconds: dict
    wall_seconds: float
    host: str = ""  # where it ran

    @property
    def flat_hashes(self) -> list[str]:
        return [h for req in self.frame_sha256 for h in req]


def fresh_run(registry_uri: str, digest: str, gate_set_digest: str, *, label: str,
              requests: list[str] | None = None) -> GateRun:
    """One run of the gate set (or of the named ``requests``, a shard's slice) in a new Python
    process that only loads and serves."""
    with tempfile.TemporaryDirectory(prefix="avatar-gate-") as tmp:
        job = Path(tmp) / "job.json"
        job.write_text(json.dumps({"registry": registry_uri, "digest": digest,
                                   "gate_set_digest": gate_set_digest, "out_dir": tmp,
                                   **({"requests": requests} if requests is not None else {})}))
        env = dict(os.environ)
        env.pop("XLA_FLAGS", None)  # the worker sets the device count from the manifest
        t0 = time.perf_counter()
        try:
            proc = subprocess.run([sys.executable, "-m", "avatar_release.gates._worker", str(job)],
                                  capture_output=True, text=True, env=env, timeout=RUN_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            raise GateInfraError(f"gate run {label}: no result after {RUN_TIMEOUT_S}s") from None
        wall = time.perf_counter() - t0
        last = (proc.stdout.strip().splitlines() or ["{}"])[-1]
        try:
            status = json.loads(last)
        except json.JSONDecodeError:
            status = {}
        if proc.returncode != 0 or not status.get("ok"):
            err = status.get("error") or proc.stderr.strip()[-1500:] or f"exit status {proc.returncode}"
            raise GateInfraError(f"gate run {label} failed in its fresh process: {err}")
        run = json.loads((Path(tmp) / "run.json").read_text())
        frames = np.load(Path(tmp) / "frames.npy", allow_pickle=False)
    return GateRun(frames=frames, frame_sha256=run["frame_sha256"], compiles=run["compiles"],
                   compile_events=run["compile_events"], chunks=run["chunks"],
                   environment=run["environment"], heavy_modules=run["heavy_modules"],
                   seconds=run["seconds"], wall_seconds=wall, host=run.get("host", ""))
