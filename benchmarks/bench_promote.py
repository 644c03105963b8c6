"""Promotion cost, and registry throughput against a plain file copy.

* promotion: wall time of `promote` to staging and prod, and the blob bytes written by it
  (goal: 0; a promotion moves a pointer);
* push / pull of a real build's blobs: the local directory store, and (when the Debian
  `docker-registry` server is installed) a real OCI registry on 127.0.0.1, each as a ratio of
  a plain file copy of the same bytes.

    python benchmarks/bench_promote.py [--registry DIR] [--out benchmarks/results/promote.json]
    python benchmarks/bench_promote.py --smoke --registry DIR --out FILE   # a stand-in gate result; the tests run it

Nothing is asserted; ratios are printed side by side and written as JSON. ``--registry``: a
registry whose dev channel holds an ungated tiny build (default: compile one); it is copied, never
changed. ``--smoke`` stores a signed, passing stand-in gate result (``tests/unit/test_copy.gate``)
instead of running the gate (a minute of fresh serving processes): the promotion admits it alike.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from _out import ROOT, out_path, write_results  # noqa: E402 (benchmarks/_out.py, beside this file)

from avatar_release.registry import LocalRegistry, read_manifest  # noqa: E402


def _blob_bytes(root: Path) -> int:
    return sum(p.stat().st_size for p in (root / "blobs").rglob("*") if p.is_file())


def _copy_time(blobs: list[bytes], tmp: Path) -> float:
    src = tmp / "copy-src"
    dst = tmp / "copy-dst"
    src.mkdir()
    dst.mkdir()
    for i, b in enumerate(blobs):
        (src / str(i)).write_bytes(b)
    t0 = time.perf_counter()
    for i in range(len(blobs)):
        shutil.copyfile(src / str(i), dst / str(i))
    return time.perf_counter() - t0


def _push_pull(reg, blobs: list[bytes]) -> tuple[float, float]:
    from avatar_release._digest import sha256_digest

    t0 = time.perf_counter()
    for b in blobs:
        reg.put_blob(b)
    push = time.perf_counter() - t0
    t0 = time.perf_counter()
    for b in blobs:
        reg.get_blob(sha256_digest(b), len(b))
    return push, time.perf_counter() - t0


def _compiled(reg) -> None:
    from avatar_release.machine import configure_host_devices

    configure_host_devices(8)
    from avatar_release.compile import compile_build

    compile_build("tiny", "cpu-8", registry=reg)


def _gated(reg, build, *, stand_in: bool) -> None:
    """A passing gate result stored with ``build``: the gate's own, or a signed stand-in."""
    if stand_in:
        from tests.release_records import gate_with_frames  # signed by this machine's gate key, as the gate signs

        _, manifest = read_manifest(reg, build.digest)
        gate_with_frames(reg, build.build_id, build.digest, manifest)
        return
    from avatar_release.gates import run_gate

    run_gate(build.build_id, reg, baseline="none")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument(
        "--registry", help="a registry whose dev channel holds an ungated tiny build (default: compile one)"
    )
    ap.add_argument("--smoke", action="store_true", help="a stored stand-in gate result instead of a gate run")
    ap.add_argument("--out", help="write the JSON here (default benchmarks/results/promote.json; --smoke: nowhere)")
    args = ap.parse_args()
    os.environ.setdefault("AVATAR_RELEASE_PROJECT", str(ROOT))  # the bundled pipeline's specs, wherever it runs

    from avatar_release.promote import promote

    out: dict = {"smoke": args.smoke}
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        if args.registry:
            shutil.copytree(args.registry, tmp / "reg")
        reg = LocalRegistry(tmp / "reg")
        ref = "dev"
        if args.smoke and not args.registry:
            from tests.release_records import publish_with_blobs  # a stored manifest, every blob reference real bytes

            ref = publish_with_blobs(reg)[0]
            from avatar_release.trust.policy import load_policy
            from avatar_release.trust.state_write import init_state

            init_state(reg, load_policy())  # what `avatar-release registry init` does
        elif not args.registry:
            _compiled(reg)
        build, _ = read_manifest(reg, ref)
        out["build_id"] = build.build_id
        _gated(reg, build, stand_in=args.smoke)
        before = _blob_bytes(tmp / "reg")
        t0 = time.perf_counter()
        promote(reg, build.build_id, "staging")
        promote(reg, build.build_id, "prod")
        promo_s = time.perf_counter() - t0
        written = _blob_bytes(tmp / "reg") - before
        out["promotion"] = {
            "seconds_for_two_moves": round(promo_s, 4),
            "blob_bytes_written": written,
            "channels": {ch: reg.get_channel(ch).build_id for ch in ("staging", "prod")},
        }
        rows.append(("blob bytes written by two promotions", written, "0"))

        _, manifest = read_manifest(reg, build.digest)
        blobs = [reg.get_blob(r.digest, r.size) for r in manifest.blobs()]
        total = sum(len(b) for b in blobs)
        copy_s = _copy_time(blobs, tmp)
        local = LocalRegistry(tmp / "reg2")
        push, pull = _push_pull(local, blobs)
        out["bytes"] = total
        out["plain_copy_s"] = round(copy_s, 5)
        out["local"] = {"push_s": round(push, 5), "pull_s": round(pull, 5)}
        rows.append(("local store push / plain copy", push / copy_s, "-"))
        rows.append(("local store pull (verified) / plain copy", pull / copy_s, "-"))
        exe = shutil.which("docker-registry")
        if exe:
            from avatar_release.registry import open_registry
            from tests.oci_server import OciServer  # the same server the tests start

            server = OciServer(exe, tmp / "oci").start()
            try:
                oci = open_registry(server.uri("bench"))
                push, pull = _push_pull(oci, blobs)
            finally:
                server.stop()
            out["oci"] = {"push_s": round(push, 5), "pull_s": round(pull, 5)}
            rows.append(("OCI registry push / plain copy", push / copy_s, "-"))
            rows.append(("OCI registry pull (verified) / plain copy", pull / copy_s, "-"))
            out["oci"]["push_MBps"] = float(f"{total / push / 1e6:.3g}")  # 3 figures: a smoke run moves kB
            out["oci"]["pull_MBps"] = float(f"{total / pull / 1e6:.3g}")
        else:
            out["oci"] = "skipped: the docker-registry server is not installed"

    print(f"build blobs: {len(blobs)} files, {total / 1e6:.2f} MB; plain copy {copy_s * 1e3:.1f} ms")
    print(f"{'measure':<46} {'value':>10} {'goal':>6}")
    for name, v, goal in rows:
        print(f"{name:<46} {v:10.2f} {goal:>6}")
    write_results(out, out_path(args.out, "promote", smoke=args.smoke), smoke=args.smoke)


if __name__ == "__main__":
    main()
