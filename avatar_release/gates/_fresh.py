"""Fresh-process gate runs: start ``python -m avatar_release.gates._worker`` on a build and
read back what it rendered and counted. A run that cannot complete is a GateInfraError."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from .._progress import Tick
from ..errors import GateInfraError
from ..records import GateRequestsRecord, GateSetRecord

__all__ = ["GateRun", "fresh_run", "chunk_ticks"]

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


def chunk_ticks(
    progress: Callable[[str], None], task: str, gs: GateSetRecord, requests: list[str] | None = None
) -> Callable[[int], None]:
    """A fresh run's ``on_chunk`` that reports ``task: n/total chunks`` (a progress bar on a terminal):
    the total is every planned bucket of the gate set's requests (or of the named ones)."""
    total = sum(len(r.buckets) for r in gs.requests if requests is None or r.name in requests)
    return lambda done: progress(Tick(task, done, total, "chunk"))


def fresh_run(
    registry_uri: str,
    digest: str,
    gate_set_digest: str,
    *,
    label: str,
    requests: list[str] | None = None,
    gate_requests: GateRequestsRecord | None = None,
    on_chunk: Callable[[int], None] | None = None,
) -> GateRun:
    """One run of the gate set (or of the named ``requests``, a shard's slice) in a new Python
    process that only loads and serves. ``on_chunk(n)`` hears the number of chunks rendered so
    far, as the worker reports each one (its stdout, one JSON line per chunk). ``gate_requests``:
    rendered instead of the build's own (``gate --requests-of``)."""
    with tempfile.TemporaryDirectory(prefix="avatar-gate-") as tmp:
        job = Path(tmp) / "job.json"
        job.write_text(
            json.dumps(
                {
                    "registry": registry_uri,
                    "digest": digest,
                    "gate_set_digest": gate_set_digest,
                    "out_dir": tmp,
                    **({"requests": requests} if requests is not None else {}),
                    **({"gate_requests": gate_requests.model_dump(mode="json")} if gate_requests else {}),
                }
            )
        )
        env = dict(os.environ)
        env.pop("XLA_FLAGS", None)  # the worker sets the device count from the manifest
        t0 = time.perf_counter()
        returncode, last, stderr = _run_worker(job, env, label, on_chunk)
        wall = time.perf_counter() - t0
        try:
            status = json.loads(last)
        except json.JSONDecodeError:
            status = {}
        if returncode != 0 or not status.get("ok"):
            err = status.get("error") or stderr.strip()[-1500:] or f"exit status {returncode}"
            raise GateInfraError(f"gate run {label} failed in its fresh process: {err}")
        run = json.loads((Path(tmp) / "run.json").read_text())
        frames = np.load(Path(tmp) / "frames.npy", allow_pickle=False)
    return GateRun(
        frames=frames,
        frame_sha256=run["frame_sha256"],
        compiles=run["compiles"],
        compile_events=run["compile_events"],
        chunks=run["chunks"],
        environment=run["environment"],
        heavy_modules=run["heavy_modules"],
        seconds=run["seconds"],
        wall_seconds=wall,
        host=run.get("host", ""),
    )


def _is_chunk_event(line: str) -> bool:
    """The worker's one-line report of a rendered chunk (anything else on its stdout is not one)."""
    try:
        return json.loads(line).get("event") == "chunk"
    except (ValueError, AttributeError):
        return False


def _run_worker(
    job: Path, env: dict[str, str], label: str, on_chunk: Callable[[int], None] | None
) -> tuple[int, str, str]:
    """Run the worker on ``job``: (exit status, its last stdout line, its stderr). Chunk events on
    stdout go to ``on_chunk`` as they arrive; stderr goes to a file (an unread pipe could fill and
    block the worker); past RUN_TIMEOUT_S the worker is killed and the run is a GateInfraError."""
    with tempfile.TemporaryFile("w+") as err:
        proc = subprocess.Popen(
            [sys.executable, "-m", "avatar_release.gates._worker", str(job)],
            stdout=subprocess.PIPE,
            stderr=err,
            text=True,
            env=env,
        )
        timed_out = threading.Event()

        def _kill() -> None:
            timed_out.set()
            proc.kill()

        timer = threading.Timer(RUN_TIMEOUT_S, _kill)
        timer.start()
        last, done = "{}", 0
        try:
            assert proc.stdout is not None
            for line in proc.stdout:
                if _is_chunk_event(line):
                    done += 1
                    if on_chunk is not None:
                        on_chunk(done)
                elif line.strip():
                    last = line.strip()
            returncode = proc.wait()
        finally:
            timer.cancel()
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        if timed_out.is_set():
            raise GateInfraError(f"gate run {label}: no result after {RUN_TIMEOUT_S}s")
        err.seek(0)
        return returncode, last, err.read()
