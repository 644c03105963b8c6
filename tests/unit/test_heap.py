"""A process that loads a build keeps the memory one chunk freed for the next
(avatar_release/machine/_heap.py): seen as page faults, in fresh processes (the setting is the process's)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from tests.helpers import cpu_manifest

# A worker thread (its own malloc arena, as XLA:CPU's device threads have) allocates 16 MiB in 64 KiB
# blocks, writes them and frees them, four times: the page faults of each round. Optionally the
# process is first configured for a build, as `render`, `serve` and the gate worker are.
_ROUNDS = """
import ctypes, json, resource, sys, threading
if len(sys.argv) > 1:
    from avatar_release.machine import configure_for_manifest
    from avatar_release.records import Manifest
    configure_for_manifest(Manifest.model_validate_json(open(sys.argv[1]).read()))
libc = ctypes.CDLL(None)
libc.malloc.restype, libc.malloc.argtypes = ctypes.c_void_p, [ctypes.c_size_t]
libc.free.argtypes, libc.memset.argtypes = [ctypes.c_void_p], [ctypes.c_void_p, ctypes.c_int, ctypes.c_size_t]
faults = []
def rounds():
    for _ in range(4):
        before = resource.getrusage(resource.RUSAGE_THREAD).ru_minflt
        blocks = [libc.malloc(64 << 10) for _ in range(256)]
        for b in blocks:
            libc.memset(b, 1, 64 << 10)
        for b in reversed(blocks):
            libc.free(b)
        faults.append(resource.getrusage(resource.RUSAGE_THREAD).ru_minflt - before)
t = threading.Thread(target=rounds)
t.start()
t.join()
print(json.dumps(faults))
"""

pytestmark = pytest.mark.skipif(
    not sys.platform.startswith("linux") or not (os.confstr("CS_GNU_LIBC_VERSION") or "").startswith("glibc"),
    reason="the setting is glibc's (elsewhere keep_freed_memory leaves the allocator alone)",
)


def _faults(*args: str, keep: bool) -> list[int]:
    env = {**os.environ, "AVATAR_RELEASE_KEEP_FREED_MEMORY": "1" if keep else "0"}
    out = subprocess.run([sys.executable, "-c", _ROUNDS, *args], capture_output=True, text=True, env=env, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_a_process_configured_for_a_build_reuses_freed_pages_and_the_switch_turns_it_off(tmp_path):
    manifest = tmp_path / "manifest.json"
    manifest.write_text(cpu_manifest().model_dump_json())
    kept = _faults(str(manifest), keep=True)
    returned = _faults(str(manifest), keep=False)
    pages = (16 << 20) // os.sysconf("SC_PAGE_SIZE")
    # The first round faults every page in either way (4,096 pages of 4 KiB).
    assert kept[0] >= pages * 0.9 and returned[0] >= pages * 0.9
    # Kept: the later rounds reuse them (measured 18, 0, 0). Returned to the kernel: faulted in again
    # (glibc's default, measured 338, 2,321, 2,321).
    assert max(kept[1:]) < pages * 0.05, kept
    assert max(returned[2:]) > pages * 0.4, returned


def test_keep_freed_memory_says_whether_it_set_anything(monkeypatch):
    from avatar_release.machine import keep_freed_memory

    assert keep_freed_memory() is True  # glibc: set (again: the call is idempotent)
    monkeypatch.setenv("AVATAR_RELEASE_KEEP_FREED_MEMORY", "0")
    assert keep_freed_memory() is False  # left to glibc's defaults
