"""Ready and swap: a running pod's swap to a new build against the JIT path with a warm JAX
persistent compilation cache for the same build; a fresh pod's ready time apart from deserializing
and weights against a bare ``import jax; jax.devices()``.

Two tiny cpu-8 builds, A and B (``matmul_k_split=2``: another program, the same weights), compiled
into a temporary registry (or copied from ``--registry``, which must hold both: A on dev). Every
run is a fresh process; the modes alternate run by run, ``--runs`` each (min / median / max):

* **swap**: a pod serving A (``serving.start_pod``, devices prepared as ``serve`` prepares them);
  dev moves to B; the seconds of the pod's next channel check (``Pod.check_channel``, what
  ``serve --follow`` runs on each poll): resolve, verify, load, one warm chunk with zero compiles,
  the switch. Also the same seconds without the warm chunk (``swap_load_s``).
* **jit**: a process that JIT-compiled and ran A from model code (JAX's persistent compilation
  cache on), then does the same for B: trace, lower, compile (every program a cache hit: an earlier,
  unmeasured run filled the cache), weights placed, one warm chunk. Serializing the programs for a
  manifest (which the JIT path needs only to reuse the runtime's stream) is not counted.
* **ready**: ``avatar-release serve`` spawned on B: seconds to its ready line, minus the wall of
  its deserialize + weights section (the ready line's load timings); also without its warm chunk
  (the build's own programs running once, not readiness overhead).
* **bare**: ``python -c "import jax; jax.devices()"`` spawned with the environment the pod gives
  JAX (its device count, ``JAX_PLATFORMS=cpu``): seconds to exit. **bare_default**: the same as a
  user types it, with no JAX settings (every installed PJRT plugin is probed).

Goals: swap / JIT + warm cache <= 0.10; ready apart from deserialize and weights / bare <= 1.25.

    python benchmarks/bench_swap.py [--runs 5] [--out benchmarks/results/swap.json]
    python benchmarks/bench_swap.py --smoke --out FILE   # one run of each mode; the tests run it

``--smoke`` runs each mode once and leaves out the unmeasured JIT run that fills the persistent
cache first: its one JIT run fills the cache itself (its compiles are XLA's own, not cache hits).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # the package and the bundled pipeline from this checkout
sys.path.insert(0, str(Path(__file__).resolve().parent))  # _jit, _out beside this file

from _out import out_path, write_results  # noqa: E402 (benchmarks/_out.py, beside this file)

OTHER = {"matmul_k_split": "2"}  # build B: another program over the same weights
MODES = ("swap", "jit", "ready", "bare", "bare_default")


# ------------------------------------------------------------------------------ child processes
def child_swap(registry: str, b_digest: str) -> dict:
    from avatar_release.machine import configure_for_manifest
    from avatar_release.registry import LocalRegistry, read_manifest
    from avatar_release.serving import start_pod
    from avatar_release.trust.state_moves import publish_to_dev

    reg = LocalRegistry(registry)

    def prepare(r, ref):
        resolved, manifest = read_manifest(r, ref)
        configure_for_manifest(manifest)
        return resolved, manifest

    pod = start_pod(reg, "dev", prepare=prepare)
    a = pod.build.build_id
    resolved, manifest = read_manifest(reg, b_digest)
    publish_to_dev(reg, resolved, manifest, reason="bench_swap: dev moves to B")
    t0 = time.perf_counter()
    what = pod.check_channel()
    swap = time.perf_counter() - t0
    if what != "swapped" or pod.build.digest != b_digest:
        raise SystemExit(f"the pod did not swap to B: {what} ({pod.follow.refused_reason})")
    t = pod.build.timings
    return {
        "from": a,
        "to": pod.build.build_id,
        "swap_s": swap,
        "warm_chunk_s": pod.warm_seconds,
        "swap_load_s": swap - pod.warm_seconds,
        "load": t.to_json(),
        "compiles": pod.build.guard.count,
    }


def child_jit(cache: str) -> dict:
    """The JIT path's seconds for B in a process already serving A: its trace + lower, XLA's compile
    of each program (the persistent cache's hit), weights placed and one warm chunk. What compile_build
    does beyond a JIT (serializing, fingerprinting, cost analysis, packaging) is left out of ``jit_s``,
    which makes it the smallest figure the JIT path could reach here."""
    from avatar_release.machine import configure_compile_env
    from avatar_release.specs import load_target

    configure_compile_env(load_target("cpu-8"))
    import jax

    jax.config.update("jax_compilation_cache_dir", cache)
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
    jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)
    from _jit import jit_build  # benchmarks/_jit.py

    from avatar_release.serving import warm_up

    first, _ = jit_build("tiny", "cpu-8")  # the running JIT pod, serving A
    warm_up(first)
    t0 = time.perf_counter()
    build, res = jit_build("tiny", "cpu-8", overrides=OTHER)
    t_built = time.perf_counter()
    warm = warm_up(build)
    t_end = time.perf_counter()
    trace_lower = sum(e.trace_seconds + e.lower_seconds for e in res.executables)
    compile_s = sum(e.compile_seconds for e in res.executables)
    place = _place_seconds(res)
    return {
        "build": build.build_id,
        "jit_total_s": t_end - t0,
        "jit_build_s": t_built - t0,
        "warm_chunk_s": warm,
        "trace_lower_s": trace_lower,
        "compile_s": compile_s,
        "place_s": place,
        "jit_s": trace_lower + compile_s + place + warm,
        "cache_entries": len(os.listdir(cache)),
    }


def _place_seconds(res) -> float:
    """The seconds the JIT path takes to put its weights on the mesh."""
    from avatar_release._dtypes import np_dtype
    from avatar_release.runtime import assemble

    host = {t.name: t.data.view(np_dtype(t.dtype)).reshape(t.shape) for t in res.weight_tensors}
    t0 = time.perf_counter()
    assemble(res.manifest, res.compiled, host)
    return time.perf_counter() - t0


def _env(state: Path | None = None) -> dict:
    """A child's environment: no JAX settings of ours, and (``state``) a state directory of its own,
    since every run starts from a copy of one registry whose signed state moves in some of them."""
    env = {k: v for k, v in os.environ.items() if k not in ("XLA_FLAGS", "JAX_PLATFORMS")}
    if state is not None:
        env["AVATAR_RELEASE_STATE_DIR"] = str(state)
    env["AVATAR_RELEASE_PROJECT"] = str(ROOT)
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), *filter(None, [env.get("PYTHONPATH")])])
    return env


def run_ready(registry: str, state: Path) -> dict:
    """``avatar-release serve`` on dev (B): seconds from spawn to its ready line."""
    cmd = [
        sys.executable,
        "-m",
        "avatar_release",
        "serve",
        "dev",
        "--registry",
        registry,
        "--host",
        "127.0.0.1",
        "--port",
        "0",
        "--probe-port",
        "-1",
    ]
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, env=_env(state))
    try:
        line = proc.stdout.readline()
        ready = time.perf_counter() - t0
    finally:
        proc.terminate()
        proc.wait(60)
    if not line:
        raise SystemExit("the pod did not become ready")
    health = json.loads(line)
    load = health["load"]
    section = load["deserialize_and_weights"]
    warm = health["warm_chunk_seconds"]
    return {
        "ready_s": ready,
        "deserialize_and_weights_s": section,
        "load": load,
        "warm_chunk_s": warm,
        "ready_apart_s": ready - section,
        "ready_apart_no_warm_s": ready - section - warm,
    }


def run_bare(pod_env: bool = True) -> dict:
    env = _env()
    if pod_env:
        env.update(XLA_FLAGS="--xla_force_host_platform_device_count=8", JAX_PLATFORMS="cpu")
    t0 = time.perf_counter()
    subprocess.run(
        [sys.executable, "-c", "import jax; jax.devices()"],
        check=True,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    return {"bare_s": time.perf_counter() - t0}


def _child(mode: str, state: Path, *args: str) -> dict:
    out = subprocess.run(
        [sys.executable, __file__, "--child", mode, *args], capture_output=True, text=True, env=_env(state), timeout=900
    )
    if out.returncode != 0:
        raise SystemExit(f"{mode} run failed:\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


# ------------------------------------------------------------------------------ the parent
def _builds(tmp: Path, given: str | None) -> tuple[Path, str, str]:
    """(registry with A on dev and B beside it, A's digest, B's digest)."""
    from avatar_release.machine import configure_compile_env
    from avatar_release.registry import LocalRegistry, read_manifest
    from avatar_release.specs import load_target

    base = tmp / "base"
    if given:
        shutil.copytree(given, base)
        reg = LocalRegistry(str(base))
        a = read_manifest(reg, "dev")[0].digest
        others = [d for d in _digests(reg) if d != a]
        if others:
            return base, a, others[0]
    configure_compile_env(load_target("cpu-8"))
    from avatar_release.compile import compile_build

    reg = LocalRegistry(str(base))
    if not given:
        a = compile_build("tiny", "cpu-8", registry=reg).digest
    b = compile_build("tiny", "cpu-8", registry=reg, overrides=OTHER, move_dev=False).digest
    return base, a, b


def _digests(reg) -> list[str]:
    return [b.digest for b in reg.list_builds()]


def _stats(xs: list[float]) -> dict:
    return {
        "min": round(min(xs), 4),
        "median": round(statistics.median(xs), 4),
        "max": round(max(xs), 4),
        "runs": [round(x, 4) for x in xs],
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--registry", default=None, help="a registry holding A (on dev) and B; copied, never changed")
    ap.add_argument("--smoke", action="store_true", help="one run of each mode: proves the benchmark runs")
    ap.add_argument("--out", help="write the JSON here (default benchmarks/results/swap.json; --smoke: nowhere)")
    ap.add_argument("--child", choices=("swap", "jit"), help=argparse.SUPPRESS)
    ap.add_argument("args", nargs="*", help=argparse.SUPPRESS)
    a = ap.parse_args()
    os.environ.setdefault("AVATAR_RELEASE_PROJECT", str(ROOT))
    if a.child == "swap":
        print(json.dumps(child_swap(*a.args)))
        return
    if a.child == "jit":
        print(json.dumps(child_jit(*a.args)))
        return
    runs = 1 if a.smoke else a.runs
    out = out_path(a.out, "swap", smoke=a.smoke)
    with tempfile.TemporaryDirectory(prefix="bench-swap-") as tmp_name:
        tmp = Path(tmp_name)
        os.environ["AVATAR_RELEASE_STATE_DIR"] = str(tmp / "state")  # this machine's memory of signed state: ours
        base, a_digest, b_digest = _builds(tmp, a.registry)
        cache = tmp / "jax-cache"
        cache.mkdir()
        on_b = tmp / "on-b"  # the ready runs serve B, as a fresh pod after the swap would
        shutil.copytree(base, on_b)
        from avatar_release.registry import LocalRegistry, read_manifest
        from avatar_release.trust.state_moves import publish_to_dev

        reg_b = LocalRegistry(str(on_b))
        publish_to_dev(reg_b, *read_manifest(reg_b, b_digest), reason="bench_swap: ready runs serve B")
        # fills the persistent cache for A and B: not measured (--smoke: the one measured run fills it)
        filling = None if a.smoke else _child("jit", tmp / "state-jit", str(cache))
        results: dict[str, list[dict]] = {m: [] for m in MODES}
        for i in range(runs):
            order = MODES if i % 2 == 0 else tuple(reversed(MODES))
            for mode in order:
                if mode == "swap":
                    reg = tmp / f"swap-{i}"
                    shutil.copytree(base, reg)
                    r = _child("swap", tmp / f"state-swap-{i}", str(reg), b_digest)
                    shutil.rmtree(reg)
                elif mode == "jit":
                    r = _child("jit", tmp / "state-jit", str(cache))
                elif mode == "ready":
                    r = run_ready(str(on_b), tmp / f"state-ready-{i}")
                else:
                    r = run_bare(pod_env=mode == "bare")
                results[mode].append(r)
                print(f"  run {i + 1}/{runs} {mode:<5} {_headline(mode, r)}", file=sys.stderr)
    doc = _summary(results, a.smoke, runs)
    doc["jit_filling_the_cache"] = filling  # the same JIT run before the cache held B: its compile_s is XLA's own
    write_results(doc, out, smoke=a.smoke)


def _headline(mode: str, r: dict) -> str:
    key = {"swap": "swap_s", "jit": "jit_s", "ready": "ready_apart_s", "bare": "bare_s", "bare_default": "bare_s"}[mode]
    return f"{r[key]:.3f} s"


def _summary(results: dict[str, list[dict]], smoke: bool, runs: int) -> dict:
    med = {
        m: statistics.median(r[k] for r in results[m])
        for m, k in (("swap", "swap_s"), ("jit", "jit_s"), ("ready", "ready_apart_s"), ("bare", "bare_s"))
    }
    swap_load = statistics.median(r["swap_load_s"] for r in results["swap"])
    jit_no_warm = statistics.median(r["jit_s"] - r["warm_chunk_s"] for r in results["jit"])
    no_warm = statistics.median(r["ready_apart_no_warm_s"] for r in results["ready"])
    bare_default = statistics.median(r["bare_s"] for r in results["bare_default"])
    ratios = {
        "swap / JIT + warm cache": (med["swap"] / med["jit"], "<= 0.10"),
        "swap without its warm chunk / JIT + warm cache without its": (swap_load / jit_no_warm, ""),
        "fresh pod ready apart from deserialize and weights / bare import jax; jax.devices()": (
            med["ready"] / med["bare"],
            "<= 1.25",
        ),
        "the same without the warm chunk / bare": (no_warm / med["bare"], "<= 1.25"),
        "the same without the warm chunk / bare, no JAX settings (plugins probed)": (no_warm / bare_default, ""),
    }
    width = max(map(len, ratios))
    print(f"\ntiny cpu-8, 8 emulated CPU devices on {os.cpu_count()} cores, {runs} runs per mode (medians)")
    for name, (value, goal) in ratios.items():
        print(f"  {name:<{width}}  {value:8.3f}  {goal}")
    from importlib.metadata import version

    return {
        "smoke": smoke,
        "runs": runs,
        "cores": os.cpu_count(),
        "versions": {d: version(d) for d in ("jax", "jaxlib", "ml_dtypes")},
        "swap_s": _stats([r["swap_s"] for r in results["swap"]]),
        "swap_load_s": _stats([r["swap_load_s"] for r in results["swap"]]),
        "jit_s": _stats([r["jit_s"] for r in results["jit"]]),
        # the ready line itself and the section taken off it: work overlapped with that section leaves
        # the ratio, so whether the pod got ready sooner is read here
        "ready_s": _stats([r["ready_s"] for r in results["ready"]]),
        "ready_deserialize_and_weights_s": _stats([r["deserialize_and_weights_s"] for r in results["ready"]]),
        "ready_warm_chunk_s": _stats([r["warm_chunk_s"] for r in results["ready"]]),
        "ready_apart_s": _stats([r["ready_apart_s"] for r in results["ready"]]),
        "ready_apart_no_warm_s": _stats([r["ready_apart_no_warm_s"] for r in results["ready"]]),
        "bare_s": _stats([r["bare_s"] for r in results["bare"]]),
        "bare_default_s": _stats([r["bare_s"] for r in results["bare_default"]]),
        "ratios": {k: {"value": round(v, 4), "goal": g} for k, (v, g) in ratios.items()},
        "runs_by_mode": results,
    }


if __name__ == "__main__":
    main()
