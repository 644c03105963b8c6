"""A spec's [gate] table is not part of a build's identity, and a published build is immutable:
compiling the same build again after the table changed keeps the published manifest, and compile
says which gate requests that build's gates go on rendering (``compile._build._publish``'s warning)."""

from __future__ import annotations

from avatar_release.compile._build import _kept_gate_requests
from avatar_release.records import GateRequestsRecord
from avatar_release.registry import MemoryRegistry
from tests.helpers import cpu_manifest, put_stand_in_build


def test_a_build_published_with_other_gate_requests_is_kept_and_compile_says_so():
    reg = MemoryRegistry()
    published = cpu_manifest(gate_requests={"images": [0, 1], "audio": [0], "seed": 0})
    digest = put_stand_in_build(reg, published)
    assert _kept_gate_requests(reg, digest, published) == []  # the same requests: nothing to say
    edited = published.model_copy(update={"gate_requests": GateRequestsRecord(images=[0, 1], audio=[0, 1], seed=0)})
    (warning,) = _kept_gate_requests(reg, digest, edited)
    assert warning.startswith(f"build {published.build_id} was published earlier with gate requests ")
    assert "images [0, 1] x audio [0], seed 0; this compile's are images [0, 1] x audio [0, 1], seed 0" in warning
    assert "[gate] table" in warning and "its gates render those" in warning
    older, reg = cpu_manifest(), MemoryRegistry()  # a manifest recording no requests: the gate set's defaults
    digest = put_stand_in_build(reg, older.model_copy(update={"gate_requests": None}))
    (warning,) = _kept_gate_requests(reg, digest, older.model_copy(update={"gate_requests": edited.gate_requests}))
    assert "with gate requests the defaults;" in warning
