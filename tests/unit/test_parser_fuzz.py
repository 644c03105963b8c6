"""Fuzzing the record parsers: arbitrary bytes, or a valid record with fields mangled, are either
refused with a validation error (IntegrityError / SchemaVersionError), never anything else, or read
as a record an honest writer could have written: one whose own bytes read back as the same record."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from avatar_release.errors import IntegrityError, SchemaVersionError
from avatar_release.records import (
    Band,
    ChannelState,
    GateResult,
    HistoryEntry,
    Manifest,
    ReviewRecord,
    StatementPayload,
    parse_record,
)
from tests.helpers import cpu_manifest

DATA = Path(__file__).resolve().parent.parent / "data"
MANIFEST = json.loads(cpu_manifest().to_json_bytes())  # a manifest of the version this tool writes
MANIFEST["weights"]["chunks"][0]["tensors"] = MANIFEST["weights"]["chunks"][0]["tensors"][
    :4
]  # every field, fewer alike
RECORDS = [Manifest, GateResult, ReviewRecord, Band, ChannelState, HistoryEntry, StatementPayload]

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=True) | st.text(max_size=20),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=10), children, max_size=4),
    max_leaves=20,
)


def _refused_or_read_back(cls, data: bytes):
    """Refused as invalid (None), or read as a ``cls`` whose canonical bytes parse to that same record.

    Everything after an accepted read (seals, identities, digests) is taken over ``to_json_bytes``,
    so what the reader accepts and what the writer then emits must agree: a validator that changes
    a value it has already validated, or a writer that emits what the reader refuses, fails here.
    Compared as bytes: NaN is a float a record may hold, and never equal to itself.
    """
    try:
        record = parse_record(cls, data, where="fuzz")
    except (IntegrityError, SchemaVersionError):
        return None
    assert type(record) is cls
    written = record.to_json_bytes()
    again = parse_record(cls, written, where="fuzz, written back")
    assert again.to_json_bytes() == written
    return record


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.binary(max_size=400), which=st.sampled_from(RECORDS))
def test_arbitrary_bytes(data, which):
    _refused_or_read_back(which, data)


@settings(max_examples=150, deadline=None)
@given(doc=json_values, which=st.sampled_from(RECORDS))
def test_arbitrary_json(doc, which):
    _refused_or_read_back(which, json.dumps(doc).encode())


def _paths(doc, prefix=()):
    if isinstance(doc, dict):
        for k, v in doc.items():
            yield prefix + (k,)
            yield from _paths(v, prefix + (k,))
    elif isinstance(doc, list):
        for i, v in enumerate(doc):
            yield prefix + (i,)
            yield from _paths(v, prefix + (i,))


MANIFEST_PATHS = list(_paths(MANIFEST))


@pytest.mark.slow  # seconds long (tests/conftest.py: FAST_LANE_LIMIT_S)
@settings(max_examples=300, deadline=None)
@given(path=st.sampled_from(MANIFEST_PATHS), value=json_values, drop=st.booleans())
def test_a_manifest_with_one_field_mangled(path, value, drop):
    doc = json.loads(json.dumps(MANIFEST))
    node = doc
    for key in path[:-1]:
        node = node[key]
    if drop and isinstance(node, dict):
        node.pop(path[-1], None)
    else:
        node[path[-1]] = value
    record = _refused_or_read_back(Manifest, json.dumps(doc).encode())
    if record is not None:  # accepted: every field the bytes hold is in the record, none dropped on the way
        assert set(_paths(doc)) <= set(_paths(record.model_dump(mode="json")))
