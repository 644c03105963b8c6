"""Attack cost: the loader's peak memory on a zstd bomb, and what the new integrity checks add to a
cold load.

* Peak RSS of a fresh process refusing a bomb vs one loading the build normally (VmHWM:
  ``ru_maxrss`` of an exec'd child carries its parent's peak on Linux). Bombs: 16 GiB of zeros
  declared honestly, and 1 GiB of zeros under the real raw size (a lying manifest). Goal: < 2x a
  normal load (they are refused before allocating, so below 1x).
* Added verification: bounding the declared sizes, streamed + hashed decompression instead of
  one-shot decompression, and reading each loaded executable's fingerprint; as a share of a cold
  load. Goal: <= 2%. Also all integrity checks together (identity and seal, every blob's sha256,
  bounds, raw digests, fingerprints).
* The compression ratios of the build's blobs, against ``MAX_ZSTD_RATIO``.

Each measurement is a fresh process; the median of N runs is reported.

    python benchmarks/bench_attacks.py [--runs 3] [--registry DIR] [--out benchmarks/results/attacks.json]
    python benchmarks/bench_attacks.py --smoke --registry DIR --out FILE   # one run each; the tests run it

``--registry``: a registry whose dev channel holds a tiny cpu-8 build (default: compile one); it is
only read, the bombs are planted in copies.
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
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from _out import out_path, write_results  # noqa: E402 (benchmarks/_out.py, beside this file)

_CHILD = r"""
import json, resource, sys, time
resource.setrlimit(resource.RLIMIT_AS, (8 << 30, 8 << 30))  # were a bound lost, fail here, not the host
from avatar_release.machine import configure_host_devices
configure_host_devices(8)
from avatar_release.errors import AvatarReleaseError
from avatar_release.registry import LocalRegistry
from avatar_release.runtime import load
import jax  # imported before timing, as in bench_trust: the cold load is what the loader does
reg = LocalRegistry(sys.argv[1], create=False)
out = {}
t0 = time.perf_counter()
try:
    b = load(sys.argv[2], reg)
    out["ok"] = True
except AvatarReleaseError as e:
    out.update(ok=False, error=str(e)[:300], exit_code=e.exit_code)
out["total"] = time.perf_counter() - t0
# Not ru_maxrss: Linux keeps the pre-exec high-water mark, so a child reports at least its
# parent's peak (measured: 813 MiB for a child of an 800 MiB parent). VmHWM is this process's.
out["maxrss_kib"] = next(int(l.split()[1]) for l in open("/proc/self/status") if l.startswith("VmHWM:"))
if out["ok"] and sys.argv[3] == "time":
    import hashlib, zstandard
    from avatar_release.records import check_identity
    from avatar_release.runtime._blobs import build_blobs, check_bounds, codec_of, decompress, raw_of
    from avatar_release.runtime._unpickle import check_fingerprint
    m, t = b.manifest, b.timings
    # the zstd blobs (a v8 build's weight chunks are raw: nothing to decompress)
    blobs = [(what, ref, reg.get_blob(ref.digest, ref.size)) for what, ref in build_blobs(m) if codec_of(m, what) == "zstd"]
    def clock(f, n=5):
        best = float("inf")
        for _ in range(n):
            s = time.perf_counter(); f(); best = min(best, time.perf_counter() - s)
        return best
    def streamed():
        for what, ref, data in blobs:
            size, digest = raw_of(m, what)
            decompress(data, size, digest, where=what)
    def one_shot():  # the loader before this change: one call, then sha256 of the result
        d = zstandard.ZstdDecompressor()
        for what, ref, data in blobs:
            size, digest = raw_of(m, what)
            raw = d.decompress(data, max_output_size=size)
            assert "sha256:" + hashlib.sha256(raw).hexdigest() == digest
    def fingerprints():
        for ls in b.stages.values():
            check_fingerprint(m, ls.entry, ls.executable)
    out.update(
        identity=clock(lambda: check_identity(m)), bounds=clock(lambda: check_bounds(m)),
        streamed=clock(streamed), one_shot=clock(one_shot), fingerprint=clock(fingerprints),
        blob_verify=t.verify, deserialize=t.deserialize,
        ratios={what: round(raw_of(m, what)[0] / ref.size, 2) for what, ref, _ in blobs},
        compile_seconds=round(sum(e.compile_seconds for e in m.executables), 3),
    )
print(json.dumps(out))
"""


def _child(root: Path, ref: str, mode: str) -> dict:
    out = subprocess.run(
        [sys.executable, "-c", _CHILD, str(root), ref, mode],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(ROOT), "JAX_PLATFORMS": "cpu"},
        check=True,
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


def _plant_bomb(reg, root: Path, build_id: str, *, raw_bytes: int, declared: int | None) -> str:
    """Put zeros as a chain of 1 MiB zstd frames in place of dit/f8, the manifest rewritten as a
    registry writer would (seal and identity recomputed, same build id). Returns the build id."""
    import zstandard

    from avatar_release.records import manifest_seal
    from avatar_release.registry import read_manifest

    _, m = read_manifest(reg, build_id)
    frame = zstandard.ZstdCompressor(level=19).compress(bytes(1 << 20))
    data = frame * (raw_bytes >> 20)
    dit = m.executable("dit", "f8")
    blob = dit.blob.model_copy(update={"digest": reg.put_blob(data), "size": len(data)})
    changes = {"blob": blob, "raw_size": declared if declared is not None else raw_bytes}
    m = m.model_copy(
        update={"executables": [e.model_copy(update=changes) if e.key == "dit/f8" else e for e in m.executables]}
    )
    m = m.model_copy(update={"seal": manifest_seal(m)})
    (root / "builds" / build_id).unlink()
    reg.put_build(build_id, m.to_json_bytes())
    return build_id


def _compiled(root: Path) -> str:
    from avatar_release.machine import configure_host_devices

    configure_host_devices(8)
    from avatar_release.compile import compile_build
    from avatar_release.registry import LocalRegistry

    return compile_build("tiny", "cpu-8", registry=LocalRegistry(root)).build_id


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--registry", help="a registry whose dev channel holds a tiny build (default: compile one)")
    ap.add_argument("--smoke", action="store_true", help="one fresh process per measurement: proves the benchmark runs")
    ap.add_argument("--out", help="write the JSON here (default benchmarks/results/attacks.json; --smoke: nowhere)")
    args = ap.parse_args()
    os.environ.setdefault("AVATAR_RELEASE_PROJECT", str(ROOT))  # the bundled pipeline's specs, wherever it runs
    if args.smoke:
        args.runs = 1

    from avatar_release.registry import LocalRegistry, read_manifest

    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        good = Path(args.registry) if args.registry else tmp / "good"
        build_id = (
            _compiled(good)
            if args.registry is None
            else read_manifest(LocalRegistry(good, create=False), "dev")[0].build_id
        )
        normal = [_child(good, build_id, "time") for _ in range(args.runs)]

        bombs = {}
        _, real = read_manifest(LocalRegistry(good, create=False), build_id)
        for name, raw_bytes, declared in [
            ("honest 16 GiB", 16 << 30, None),
            ("lying: 1 GiB under the real raw size", 1 << 30, real.executable("dit", "f8").raw_size),
        ]:
            root = tmp / name.split()[0].rstrip(":")
            shutil.copytree(good, root)
            _plant_bomb(LocalRegistry(root), root, build_id, raw_bytes=raw_bytes, declared=declared)
            bombs[name] = [_child(root, build_id, "refuse") for _ in range(args.runs)]
            assert all(not r["ok"] and r["exit_code"] == 4 for r in bombs[name]), bombs[name]

    med = lambda rows, k: statistics.median(r[k] for r in rows)  # noqa: E731
    total = med(normal, "total")
    streaming = max(0.0, med(normal, "streamed") - med(normal, "one_shot"))  # bounded + hashed vs one call
    added = med(normal, "bounds") + med(normal, "fingerprint") + streaming
    every = (
        med(normal, "identity")
        + med(normal, "blob_verify")
        + med(normal, "bounds")
        + med(normal, "streamed")
        - med(normal, "one_shot")
        + med(normal, "fingerprint")
    )
    rss = med(normal, "maxrss_kib")
    result = {
        "runs": args.runs,
        "smoke": args.smoke,
        "build_id": build_id,
        "cold_load_s": round(total, 4),
        "normal_load_maxrss_mib": round(rss / 1024, 1),
        "bombs": {
            name: {"maxrss_mib": round(med(rows, "maxrss_kib") / 1024, 1), "refused": rows[0]["error"]}
            for name, rows in bombs.items()
        },
        "seconds": {
            k: round(med(normal, k), 6)
            for k in ("identity", "bounds", "streamed", "one_shot", "fingerprint", "blob_verify", "deserialize")
        },
        "compression_ratios": normal[0]["ratios"],
        "compile_seconds": normal[0]["compile_seconds"],
        "ratios": {
            **{
                f"peak RSS: {name} / normal load": round(med(rows, "maxrss_kib") / rss, 3)
                for name, rows in bombs.items()
            },
            "added verification / cold load": round(added / total, 4),
            "all integrity checks / cold load": round(every / total, 4),
            "compile-side fingerprint round trip (~ deserialize) / compile": round(
                med(normal, "deserialize") / normal[0]["compile_seconds"], 4
            ),
        },
    }
    from avatar_release.runtime._blobs import MAX_ZSTD_RATIO

    print(f"cold load (median of {args.runs} fresh processes): {total:.3f}s, peak RSS {rss / 1024:.0f} MiB")
    print(f"compression ratios (raw / stored): {result['compression_ratios']} (bound {MAX_ZSTD_RATIO}x)")
    goals = {
        "peak RSS": ("< 2", lambda v: v < 2),
        "added verification": ("<= 0.02", lambda v: v <= 0.02),
        "all integrity": ("", None),
        "compile-side": ("", None),
    }
    print(f"{'measure':<62} {'ratio':>8} {'goal':>8}")
    for name, v in result["ratios"].items():
        goal, ok = next(g for k, g in goals.items() if name.startswith(k))
        verdict = "" if ok is None else ("ok" if ok(v) else "MISSED")
        print(f"{name:<62} {v:8.4f} {goal:>8}  {verdict}")
    write_results(result, out_path(args.out, "attacks", smoke=args.smoke), smoke=args.smoke)


if __name__ == "__main__":
    main()
