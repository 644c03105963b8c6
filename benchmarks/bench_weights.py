"""Production-size weights: the loader's weight path against the anchors users would pick instead.

Synthetic bf16 weights (tensors of 4096 x 4096, 32 MiB; values ~N(0, 0.02) like trained weights,
each tensor a cheap variation of one random base so that writing gigabytes takes seconds) are
stored as ``compile`` stores them (build manifest v8): tensor-aligned chunks of at most 64 MiB,
content-addressed, in a directory registry, raw (the default) and, in a second registry, zstd
(``--weight-compression zstd``). Then every mode runs in a fresh process with JAX on 8 CPU devices
and a mesh ``fsdp=8`` (each tensor split along its first dimension), the modes alternated run
after run, ``--runs`` times each (min / median / max):

warm node (the bytes already on this node: the page cache is warm for every mode)

* **ours**: ``runtime._weights.stream_weights`` over the raw chunks, the loader's weight path:
  read, BLAKE3 against the manifest, placement of every tensor as its 8 shards;
* **ours-zstd**: the same over the zstd chunks (one bounded zstd decode per chunk besides);
* **safetensors**: the same tensors as one safetensors file, loaded with the ``safetensors``
  package's own loader (``safetensors.numpy.load_file``) and placed with ``jax.device_put`` on the
  same shardings: the anchor, with no checks at all;
* **zstd-1-thread**: one-thread zstd decoding of the zstd chunks, alone (the files read, decoded;
  no hashing, no placement): what decoding alone costs.

first pull (``--pull``; a loopback OCI registry, CNCF distribution's ``docker-registry``)

* **ours-pull**: the raw chunks pulled from the registry into an empty node cache
  (``registry.cache``: sha256 checked as each blob enters, concurrent pulls), then loaded as above;
* **safetensors-pull**: the safetensors file fetched from the same server as one blob into a file
  (its sha256 checked as it arrives), then loaded and placed as the safetensors anchor.

Memory (``--memory``): peak RSS of loading (``runtime.load``: placement, nothing run) and of
``avatar-release render`` of one chunk, for the tiny build and a tiny build with a wide DiT
(``--set dit.dim=2048 --set dit.depth=8 --set dit.heads=16``: 1.24 GB of weights), each in a fresh process; and of
``verify`` of the wide build (``--no-programs``, and with programs).

    python benchmarks/bench_weights.py [--sizes 0.5,2] [--runs 3] [--pull] [--memory]
    python benchmarks/bench_weights.py --smoke        # 16 MiB, one run: what the tests run
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import statistics
import struct
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from _out import out_path, write_results  # noqa: E402 (benchmarks/_out.py, beside this file)

SIDE = 4096  # a tensor is SIDE x SIDE bf16: 32 MiB
WARM_MODES = ("ours", "ours-zstd", "safetensors", "zstd-1-thread")
PULL_MODES = ("ours-pull", "safetensors-pull")
WIDE = ["dit.dim=2048", "dit.depth=8", "dit.heads=16"]  # 1.24 GB of weights; one chunk renders in tens of seconds


def _peak_rss() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


# ------------------------------------------------------------------------------------------ writer
def _base(side: int):
    import ml_dtypes
    import numpy as np

    rng = np.random.default_rng(0)
    return (rng.standard_normal(side * side, dtype=np.float32) * 0.02).astype(ml_dtypes.bfloat16).view(np.uint8)


def _variant(base, i: int):
    """Tensor i: the base with its low mantissa byte varied (cheap, distinct, as compressible)."""
    v = base.copy()
    v[0::2] ^= (i * 37 + 11) & 0x7F
    return v


def write(folder: Path, total_bytes: int, side: int) -> dict:
    """Two chunked registries (raw, zstd), the safetensors file, and the one-layer-change figure."""
    from avatar_release.compile._package import WEIGHTS_ZSTD_LEVEL
    from avatar_release.compile._weights import HostTensor, pack_chunks
    from avatar_release.records import WEIGHT_CHUNK_BYTES
    from avatar_release.registry import LocalRegistry

    folder.mkdir(parents=True, exist_ok=True)
    regs = {c: LocalRegistry(folder / f"reg-{c}") for c in ("none", "zstd")}
    n = max(1, total_bytes // (side * side * 2))
    names = [f"dit.blocks.{i:04d}.w" for i in range(n)]
    base = _base(side)
    chunks: dict[str, list] = {"none": [], "zstd": []}
    header = {
        nm: {"dtype": "BF16", "shape": [side, side], "data_offsets": [i * side * side * 2, (i + 1) * side * side * 2]}
        for i, nm in enumerate(names)
    }
    head = json.dumps(header).encode()
    head += b" " * (-len(head) % 8)
    # Equal tensors whose size divides the chunk size: the rule packs them ``per`` to a chunk, in
    # name order, so packing ``per`` at a time cuts exactly the chunks the whole list would.
    per = max(1, WEIGHT_CHUNK_BYTES // (side * side * 2))
    t0 = time.perf_counter()
    with open(folder / "w.safetensors", "wb") as st:
        st.write(struct.pack("<Q", len(head)) + head)
        for start in range(0, n, per):
            batch = [
                HostTensor(names[i], "bfloat16", (side, side), _variant(base, i))
                for i in range(start, min(start + per, n))
            ]
            for codec, reg in regs.items():
                packed, blobs = pack_chunks(batch, level=WEIGHTS_ZSTD_LEVEL, compression=codec)
                for z in blobs.values():
                    reg.put_blob(z)
                chunks[codec] += [c.model_dump(mode="json") for c in packed]
            for t in batch:
                st.write(t.data.tobytes())
    write_s = time.perf_counter() - t0
    # a build that changes one tensor: the chunk holding it is the only new blob
    first = [HostTensor(names[0], "bfloat16", (side, side), _variant(base, 10**6))]
    first += [HostTensor(names[i], "bfloat16", (side, side), _variant(base, i)) for i in range(1, min(per, n))]
    new, _ = pack_chunks(first, level=WEIGHTS_ZSTD_LEVEL, compression="none")
    stored = {c: sum(x["blob"]["size"] for x in chunks[c]) for c in chunks}
    new_bytes = sum(c.blob.size for c in new if c.blob.digest not in {x["blob"]["digest"] for x in chunks["none"]})
    (folder / "chunks.json").write_text(json.dumps({"chunks": chunks, "names": names, "side": side}))
    return {
        "tensors": n,
        "raw_bytes": n * side * side * 2,
        "stored_bytes": stored["none"],
        "zstd_bytes": stored["zstd"],
        "zstd_saves": round(1 - stored["zstd"] / stored["none"], 4),
        "chunks": len(chunks["none"]),
        "write_seconds": round(write_s, 2),
        "one_layer_change": {
            "layers": n,
            "uploaded_bytes": new_bytes,
            "share_of_weights": round(new_bytes / stored["none"], 4),
            "goal_at_most": round(2 / n, 4),
        },
    }


def push(folder: Path, uri: str) -> dict:
    """The raw chunks and the safetensors file into the OCI registry at ``uri`` (blobs only)."""
    from avatar_release.registry import LocalRegistry, OciRegistry

    doc = json.loads((folder / "chunks.json").read_text())
    oci, local = OciRegistry(uri), LocalRegistry(folder / "reg-none", create=False)
    for c in doc["chunks"]["none"]:
        oci.put_blob(local.get_blob(c["blob"]["digest"], c["blob"]["size"]))
    path = folder / "w.safetensors"
    digest = oci.push_blob_from(path)  # in PATCH pieces: a one-request PUT of gigabytes is refused
    pushed = {"uri": uri, "safetensors": {"digest": digest, "size": path.stat().st_size}}
    (folder / "pushed.json").write_text(json.dumps(pushed))
    return pushed


# ------------------------------------------------------------------------------------------ children
def _mesh_and_specs(doc: dict):
    from avatar_release.machine import configure_host_devices

    configure_host_devices(8)
    import jax
    import numpy as np
    from jax.sharding import Mesh

    mesh = Mesh(np.array(jax.devices("cpu")[:8]), ("fsdp",))
    from avatar_release.records import ArraySpec

    side = doc["side"]
    specs = [ArraySpec(name=nm, shape=[side, side], dtype="bfloat16", sharding=["fsdp", None]) for nm in doc["names"]]
    return mesh, specs


def _ours(reg, chunks: list, codec: str, specs: list, mesh) -> dict:
    from types import SimpleNamespace

    from avatar_release.records import WeightChunk, WeightsRecord
    from avatar_release.runtime._weights import stream_weights

    parsed = [WeightChunk.model_validate(c) for c in chunks]
    w = WeightsRecord(
        blob=None,
        raw_size=sum(c.raw_size for c in parsed),
        raw_digest="sha256:" + "0" * 64,
        tensors=len(specs),
        source="bench",
        chunks=parsed,
        compression=codec,
    )
    stage = SimpleNamespace(entry=SimpleNamespace(params=specs, key="dit/f8"), params={})
    return stream_weights(reg, SimpleNamespace(build_id="bench", weights=w), {("dit", "f8"): stage}, mesh).to_json()


def _safetensors(path: Path, specs: list, mesh) -> dict:
    import jax
    from safetensors.numpy import load_file

    from avatar_release.runtime._weights import sharding_of

    t0 = time.perf_counter()
    tensors = load_file(str(path))
    t1 = time.perf_counter()
    placed = [jax.device_put(tensors[s.name], sharding_of(mesh, s)) for s in specs]
    jax.block_until_ready(placed)
    return {"read": round(t1 - t0, 4), "place": round(time.perf_counter() - t1, 4)}


def child(mode: str, folder: Path, scratch: Path) -> dict:
    doc = json.loads((folder / "chunks.json").read_text())
    mesh, specs = _mesh_and_specs(doc)
    import jax

    jax.block_until_ready(jax.numpy.zeros(8))
    before = _peak_rss()
    import zstandard
    from safetensors.numpy import load_file  # noqa: F401 (imported before the clock starts, as every mode's code)

    from avatar_release.records import WeightChunk, WeightsRecord  # noqa: F401
    from avatar_release.registry import LocalRegistry, OciRegistry
    from avatar_release.registry.cache import CachedRegistry, NodeCache
    from avatar_release.runtime._weights import sharding_of, stream_weights  # noqa: F401

    out: dict = {"mode": mode, "rss_before_bytes": before}
    t0 = time.perf_counter()
    if mode in ("ours", "ours-zstd"):
        codec = "none" if mode == "ours" else "zstd"
        out["steps"] = _ours(
            LocalRegistry(folder / f"reg-{codec}", create=False), doc["chunks"][codec], codec, specs, mesh
        )
    elif mode == "ours-pull":
        pushed = json.loads((folder / "pushed.json").read_text())
        reg = CachedRegistry(OciRegistry(pushed["uri"]), NodeCache(scratch / "cache", max_bytes=1 << 40))
        out["steps"] = _ours(reg, doc["chunks"]["none"], "none", specs, mesh)
    elif mode == "safetensors":
        out["steps"] = _safetensors(folder / "w.safetensors", specs, mesh)
    elif mode == "safetensors-pull":
        pushed = json.loads((folder / "pushed.json").read_text())
        blob = pushed["safetensors"]
        path = scratch / "w.safetensors"

        def sink(pieces) -> None:
            with open(path, "wb") as f:
                for piece in pieces:
                    f.write(piece)

        OciRegistry(pushed["uri"]).stream_blob(blob["digest"], blob["size"], sink)  # sha256 checked on arrival
        t1 = time.perf_counter()
        out["steps"] = {"fetch": round(t1 - t0, 4), **_safetensors(path, specs, mesh)}
    elif mode == "zstd-1-thread":
        d = zstandard.ZstdDecompressor()
        reg = LocalRegistry(folder / "reg-zstd", create=False)
        for c in doc["chunks"]["zstd"]:
            hexd = c["blob"]["digest"].split(":")[1]
            d.decompress((reg.root / "blobs" / "sha256" / hexd).read_bytes(), max_output_size=c["raw_size"])
    elif mode != "baseline":
        raise SystemExit(f"unknown mode {mode}")
    out["seconds"] = round(time.perf_counter() - t0, 4)
    out["peak_rss_bytes"] = _peak_rss()
    return out


def _run_child(mode: str, folder: Path) -> dict:
    env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
    env.setdefault("JAX_PLATFORMS", "cpu")
    with tempfile.TemporaryDirectory(prefix="bench-weights-run-", dir=folder) as scratch:  # an empty cache each run
        r = subprocess.run(
            [sys.executable, __file__, "--child", mode, str(folder), scratch],
            capture_output=True,
            text=True,
            env=env,
            timeout=3600,
        )
    if r.returncode != 0:
        raise SystemExit(f"{mode} child failed:\n{r.stderr[-3000:]}")
    return json.loads(r.stdout.strip().splitlines()[-1])


def _spread(values: list[float]) -> dict:
    return {"min": min(values), "median": round(statistics.median(values), 4), "max": max(values)}


def _summarise(runs: dict[str, list[dict]], raw: int, baseline: dict) -> dict:
    out = {}
    for mode, rs in runs.items():
        over = [r["peak_rss_bytes"] - baseline["peak_rss_bytes"] for r in rs]
        out[mode] = {
            "seconds": _spread([r["seconds"] for r in rs]),
            "gb_per_s_at_median": round(raw / statistics.median(r["seconds"] for r in rs) / 1e9, 3),
            "peak_rss_over_baseline_bytes": _spread(over),
            "peak_rss_over_raw_weights_bytes": _spread([o - raw for o in over]),
            "runs": rs,
        }
    return out


def _ratio(summary: dict, a: str, b: str) -> float | None:
    if a not in summary or b not in summary:
        return None
    return round(summary[a]["seconds"]["median"] / summary[b]["seconds"]["median"], 3)


def measure_size(
    folder: Path, gib: float, side: int, runs: int, server, baseline: dict | None, only: list[str] | None = None
) -> tuple[dict, dict]:
    """Every mode at one size (``only``: just these), alternated run after run."""
    info = write(folder, int(gib * 2**30), side)
    modes = list(WARM_MODES)
    if server is not None:
        push(folder, server.uri(f"bench/w{str(gib).replace('.', '-')}"))
        modes += PULL_MODES
    modes = [m for m in modes if only is None or m in only]
    baseline = baseline or _run_child("baseline", folder)
    results: dict[str, list[dict]] = {m: [] for m in modes}
    for i in range(runs):  # alternated: each run takes every mode once, in a rotated order
        for mode in modes[i % len(modes) :] + modes[: i % len(modes)]:
            results[mode].append(_run_child(mode, folder))
    summary = _summarise(results, info["raw_bytes"], baseline)
    row = {
        "gib": gib,
        **info,
        "modes": summary,
        "ratios_of_medians": {
            "ours_vs_safetensors": _ratio(summary, "ours", "safetensors"),
            "ours_zstd_vs_safetensors": _ratio(summary, "ours-zstd", "safetensors"),
            "ours_vs_zstd_1_thread": _ratio(summary, "ours", "zstd-1-thread"),
            "ours_pull_vs_safetensors_pull": _ratio(summary, "ours-pull", "safetensors-pull"),
        },
    }
    return row, baseline


# ------------------------------------------------------------------------------------------ memory
def child_load(registry: str, build_id: str) -> dict:
    """Load a build as a pod does (``runtime.load``) and report the peak RSS: placement, no run."""
    from avatar_release.machine import configure_host_devices

    configure_host_devices(8)
    import jax

    jax.devices()
    before = _peak_rss()
    from avatar_release.runtime import load

    t0 = time.perf_counter()
    build = load(build_id, registry)
    temps = max((e.memory.get("temp_size", 0) for e in build.manifest.executables), default=0)
    return {
        "seconds": round(time.perf_counter() - t0, 3),
        "rss_jax_up_bytes": before,
        "peak_rss_bytes": _peak_rss(),
        "weight_path": build.timings.weight_path,
        "xla_temp_bytes_all_devices": temps * build.manifest.platform.device_count,
    }


def _cli_peak(args: list[str], module: list[str] | None = None) -> dict:
    """``avatar-release ARGS`` (or ``python MODULE...``) in a fresh process: seconds, its own peak RSS
    and its JSON answer."""
    t0 = time.perf_counter()
    cmd = [sys.executable, *(module or ["-m", "avatar_release"]), *args]
    proc = subprocess.Popen(
        cmd, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, env={**os.environ, "JAX_PLATFORMS": "cpu"}
    )
    text = proc.stdout.read()
    _, status, usage = os.wait4(proc.pid, 0)
    code = os.waitstatus_to_exitcode(status)
    if code != 0:
        raise SystemExit(f"{' '.join(cmd)} exited {code}")
    answer = json.loads(text) if text.strip() else {}  # the one JSON document the command prints
    return {"seconds": round(time.perf_counter() - t0, 2), "peak_rss_bytes": usage.ru_maxrss * 1024, "answer": answer}


def memory(tmp: Path, sets: list[str]) -> dict:
    """Peak RSS of loading (placement) and of rendering one chunk, for the tiny build and a wide one,
    and of verify on the wide one, each in a fresh process."""
    from avatar_release.registry import LocalRegistry, read_manifest

    out: dict = {"wide_set": sets}
    for name, extra in (("tiny", []), ("wide", sets)):
        reg = tmp / f"reg-{name}"
        print(f"compiling {name} ...", flush=True)
        _cli_peak(["compile", "--registry", str(reg), "--json"] + [x for s in extra for x in ("--set", s)])
        (ref,) = LocalRegistry(reg, create=False).list_builds()
        _, m = read_manifest(LocalRegistry(reg, create=False), ref.build_id)
        loaded = _cli_peak([str(reg), ref.build_id], module=[__file__, "--child-load"])
        rendered = _cli_peak(
            [
                "render",
                "--registry",
                str(reg),
                "--build",
                ref.build_id,
                "--seconds",
                "0.3",
                "--out",
                str(tmp / f"{name}.mp4"),
                "--json",
            ]
        )
        out[name] = {
            "build_id": ref.build_id,
            "raw_weight_bytes": m.weights.raw_size,
            "load": {"peak_rss_bytes": loaded["peak_rss_bytes"], **loaded["answer"]},
            "render_one_chunk": {k: rendered[k] for k in ("seconds", "peak_rss_bytes")},
        }
        if name == "wide":
            for key, flags in (("verify_no_programs", ["--no-programs"]), ("verify", [])):
                v = _cli_peak(["verify", ref.build_id, "--registry", str(reg), "--json", *flags])
                out[name][key] = {
                    "seconds": v["seconds"],
                    "peak_rss_bytes": v["peak_rss_bytes"],
                    "ok": v["answer"]["ok"],
                }
    raw = out["wide"]["raw_weight_bytes"] - out["tiny"]["raw_weight_bytes"]
    for what, key in (("load", "load"), ("render", "render_one_chunk")):
        over = out["wide"][key]["peak_rss_bytes"] - out["tiny"][key]["peak_rss_bytes"]
        out[f"{what}_rss_over_tiny_bytes"] = over
        out[f"{what}_rss_over_tiny_minus_raw_weights_bytes"] = over - raw
    # what XLA itself asks for while the wide program runs (its temporaries on every device: FSDP
    # gathers each layer's weights), beside the weights: the render's peak is not the placement's
    out["wide_xla_temp_bytes_all_devices"] = out["wide"]["load"]["xla_temp_bytes_all_devices"]
    out["verify_no_programs_peak_rss_bytes"] = out["wide"]["verify_no_programs"]["peak_rss_bytes"]
    out["verify_rss_over_tiny_load_bytes"] = (
        out["wide"]["verify"]["peak_rss_bytes"] - out["tiny"]["load"]["peak_rss_bytes"]
    )
    return out


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument(
        "--sizes",
        default="0.5,2",
        help="GiB of bf16 weights, comma separated (8 needs ~20 GiB free "
        "memory: the safetensors anchor holds the file and its placed copy)",
    )
    ap.add_argument("--runs", type=int, default=3, help="fresh-process runs of each mode, alternated")
    ap.add_argument(
        "--pull",
        action="store_true",
        help="also the first pull from a loopback OCI registry (docker-registry) into an empty node cache",
    )
    ap.add_argument("--memory", action="store_true", help="also the load, render and verify RSS of a wide build")
    ap.add_argument(
        "--modes",
        help=f"only these modes, comma separated (of {', '.join(WARM_MODES + PULL_MODES)}; default: all "
        "that apply), e.g. --pull --modes ours-pull,safetensors-pull for the first pull alone",
    )
    ap.add_argument("--smoke", action="store_true", help="16 MiB of 1024 x 1024 tensors, one run: seconds")
    ap.add_argument("--out")
    ap.add_argument("--keep", help="write the stores here and keep them")
    args = ap.parse_args(argv)
    sizes = [16 / 1024] if args.smoke else [float(x) for x in args.sizes.split(",") if x.strip()]  # "": none
    only = [m.strip() for m in args.modes.split(",")] if args.modes else None
    if only and (unknown := set(only) - set(WARM_MODES + PULL_MODES)):
        ap.error(f"--modes: unknown {', '.join(sorted(unknown))}; modes: {', '.join(WARM_MODES + PULL_MODES)}")
    if only and set(only) & set(PULL_MODES) and not args.pull:
        ap.error("--modes names a first-pull mode: add --pull (it starts the loopback registry)")
    side, runs = (1024, 1) if args.smoke else (SIDE, args.runs)
    tmp = Path(args.keep) if args.keep else Path(tempfile.mkdtemp(prefix="bench-weights-"))
    server = None
    rows, baseline, mem = [], None, None
    try:
        if args.pull:
            sys.path.insert(0, str(ROOT))
            from tests.oci_server import OciServer

            exe = shutil.which("docker-registry") or shutil.which("registry")
            if exe is None:
                raise SystemExit("--pull needs the docker-registry binary (apt-get install docker-registry)")
            server = OciServer(exe, tmp / "oci").start()
        for gib in sizes:
            folder = tmp / f"{gib:g}GiB"
            print(f"{gib:g} GiB ...", file=sys.stderr, flush=True)
            row, baseline = measure_size(folder, gib, side, runs, server, baseline, only)
            rows.append(row)
            if not args.keep:
                shutil.rmtree(folder, ignore_errors=True)
            _write(args, runs, baseline, rows, mem, pull=server is not None, echo=False)  # what is done so far
        if args.memory:
            mem = memory(tmp / "memory", WIDE)
    finally:
        if server is not None:
            server.stop()
        if not args.keep:
            shutil.rmtree(tmp, ignore_errors=True)
    return _write(args, runs, baseline, rows, mem, pull=args.pull, echo=True)


def _write(
    args: argparse.Namespace, runs: int, baseline: dict | None, rows: list, mem: dict | None, *, pull: bool, echo: bool
) -> dict:
    doc = {
        "benchmark": "weights",
        "smoke": args.smoke,
        "cores": os.cpu_count(),
        "runs_per_mode": runs,
        "node": "warm: every file in the page cache"
        + ("; pull: loopback docker-registry, empty node cache" if pull else ""),
        "baseline": baseline,
        "sizes": rows,
        "memory": mem,
        "goals": {
            "ours_vs_safetensors_median_at_most": 0.8,
            "ours_pull_vs_safetensors_pull_median_at_most": 1.2,
            "load_rss_over_tiny_minus_raw_weights_at_most_bytes": 512 << 20,
            "render_rss_over_tiny_minus_raw_weights_at_most_bytes": 512 << 20,
            "verify_no_programs_peak_rss_at_most_bytes": 256 << 20,
        },
    }
    result = write_results(doc, out_path(args.out, "weights", smoke=args.smoke), smoke=args.smoke, echo=echo)
    assert isinstance(result, dict)
    return result


if __name__ == "__main__":
    if sys.argv[1:2] == ["--child"]:
        print(json.dumps(child(sys.argv[2], Path(sys.argv[3]), Path(sys.argv[4]))))
    elif sys.argv[1:2] == ["--child-load"]:
        print(json.dumps(child_load(sys.argv[2], sys.argv[3])))
    else:
        main()
