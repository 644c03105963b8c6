"""Autotune results as a build keeps them (manifest v7): XLA's text form read and merged
deterministically, the refusals of what is not that form, the record and the identity covering
the results, and the refusals of `autotune` for a build with nothing to tune.

``tests/data/build-manifest.v7.json`` is a real v7 manifest: tiny for gpu-h100-8 compiled on this
CPU host by ``avatar-release autotune BUILD --results <empty results> --allow-incomplete``."""

from __future__ import annotations

import hashlib
import json
import re
from pathlib import Path

import pytest

from avatar_release.compile import read_results
from avatar_release.compile._autotune import AutotunePlan, autotune_record
from avatar_release.compile._autotune_results import MAX_RESULTS_BYTES, merge_results
from avatar_release.compile._tune import _tunable
from avatar_release.errors import InputError, IntegrityError
from avatar_release.records import Manifest, check_identity, manifest_identity, parse_record
from avatar_release.runtime import build_blobs
from tests.helpers import cpu_manifest

DATA = Path(__file__).resolve().parents[1] / "data"

# Two entries in the shape XLA writes them; the HLO strings hold braces and escaped quotes.
GEMM = """results {
  device: "CUDA: 9.0, Cores: 132, GPU clock: 1.98 GHz"
  hlo: "(bf16[256,512]{1,0}) -> bf16[256,256]{1,0} {\\n  %p = bf16[256,512]{1,0} parameter(0) \\"}\\"\\n}"
  result { gemm { algorithm: 5 } run_time { nanos: 10240 } }
}
"""
CONV = """results {
  device: "CUDA: 9.0, Cores: 132, GPU clock: 1.98 GHz"
  hlo: "custom-call(%a, %b), window={size=3x3 pad=1_1x1_1}"
  result { algorithm { algo_id: 14 math_type: TENSOR_OP_MATH } run_time { nanos: 2048 } }
}
"""


def test_results_are_read_with_their_version_and_entries_and_merged_the_same_whatever_the_order():
    one = read_results(f"version: 3\n# dumped by XLA\n{GEMM}".encode(), where="a")
    assert (one.version, one.entries) == (3, 1)
    ab = merge_results([f"version: 3\n{GEMM}".encode(), f"version: 3\n{CONV}{GEMM}".encode()], where="m")
    ba = merge_results([f"version: 3\n{CONV}".encode(), f"version: 3\n{GEMM}".encode()], where="m")
    assert ab.entries == 2 and ab.text == ba.text and ab.digest == ba.digest  # each config once, sorted
    assert ab.digest == "sha256:" + hashlib.sha256(ab.text).hexdigest()
    assert read_results(ab.text, where="again").text == ab.text  # canonical text reads back as itself


@pytest.mark.parametrize(
    "data, message",
    [
        (b"\x08\x03\x12\xc1\x01", "not UTF-8 text at byte 3"),  # the binary form (.pb)
        (b"\x08\x03\x12\x10results", "not text: a control character at character 0"),  # binary that happens to be UTF-8
        (b'results {\n  device: "x"\n', "never closed (a truncated file?)"),
        (GEMM.encode(), "no `version: N` line"),
        (b"version: 3\nversion: 4\n", "version given twice"),
        (b"version: 3\n{ }", "expected a field name"),
        (b"version: 3\nresults\n", "field results has no value"),
        (b"v" * (MAX_RESULTS_BYTES + 1), "allowed for autotune results"),
    ],
    # Named by what each refusal is about: pytest would spell the last case's 64 MiB of bytes into
    # its test id, which every worker then sends to the controller and every report prints.
    ids=["binary", "binary-utf8", "truncated", "no-version", "two-versions", "no-field", "no-value", "too-large"],
)
def test_what_is_not_xlas_text_form_is_refused_with_the_reason(data, message):
    with pytest.raises(InputError, match=re.escape(message)):
        read_results(data, where="--results f")


def test_results_from_two_xla_versions_are_not_merged():
    with pytest.raises(InputError, match="part 2 of 2.*version: 4, where an earlier part says 3"):
        merge_results([f"version: 3\n{GEMM}".encode(), f"version: 4\n{CONV}".encode()], where="measured")


def test_a_plan_hands_xla_the_results_file_and_the_record_keeps_their_digest_not_the_path(tmp_path):
    results = read_results(f"version: 3\n{GEMM}{CONV}".encode(), where="r")
    plan = AutotunePlan(results=results, results_file=tmp_path / "r.textproto")
    assert plan.compiler_options() == {
        "xla_gpu_load_autotune_results_from": str(tmp_path / "r.textproto"),
        "xla_gpu_require_complete_aot_autotune_results": True,
    }
    assert AutotunePlan(dump_to=tmp_path).compiler_options() == {}  # the compile names one dump file a stage
    options = {"xla_gpu_deterministic_ops": True, **plan.compiler_options()}
    rec = autotune_record({"vae/f8": ""}, options, deviceless=True, results=results)
    assert rec.results == results.digest and rec.results_entries == 2 and rec.results_size == len(results.text)
    assert rec.complete_required is True and str(tmp_path) not in json.dumps(rec.model_dump(mode="json"))
    untuned = autotune_record({"vae/f8": ""}, {"xla_gpu_deterministic_ops": True}, deviceless=True)
    assert untuned.results is None and "results_size" not in untuned.to_json_bytes().decode()  # v6 bytes kept


def _v7() -> Manifest:
    return parse_record(Manifest, (DATA / "build-manifest.v7.json").read_bytes(), where="stored v7")


def test_the_stored_v7_build_keeps_its_results_as_a_blob_the_identity_binds():
    m = _v7()
    check_identity(m)
    a = m.autotune
    assert a is not None and a.results and a.results_blob and a.complete_required is False
    assert ("autotune results", a.results_blob) in build_blobs(m)  # verify and copy check it
    assert a.results_blob in m.blobs()  # garbage collection keeps it
    other = "sha256:" + "0" * 64
    edited = m.model_copy(update={"autotune": a.model_copy(update={"results": other})})
    with pytest.raises(IntegrityError, match="hash to identity"):
        check_identity(edited)  # other results are another build
    assert manifest_identity(edited) != m.identity


def test_a_build_for_cpu_has_nothing_to_tune():
    m = cpu_manifest()
    with pytest.raises(InputError, match="is a cpu build: autotune is for GPU builds"):
        _tunable(m)
    assert _tunable(_v7()) == 10  # the tiny build's VAE convolutions, still left to run time (incomplete)
