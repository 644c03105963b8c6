"""The fault and attack suite on the local store: each case refused with a clear error, nothing
lost, no partial state. (Registry-server cases live in test_oci_registry.py; signatures, planted
pickles and mixed manifests in test_trust_loading.py; parser fuzzing in unit/test_parser_fuzz.py.)
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest
from click.testing import CliRunner

from avatar_release.cli import cli
from avatar_release.errors import EnvironmentMismatch, InputError, IntegrityError, NotFoundError
from avatar_release.registry import LocalRegistry, read_manifest
from avatar_release.runtime import load
from tests.helpers import local_blob_path, resealed


def _bytes_read() -> int:
    """Bytes this process has read through read() so far (Linux's /proc/self/io: rchar)."""
    with open("/proc/self/io") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("rchar:"))


def _flip(path, offset=None):
    data = bytearray(path.read_bytes())
    i = len(data) // 2 if offset is None else offset
    data[i] ^= 0x01
    path.write_bytes(bytes(data))


@pytest.mark.parametrize("kind", ["manifest", "weights", "executable", "gate-frames", "gate-result"])
def test_a_bit_flip_in_any_kind_of_blob_is_refused_by_name(registry_copy, kind):
    import numpy as np

    from avatar_release.gates.store import get_frames, get_result, put_frames, result_refs, save_result
    from avatar_release.records import BlobRef, EnvironmentRecord, GateResult, GateSetRecord

    root, result = registry_copy
    reg = LocalRegistry(root)
    resolved, m = read_manifest(reg, result.build_id)
    if kind in ("manifest", "weights", "executable"):
        digest = {
            "manifest": resolved.digest,
            "weights": m.weights.chunks[0].blob.digest,
            "executable": m.executable("dit", "f8").blob.digest,
        }[kind]
        _flip(local_blob_path(root, digest))
        with pytest.raises(IntegrityError, match=digest.split(":")[1][:12]):
            load(result.build_id, reg)
        return
    frames = put_frames(reg, np.zeros((2, 4, 4, 3), np.uint8))
    env = EnvironmentRecord(
        fingerprint="sha256:" + "1" * 64,
        backend="cpu",
        platform_version="x",
        device_kind="cpu",
        device_count=8,
        jax="0",
        jaxlib="0",
    )
    r = GateResult(
        status="passed",
        build_id=m.build_id,
        build_digest=resolved.digest,
        pipeline="tiny",
        target="cpu-8",
        baseline=None,
        tier=None,
        environment=env,
        tool={},
        gate_set=GateSetRecord(name="t", version=1, digest="sha256:" + "0" * 64, requests=[]),
        gates=[],
        frame_sha256=[],
        frames_blob=frames,
        created_at="now",
        created_by="t",
    )
    save_result(reg, r)
    ref: BlobRef = result_refs(reg, m.build_id)[-1] if kind == "gate-result" else frames
    _flip(local_blob_path(root, ref.digest))
    with pytest.raises(IntegrityError, match=ref.digest.split(":")[1][:12]):
        get_result(reg, ref) if kind == "gate-result" else get_frames(reg, ref)


def test_truncated_and_lying_sizes_and_endless_blobs_read_at_most_the_declared_size(registry_copy):
    root, result = registry_copy
    reg = LocalRegistry(root)
    _, m = read_manifest(reg, result.build_id)
    ref = m.executable("vae", "f8").blob
    path = local_blob_path(root, ref.digest)
    good = path.read_bytes()
    with pytest.raises(IntegrityError, match=f"size more than {ref.size - 1} bytes"):
        reg.get_blob(ref.digest, ref.size - 1)  # a manifest whose size lies (too small)
    with pytest.raises(IntegrityError, match=f"size {ref.size} bytes, manifest says {ref.size + 10}"):
        reg.get_blob(ref.digest, ref.size + 10)  # ... or too large
    path.write_bytes(good[: len(good) // 2])  # truncated on disk
    with pytest.raises(IntegrityError, match="manifest says"):
        load(result.build_id, reg)
    # An endless blob: a 64 GiB sparse file where the blob should be. Reading stops at size + 1.
    with open(path, "wb") as f:
        f.truncate(64 << 30)
    read_before = _bytes_read()
    with pytest.raises(IntegrityError, match=f"size more than {ref.size}"):
        reg.get_blob(ref.digest, ref.size)
    assert _bytes_read() - read_before < ref.size + (64 << 20)  # it stopped past the size, not 64 GiB later
    path.write_bytes(good)
    assert reg.get_blob(ref.digest, ref.size) == good  # restored: nothing else was touched


def test_a_flag_profile_the_process_lacks_is_an_environment_mismatch(registry_copy):

    root, result = registry_copy
    reg = LocalRegistry(root)
    _, m = read_manifest(reg, result.build_id)
    flags = m.flags.model_copy(
        update={
            "env_flags": ["--xla_cpu_copy_insertion_use_region_analysis=true"],
            "version": 2,
            "digest": "sha256:" + "3" * 64,
        }
    )
    f = resealed(m, flags=flags)
    reg.put_build(f.build_id, f.to_json_bytes())
    with pytest.raises(EnvironmentMismatch) as e:
        load(f.build_id, reg)
    assert "flag_profile" in e.value.differences and "cpu-default v2" in str(e.value)


@pytest.mark.parametrize("name", ["../../etc/passwd", "dev/../../x", "..", "a/b", "UPPER", ".hidden", "x" * 200])
def test_path_traversal_in_names_is_bad_input_everywhere(registry_copy, name):
    root, result = registry_copy
    reg = LocalRegistry(root)
    with pytest.raises((InputError, NotFoundError)):
        reg.resolve(name)
    for call in (
        lambda: reg.put_build(name, b"{}"),
        lambda: reg.get_channel(name),
        lambda: reg.put_record("gate-results", name, b"{}"),
        lambda: reg.get_record(name, "x"),
    ):
        with pytest.raises(InputError, match="invalid"):
            call()
    res = CliRunner().invoke(cli, ["promote", result.build_id, "--to", name, "--registry", str(root)])
    assert res.exit_code == 2
    assert not any(p.name == "passwd" for p in root.rglob("*"))


_PROMOTER = r"""
import sys
from avatar_release.registry import LocalRegistry
reg = LocalRegistry(sys.argv[1])
a, b = sys.argv[2], sys.argv[3]
i = 0
while True:
    target = (a, b)[i % 2]
    cur = reg.get_channel("dev")
    reg.move_channel("dev", reg.resolve(target), expected_digest=cur.digest if cur else None,
                     action="promote", who="loop", reason=str(i))
    i += 1
"""


def test_kill_9_mid_promote_leaves_the_old_or_the_new_state(registry_copy, build_cache, tmp_path):

    root, a = registry_copy
    reg = LocalRegistry(root)
    b = build_cache.compile("tiny", "cpu-8", registry=reg, overrides={"dit.steps": "2"}, move_dev=False)
    digests = {reg.resolve(a.build_id).digest, b.digest}
    for delay in (0.05, 0.13, 0.21, 0.34, 0.55):
        p = subprocess.Popen(
            [sys.executable, "-c", _PROMOTER, str(root), a.build_id, b.build_id],
            env={**os.environ, "PYTHONPATH": os.getcwd()},
        )
        time.sleep(delay)
        p.send_signal(signal.SIGKILL)
        p.wait()
        fresh = LocalRegistry(root)  # a new reader after the crash
        state = fresh.get_channel("dev")
        assert state.digest in digests
        history = fresh.history("dev")
        seqs = [e.sequence for e in history]
        assert seqs == sorted(set(seqs))  # strictly increasing, nothing duplicated
        assert history[-1].to_digest == state.digest and history[-1].sequence == state.sequence
        # the channel file is complete JSON; only the last history line can be torn (then the
        # channel file still carries that entry, and the next writer repairs the log)
        json.loads((root / "channels" / "dev.json").read_text())
        lines = [x for x in (root / "history.jsonl").read_text().splitlines() if x.strip()]
        for line in lines[:-1]:
            json.loads(line)
        assert not list(root.rglob("*.tmp*"))  # no temp file left visible as data
    # and the registry still moves normally afterwards
    cur = reg.get_channel("dev")
    reg.move_channel(
        "dev", reg.resolve(a.build_id), expected_digest=cur.digest, action="promote", who="t", reason="after"
    )
