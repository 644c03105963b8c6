"""One gate run in a fresh process, as a serving pod would run it.

    python -m avatar_release.gates._worker JOB.json

The job names a registry, a build digest, an output folder and optionally ``requests`` (the names
of a shard's slice of the gate set; default: all of it) and ``gate_requests`` (another build's gate
requests, rendered instead of this build's own: ``gate --requests-of``). The process imports only
the runtime loader (never the compiler, torch or torchax), loads the build in counting mode
(every compile is recorded, none is fatal, so all of them can be reported), renders every
request of the gate set, and writes:

    frames.npy   every delivered frame, (N, H, W, 3) uint8, requests in gate-set order; for an
                 audio or tensors build every delivered chunk instead, (chunks, longest) float64
                 (``metrics.chunk_units``)
    run.json     per-frame sha256 (per chunk of the delivered arrays for audio and tensors), compile events (stage and input shapes), timings,
                 the environment fingerprint, and which heavy modules were imported

Exit 0 when the run completed (whatever it found); non-zero only for infrastructure faults,
with the error as JSON on stdout.
"""

from __future__ import annotations

import functools
import json
import socket
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from .. import _atomic
from ..errors import AvatarReleaseError, GateInfraError
from ..machine import configure_for_manifest, environment_record
from ..records import GateRequestsRecord
from ..registry import open_registry, read_manifest
from ..runtime import Chunk, load, render
from .gateset import gate_request_inputs, gate_set
from .metrics import chunk_units, delivered_sha256, frame_sha256
from .requests_of import with_requests

if TYPE_CHECKING:
    from ..records import GateRequestRecord, GateSetRecord, Manifest
    from ..runtime import LoadedBuild


def _say_chunk(request: str, delivered: list[dict[str, np.ndarray]] | None, chunk: Chunk) -> None:
    """One line per rendered chunk on stdout, for the parent's progress (the result goes to run.json);
    ``delivered``: where an audio or tensors build's chunks are kept (None for video)."""
    if delivered is not None:
        delivered.append(dict(chunk.outputs))
    print(json.dumps({"event": "chunk", "request": request, "index": chunk.index}), flush=True)


def render_gate_set(job: dict) -> dict:
    """Load the job's build and render its gate set; -> what run.json records."""
    t_start = time.perf_counter()

    registry = open_registry(job["registry"], create=False)
    resolved, manifest = read_manifest(registry, job["digest"])
    configure_for_manifest(manifest)  # before JAX starts: the devices the build was compiled for
    if "gate_requests" in job:  # another build's requests (gate --requests-of), rendered by this one
        manifest = with_requests(manifest, GateRequestsRecord.model_validate(job["gate_requests"]))
    gs = gate_set(manifest)
    if gs.digest != job["gate_set_digest"]:
        raise GateInfraError(
            f"gate set digest {gs.digest} differs from the parent's {job['gate_set_digest']}; "
            "the worker and the gate must run the same avatar-release"
        )
    t0 = time.perf_counter()
    build = load(resolved.digest, registry, strict=False)
    load_seconds = time.perf_counter() - t0
    env = environment_record(manifest.platform.backend)

    video = manifest.program.delivery().kind == "video"
    t0 = time.perf_counter()
    frames, hashes, chunks, delivered = _render_requests(build, manifest, _wanted_requests(gs, job), video)
    render_seconds = time.perf_counter() - t0
    out_dir = Path(job["out_dir"])
    np.save(out_dir / "frames.npy", np.concatenate(frames) if video else chunk_units(delivered), allow_pickle=False)
    heavy = _heavy_modules(manifest.model_entry)
    return {
        "ok": True,
        "build_id": manifest.build_id,
        "digest": resolved.digest,
        "frame_sha256": hashes,
        "compiles": build.guard.count,
        "compile_events": build.guard.events,
        "chunks": chunks,
        "environment": env.model_dump(mode="json"),
        "heavy_modules": heavy,
        "host": socket.gethostname(),
        "seconds": {
            "load": round(load_seconds, 4),
            "render": round(render_seconds, 4),
            "process": round(time.perf_counter() - t_start, 4),
        },
    }


def _wanted_requests(gs: GateSetRecord, job: dict) -> list[GateRequestRecord]:
    """The gate set's requests this job renders (its ``requests``, default all), in gate-set order."""
    wanted = job.get("requests")
    if wanted is not None and set(wanted) - {r.name for r in gs.requests}:
        raise GateInfraError(
            f"requests {sorted(set(wanted) - {r.name for r in gs.requests})} are not in gate set "
            f"{gs.name} v{gs.version}"
        )
    return [req for req in gs.requests if wanted is None or req.name in wanted]


def _render_requests(
    build: LoadedBuild, manifest: Manifest, requests: list[GateRequestRecord], video: bool
) -> tuple[list[np.ndarray], list[list[str]], list[dict], list[dict[str, np.ndarray]]]:
    """Render each request -> (frames (video only), per-request hashes, per-chunk reports, the
    delivered chunks (audio, tensors only))."""
    frames, hashes, chunks = [], [], []
    delivered: list[dict[str, np.ndarray]] = []
    for req in requests:
        given = gate_request_inputs(manifest, req)
        first = len(delivered)
        out, report = render(
            build,
            given.image,
            given.audio,
            seed=req.seed,
            frames=given.frames,
            values=given.values,
            on_chunk=functools.partial(_say_chunk, req.name, None if video else delivered),
        )
        if video:
            frames.append(out)
            hashes.append([frame_sha256(f) for f in out])
        else:  # audio, tensors: one unit per delivered chunk
            hashes.append([delivered_sha256(c) for c in delivered[first:]])
        chunks += [{"request": req.name, **c} for c in report.to_json()["per_chunk"]]
    return frames, hashes, chunks, delivered


def _heavy_modules(model_entry: str) -> list[str]:
    """What a serving process must never import and did: the compile-side stack, and the pipeline's
    own package (the top-level package of the entry the manifest names), whichever project it is."""
    parts = model_entry.partition(":")[0].split(".")
    pipeline_package = ".".join(parts[:2] if parts[0] == "avatar_release" else parts[:1])  # (builds before v4)
    return sorted(
        m
        for m in ("torch", "torchax", "avatar_release.compile", "avatar_release.pipeline", pipeline_package)
        if m in sys.modules
    )


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    job = json.loads(Path(argv[0]).read_text())
    try:
        result = render_gate_set(job)
    except Exception as e:  # noqa: BLE001 - reported to the parent, which raises the typed error
        out = {
            "ok": False,
            "error": f"{type(e).__name__}: {e}",
            "exit_code": e.exit_code if isinstance(e, AvatarReleaseError) else 70,
        }
        print(json.dumps(out))
        return 1
    _atomic.write_json(Path(job["out_dir"]) / "run.json", result)  # the parent reads it whole or not at all
    print(json.dumps({"ok": True}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
