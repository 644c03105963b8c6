"""Spec formats a new user can write in one round trip: the JSON Schema of every project file kind
(`specs schema`, and the docs site's page made from the same models), errors that name every field
a section takes, a missing levers.toml reported at compile, and error pointers that name a page of
the docs site rather than a path of this repository."""

from __future__ import annotations

import ast
import importlib.util
import json
import shutil
from pathlib import Path

import pytest
import yaml

from avatar_release.errors import SpecError
from avatar_release.pipeline import CONTRACT_PAGE
from avatar_release.specs import SPEC_KINDS, SPECS_PAGE, levers_warning, load_levers_spec, load_pipeline
from tests.helpers import cli

ROOT = Path(__file__).resolve().parents[2]
KINDS = ["pipeline", "target", "flags", "levers", "band"]


@pytest.fixture
def manifests(tmp_path, monkeypatch) -> Path:
    out = tmp_path / "manifests"
    shutil.copytree(ROOT / "manifests", out)
    monkeypatch.setenv("AVATAR_RELEASE_MANIFESTS", str(out))
    return out


def test_specs_schema_prints_the_json_schema_of_every_kind():
    assert list(SPEC_KINDS) == KINDS
    for kind in KINDS:
        res = cli("specs", "schema", kind)
        assert res.exit_code == 0, res.output
        doc = json.loads(res.stdout)
        model = SPEC_KINDS[kind].model
        assert set(doc["properties"]) == set(model.model_fields), kind
        assert set(doc.get("required", ())) == {n for n, f in model.model_fields.items() if f.is_required()}, kind
    every = json.loads(cli("specs", "schema").stdout)
    assert sorted(every) == sorted(KINDS) and every["pipeline"]["properties"]["buckets"]["items"]["$ref"]


def test_a_mistyped_kind_is_a_usage_error_naming_the_kinds():
    res = cli("specs", "schema", "pipline")
    assert res.exit_code == 2 and "did you mean 'pipeline'?" in res.stderr and "levers" in res.stderr


def test_the_spec_formats_page_is_rendered_from_the_models():
    spec = importlib.util.spec_from_file_location("gen_spec_reference", ROOT / "docs" / "gen_spec_reference.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    page = module.render()
    for kind in KINDS:
        assert f"## {kind}\n" in page, kind
        for field in SPEC_KINDS[kind].model.model_fields:
            assert f"| `{field}` |" in page, (kind, field)
    assert "| `frames` | int | **required** |" in page  # a bucket's fields, in their own table
    nav = json.dumps(yaml.safe_load((ROOT / "mkdocs.yml").read_text().split("\nhooks:")[0] + "\n" + _nav_block()))
    assert '"Spec formats": "reference/specs.md"' in nav


def _nav_block() -> str:
    text = (ROOT / "mkdocs.yml").read_text()
    return text[text.index("\nnav:") :]


def _write_pipeline(manifests: Path, body: str) -> None:
    (manifests / "pipelines" / "mine.toml").write_text(body)


def test_missing_fields_are_named_all_at_once_with_every_field_of_their_section(manifests):
    _write_pipeline(manifests, 'name = "mine"\n[[buckets]]\nname = "f8"\n')
    with pytest.raises(SpecError) as err:
        load_pipeline("mine")
    msg = str(err.value)
    # one round trip: the top level's two missing fields and the bucket's, in one message
    assert (
        "missing required fields entry, config; the top level (PipelineSpec) takes required: name, entry, "
        "config, buckets; optional: schema_version, weights, gate, noise, description" in msg
    )
    assert "missing required field buckets.0.frames; buckets.0 (BucketSpec) takes required: name, frames" in msg
    assert "specs schema" in msg and SPECS_PAGE in msg and "docs/" not in msg


def test_a_wrong_bucket_field_names_the_fields_a_bucket_takes(manifests):
    _write_pipeline(manifests, 'name = "mine"\nentry = "m:p"\nconfig = "c"\n[[buckets]]\nname = "f8"\nframe = 8\n')
    with pytest.raises(
        SpecError,
        match=r"buckets\.0\.frame: .*did you mean 'frames' or 'name'\?; "
        r"allowed here: frames, name, schema_version",
    ):
        load_pipeline("mine")
    with pytest.raises(SpecError) as err:  # the misspelled key stands for the missing one: not reported twice
        load_pipeline("mine")
    assert "missing" not in str(err.value)
    _write_pipeline(manifests, 'name = "mine"\nentry = "m:p"\nconfig = "c"\nbuckets = []\n')
    with pytest.raises(SpecError, match=r"declares no shape buckets; .*name \(str\) and frames \(int > 0\)"):
        load_pipeline("mine")


_MINE = 'name = "mine"\nentry = "m:p"\nconfig = "c"\n[[buckets]]\nname = "f8"\nframes = 8\n'


def test_a_gate_table_narrows_the_requests_and_its_mistakes_are_named(manifests):
    assert load_pipeline("tiny").gate.model_dump() == {
        "schema_version": 1,
        "images": [0, 1],
        "audio": [0],
        "seed": None,
    }
    _write_pipeline(manifests, _MINE)
    assert load_pipeline("mine").gate is None  # no table: the pipeline's own gate_requests
    for table, expected in (
        ("images = [0, 0]", r"gate\.images: .*each variant once: \[0, 0\]"),
        ("audio = []", r"gate\.audio: .*at least 1 item"),
        ("images = [-1]", r"gate\.images\.0: .*greater than or equal to 0"),
        ("image = [1]", r"gate\.image: .*did you mean 'images'\?"),
    ):
        _write_pipeline(manifests, _MINE + f"[gate]\n{table}\n")
        with pytest.raises(SpecError, match=expected):
            load_pipeline("mine")


def test_compile_records_the_gate_tables_requests_over_the_pipelines(manifests):
    """Each field the [gate] table sets replaces the pipeline's declaration; the others stay."""
    from types import SimpleNamespace

    from avatar_release.compile._package import _gate_requests
    from avatar_release.pipeline import GateRequests

    declared = SimpleNamespace(gate_requests=GateRequests(images=(0, 1), audio=(0, 1), seed=3))
    _write_pipeline(manifests, _MINE + "[gate]\naudio = [1]\n")
    plan = SimpleNamespace(pipeline=declared, spec=load_pipeline("mine"))
    assert _gate_requests(plan).model_dump() == {"images": [0, 1], "audio": [1], "seed": 3}
    plan = SimpleNamespace(pipeline=declared, spec=load_pipeline("tiny"))
    assert _gate_requests(plan).model_dump() == {"images": [0, 1], "audio": [0], "seed": 3}
    _write_pipeline(manifests, _MINE)
    plan = SimpleNamespace(pipeline=declared, spec=load_pipeline("mine"))
    assert _gate_requests(plan).model_dump() == {"images": [0, 1], "audio": [0, 1], "seed": 3}


def test_a_missing_levers_file_is_a_warning_at_compile_and_a_bad_one_an_error(manifests, tmp_path):
    levers = manifests / "levers.toml"
    assert levers_warning(levers) is None and load_levers_spec(levers) is not None
    levers.unlink()
    text = levers_warning(levers)
    assert text and "schema_version = 1" in text and "specs schema levers" in text
    # reported by compile before it compiles anything (here it then stops at an unknown target)
    res = cli("compile", "--target", "no-such-target", "--registry", str(tmp_path / "r"))
    assert res.exit_code == 2, res.output
    assert f"warning: {levers} is missing" in res.stderr and "gate` against prod" in res.stderr
    levers.write_text('schema_version = 1\n[options.xla_cpu_enable_fast_math]\neffect = "faster"\n')
    with pytest.raises(
        SpecError,
        match=r"options\.xla_cpu_enable_fast_math\.effect: Input should be "
        r"'reassociation' or 'precision'",
    ):
        levers_warning(levers)
    res = cli("compile", "--target", "no-such-target", "--registry", str(tmp_path / "r"))
    assert res.exit_code == 2 and "levers.toml: options.xla_cpu_enable_fast_math.effect" in res.stderr
    from avatar_release.gates.tier import read_levers  # the gate refuses what compile refused, the same way

    with pytest.raises(SpecError, match=r"options\.xla_cpu_enable_fast_math\.effect: Input should be"):
        read_levers(levers)


def _nav_titles(nav: list, trail: tuple[str, ...] = ()) -> set[str]:
    out: set[str] = set()
    for item in nav:
        for title, value in item.items():
            out.add(" > ".join((*trail, title)))
            if isinstance(value, list):
                out |= _nav_titles(value, (*trail, title))
    return out


def test_error_pointers_name_pages_of_the_docs_site():
    nav = yaml.safe_load(_nav_block())["nav"]
    titles = _nav_titles(nav)
    for pointer in (CONTRACT_PAGE, SPECS_PAGE):
        assert pointer.startswith("docs site: ") and pointer.removeprefix("docs site: ") in titles, pointer


def _docstrings(tree: ast.AST) -> set[int]:
    ids = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
                ids.add(id(first.value))
    return ids


def test_no_message_points_at_a_path_under_the_repositorys_docs():
    """A user's project has no docs/: a string in the toolchain (docstrings aside) never names one."""
    found = []
    for path in sorted((ROOT / "avatar_release").rglob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        skip = _docstrings(tree)
        for node in ast.walk(tree):
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in skip:
                if "docs/" in node.value and ".md" in node.value:
                    found.append(f"{path.relative_to(ROOT)}:{node.lineno}: {node.value[:80]!r}")
    assert not found, "\n".join(found)
