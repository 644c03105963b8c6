"""The compiler's C++ log (glog lines on fd 2) reaches the user as one readable line per distinct
message, while everything else written to stderr passes through unchanged and in order."""

from __future__ import annotations

import json
import subprocess
import sys

from avatar_release.machine._native_log import summarize

REMAT = (
    "W1201 10:08:06.669259    5184 spmd_partitioner.cc:656] [SPMD] Involuntary full rematerialization. "
    "The compiler cannot go from sharding {devices=[8,1,1]<=[8]} to {devices=[1,4,1,2]<=[8] "
    "last_tile_dim_replicate} efficiently for HLO operation %add.7 = f32[1,240,64]{2,1,0} add(%dot, %add.6), "
    "sharding={devices=[8,1,1]<=[8]}. As the last resort, SPMD will replicate the tensor and then partition "
    "it to obtain the target sharding, which is inefficient. This issue will be fixed by Shardy partitioner "
    "in the future, which is tracked in b/433785288. Contact Shardy or XLA team for help."
)

CHILD = r"""
import json, os, sys
from avatar_release.machine import native_log_filter
print("before", file=sys.stderr, flush=True)
with native_log_filter() as notes:
    os.write(2, b"WARNING: Logging before InitGoogle() is written to STDERR\n")
    for _ in range(3):
        os.write(2, (REMAT + "\n").encode())  # as the C++ side writes it: past sys.stderr
    os.write(2, b"I1201 10:08:06.000001    5184 service.cc:12] XLA service initialized\n")
    print("progress: compiling vae/f8", file=sys.stderr, flush=True)
    os.write(2, b"E0000 00:00:1796119683.396957 5094 common_lib.cc:554] INVALID_ARGUMENT: bad hostname\n")
    os.write(2, b"=== Source Location Trace: === \nlearning/45eac/tfrc/runtime/libtpu_init_utils.cc:327\n")
print("after", file=sys.stderr, flush=True)
print(json.dumps([n.to_json() for n in notes]))
"""


def test_glog_lines_become_one_note_each_and_the_rest_passes_in_order():
    code = f"REMAT = {REMAT!r}\n" + CHILD
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True)
    err = out.stderr.splitlines()
    assert not [line for line in err if "Contact Shardy" in line or line.startswith(("W1201", "E0000", "I1201", "==="))]
    assert "InitGoogle" not in out.stderr and "libtpu_init_utils.cc" not in out.stderr
    assert err[0] == "before" and err[-1] == "after"
    assert err.index("progress: compiling vae/f8") > 0  # our own lines, unchanged and in order
    (remat,) = [line for line in err if "rematerialization" in line]
    assert remat.startswith("  xla warning [spmd_partitioner.cc]") and "f32[1,240,64]{2,1,0} add" in remat
    notes = json.loads(out.stdout)
    assert [(n["severity"], n["source"], n["count"]) for n in notes] == [
        ("warning", "spmd_partitioner.cc", 3),
        ("error", "common_lib.cc", 1),
    ]  # info lines are dropped


def test_a_message_is_shortened_without_its_contact_us_tail():
    assert summarize("x.cc", "Something odd. Contact Shardy or XLA team for help.") == "Something odd."
    assert len(summarize("x.cc", "y" * 1000)) == 240
