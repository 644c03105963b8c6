"""Production-size weights: the streaming chunk loader against two anchors, at 0.5 to 8 GiB.

Synthetic bf16 weights (tensors of 4096 x 4096, 32 MiB; values ~N(0, 0.02) like trained weights,
each tensor a cheap variation of one random base so that writing 8 GiB takes seconds, not minutes)
are stored as ``compile`` stores them since build manifest v5: tensor-aligned chunks of at most
64 MiB, each zstd-compressed (the compiler's weight level) and content-addressed, in a directory
registry. Then, each in a fresh process with JAX on 8 CPU devices and a mesh ``fsdp=8``, side by
side:

* **ours**: ``runtime._weights.stream_weights``, the loader's weight path: fetch, sha256, bounded
  decompression, sha256 of the raw bytes, and placement of every tensor as its 8 shards, chunks
  side by side in worker threads;
* **safetensors**: the same tensors as one *uncompressed* safetensors file, loaded with the
  ``safetensors`` package's own loader (``safetensors.numpy.load_file``) and placed with
  ``jax.device_put`` on the same shardings: the anchor with no compression and no checks;
* **zstd-1-thread**: one-thread zstd decompression of the same compressed chunks, alone (no
  fetch through the registry, no hashing, no placement).

For each: seconds, GB/s of raw weights, peak RSS (VmHWM) and peak RSS over a process that only
started JAX and built the mesh. The page cache is warm for all three (the files were just
written). Also, per size, the stored bytes a build that changes one tensor (one layer) would
upload: the chunks whose digests change.

    python benchmarks/bench_weights.py [--sizes 0.5,2,4,8] [--out benchmarks/results/weights.json]
    python benchmarks/bench_weights.py --smoke        # 16 MiB: seconds; what the tests run
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
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
TENSOR_BYTES = SIDE * SIDE * 2


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
    """The chunked registry, the uncompressed safetensors file, and the one-layer-change figure."""
    from avatar_release.compile._package import WEIGHTS_ZSTD_LEVEL
    from avatar_release.compile._weights import HostTensor, pack_chunks
    from avatar_release.records import WEIGHT_CHUNK_BYTES
    from avatar_release.registry import LocalRegistry

    folder.mkdir(parents=True, exist_ok=True)
    reg = LocalRegistry(folder / "reg")
    n = max(1, total_bytes // (side * side * 2))
    names = [f"dit.blocks.{i:04d}.w" for i in range(n)]
    base = _base(side)
    chunks = []
    header = {nm: {"dtype": "BF16", "shape": [side, side], "data_offsets": [i * side * side * 2, (i + 1) * side * side * 2]}
              for i, nm in enumerate(names)}
    head = json.dumps(header).encode()
    head += b" " * (-len(head) % 8)
    t0 = time.perf_counter()
    with open(folder / "w.safetensors", "wb") as st:
        st.write(struct.pack("<Q", len(head)) + head)
        # Equal tensors whose size divides the chunk size: the rule packs them ``per`` to a chunk, in
        # name order, so packing ``per`` at a time cuts exactly the chunks the whole list would.
        per = max(1, WEIGHT_CHUNK_BYTES // (side * side * 2))
        for start in range(0, n, per):
            batch = [HostTensor(names[i], "bfloat16", (side, side), _variant(base, i)) for i in range(start, min(start + per, n))]
            packed, blobs = pack_chunks(batch, level=WEIGHTS_ZSTD_LEVEL)
            for z in blobs.values():
                reg.put_blob(z)
            chunks += [c.model_dump(mode="json") for c in packed]
            for t in batch:
                st.write(t.data.tobytes())
    write_s = time.perf_counter() - t0
    # a build that changes one tensor: the chunk holding it is the only new blob
    first = [HostTensor(names[0], "bfloat16", (side, side), _variant(base, 10**6))]
    first += [HostTensor(names[i], "bfloat16", (side, side), _variant(base, i)) for i in range(1, min(per, n))]
    new, _ = pack_chunks(first, level=WEIGHTS_ZSTD_LEVEL)
    stored = sum(c["blob"]["size"] for c in chunks)
    new_bytes = sum(c.blob.size for c in new if c.blob.digest not in {x["blob"]["digest"] for x in chunks})
    (folder / "chunks.json").write_text(json.dumps({"chunks": chunks, "names": names, "side": side}))
    return {"tensors": n, "raw_bytes": n * side * side * 2, "stored_bytes": stored, "chunks": len(chunks),
            "write_seconds": round(write_s, 2),
            "one_layer_change": {"layers": n, "uploaded_bytes": new_bytes, "share_of_weights": round(new_bytes / stored, 4),
                                 "goal_at_most": round(2 / n, 4)}}


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


def child(mode: str, folder: Path) -> dict:
    from types import SimpleNamespace

    doc = json.loads((folder / "chunks.json").read_text())
    mesh, specs = _mesh_and_specs(doc)
    import jax

    jax.block_until_ready(jax.numpy.zeros(8))
    before = _peak_rss()
    from avatar_release.records import WeightChunk

    import zstandard
    from safetensors.numpy import load_file

    from avatar_release.records import WeightsRecord
    from avatar_release.registry import LocalRegistry
    from avatar_release.runtime._weights import sharding_of, stream_weights

    chunks = [WeightChunk.model_validate(c) for c in doc["chunks"]]
    out: dict = {"mode": mode, "rss_before_bytes": before}
    t0 = time.perf_counter()
    if mode == "ours":
        reg = LocalRegistry(folder / "reg", create=False)
        w = WeightsRecord(blob=None, raw_size=sum(c.raw_size for c in chunks), raw_digest="sha256:" + "0" * 64,
                          tensors=len(specs), source="bench", chunks=chunks)
        stage = SimpleNamespace(entry=SimpleNamespace(params=specs, key="dit/f8"), params={})
        stats = stream_weights(reg, SimpleNamespace(build_id="bench", weights=w), {("dit", "f8"): stage}, mesh)
        out["steps"] = stats.to_json()
    elif mode == "safetensors":
        tensors = load_file(str(folder / "w.safetensors"))
        t1 = time.perf_counter()
        placed = [jax.device_put(tensors[s.name], sharding_of(mesh, s)) for s in specs]
        jax.block_until_ready(placed)
        out["steps"] = {"read": round(t1 - t0, 4), "place": round(time.perf_counter() - t1, 4)}
    elif mode == "zstd-1-thread":
        d = zstandard.ZstdDecompressor()
        root = folder / "reg" / "blobs" / "sha256"
        for c in chunks:
            hexd = c.blob.digest.split(":")[1]
            path = next(p for p in (root / hexd[:2] / hexd, root / hexd) if p.exists())
            d.decompress(path.read_bytes(), max_output_size=c.raw_size)
    elif mode != "baseline":
        raise SystemExit(f"unknown mode {mode}")
    out["seconds"] = round(time.perf_counter() - t0, 4)
    out["peak_rss_bytes"] = _peak_rss()
    return out


def _run_child(mode: str, folder: Path) -> dict:
    env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
    env.setdefault("JAX_PLATFORMS", "cpu")
    r = subprocess.run([sys.executable, __file__, "--child", mode, str(folder)], capture_output=True, text=True,
                       env=env, timeout=3600)
    if r.returncode != 0:
        raise SystemExit(f"{mode} child failed:\n{r.stderr[-3000:]}")
    return json.loads(r.stdout.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sizes", default="0.5,2,4,8", help="GiB of bf16 weights, comma separated")
    ap.add_argument("--smoke", action="store_true", help="16 MiB of 1024 x 1024 tensors: seconds")
    ap.add_argument("--out")
    ap.add_argument("--keep", help="write the stores here and keep them")
    args = ap.parse_args(argv)
    sizes = [16 / 1024] if args.smoke else [float(x) for x in args.sizes.split(",")]
    side = 1024 if args.smoke else SIDE
    tmp = Path(args.keep) if args.keep else Path(tempfile.mkdtemp(prefix="bench-weights-"))
    rows = []
    baseline = None
    try:
        for gib in sizes:
            folder = tmp / f"{gib:g}GiB"
            info = write(folder, int(gib * 2**30), side)
            if baseline is None:
                baseline = _run_child("baseline", folder)
            runs = {m: _run_child(m, folder) for m in ("ours", "safetensors", "zstd-1-thread")}
            raw = info["raw_bytes"]
            for r in runs.values():
                r["gb_per_s"] = round(raw / r["seconds"] / 1e9, 3)
                r["peak_rss_over_baseline_bytes"] = r["peak_rss_bytes"] - baseline["peak_rss_bytes"]
                r["peak_rss_over_raw_weights_bytes"] = r["peak_rss_over_baseline_bytes"] - raw
            ours = runs["ours"]
            rows.append({"gib": gib, **info, "runs": runs,
                         "ours_vs_safetensors": round(ours["seconds"] / runs["safetensors"]["seconds"], 3),
                         "ours_vs_zstd_1_thread": round(ours["seconds"] / runs["zstd-1-thread"]["seconds"], 3)})
            if not args.keep:
                shutil.rmtree(folder, ignore_errors=True)
    finally:
        if not args.keep:
            shutil.rmtree(tmp, ignore_errors=True)
    doc = {"benchmark": "weights", "smoke": args.smoke, "cores": os.cpu_count(), "baseline": baseline, "sizes": rows,
           "goals": {"ours_vs_zstd_1_thread_at_most": 1.0, "ours_vs_safetensors_at_most": 1.5,
                     "peak_rss_over_raw_weights_at_most_bytes": 512 << 20}}
    return write_results(doc, out_path(args.out, None, smoke=args.smoke), smoke=args.smoke, echo=True)


if __name__ == "__main__":
    if sys.argv[1:2] == ["--child"]:
        print(json.dumps(child(sys.argv[2], Path(sys.argv[3]))))
    else:
        main()
