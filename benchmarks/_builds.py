"""Compiles for the compile-only benchmarks (bench_tpu.py, bench_gpu.py): each in a fresh
``avatar-release compile --json`` process whose own peak RSS is read, then the build's evidence
(HBM fit, the per-chunk estimate against the target's published peaks, schedule, kernels) read
back from its manifest."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from avatar_release.records import Manifest

GIB = 2**30

__all__ = ["compile_rows", "compile_row", "compiled_row", "add_evidence", "GIB"]


def compile_row(pipeline: str, target: str, sets: list[str], registry: Path) -> dict:
    cmd = [
        sys.executable,
        "-m",
        "avatar_release",
        "compile",
        "--pipeline",
        pipeline,
        "--target",
        target,
        "--registry",
        str(registry),
        "--json",
    ]
    for s in sets:
        cmd += ["--set", s]
    t0 = time.perf_counter()
    proc = subprocess.Popen(
        cmd, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, env={**os.environ, "JAX_PLATFORMS": "cpu"}
    )
    out = proc.stdout.read()
    _, status, usage = os.wait4(proc.pid, 0)  # this child's own peak RSS
    proc.returncode = os.waitstatus_to_exitcode(status)
    wall = time.perf_counter() - t0
    doc = json.loads(out) if out.strip() else {}
    row = {
        "pipeline": pipeline,
        "target": target,
        "set": sets,
        "compiled_here": True,
        "wall_seconds": round(wall, 1),
        "exit_code": proc.returncode,
    }
    row["peak_rss_gib"] = round(usage.ru_maxrss * 1024 / GIB, 2)
    if proc.returncode != 0:
        row["refused"] = doc.get("message", "")[:600]
        if doc.get("memory_fit"):
            row["memory_fit"] = doc["memory_fit"]
        return row
    row["build_id"] = doc["build_id"]
    row["xla_log"] = doc.get("xla_log", [])  # compiler warnings (e.g. SPMD rematerialization); none expected
    row["compile_wall_seconds"] = doc["compile_wall_seconds"]
    row["compile_seconds"] = {e["key"]: e["compile_seconds"] for e in doc["executables"]}
    return row


def compiled_row(registry: Path, pipeline: str, target: str) -> dict:
    """The row of the build on ``registry``'s dev channel, compiled elsewhere (``--compiled``): its
    manifest read, nothing compiled here, so no process wall time or peak RSS (``None``); the
    per-stage compile seconds are the ones its manifest recorded."""
    from avatar_release.registry import LocalRegistry, read_manifest

    _, m = read_manifest(LocalRegistry(registry, create=False), "dev")
    if (m.pipeline, m.target) != (pipeline, target):
        raise SystemExit(f"--compiled: dev holds {m.pipeline} for {m.target}, not {pipeline} for {target}")
    row = {
        "pipeline": pipeline,
        "target": target,
        "set": [f"{k}={v}" for k, v in sorted(m.overrides.items())],
        "compiled_here": False,
        "wall_seconds": None,
        "exit_code": 0,
        "peak_rss_gib": None,
        "build_id": m.build_id,
        "xla_log": [],
        "compile_wall_seconds": None,
        "compile_seconds": {e.key: e.compile_seconds for e in m.executables},
    }
    add_evidence(row, registry, m)
    return row


def add_evidence(row: dict, registry: Path, m: Manifest | None = None) -> None:
    from avatar_release.analysis import estimate_chunks
    from avatar_release.registry import LocalRegistry, read_manifest
    from avatar_release.specs import load_target

    if m is None:
        _, m = read_manifest(LocalRegistry(registry, create=False), row["build_id"])
    t = load_target(m.target)
    row["memory_fit"] = m.memory_fit.model_dump() if m.memory_fit else None
    row["chunks"] = [
        c.to_json() for c in estimate_chunks(m, t.peak_flops_per_second, t.hbm_bytes_per_second, t.ici_bytes_per_second)
    ]
    row["schedule"] = {e.key: e.schedule.model_dump() for e in m.executables if e.schedule}
    row["kernels"] = {e.key: [k.model_dump() for k in e.kernels] for e in m.executables if e.kernels}
    row["weights"] = {"materialized": m.weights.materialized, "bytes": m.weights.raw_size}


def compile_rows(runs: list[tuple[str, str, list[str]]]) -> list[dict]:
    """Each (pipeline, target, --set values) compiled into a registry of its own (thrown away after),
    with its evidence where it compiled; progress on stdout."""
    rows: list[dict] = []
    with tempfile.TemporaryDirectory() as tmp:
        for pipeline, target, sets in runs:
            reg = Path(tmp) / f"reg-{len(rows)}"
            print(f"compiling {pipeline} for {target} {' '.join(sets)} ...", flush=True)
            row = compile_row(pipeline, target, sets, reg)
            if row["exit_code"] == 0:
                add_evidence(row, reg)
            rows.append(row)
    return rows
