"""Spine benchmarks: compile, load, serve and JIT paths of one pipeline, side by side.

Each scenario runs in its own fresh process (so imports, cold start and peak RSS are real),
then the parent prints ratios against the goals and writes JSON. Nothing here is asserted:
speed targets are measurements, not tests.

    python benchmarks/bench_spine.py [--pipeline tiny] [--chunks 6] [--out benchmarks/results/spine.json]
    python benchmarks/bench_spine.py --smoke --out FILE   # one chunk, no serial compile; the tests run it

``--smoke`` runs every scenario on one chunk (the steady chunk is then the first) and skips the
compile scenario's second, serial compile (its ratio is then null): the concurrent compile and the
JIT path's are the work left.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # the bundled pipeline (model/, kernels/) is a project beside the package

from _out import out_path, write_results  # noqa: E402 (benchmarks/_out.py, beside this file)

T_PROCESS = time.perf_counter()


def _rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def _inputs(program, chunks: int):
    from avatar_release.media import sample_audio, sample_image

    frames = chunks * 8
    return sample_image(program.height, program.width), sample_audio(frames / program.fps, program.sample_rate)


def scenario_compile(args) -> dict:
    from avatar_release.compile import compile_build
    from avatar_release.registry import LocalRegistry, MemoryRegistry

    conc = compile_build(args.pipeline, "cpu-8", registry=LocalRegistry(args.registry))
    serial = (
        None
        if args.smoke
        else compile_build(args.pipeline, "cpu-8", registry=MemoryRegistry(), concurrent_compile=False, publish=False)
    )
    m = conc.manifest
    return {
        "build_id": conc.build_id,
        "per_executable": [
            {
                "key": e.key,
                "trace_s": e.trace_seconds,
                "lower_s": e.lower_seconds,
                "compile_s": e.compile_seconds,
                "raw_bytes": e.raw_size,
                "zstd_bytes": e.blob.size,
                "zstd_ratio": round(e.blob.size / e.raw_size, 4),
            }
            for e in m.executables
        ],
        "trace_lower_compile_s": sum(e.trace_seconds + e.lower_seconds + e.compile_seconds for e in m.executables),
        "compile_wall_concurrent_s": conc.compile_wall_seconds,
        "compile_wall_serial_s": serial.compile_wall_seconds if serial else None,
        "peak_rss_mb": _rss_mb(),
    }


def _time_chunks(build, image, audio) -> tuple[float, list[float]]:
    from avatar_release.runtime import stream

    times = [c.seconds for c in stream(build, image, audio)]
    return times[0], times[1:]


def scenario_serve(args) -> dict:
    import jax  # noqa: F401

    from avatar_release.machine import keep_freed_memory
    from avatar_release.runtime import load

    keep_freed_memory()  # as the CLI's render and serve do (configure_for_manifest)

    t_imports = time.perf_counter() - T_PROCESS
    build = load("dev", args.registry)
    t = build.timings
    image, audio = _inputs(build.manifest.program, args.chunks)
    first, rest = _time_chunks(build, image, audio)
    return {
        "imports_s": t_imports,
        "load": {
            "resolve": t.resolve,
            "fetch": t.fetch,
            "verify": t.verify,
            "decompress": t.decompress,
            "deserialize": t.deserialize,
            "weights": t.weights,
            "total": t.total(),
        },
        "first_chunk_s": first,
        "time_to_first_chunk_s": time.perf_counter() - T_PROCESS - sum(rest),
        "steady_chunk_s": sorted(rest)[len(rest) // 2] if rest else first,
        "compiles": build.guard.count,
        "torch_imported": "torch" in sys.modules,
        "peak_rss_mb": _rss_mb(),
    }


def scenario_jit(args) -> dict:
    """The JIT path from model code: trace + lower + compile in-process, then run the same stream."""
    from _jit import jit_build  # benchmarks/_jit.py, beside this file

    build, _ = jit_build(args.pipeline, "cpu-8")
    m = build.manifest
    image, audio = _inputs(m.program, args.chunks)
    first, rest = _time_chunks(build, image, audio)
    return {
        "time_to_first_chunk_s": time.perf_counter() - T_PROCESS - sum(rest),
        "first_chunk_s": first,
        "steady_chunk_s": sorted(rest)[len(rest) // 2] if rest else first,
        "peak_rss_mb": _rss_mb(),
    }


def scenario_eager(args) -> dict:
    """The same chunk in plain PyTorch eager, on the host (no XLA)."""
    import torch

    from model.config import get_config
    from model.noise import chunk_noise
    from model.weights import init_pipeline

    config = get_config(args.pipeline)
    pipe = init_pipeline(config, 0)
    from avatar_release.media import sample_audio, sample_image

    image = torch.from_numpy(sample_image(config.height, config.width))
    audio = torch.from_numpy(sample_audio(config.frames_per_chunk / config.fps, config.sample_rate))
    h, w = config.dit_grid
    prev = torch.zeros(config.latent_channels, h, w)
    times = []
    with torch.no_grad():
        for i in range(args.chunks):
            noise = torch.from_numpy(chunk_noise(config, 0, i))
            t0 = time.perf_counter()
            frames, prev = pipe.render_chunk(image, audio, prev, noise)
            times.append(time.perf_counter() - t0)
    return {
        "chunk_s": sorted(times)[len(times) // 2],
        "threads": torch.get_num_threads(),
        "frames_per_chunk": config.frames_per_chunk,
        "fps": config.fps,
    }


SCENARIOS = {
    "compile": scenario_compile,
    "serve": scenario_serve,
    # the same serving process with glibc's allocator defaults (AVATAR_RELEASE_KEEP_FREED_MEMORY=0):
    # what keeping a chunk's freed memory (avatar_release/machine/_heap.py) is worth
    "serve_glibc_defaults": scenario_serve,
    "jit": scenario_jit,
    "eager": scenario_eager,
}


def _run(name: str, args) -> dict:
    env = dict(os.environ, XLA_FLAGS="--xla_force_host_platform_device_count=8", JAX_PLATFORMS="cpu")
    env["AVATAR_RELEASE_KEEP_FREED_MEMORY"] = "0" if name == "serve_glibc_defaults" else "1"
    cmd = [
        sys.executable,
        __file__,
        "--scenario",
        name,
        "--pipeline",
        args.pipeline,
        "--chunks",
        str(args.chunks),
        "--registry",
        args.registry,
        *(["--smoke"] if args.smoke else []),
    ]
    t0 = time.perf_counter()
    out = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if out.returncode != 0:
        raise SystemExit(f"scenario {name} failed:\n{out.stderr[-3000:]}")
    res = json.loads(out.stdout.strip().splitlines()[-1])
    res["process_wall_s"] = time.perf_counter() - t0
    print(f"  {name:<8} done in {res['process_wall_s']:.1f}s", file=sys.stderr)
    return res


def _ratio(num: float | None, den: float | None) -> float | None:
    return None if num is None or den is None else num / den


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--scenario", choices=sorted(SCENARIOS))
    ap.add_argument("--pipeline", default="tiny")
    ap.add_argument("--chunks", type=int, default=6)
    ap.add_argument("--registry", default=None)
    ap.add_argument("--smoke", action="store_true", help="one chunk, no serial compile: proves the benchmark runs")
    ap.add_argument("--out", help="write the JSON here (default benchmarks/results/spine.json; --smoke: nowhere)")
    args = ap.parse_args()
    os.environ.setdefault("AVATAR_RELEASE_PROJECT", str(ROOT))  # the bundled pipeline's specs, wherever it runs
    if args.smoke:
        args.chunks = 1
    if args.scenario:
        print(json.dumps(SCENARIOS[args.scenario](args)))
        return
    with tempfile.TemporaryDirectory() as tmp:
        args.registry = args.registry or str(Path(tmp) / "reg")
        r = {name: _run(name, args) for name in ("compile", "serve", "serve_glibc_defaults", "jit", "eager")}
    c, s, j, e = r["compile"], r["serve"], r["jit"], r["eager"]
    chunk_seconds = e["frames_per_chunk"] / e["fps"]
    ratios = [
        (
            "concurrent / serial compile wall",
            _ratio(c["compile_wall_concurrent_s"], c["compile_wall_serial_s"]),
            "<= 0.70",
        ),
        ("cold load / (trace+lower+compile)", s["load"]["total"] / c["trace_lower_compile_s"], "<= 0.05"),
        ("first chunk: registry / JIT path", s["time_to_first_chunk_s"] / j["time_to_first_chunk_s"], "<= 0.25"),
        ("steady chunk: loaded / JIT", s["steady_chunk_s"] / j["steady_chunk_s"], "1.00 +- 0.03"),
        (
            "steady chunk: freed memory kept / glibc defaults",
            s["steady_chunk_s"] / r["serve_glibc_defaults"]["steady_chunk_s"],
            "<= 0.90",
        ),
        (
            "(verify + decompress) / load",
            (s["load"]["verify"] + s["load"]["decompress"]) / s["load"]["total"],
            "<= 0.05",
        ),
        ("peak RSS: serving / compile", s["peak_rss_mb"] / c["peak_rss_mb"], "(lower is better)"),
        ("chunk: eager torch / torchax+jit", e["chunk_s"] / j["steady_chunk_s"], "(>1: XLA faster)"),
        ("real-time factor, torchax+jit", chunk_seconds / j["steady_chunk_s"], "(>=1: real time)"),
        ("real-time factor, eager torch", chunk_seconds / e["chunk_s"], "(>=1: real time)"),
    ]
    print(f"\npipeline {args.pipeline}, 8 virtual CPU devices on {os.cpu_count()} cores\n")
    print(f"{'measure':<38} {'ratio':>8}   goal")
    for name, value, goal in ratios:
        print(f"{name:<38} {'-' if value is None else f'{value:8.3f}':>8}   {goal}")
    print("\nper executable:")
    for x in c["per_executable"]:
        print(
            f"  {x['key']:<8} trace {x['trace_s']:.2f}s lower {x['lower_s']:.2f}s compile {x['compile_s']:.2f}s  "
            f"raw {x['raw_bytes'] / 1e6:.2f} MB zstd {x['zstd_bytes'] / 1e6:.2f} MB ({x['zstd_ratio']:.3f})"
        )
    doc = {
        "pipeline": args.pipeline,
        "smoke": args.smoke,
        "chunks": args.chunks,
        "cores": os.cpu_count(),
        "scenarios": r,
        "ratios": {name: {"value": None if v is None else round(v, 4), "goal": g} for name, v, g in ratios},
    }
    write_results(doc, out_path(args.out, "spine", smoke=args.smoke), smoke=args.smoke)


if __name__ == "__main__":
    main()
