"""The GPU check: compile, gate and serve a build on the GPU machine itself, against the JIT path.

**Not yet run on a GPU** (2026-12-02: no GPU machine was lent to the task that wrote it; see
docs/how-to/gpu-builds.md, "The H200 check", for what would block it there).
``benchmarks/gpu_check.sh`` drives it on the H200; here it runs end to end for ``--target cpu-8``
(``--smoke``), which proves the steps, not the GPU figures.

Each step runs in a fresh process (imports, cold start and compiles are real):

  preflight  versions of python, jax, jaxlib, the GPU plugin, torch, torchax; the devices; what in
             them differs from what this checkout pins (each a blocker with its reason)
  compile    the pipeline for the target, on this machine (its GPUs when the process sees the
             target's own: XLA autotunes on them); compile wall, the manifest's autotune record
             (``--compiled``: the build already on ``--registry``'s dev channel, its manifest read)
  gate       ``avatar-release gate BUILD --baseline none``: two fresh serving processes, zero
             compiles after load, bit-exact twins (the verdict and its evidence)
  serve      load from the registry and stream chunks: time to first chunk, steady chunk against
             its deadline, compiles after load (goal 0)
  jit        the JIT path from model code (trace, lower, compile in the process, then the same
             stream), twice with one JAX persistent cache: the second is "JIT with a warm cache"
  autotune   (GPU targets) ``avatar-release autotune BUILD``: XLA measures every config on the GPU,
             the build is compiled again requiring all of them and published as a new build
  kernels    the model's two Triton kernels (kernels/window_gpu.py, kernels/flash_gpu.py) run on the
             GPU against XLA's dense attention: largest error, and each one's time beside XLA's at
             one shape (the Pallas interpreter at a small shape elsewhere: errors only)

Each step runs under its own time limit (``STEP_TIMEOUT_S``), so one that hangs costs its share
and the JSON still comes back with the others.

    python benchmarks/gpu_check.py --target gpu-h200-1 --out benchmarks/results/gpu-h200.json
    python benchmarks/gpu_check.py --target cpu-8 --smoke --out /tmp/gpu-check.json
    python benchmarks/gpu_check.py --target cpu-8 --smoke --registry DIR --compiled --out FILE  # the tests' row

The tests' row hands it their session's tiny cpu-8 build (a copy of its registry) with ``--compiled``
rather than compile the same build again (compile itself is tested in tests/integration/test_compile.py):
the row proves that every other step runs on it and that the JSON carries each step.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from importlib import metadata
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # the package and the bundled pipeline from this checkout (no install needed)

from _out import write_results  # noqa: E402 (benchmarks/_out.py, beside this file)
from _timing import median_seconds  # noqa: E402 (benchmarks/_timing.py, beside this file)

T_PROCESS = time.perf_counter()
PINS = {"python": "3.11", "jax": "0.10.2", "jaxlib": "0.10.2", "torch": "2.13.0", "torchax": "0.0.14.dev20261026"}


def _version(dist: str) -> str | None:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return None


def step_preflight(args) -> dict:
    found = {"python": platform.python_version(), **{d: _version(d) for d in ("jax", "jaxlib", "torch", "torchax")}}
    plugins = {d: _version(d) for d in ("jax-cuda12-plugin", "jax-cuda12-pjrt", "jax-cuda13-plugin", "jax-cuda13-pjrt")}
    blockers = []
    if not found["python"].startswith(PINS["python"] + "."):
        blockers.append(
            f"python {found['python']}: pyproject.toml requires >=3.11,<3.12 (pip refuses to install; "
            "this check runs from the checkout on PYTHONPATH instead)"
        )
    from avatar_release.errors import IntegrityError
    from avatar_release.runtime._unpickle import allowed_classes

    for dist in ("jax", "jaxlib"):
        if found[dist] != PINS[dist]:
            minor = ".".join(str(found[dist]).split(".")[:2])
            try:  # the loader's own lookup, by the jax found here
                allowed_classes(str(found[dist]))
                pickles = f"the restricted unpickler has a class list recorded for jax {minor}"
            except IntegrityError:
                pickles = f"the restricted unpickler has no class list for jax {minor} and refuses every executable"
            blockers.append(
                f"{dist} {found[dist]}: the toolchain pins {PINS[dist]} ({pickles}; the target "
                "descriptions' proto and the flag names are checked against the pin only)"
            )
    if found["torchax"] is None:
        blockers.append("torchax is not installed: the bundled pipeline is traced through it (compile and jit fail)")
    devices = {}
    try:
        import jax

        devs = jax.devices()
        devices = {
            "backend": devs[0].platform,
            "count": len(devs),
            "kinds": sorted({d.device_kind for d in devs}),
            "platform_version": str(getattr(devs[0].client, "platform_version", "?")),
        }
    except Exception as e:  # noqa: BLE001 - reported, not raised: the preflight says what is missing
        devices = {"error": f"{type(e).__name__}: {e}"}
    return {"found": found, "plugins": plugins, "pins": PINS, "blockers": blockers, "devices": devices}


def _built(build_id: str, m) -> dict:
    """What the manifest says of a build: its platform, autotune record, kernel routes, executables."""
    return {
        "build_id": build_id,
        "platform": m.platform.model_dump(mode="json"),
        "autotune": m.autotune.model_dump(mode="json") if m.autotune else None,
        "kernel_routes": {k: [r.model_dump(mode="json") for r in v] for k, v in (m.kernel_routes or {}).items()},
        "executables": [
            {"key": e.key, "compile_s": e.compile_seconds, "zstd_bytes": e.blob.size} for e in m.executables
        ],
    }


def step_compile(args) -> dict:
    from avatar_release.registry import LocalRegistry, read_manifest

    reg = LocalRegistry(args.registry)
    if args.compiled:  # compiled elsewhere (the tests hand their session's build): read, not compiled again
        resolved, m = read_manifest(reg, "dev")
        if m.target != args.target or m.pipeline != args.pipeline:
            raise SystemExit(
                f"--compiled: dev holds {m.pipeline} for {m.target}, not {args.pipeline} for {args.target}"
            )
        return {"compiled_here": False, "wall_s": None, "compile_wall_s": None, **_built(resolved.build_id, m)}
    from avatar_release.compile import compile_build

    t0 = time.perf_counter()
    res = compile_build(args.pipeline, args.target, registry=reg)
    wall = time.perf_counter() - t0
    return {
        "compiled_here": True,
        "wall_s": wall,
        "compile_wall_s": res.compile_wall_seconds,
        **_built(res.build_id, res.manifest),
    }


def _inputs(program, chunks: int):
    from avatar_release.media import sample_audio, sample_image

    frames = chunks * 8
    return sample_image(program.height, program.width), sample_audio(frames / program.fps, program.sample_rate)


def _chunks(build, chunks: int) -> dict:
    from avatar_release.runtime import stream

    image, audio = _inputs(build.manifest.program, chunks)
    times = [c.seconds for c in stream(build, image, audio)]
    steady = sorted(times[1:])[len(times[1:]) // 2] if len(times) > 1 else times[0]
    b = build.manifest.buckets[0]
    deadline = b.frames / build.manifest.program.fps
    return {
        "first_chunk_s": times[0],
        "steady_chunk_s": steady,
        "deadline_s": deadline,
        "steady_over_deadline": steady / deadline,
        "chunks": len(times),
    }


def step_serve(args) -> dict:
    from avatar_release.runtime import load

    build = load("dev", args.registry, strict=False)
    timed = _chunks(build, args.chunks)
    return {
        "load_s": build.timings.total(),
        **timed,
        "time_to_first_chunk_s": time.perf_counter() - T_PROCESS - timed["steady_chunk_s"] * (timed["chunks"] - 1),
        "compiles_after_load": build.guard.count,
        "compile_events": build.guard.events[:8],
    }


def step_jit(args) -> dict:
    """Trace, lower and compile from model code in this process (JAX's persistent cache on), then stream."""
    import jax

    jax.config.update("jax_compilation_cache_dir", args.jax_cache)
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
    jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)
    from _jit import jit_build  # benchmarks/_jit.py, beside this file

    build, res = jit_build(args.pipeline, args.target)
    timed = _chunks(build, args.chunks)
    return {
        "compile_wall_s": res.compile_wall_seconds,
        **timed,
        "time_to_first_chunk_s": time.perf_counter() - T_PROCESS - timed["steady_chunk_s"] * (timed["chunks"] - 1),
        "cache_entries": len(list(Path(args.jax_cache).glob("*"))),
    }


def step_gate(args) -> dict:
    build_id = json.loads(Path(args.registry, "..", "compile.json").read_text())["build_id"]
    t0 = time.perf_counter()
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "avatar_release",
            "gate",
            build_id,
            "--baseline",
            "none",
            "--registry",
            args.registry,
            "--json",
        ],
        capture_output=True,
        text=True,
        env=_env(args),
    )
    try:
        doc = json.loads(out.stdout)
    except json.JSONDecodeError:
        doc = {"stdout": out.stdout[-2000:], "stderr": out.stderr[-2000:]}
    return {"exit_code": out.returncode, "wall_s": time.perf_counter() - t0, "result": doc}


def step_autotune(args) -> dict:
    """``avatar-release autotune BUILD`` on the GPUs: measure, compile again requiring every config, publish."""
    build_id = json.loads(Path(args.registry, "..", "compile.json").read_text())["build_id"]
    saved = Path(args.registry, "..", "autotune-results.textproto")
    t0 = time.perf_counter()
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "avatar_release",
            "autotune",
            build_id,
            "--save-results",
            str(saved),
            "--registry",
            args.registry,
            "--json",
        ],
        capture_output=True,
        text=True,
        env=_env(args),
    )
    try:
        doc = json.loads(out.stdout)
    except json.JSONDecodeError:
        doc = {"stdout": out.stdout[-2000:], "stderr": out.stderr[-2000:]}
    return {
        "exit_code": out.returncode,
        "wall_s": time.perf_counter() - t0,
        "result": doc,
        "results_bytes": saved.stat().st_size if saved.exists() else None,
    }


def step_kernels(args) -> dict:
    """The Triton kernels on this machine's device beside XLA's dense attention (bf16 in, float32 reference)."""
    import jax
    import jax.numpy as jnp
    import numpy as np

    from kernels.blocksparse import frame_reference, reference_attention
    from kernels.flash_gpu import flash_attention_gpu
    from kernels.window_gpu import BLOCK, window_attention_gpu

    gpu = not args.target.startswith("cpu")
    # On the GPU: an SR-like call (17 frames of 368 tokens, window 2, head_dim 128) and a 4,096-token
    # DiT-like one; elsewhere the Pallas interpreter at a small shape (its times mean nothing).
    frames, tokens, window, heads, hd, dense = (17, 368, 2, 2, 128, 4096) if gpu else (5, 48, 1, 1, 16, 256)
    keys = jax.random.split(jax.random.PRNGKey(0), 6)
    q, k, v = (jax.random.normal(kk, (heads, frames * tokens, hd), jnp.bfloat16) for kk in keys[:3])
    dq, dk, dv = (jax.random.normal(kk, (heads, dense, hd), jnp.bfloat16) for kk in keys[3:])

    def window_at(block: int):
        return jax.jit(
            lambda q, k, v: window_attention_gpu(
                q, k, v, frames=frames, tokens_per_frame=tokens, window=window, block=block, interpret=not gpu
            )
        )

    by_block = {b: window_at(b) for b in ((32, BLOCK, 128) if gpu else (BLOCK,))}
    window_fn = by_block[BLOCK]
    window_ref = jax.jit(
        lambda q, k, v: frame_reference(q, k, v, frames=frames, tokens_per_frame=tokens, window=window)
    )
    flash_fn = jax.jit(lambda q, k, v: flash_attention_gpu(q, k, v, interpret=not gpu))
    flash_ref = jax.jit(lambda q, k, v: reference_attention(q, k, v, None))

    def err(a, b) -> float:
        return float(np.abs(np.asarray(a, np.float32) - np.asarray(b, np.float32)).max())

    out = {
        "device": jax.devices()[0].device_kind,
        "interpreted": not gpu,
        "window": {
            "shape": [heads, frames * tokens, hd],
            "frames": frames,
            "tokens_per_frame": tokens,
            "window": window,
            "max_abs_err": err(window_fn(q, k, v), window_ref(q, k, v)),
        },
        "flash": {"shape": [heads, dense, hd], "max_abs_err": err(flash_fn(dq, dk, dv), flash_ref(dq, dk, dv))},
    }
    if gpu:  # the reference is float32 at HIGHEST precision with (S, S) logits: XLA's masked attention
        # the block size is a first choice (BLOCK): what 32 and 128 would give, for the next build
        ms = {b: median_seconds(fn, q, k, v) * 1e3 for b, fn in by_block.items()}
        out["window"].update(
            kernel_ms=ms[BLOCK], kernel_ms_by_block=ms, xla_reference_ms=median_seconds(window_ref, q, k, v) * 1e3
        )
        out["flash"].update(
            kernel_ms=median_seconds(flash_fn, dq, dk, dv) * 1e3,
            xla_reference_ms=median_seconds(flash_ref, dq, dk, dv) * 1e3,
        )
    return out


STEPS = {
    "preflight": step_preflight,
    "compile": step_compile,
    "serve": step_serve,
    "jit": step_jit,
    "gate": step_gate,
    "autotune": step_autotune,
    "kernels": step_kernels,
}
# Each step's own limit, so a step that hangs costs its share, not the whole run's JSON; together
# under the 470 s gpu_check.sh gives the run.
STEP_TIMEOUT_S = {
    "preflight": 30,
    "compile": 90,
    "gate": 110,
    "serve": 45,
    "jit": 50,
    "autotune": 60,
    "kernels": 30,
}  # 465 s in all (jit runs twice)


def _env(args) -> dict:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep))
    if args.target.startswith("cpu"):
        env.update(XLA_FLAGS="--xla_force_host_platform_device_count=8", JAX_PLATFORMS="cpu")
    else:  # the real GPU, and the CPU backend the toolchain's cost analysis uses
        env.setdefault("JAX_PLATFORMS", "cuda,cpu")
    return env


def _run(name: str, args, **extra) -> dict:
    cmd = [
        sys.executable,
        __file__,
        "--step",
        name,
        "--target",
        args.target,
        "--pipeline",
        args.pipeline,
        "--chunks",
        str(args.chunks),
        "--registry",
        args.registry,
        "--jax-cache",
        args.jax_cache,
        *(["--compiled"] if args.compiled else []),
    ]
    t0 = time.perf_counter()
    try:
        out = subprocess.run(
            cmd,
            capture_output=True,
            text=True,
            env=_env(args),
            cwd=ROOT,
            timeout=STEP_TIMEOUT_S[name] * (3 if args.target.startswith("cpu") else 1),
        )
    except subprocess.TimeoutExpired as e:
        print(f"  {name:<9} timed out after {e.timeout:.0f}s", file=sys.stderr)
        return {"failed": True, "timed_out_s": e.timeout, "stderr": (e.stderr or b"")[-3000:].decode(errors="replace")}
    wall = time.perf_counter() - t0
    print(f"  {name:<9} exit {out.returncode} in {wall:.1f}s", file=sys.stderr)
    if out.returncode != 0:
        return {"failed": True, "exit_code": out.returncode, "stderr": out.stderr[-3000:], "process_wall_s": wall}
    res = json.loads(out.stdout.strip().splitlines()[-1])
    res["process_wall_s"] = wall
    return res


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--step", choices=sorted(STEPS))
    ap.add_argument("--target", default="gpu-h200-1")
    ap.add_argument("--pipeline", default="tiny")
    ap.add_argument("--chunks", type=int, default=6)
    ap.add_argument("--registry", default=None)
    ap.add_argument("--jax-cache", default=None)
    ap.add_argument(
        "--compiled",
        action="store_true",
        help="--registry's dev channel already holds the build (compiled elsewhere): the compile step reads it",
    )
    ap.add_argument("--smoke", action="store_true", help="two chunks: proves the steps run")
    ap.add_argument("--out", help="write the JSON here (default: print it)")
    args = ap.parse_args()
    if args.step:  # a child: one step, one JSON line on stdout
        print(json.dumps(STEPS[args.step](args), default=str))
        return
    if args.smoke:
        args.chunks = 2
    work = Path(tempfile.mkdtemp(prefix="gpu-check-"))
    args.registry = args.registry or str(work / "reg")
    args.jax_cache = args.jax_cache or str(work / "jax-cache")
    doc: dict = {
        "benchmark": "gpu_check",
        "date": datetime.date.today().isoformat(),
        "target": args.target,
        "pipeline": args.pipeline,
        "host": platform.node(),
        "run_on_gpu": not args.target.startswith("cpu"),
    }
    doc["preflight"] = _run("preflight", args)
    doc["compile"] = _run("compile", args)
    if not doc["compile"].get("failed"):
        Path(args.registry, "..", "compile.json").write_text(json.dumps(doc["compile"]))
        doc["gate"] = _run("gate", args)
        doc["serve"] = _run("serve", args)
    doc["jit_cold_cache"] = _run("jit", args)
    doc["jit_warm_cache"] = _run("jit", args)
    if not doc["compile"].get("failed") and not args.target.startswith("cpu"):  # autotuning is XLA:GPU's
        doc["autotune"] = _run("autotune", args)
    doc["kernels"] = _run("kernels", args)
    serve, warm = doc.get("serve", {}), doc["jit_warm_cache"]
    if "time_to_first_chunk_s" in serve and "time_to_first_chunk_s" in warm:
        doc["ratios"] = {
            "time_to_first_chunk_artifact_over_jit_warm_cache": serve["time_to_first_chunk_s"]
            / warm["time_to_first_chunk_s"],
            "steady_chunk_over_deadline": serve["steady_over_deadline"],
            "compiles_after_load": serve["compiles_after_load"],
        }
    write_results(doc, args.out, smoke=args.smoke, echo=args.out is None, default=str)


if __name__ == "__main__":
    main()
