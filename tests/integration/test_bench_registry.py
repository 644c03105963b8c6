"""benchmarks/bench_registry.py keeps working: its smoke mode (no compile) pushes and pulls a 1 MiB
blob with ours and with skopeo against a real registry, and copies a stand-in build directory ->
registry A -> registry B -> directory, byte-identical, the second copy a near no-op."""

from __future__ import annotations

import pytest

from tests.helpers import run_smoke
from tests.tools import binary, binary_if_present

pytestmark = pytest.mark.slow  # three registry servers, four child processes: 5 s idle, twice that on a busy host


def test_smoke_mode_moves_a_blob_and_copies_a_build_byte_identical(tmp_path):
    binary("docker-registry")
    binary_if_present("skopeo")  # the bench leaves skopeo's half out without it; under the switch that fails
    out = tmp_path / "registry.json"
    doc = run_smoke("bench_registry.py", out=out, timeout=600)
    blob = doc["blob"]
    if isinstance(blob, str):  # skopeo absent: said so, not crashed
        assert blob.startswith("skipped")
    else:
        assert blob["size_bytes"] == 1 << 20 and blob["push"]["ours"]["digest"] == blob["digest"]
        assert blob["pull"]["ours_byte_identical"] and blob["pull"]["skopeo_byte_identical"]
        for op in ("push", "pull"):
            assert blob[op]["ratio"] > 0 and blob[op]["ours"]["requests"] >= 1 and blob[op]["ours"]["peak_rss_mb"] > 0
    copy = doc["copy"]
    assert copy["compiled"] is False and copy["blobs"] >= 1 and copy["records"] >= 1
    assert all(copy["round_trip_identical"].values()), copy["round_trip_identical"]
    assert 0 < copy["a_to_b_again"]["requests"] < copy["a_to_b"]["requests"]  # nothing left to copy
