"""Evidence you cannot forge: attacks by someone who can write to the registry but holds none of
our keys, on a real build. Each is refused as an integrity error (exit 4) naming what failed,
before anything runs and without a traceback. (Bit flips, truncation and endless blobs are in
test_faults.py; planted pickles and signatures in test_trust_loading.py.)
"""

from __future__ import annotations

import hashlib
import json
import os
import pickle
import shutil
import subprocess
import sys

import numpy as np
import pytest
import zstandard

from avatar_release._digest import sha256_digest
from avatar_release.errors import IntegrityError
from avatar_release.records import Manifest, build_id_for, check_identity, manifest_identity
from avatar_release.registry import LocalRegistry, read_manifest
from avatar_release.runtime import load
from avatar_release.runtime._blobs import MAX_ZSTD_RATIO
from tests.helpers import cli, local_blob_path, resealed

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def other_build(tmp_path_factory, build_cache):
    """Another real build of the same shapes (a reassociation variant): its executables would
    load in A's place and compute other numbers."""
    root = tmp_path_factory.mktemp("other") / "reg"
    result = build_cache.compile("tiny", "cpu-8", registry=LocalRegistry(root), overrides={"matmul_k_split": "2"})
    return root, result


def _republish(reg: LocalRegistry, root, m: Manifest) -> Manifest:
    """What a writer who knows the format does: recompute identity, build id and seal, replace the
    build's commit marker, point dev at it."""
    m = resealed(m)
    (root / "builds" / m.build_id).unlink(missing_ok=True)
    digest, _ = reg.put_build(m.build_id, m.to_json_bytes())
    current = reg.get_channel("dev")
    reg.move_channel(
        "dev",
        reg.resolve(digest),
        expected_digest=current.digest if current else None,
        action="publish",
        who="attacker",
        reason="",
    )
    return m


def _with_entry(m: Manifest, key: str, **changes) -> Manifest:
    return m.model_copy(
        update={"executables": [e.model_copy(update=changes) if e.key == key else e for e in m.executables]}
    )


def _swap_payload(reg: LocalRegistry, root, build_id: str, key: str, raw: bytes) -> Manifest:
    """Put ``raw`` (zstd-compressed, every digest and size made to match) in place of ``key``."""
    _, m = read_manifest(reg, build_id)
    z = zstandard.ZstdCompressor().compress(raw)
    blob = m.executable(*key.split("/")).blob.model_copy(update={"digest": reg.put_blob(z), "size": len(z)})
    return _republish(reg, root, _with_entry(m, key, blob=blob, raw_size=len(raw), raw_digest=sha256_digest(raw)))


# ------------------------------------------------------------------------------ a program swapped
def test_a_program_swapped_in_under_an_unchanged_build_id_is_refused(registry_copy, other_build, tmp_path):
    root, a = registry_copy
    reg = LocalRegistry(root)
    _, ma = read_manifest(reg, a.build_id)
    other_root, b = other_build
    _, mb = read_manifest(LocalRegistry(other_root, create=False), b.build_id)
    theirs, ours = mb.executable("dit", "f8"), ma.executable("dit", "f8")
    assert theirs.fingerprint != ours.fingerprint  # really another program
    shutil.copy(local_blob_path(other_root, theirs.blob.digest), local_blob_path(root, theirs.blob.digest))

    # B's executable bytes under A's entry: the blob, its raw size and digest; the seal recomputed.
    # The fields the identity covers (hlo_digest, fingerprint) stay A's, so the build id is A's.
    swapped = _republish(
        reg, root, _with_entry(ma, "dit/f8", blob=theirs.blob, raw_size=theirs.raw_size, raw_digest=theirs.raw_digest)
    )
    assert swapped.build_id == a.build_id and swapped.identity == ma.identity
    check_identity(swapped)  # identity and seal agree: an unkeyed hash is no defence here

    with pytest.raises(IntegrityError) as e:
        load(a.build_id, reg)
    message = str(e.value)
    assert "executable dit/f8" in message and ours.fingerprint in message and theirs.fingerprint in message

    res = cli("verify", a.build_id, "--registry", str(root), "--json")
    assert res.exit_code == 4, res.output
    rows = {r["what"]: r for r in json.JSONDecoder().raw_decode(res.output)[0]["blobs"]}
    assert not rows["dit/f8"]["ok"] and theirs.fingerprint in rows["dit/f8"]["error"]
    assert rows["manifest"]["ok"] and rows["sr/f8"]["ok"] and "fingerprint" in rows["sr/f8"]["note"]

    out = tmp_path / "out.mp4"
    res = cli("render", "--build", a.build_id, "--registry", str(root), "--out", str(out), "--seconds", "0.3")
    assert res.exit_code == 4 and "dit/f8" in res.output, res.output
    assert not out.exists()  # nothing rendered

    # Recording B's fingerprint too moves the identity: no longer A's build id.
    forged = _with_entry(swapped, "dit/f8", fingerprint=theirs.fingerprint, hlo_digest=theirs.hlo_digest)
    assert build_id_for(forged.pipeline, forged.target, manifest_identity(forged)) != a.build_id
    # ... and relabelling the manifest as version 2 (whose fingerprints are not checkable) does too.
    relabelled = swapped.model_copy(update={"schema_version": 2})
    assert manifest_identity(relabelled) != swapped.identity
    with pytest.raises(IntegrityError, match="hash to identity"):
        check_identity(relabelled)


def test_an_honest_build_verifies_every_program(built_registry):
    root, a = built_registry
    res = cli("verify", a.build_id, "--registry", str(root), "--json")
    assert res.exit_code == 0, res.output
    rows = json.loads(res.stdout)["blobs"]
    assert [r["what"] for r in rows] == ["manifest", "weights chunk 0", "dit/f8", "sr/f8", "vae/f8"]
    assert all(r["ok"] for r in rows)
    assert all("fingerprint" in r["note"] and "matches" in r["note"] for r in rows[2:])


# ------------------------------------------------------------------------------ zstd bombs
_CHILD = r"""
import json, resource, sys
# A safety net for the shared test machine: were the bound ever lost, the bomb fails here.
resource.setrlimit(resource.RLIMIT_AS, (4 << 30, 4 << 30))
from avatar_release.machine import configure_host_devices
configure_host_devices(8)
from avatar_release.errors import AvatarReleaseError
from avatar_release.registry import LocalRegistry
from avatar_release.runtime import load
try:
    load(sys.argv[2], LocalRegistry(sys.argv[1], create=False))
    out = {"ok": True}
except AvatarReleaseError as e:
    out = {"ok": False, "error": type(e).__name__, "message": str(e), "exit_code": e.exit_code}
# Not ru_maxrss: Linux keeps the pre-exec high-water mark, so a child reports at least its
# parent's peak (measured: 813 MiB for a child of an 800 MiB parent). VmHWM is this process's.
out["maxrss_kib"] = next(int(l.split()[1]) for l in open("/proc/self/status") if l.startswith("VmHWM:"))
print(json.dumps(out))
"""


def _load_in_child(root, ref) -> dict:
    res = subprocess.run(
        [sys.executable, "-c", _CHILD, str(root), ref],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": os.getcwd()},
        timeout=300,
    )
    assert res.returncode == 0, res.stderr[-2000:]
    return json.loads(res.stdout.strip().splitlines()[-1])


def _bomb(raw_bytes: int) -> bytes:
    """Zeros as a chain of 1 MiB zstd frames: a few dozen bytes per MiB."""
    frame = zstandard.ZstdCompressor(level=19).compress(bytes(1 << 20))
    return frame * (raw_bytes >> 20)


def _zeros_digest(raw_bytes: int) -> str:
    h, chunk = hashlib.sha256(), bytes(1 << 20)
    for _ in range(raw_bytes >> 20):
        h.update(chunk)
    return "sha256:" + h.hexdigest()


def test_zstd_bombs_are_refused_before_allocating_with_honest_or_lying_sizes(registry_copy):
    root, a = registry_copy
    reg = LocalRegistry(root)
    _, m = read_manifest(reg, a.build_id)
    normal = _load_in_child(root, a.build_id)
    assert normal["ok"], normal

    def plant(data: bytes, raw_size: int, raw_digest: str) -> None:
        blob = m.executable("dit", "f8").blob.model_copy(update={"digest": reg.put_blob(data), "size": len(data)})
        _republish(reg, root, _with_entry(m, "dit/f8", blob=blob, raw_size=raw_size, raw_digest=raw_digest))

    honest = 256 << 20  # sizes and digest all true: 256 MiB of zeros in ~12 KB
    plant(_bomb(honest), honest, _zeros_digest(honest))
    got = _load_in_child(root, a.build_id)
    assert got["exit_code"] == 4 and "dit/f8" in got["message"] and f"at most {MAX_ZSTD_RATIO}x" in got["message"]
    assert f"declares {honest} raw bytes" in got["message"] and "before decompressing" in got["message"]
    assert got["maxrss_kib"] < 2 * normal["maxrss_kib"], (got, normal)

    # The same bomb, 16 GiB, the manifest saying so (the digest left unchecked: refused before).
    plant(_bomb(16 << 30), 16 << 30, "sha256:" + "0" * 64)
    got = _load_in_child(root, a.build_id)
    assert got["exit_code"] == 4 and f"declares {16 << 30} raw bytes" in got["message"]
    assert got["maxrss_kib"] < 2 * normal["maxrss_kib"], (got, normal)

    # Lying small: the manifest keeps the real program's raw size (within every bound); the frame
    # decompresses to 1 GiB. The stream stops one byte past the declared size.
    real = m.executable("dit", "f8")
    plant(_bomb(1 << 30), real.raw_size, real.raw_digest)
    got = _load_in_child(root, a.build_id)
    assert got["exit_code"] == 4 and f"more than the {real.raw_size} bytes" in got["message"], got
    assert got["maxrss_kib"] < 2 * normal["maxrss_kib"], (got, normal)

    # Lying large: the real blob, its raw size claimed 16 GiB.
    blob = real.blob
    _republish(reg, root, _with_entry(m, "dit/f8", blob=blob, raw_size=16 << 30))
    got = _load_in_child(root, a.build_id)
    assert got["exit_code"] == 4 and f"declares {16 << 30} raw bytes from a {blob.size}-byte" in got["message"]
    assert got["maxrss_kib"] < 2 * normal["maxrss_kib"], (got, normal)

    # Within the ratio but not within memory: a stored size claimed 1 TiB (refused before fetching it).
    huge = blob.model_copy(update={"size": 1 << 40})
    _republish(reg, root, _with_entry(m, "dit/f8", blob=huge))
    with pytest.raises(IntegrityError, match="more than this (host's physical memory|process's cgroup)"):
        load(a.build_id, reg)
    res = cli("verify", a.build_id, "--registry", str(root))
    assert res.exit_code == 4 and "dit/f8" in res.output


# ------------------------------------------------------------------------------ malformed pickles
class _Persistent(pickle.Pickler):
    def persistent_id(self, obj):
        return obj[1] if isinstance(obj, tuple) and obj and obj[0] == "pid" else None


def _with_pid(pid) -> bytes:
    import io

    f = io.BytesIO()
    _Persistent(f).dump((("pid", pid), [], False))
    return f.getvalue()


@pytest.mark.parametrize(
    "kind", ["truncated", "not-a-triple", "unknown-device", "garbage-executable", "too-few-leaves", "another-stage"]
)
def test_malformed_pickles_are_integrity_errors_naming_the_executable(registry_copy, kind):
    root, a = registry_copy
    reg = LocalRegistry(root)
    _, m = read_manifest(reg, a.build_id)

    def raw_of(key):
        e = m.executable(*key.split("/"))
        return zstandard.ZstdDecompressor().decompress(
            reg.get_blob(e.blob.digest, e.blob.size), max_output_size=e.raw_size
        )

    payload = {
        "truncated": lambda: raw_of("dit/f8")[:5000],
        "not-a-triple": lambda: pickle.dumps((1, 2)),
        "unknown-device": lambda: _with_pid(("device", 999)),  # KeyError inside jax's unpickler
        "garbage-executable": lambda: _with_pid(("exec", b"\x00not an executable")),
        "too-few-leaves": lambda: pickle.dumps((None, [], False)),  # ValueError: Too few leaves
        "another-stage": lambda: raw_of("vae/f8"),  # its argument info does not fit dit's in_tree
    }[kind]()
    _swap_payload(reg, root, a.build_id, "dit/f8", payload)
    with pytest.raises(IntegrityError, match="executable dit/f8"):
        load(a.build_id, reg)
    res = cli("verify", a.build_id, "--registry", str(root))
    assert res.exit_code == 4 and "dit/f8" in res.output, res.output


# ------------------------------------------------------------------------------ corrupt registry files
@pytest.mark.parametrize(
    "path, data, commands",
    [
        ("channels/dev.json", b"\x00garbage{", [["ls"], ["inspect", "dev"]]),
        ("channels/dev.json", b'{"state": 5, "entry": []}', [["ls"], ["inspect", "dev"]]),
        ("builds/{build}", b"garbage", [["ls"], ["inspect", "{build}"], ["verify", "{build}"]]),
        (
            "builds/{build}",
            b'{"build_id": "tiny-cpu-8-000000000000", "digest": "sha256:00", "published_at": ""}',
            [["ls"], ["verify", "{build}"]],
        ),
        ("history.jsonl", b"garbage\n{history}", [["gc", "--prune-builds", "--dry-run"]]),
        ("records/gate-results/{build}", b"garbage", [["ls"]]),
        ("records/compile-gates/{build}", b"[1, 2", [["ls"]]),
    ],
)
def test_corrupt_registry_files_are_refused_naming_the_file(registry_copy, path, data, commands):
    root, a = registry_copy
    path = path.format(build=a.build_id)
    target = root / path
    target.parent.mkdir(parents=True, exist_ok=True)
    old = target.read_bytes() if target.exists() else b""
    target.write_bytes(data.replace(b"{history}", old))
    named = path.removeprefix("records/")  # records are named by namespace/name, as their readers do
    for command in commands:
        res = cli(*[c.format(build=a.build_id) for c in command], "--registry", str(root))
        assert res.exit_code == 4, (command, res.output)
        assert named in res.output, (command, res.output)
    if path.startswith(("channels/", "history")):  # the plain mirror: `history` reads the signed state
        res = cli("history", "--registry", str(root))
        assert res.exit_code == 0 and a.build_id in res.output, res.output


def test_a_torn_history_line_from_a_crash_is_still_tolerated(registry_copy):
    """A crash mid-append is not an attack: the torn line is skipped (the channel file carries the
    entry), and after the next move repairs the log it stays skipped."""
    root, a = registry_copy
    history = root / "history.jsonl"
    *before, last = history.read_bytes().splitlines(keepends=True)
    history.write_bytes(b"".join(before) + last[: len(last) // 2])  # the dev move's append, cut short
    res = cli("history", "--registry", str(root))
    assert res.exit_code == 0 and "dev" in res.output
    reg = LocalRegistry(root)
    reg.move_channel("staging", reg.resolve(a.build_id), expected_digest=None, action="promote", who="t", reason="")
    lines = history.read_bytes().splitlines()
    assert lines[-3] == last[: len(last) // 2] and lines[-2] == last.rstrip(b"\n")  # closed, then re-appended
    assert [e.channel for e in reg.history()][-1] == "staging"  # the plain history reads past the torn line


# ------------------------------------------------------------------------------ what a manifest asks of the process
def _cli_process(*args, root) -> subprocess.CompletedProcess:
    """`avatar-release ARGS --registry ROOT` in another process: a signal (XLA's abort, a fault)
    shows as a negative return code, where CliRunner would take the test process down with it."""
    return subprocess.run(
        [sys.executable, "-m", "avatar_release", *map(str, args), "--registry", str(root)],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": os.getcwd()},
        timeout=600,
    )


def _refused(proc: subprocess.CompletedProcess, *needles: str) -> None:
    output = proc.stdout + proc.stderr
    assert proc.returncode == 4, f"exit {proc.returncode}, expected 4 (negative: a signal)\n{output[-3000:]}"
    assert "Traceback" not in output and all(n in output for n in needles), output[-3000:]


def _with_platform(reg: LocalRegistry, root, build_id: str, **changes) -> Manifest:
    _, m = read_manifest(reg, build_id)
    return _republish(reg, root, m.model_copy(update={"platform": m.platform.model_copy(update=changes)}))


def test_a_manifest_asking_for_2048_devices_is_refused_before_xla_sees_it(registry_copy, tmp_path):
    """XLA:CPU was asked for 2048 host devices, then for 2048-device programs: SIGABRT, before."""
    root, a = registry_copy
    forged = _with_platform(LocalRegistry(root), root, a.build_id, device_count=2048, mesh_shape=[2048])
    why = ("platform.device_count", "2048", "expected 1 to 512")
    _refused(_cli_process("verify", forged.build_id, root=root), *why)
    out = tmp_path / "out.mp4"
    _refused(_cli_process("render", "--build", forged.build_id, "--out", out, "--seconds", "0.3", root=root), *why)
    assert not out.exists()


def test_a_manifest_whose_programs_were_compiled_for_other_devices_is_refused(registry_copy, tmp_path):
    """16 devices is within every bound, but the programs were compiled for 8: XLA CHECK-fails
    loading an executable onto another number of devices (SIGABRT, before)."""
    root, a = registry_copy
    forged = _with_platform(LocalRegistry(root), root, a.build_id, device_count=16, mesh_shape=[16])
    why = ("compiled for 8 device(s)", "asks to load it on 16")
    _refused(
        _cli_process(
            "render", "--build", forged.build_id, "--out", tmp_path / "out.mp4", "--seconds", "0.3", root=root
        ),
        "executable dit/f8",
        *why,
    )
    _refused(_cli_process("verify", forged.build_id, root=root), "dit/f8", "sr/f8", "vae/f8", *why)
    # ... and a mesh that does not multiply out to the device count, before anything starts
    odd = _with_platform(LocalRegistry(root), root, a.build_id, mesh_shape=[4])
    _refused(_cli_process("verify", odd.build_id, root=root), "platform.mesh_shape", "[4]", "product")


@pytest.mark.parametrize(
    "flag, why",
    [
        ("--xla_no_such_flag=1", "'xla_no_such_flag' is not an XLA flag a flag profile may set"),  # XLA: fatal, before
        ("--xla_dump_to={dump}", "'xla_dump_to' is not an XLA flag"),  # the loader would write there
        ("--xla_cpu_enable_fast_math=false --xla_dump_to={dump}", "no spaces"),  # one entry, two flags in XLA_FLAGS
        ("--xla_cpu_enable_fast_math=maybe", "takes true or false"),
    ],
)
def test_an_unknown_xla_flag_in_a_manifest_is_refused_before_xla_sees_it(registry_copy, tmp_path, flag, why):
    root, a = registry_copy
    reg = LocalRegistry(root)
    _, m = read_manifest(reg, a.build_id)
    flag = flag.format(dump=tmp_path / "dump")
    forged = _republish(reg, root, m.model_copy(update={"flags": m.flags.model_copy(update={"env_flags": [flag]})}))
    out = tmp_path / "out.mp4"
    _refused(
        _cli_process("render", "--build", forged.build_id, "--out", out, "--seconds", "0.3", root=root),
        "flags.env_flags[0]",
        why,
    )
    _refused(_cli_process("verify", forged.build_id, root=root), "flags.env_flags[0]", why)
    assert not out.exists() and not (tmp_path / "dump").exists()  # nothing rendered, nothing dumped


# ------------------------------------------------------------------------------ a chunk truncated while it loads
# `render`, with the file of weights chunk 0 cut in half in place at the moment its bytes start to
# be read (a raw v8 chunk: its read from the store; a zstd one: the first zstd reader opened once
# the weight path started). A loader that mapped the file (as it did for chunks of a mebibyte and
# more) then reads past the file's new end: SIGBUS.
_TRUNCATING_RENDER = r"""
import os, sys
import zstandard
import avatar_release.runtime._load as load_module
from avatar_release.registry import LocalRegistry

path, size = sys.argv[1], int(sys.argv[2])
weights_started = []
stream_weights = load_module.stream_weights

def started(*args, **kwargs):
    weights_started.append(True)
    return stream_weights(*args, **kwargs)

load_module.stream_weights = started
Decompressor = zstandard.ZstdDecompressor

class Truncating:
    def __init__(self, *args, **kwargs):
        self._d = Decompressor(*args, **kwargs)

    def stream_reader(self, *args, **kwargs):
        if weights_started and os.path.getsize(path) == size:
            os.truncate(path, size // 2)
            print("truncated", path, file=sys.stderr)
        return self._d.stream_reader(*args, **kwargs)

    def __getattr__(self, name):
        return getattr(self._d, name)

zstandard.ZstdDecompressor = Truncating
read_blob_into = LocalRegistry.read_blob_into

def truncating_read(self, digest, size_, out):
    if weights_started and os.path.getsize(path) == size:
        os.truncate(path, size // 2)
        print("truncated", path, file=sys.stderr)
    return read_blob_into(self, digest, size_, out)

LocalRegistry.read_blob_into = truncating_read
from avatar_release.cli import main
main(sys.argv[3:])
"""


def _with_a_large_weight_chunk(reg: LocalRegistry, root, build_id: str) -> Manifest:
    """The build with a weight chunk of more than a mebibyte stored (the tiny build's is 0.5 MiB):
    its tensors and 1.5 MiB of incompressible bytes nothing reads, packed as compile packs them."""
    from avatar_release.compile._package import WEIGHTS_ZSTD_LEVEL
    from avatar_release.compile._weights import HostTensor, chunk_table_digest, pack_chunks

    _, m = read_manifest(reg, build_id)
    (chunk,) = m.weights.chunks
    stored = reg.get_blob(chunk.blob.digest, chunk.blob.size)
    raw = (
        stored
        if m.weights.chunk_codec == "none"
        else zstandard.ZstdDecompressor().decompress(stored, max_output_size=chunk.raw_size)
    )
    flat = np.frombuffer(raw, np.uint8)
    tensors = [HostTensor(t.name, t.dtype, tuple(t.shape), flat[t.offset : t.offset + t.nbytes]) for t in chunk.tensors]
    tensors.append(
        HostTensor("zz.unused", "uint8", (3 << 19,), np.random.default_rng(0).integers(0, 256, 3 << 19, np.uint8))
    )
    chunks, blobs = pack_chunks(tensors, level=WEIGHTS_ZSTD_LEVEL, compression=m.weights.compression)
    assert len(chunks) == 1 and chunks[0].blob.size > 1 << 20
    for z in blobs.values():
        reg.put_blob(z)
    weights = m.weights.model_copy(
        update={
            "chunks": chunks,
            "raw_size": chunks[0].raw_size,
            "tensors": len(tensors),
            "raw_digest": chunk_table_digest(chunks, m.weights.compression),
        }
    )
    return _republish(reg, root, m.model_copy(update={"weights": weights}))


def test_a_weight_chunk_truncated_while_it_loads_is_refused_not_a_signal(registry_copy, tmp_path):
    root, a = registry_copy
    reg = LocalRegistry(root)
    big = _with_a_large_weight_chunk(reg, root, a.build_id)
    load(big.build_id, reg)  # whole, the build loads
    (chunk,) = big.weights.chunks
    path = local_blob_path(root, chunk.blob.digest)
    out = tmp_path / "out.mp4"
    proc = subprocess.run(
        [
            sys.executable,
            "-c",
            _TRUNCATING_RENDER,
            str(path),
            str(chunk.blob.size),
            "render",
            "--build",
            big.build_id,
            "--registry",
            str(root),
            "--out",
            str(out),
            "--seconds",
            "0.3",
        ],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": os.getcwd()},
        timeout=600,
    )
    assert "truncated" in proc.stderr and path.stat().st_size == chunk.blob.size // 2  # cut while loading
    _refused(proc, "weights chunk 0", f"size {chunk.blob.size // 2} bytes, manifest says {chunk.blob.size}")
    assert not out.exists()
