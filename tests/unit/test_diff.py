"""``avatar-release diff A B``: every field that differs, section by section, and nothing else."""

from __future__ import annotations

import json

from avatar_release.promote.diff import diff_builds
from avatar_release.registry import LocalRegistry
from tests.helpers import cli, cpu_manifest, put_stand_in_build
from tests.release_records import signed_gate_result


def _two_builds(tmp_path):
    reg = LocalRegistry(tmp_path / "reg")
    a = cpu_manifest().model_copy(update={"build_id": "tiny-cpu-8-" + "a" * 12})
    exe = a.executables[0]
    changed_exe = exe.model_copy(
        update={
            "hlo_digest": "sha256:" + "9" * 64,
            "raw_size": exe.raw_size * 2,
            "cost": {**exe.cost, "flops": 2 * exe.cost.get("flops", 1.0)},
        }
    )
    flags = a.flags.model_copy(update={"compiler_options": {**a.flags.compiler_options, "xla_new_option": True}})
    b = a.model_copy(
        update={
            "build_id": "tiny-cpu-8-" + "b" * 12,
            "overrides": {"matmul_k_split": 2},
            "flags": flags,
            "executables": [changed_exe, *a.executables[1:]],
            "toolchain": a.toolchain.model_copy(update={"jax": "9.9.9"}),
        }
    )
    da, db = put_stand_in_build(reg, a), put_stand_in_build(reg, b)
    return reg, a, b, da, db


def test_each_changed_field_is_one_row_and_the_rest_count_as_the_same(tmp_path):
    reg, a, b, da, db = _two_builds(tmp_path)
    d = diff_builds(reg, a.build_id, b.build_id)
    rows = {(r.section, r.key): (r.a, r.b) for r in d.differences}
    key = a.executables[0].key
    assert rows[("overrides", "matmul_k_split")] == (None, 2)
    assert rows[("flags", "compiler_options.xla_new_option")] == (None, True)
    assert rows[("toolchain", "jax")] == (a.toolchain.jax, "9.9.9")
    assert rows[("executables", f"{key}.hlo_digest")] == (a.executables[0].hlo_digest, "sha256:" + "9" * 64)
    assert rows[("executables", f"{key}.raw_size")][1] == 2 * a.executables[0].raw_size
    assert ("build", "build_id") in rows and not d.identical
    untouched = {r.key for r in d.differences if r.section == "executables"}
    assert not any(k.startswith(a.executables[1].key + ".") for k in untouched)  # the unchanged executable
    assert d.same["platform"] > 0 and d.same["inputs"] > 0 and not any(r.section == "platform" for r in d.differences)


def test_a_build_against_itself_differs_in_nothing_and_gate_verdicts_show_what_they_compared_with(tmp_path):
    reg, a, b, da, db = _two_builds(tmp_path)
    same = diff_builds(reg, a.build_id, a.build_id)
    assert same.differences == [] and same.identical
    signed_gate_result(reg, b.build_id, db, b, against=(a.build_id, da))
    rows = {(r.section, r.key): (r.a, r.b) for r in diff_builds(reg, a.build_id, b.build_id).differences}
    assert rows[("gates", "status")] == ("ungated", "passed")
    assert rows[("gates", "compared_with")] == (None, a.build_id)


def test_the_command_prints_a_table_json_and_exits_1_with_exit_code(tmp_path):
    reg, a, b, *_ = _two_builds(tmp_path)
    res = cli("diff", a.build_id, b.build_id, "--registry", str(reg.root))
    assert res.exit_code == 0, res.output
    table = res.stdout.splitlines()
    assert any(line.split()[:2] == ["toolchain", "jax"] and "9.9.9" in line for line in table)
    assert any(line.startswith("executables") and "hlo_digest" in line for line in table)
    assert "the same:" in res.stdout and "platform" in res.stdout.split("the same:")[1]
    doc = json.loads(
        cli("diff", a.build_id, b.build_id, "--registry", str(reg.root), "--json", "--section", "flags").stdout
    )
    assert doc["ok"] and {r["section"] for r in doc["differences"]} == {"flags"}
    res = cli("diff", a.build_id, b.build_id, "--registry", str(reg.root), "--exit-code")
    assert res.exit_code == 1 and "differ in" in res.stderr
    assert cli("diff", a.build_id, a.build_id, "--registry", str(reg.root), "--exit-code").exit_code == 0
    res = cli("diff", a.build_id, "nope", "--registry", str(reg.root))
    assert res.exit_code == 3 and "unknown build or channel 'nope'" in res.stderr
