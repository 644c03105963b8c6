"""OCI registry throughput and copy cost on loopback, against skopeo.

* **1 GiB blob, push and pull** (random bytes, so nothing compresses) to a CNCF distribution server
  (Debian ``docker-registry``, as the tests start it) on 127.0.0.1 over plain HTTP:
  - ours: ``OciRegistry.push_blob_from`` (one upload session, PATCH chunks) and
    ``OciRegistry.pull_blob_to`` (streamed, hashed as it arrives, renamed once verified), each in a
    child process of its own, timed and its peak RSS read from ``wait4``;
  - skopeo: ``skopeo copy --preserve-digests`` of the same bytes, as the one layer of an OCI layout
    (hard-linked, not copied) to ``docker://`` and back to ``dir:``, timed and measured the same way.
    ``--preserve-digests`` stops skopeo from gzipping the layer on the way (it compresses
    uncompressed layers for registries by default), so both move the same bytes.
  Goals: ours at most 1.5x skopeo's time, our peak RSS at most 200 MB.
* **copy of a tiny build between two registries** (two servers): the ``tiny`` pipeline compiled for
  cpu-8 into a directory store, with a stored gate result and a signed promotion to staging, copied
  directory -> registry A -> registry B -> a second directory: requests made and seconds for A -> B
  (and for the same copy again, a no-op), and the round trip byte-identical (manifest, every blob,
  every record, the OCI manifest between the registries; the statement verifies at the end).

    python benchmarks/bench_registry.py [--size-mib 1024] [--skip-copy] [--out benchmarks/results/registry.json]
    python benchmarks/bench_registry.py --smoke --out FILE   # 1 MiB, a stand-in build (no compile); the tests run it

Nothing is asserted; results are printed side by side as ratios and written as JSON. The 1 GiB
files (source, registry storage, pulled copies) live in one temporary directory, deleted at the end;
the run refuses to start with less than five times the blob free there. ``--smoke`` moves a 1 MiB
blob and copies a stand-in build (``tests/unit/test_copy.publish``: a stored manifest whose every
blob reference names real bytes, nothing compiled) along the same path.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from _out import out_path, write_results  # noqa: E402 (benchmarks/_out.py, beside this file)

PUSH_GOAL, RSS_GOAL_MB = 1.5, 200


# ---- child processes: one measured operation each ---------------------------------------------------------
def _child(op: str, uri: str, path: str, digest: str = "", size: int = 0) -> None:
    """Run in a fresh interpreter: one push or pull, then print its own timing as JSON."""
    from avatar_release.registry import OciRegistry

    reg = OciRegistry(uri, lock_dir=tempfile.gettempdir())
    t0 = time.perf_counter()
    if op == "push":
        digest = reg.push_blob_from(path)
    else:
        reg.pull_blob_to(digest, size, path)
    seconds = time.perf_counter() - t0
    print(
        json.dumps(
            {
                "seconds": seconds,
                "digest": digest,
                "requests": reg.transport.requests,
                "peak_rss_mb": _vm_hwm_mb("self"),
            }
        )
    )


def _vm_hwm_mb(pid: int | str) -> float | None:
    """The peak resident set of a running process (VmHWM), in MB; None once it has exited."""
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    return None


def _measured(cmd: list[str], env: dict | None = None) -> dict:
    """Run ``cmd``: its wall time, its peak RSS and its stdout.

    The peak is the process's own VmHWM, sampled every 10 ms while it runs. Not ``wait4``'s
    ``ru_maxrss``: a child forked from this (large) Python process inherits its high-water mark
    through exec, so that would report this process, not the child."""
    import threading

    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        t0 = time.perf_counter()
        proc = subprocess.Popen(cmd, stdout=out, stderr=err, env=env)
        peak = [0.0]
        done = threading.Event()

        def sample() -> None:
            while not done.is_set():
                now = _vm_hwm_mb(proc.pid)
                if now is not None:
                    peak[0] = max(peak[0], now)
                done.wait(0.01)

        sampler = threading.Thread(target=sample, daemon=True)
        sampler.start()
        proc.wait()
        wall = time.perf_counter() - t0
        done.set()
        sampler.join()
        out.seek(0)
        err.seek(0)
        stdout, stderr = out.read().decode(), err.read().decode()
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd[:3])}... exited {proc.returncode}: {stderr[-2000:]}")
    return {"wall_s": wall, "peak_rss_mb": peak[0], "stdout": stdout}


def _ours(op: str, uri: str, path: Path, digest: str = "", size: int = 0) -> dict:
    r = _measured([sys.executable, __file__, "--child", op, uri, str(path), digest, str(size)])
    inner = json.loads(r.pop("stdout").strip().splitlines()[-1])
    # its own VmHWM at the end: exact (the sampled one can miss a last peak)
    r["peak_rss_mb"] = max(r["peak_rss_mb"], inner["peak_rss_mb"])
    return {**r, "op_s": inner["seconds"], "requests": inner["requests"], "digest": inner["digest"]}


def _skopeo(*args: str) -> dict:
    r = _measured(["skopeo", "copy", "--quiet", "--preserve-digests", *args])
    r.pop("stdout")
    return r


# ---- the 1 GiB blob ----------------------------------------------------------------------------------------
def _random_file(path: Path, size: int) -> str:
    h = hashlib.sha256()
    with open(path, "wb") as f:
        left = size
        while left:
            chunk = os.urandom(min(left, 16 << 20))
            h.update(chunk)
            f.write(chunk)
            left -= len(chunk)
    return "sha256:" + h.hexdigest()


def _oci_layout(layout: Path, blob: Path, digest: str, size: int) -> None:
    """An OCI image layout whose one layer is ``blob`` (hard-linked), tagged ``bench``."""
    shas = layout / "blobs" / "sha256"
    shas.mkdir(parents=True)
    os.link(blob, shas / digest.removeprefix("sha256:"))

    def put(doc: dict) -> dict:
        data = json.dumps(doc).encode()
        d = hashlib.sha256(data).hexdigest()
        (shas / d).write_bytes(data)
        return {"digest": "sha256:" + d, "size": len(data)}

    config = put({"architecture": "amd64", "os": "linux", "rootfs": {"type": "layers", "diff_ids": [digest]}})
    manifest = put(
        {
            "schemaVersion": 2,
            "mediaType": "application/vnd.oci.image.manifest.v1+json",
            "config": {"mediaType": "application/vnd.oci.image.config.v1+json", **config},
            "layers": [{"mediaType": "application/vnd.oci.image.layer.v1.tar", "digest": digest, "size": size}],
        }
    )
    (layout / "oci-layout").write_text('{"imageLayoutVersion": "1.0.0"}')
    (layout / "index.json").write_text(
        json.dumps(
            {
                "schemaVersion": 2,
                "manifests": [
                    {
                        "mediaType": "application/vnd.oci.image.manifest.v1+json",
                        **manifest,
                        "annotations": {"org.opencontainers.image.ref.name": "bench"},
                    }
                ],
            }
        )
    )


def bench_blob(tmp: Path, size: int, exe: str) -> dict:
    from tests.oci_server import OciServer  # the same server the tests start

    src = tmp / "blob.bin"
    print(f"writing {size >> 20} MiB of random bytes ...", flush=True)
    digest = _random_file(src, size)
    server = OciServer(exe, tmp / "server").start()
    try:
        ours_uri = server.uri(f"bench/ours-{uuid.uuid4().hex[:8]}")
        skopeo_ref = f"docker://{server.host}/bench/skopeo-{uuid.uuid4().hex[:8]}:v1"
        _oci_layout(tmp / "layout", src, digest, size)

        print("push: ours ...", flush=True)
        push = _ours("push", ours_uri, src)
        assert push["digest"] == digest, push
        print("push: skopeo ...", flush=True)
        s_push = _skopeo("--dest-tls-verify=false", "oci:" + str(tmp / "layout") + ":bench", skopeo_ref)

        print("pull: ours ...", flush=True)
        pulled = tmp / "pulled.bin"
        pull = _ours("pull", ours_uri, pulled, digest, size)
        same = pulled.stat().st_size == size and _file_sha256(pulled) == digest
        pulled.unlink()
        print("pull: skopeo ...", flush=True)
        s_pull = _skopeo("--src-tls-verify=false", skopeo_ref, "dir:" + str(tmp / "skopeo-pulled"))
        s_same = _file_sha256(tmp / "skopeo-pulled" / digest.removeprefix("sha256:")) == digest
        shutil.rmtree(tmp / "skopeo-pulled")
    finally:
        server.stop()
    return {
        "size_bytes": size,
        "digest": digest,
        "push": {"ours": push, "skopeo": s_push, "ratio": push["wall_s"] / s_push["wall_s"]},
        "pull": {
            "ours": pull,
            "skopeo": s_pull,
            "ratio": pull["wall_s"] / s_pull["wall_s"],
            "ours_byte_identical": same,
            "skopeo_byte_identical": s_same,
        },
    }


def _file_sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(16 << 20), b""):
            h.update(chunk)
    return "sha256:" + h.hexdigest()


# ---- copy of a tiny build between two registries --------------------------------------------------------------
def _compiled(src) -> str:
    from avatar_release.machine import configure_compile_env
    from avatar_release.specs import load_target

    configure_compile_env(load_target("cpu-8"))  # as `compile` does: 8 CPU devices, JAX on CPU only
    from avatar_release.compile import compile_build

    print("compiling tiny for cpu-8 ...", flush=True)
    return compile_build("tiny", "cpu-8", registry=src).build_id


def _stand_in(src) -> str:
    from tests.release_records import publish_with_blobs  # a stored manifest, every blob reference real bytes

    return publish_with_blobs(src)[0]


def bench_copy(tmp: Path, exe: str, *, smoke: bool) -> dict:
    from avatar_release.ops import copy_build
    from avatar_release.promote import promote
    from avatar_release.registry import LocalRegistry, OciRegistry, read_manifest
    from avatar_release.trust.keys import generate_keypair, load_private_key, load_public_key
    from avatar_release.trust.policy import load_policy
    from avatar_release.trust.state_read import state_exists
    from avatar_release.trust.state_write import init_state
    from avatar_release.trust.statements import verify_channel
    from tests.oci_server import OciServer
    from tests.release_records import (
        gate_with_frames,
        records_of,
    )  # a stored, signed, passing gate result; every record

    src = LocalRegistry(tmp / "src")
    build_id = _stand_in(src) if smoke else _compiled(src)
    if not state_exists(src):  # a stand-in build: the registry's signed state, as `registry init` makes it
        init_state(src, load_policy())
    resolved, m = read_manifest(src, build_id)
    gate_with_frames(src, build_id, resolved.digest, m)
    priv, pub, _ = generate_keypair(tmp / "keys")
    promote(src, build_id, "staging", signing_key=load_private_key(priv))
    servers = [OciServer(exe, tmp / f"server-{n}").start() for n in ("a", "b")]
    try:
        a, b = (OciRegistry(s.uri("bench/tiny"), lock_dir=tmp / "locks") for s in servers)
        to_a = copy_build(src, a, "staging", channel="staging")
        requests_to_a = a.transport.requests
        before = a.transport.requests, b.transport.requests
        a_to_b = copy_build(a, b, "staging", channel="staging")
        requests = a.transport.requests - before[0] + b.transport.requests - before[1]
        before = a.transport.requests, b.transport.requests
        again = copy_build(a, b, "staging", channel="staging")
        requests_again = a.transport.requests - before[0] + b.transport.requests - before[1]
        home = LocalRegistry(tmp / "home")
        back = copy_build(b, home, "staging", channel="staging")
        identical = {
            "manifest": home.get_manifest_bytes(back.destination_digest) == src.get_manifest_bytes(resolved.digest),
            "blobs": all(home.get_blob(r.digest, r.size) == src.get_blob(r.digest, r.size) for r in m.blobs()),
            "records": records_of(home, build_id) == records_of(b, build_id) == records_of(src, build_id),
            "oci_manifest_a_b": a.build_artifact(a_to_b.source_digest) == b.build_artifact(a_to_b.destination_digest),
        }
        verify_channel(home, "staging", load_public_key(pub), digest=back.destination_digest)
        identical["statement_verifies_at_home"] = True
    finally:
        for s in servers:
            s.stop()
    return {
        "build_id": build_id,
        "compiled": not smoke,
        "blobs": a_to_b.blobs_copied,
        "bytes": a_to_b.bytes_copied,
        "records": len(a_to_b.records_copied),
        "local_to_a": {"requests": requests_to_a, "seconds": to_a.seconds},
        "a_to_b": {"requests": requests, "seconds": a_to_b.seconds},
        "a_to_b_again": {"requests": requests_again, "seconds": again.seconds},
        "b_to_local": {"seconds": back.seconds},
        "round_trip_identical": identical,
    }


# ---- report --------------------------------------------------------------------------------------------------
def _report(out: dict) -> None:
    blob = out.get("blob")
    if isinstance(blob, dict):
        mib = blob["size_bytes"] / 2**20
        print(f"\n{mib:.0f} MiB blob on loopback     ours          skopeo        ours/skopeo  goal")
        for op in ("push", "pull"):
            o, s = blob[op]["ours"], blob[op]["skopeo"]
            print(
                f"  {op:5s} time              {o['wall_s']:6.2f} s      {s['wall_s']:6.2f} s      "
                f"{blob[op]['ratio']:5.2f}x       <= {PUSH_GOAL}x  ({mib / o['wall_s']:.0f} vs "
                f"{mib / s['wall_s']:.0f} MiB/s; ours {o['op_s']:.2f} s in the call, {o['requests']} requests)"
            )
            print(
                f"  {op:5s} peak RSS          {o['peak_rss_mb']:6.1f} MB     {s['peak_rss_mb']:6.1f} MB     "
                f"{o['peak_rss_mb'] / s['peak_rss_mb']:5.2f}x       <= {RSS_GOAL_MB} MB"
            )
        print(
            f"  pulled bytes identical: ours {blob['pull']['ours_byte_identical']}, "
            f"skopeo {blob['pull']['skopeo_byte_identical']}"
        )
    else:
        print(f"\nblob: {blob}")
    c = out.get("copy")
    if isinstance(c, dict):
        print(
            f"\ncopy of {c['build_id']} ({c['blobs']} blobs, {c['bytes'] / 2**20:.1f} MiB, {c['records']} records) "
            "between two registries"
        )
        print(f"  dir -> A        {c['local_to_a']['requests']:4d} requests  {c['local_to_a']['seconds']:.2f} s")
        print(
            f"  A -> B          {c['a_to_b']['requests']:4d} requests  {c['a_to_b']['seconds']:.2f} s"
            "  (both registries' requests)"
        )
        print(f"  A -> B again    {c['a_to_b_again']['requests']:4d} requests  {c['a_to_b_again']['seconds']:.2f} s")
        print(f"  round trip (dir -> A -> B -> dir) identical: {c['round_trip_identical']}")
    elif c is not None:
        print(f"\ncopy: {c}")


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        op, uri, path, digest, size = sys.argv[2:7]
        return _child(op, uri, path, digest, int(size))
    ap = argparse.ArgumentParser()
    ap.add_argument("--size-mib", type=int, default=1024)
    ap.add_argument("--skip-copy", action="store_true", help="only the blob push/pull")
    ap.add_argument("--skip-blob", action="store_true", help="only the copy between registries")
    ap.add_argument("--smoke", action="store_true", help="a 1 MiB blob, and a stand-in build copied (no compile)")
    ap.add_argument("--out", help="write the JSON here (default benchmarks/results/registry.json; --smoke: nowhere)")
    args = ap.parse_args()
    os.environ.setdefault("AVATAR_RELEASE_PROJECT", str(ROOT))  # the bundled pipeline's specs, wherever it runs
    if args.smoke:
        args.size_mib = 1
    exe = shutil.which("docker-registry") or shutil.which("registry")
    out: dict = {"smoke": args.smoke, "host": {"cpus": os.cpu_count()}}
    with tempfile.TemporaryDirectory(prefix="bench-registry-") as tmp:
        tmp = Path(tmp)
        free = shutil.disk_usage(tmp).free
        need = 5 * (args.size_mib << 20)  # the source, the registry's copy, the pulled copies, slack
        if exe is None:
            out["blob"] = out["copy"] = (
                "skipped: docker-registry is not installed (Debian: apt-get install docker-registry)"
            )
        else:
            if args.skip_blob:
                out["blob"] = "skipped (--skip-blob)"
            elif shutil.which("skopeo") is None:
                out["blob"] = "skipped: skopeo is not installed"
            elif free < need:
                out["blob"] = f"skipped: {free >> 20} MiB free in {tmp}, the run needs {need >> 20}"
            else:
                out["blob"] = bench_blob(tmp, args.size_mib << 20, exe)
            out["copy"] = "skipped (--skip-copy)" if args.skip_copy else bench_copy(tmp, exe, smoke=args.smoke)
    _report(out)
    write_results(out, out_path(args.out, "registry", smoke=args.smoke), smoke=args.smoke, default=str)


if __name__ == "__main__":
    main()
