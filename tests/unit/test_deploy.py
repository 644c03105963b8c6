"""The shipped engine configs are valid for their engines and run what the CLI accepts:
deploy/gate-shards.job.yaml against the Kubernetes schemas, the example workflow against the
GitHub workflow schema, both against the sharded-gate CLI."""

from __future__ import annotations

import copy
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from avatar_release.gates import parse_shard
from tests.tools import binary, module

ROOT = Path(__file__).resolve().parents[2]
JOB = ROOT / "deploy" / "gate-shards.job.yaml"
WORKFLOW = ROOT / "examples" / "release.github-actions.yml"
# GKE serves TPU v6e (Trillium) from 1.31; a version kubernetes-validate bundles.
K8S_VERSION = "1.31.0"


def _job() -> dict:
    return yaml.safe_load(JOB.read_text())


def test_the_gate_shards_job_is_a_valid_kubernetes_indexed_job():
    kv = module("kubernetes_validate")
    job = _job()
    kv.validate(job, K8S_VERSION, strict=True)
    broken = copy.deepcopy(job)
    broken["spec"]["template"]["spec"]["containers"][0]["resource"] = {}  # a typo the strict schema refuses
    with pytest.raises(kv.ValidationError):
        kv.validate(broken, K8S_VERSION, strict=True)


def test_each_index_of_the_job_runs_a_shard_the_cli_accepts_on_a_v6e_8_slice():
    job = _job()
    spec, pod = job["spec"], job["spec"]["template"]["spec"]
    assert spec["completionMode"] == "Indexed" and spec["completions"] == spec["parallelism"]
    assert pod["nodeSelector"] == {
        "cloud.google.com/gke-tpu-accelerator": "tpu-v6e-slice",
        "cloud.google.com/gke-tpu-topology": "2x4",
    }
    (container,) = pod["containers"]
    assert (
        container["resources"]["requests"]["google.com/tpu"]
        == container["resources"]["limits"]["google.com/tpu"]
        == "8"
    )
    command = " ".join(container["args"])
    m = re.search(r'--shard "\$JOB_COMPLETION_INDEX/(\d+)"', command)
    assert m and int(m.group(1)) == spec["completions"]
    for index in range(spec["completions"]):  # JOB_COMPLETION_INDEX runs 0..completions-1
        assert parse_shard(f"{index}/{m.group(1)}") == (index, spec["completions"])
    assert "--run-id" in command and "gate merge" not in command


def test_the_example_workflow_is_a_valid_github_workflow():
    exe = binary("check-jsonschema")
    out = subprocess.run(
        [exe, "--builtin-schema", "vendor.github-workflows", str(WORKFLOW)], capture_output=True, text=True
    )
    assert out.returncode == 0, out.stdout + out.stderr


def _steps_text(job: dict) -> str:
    return "\n".join(str(s.get("run", "")) + str(s.get("env", "")) + str(s.get("uses", "")) for s in job["steps"])


def test_the_example_workflow_passes_the_build_by_id_and_serialises_registry_writers():
    wf = yaml.safe_load(WORKFLOW.read_text())
    jobs = wf["jobs"]
    text = WORKFLOW.read_text()
    assert not re.search(r"avatar-release gate dev\b", text)  # dev moves: gate the id the compile job made
    for name in ("build-gate-stage", "build-tpu"):
        assert jobs[name]["outputs"]["build"] == "${{ steps.compile.outputs.build }}"
    for name in ("gate-tpu-shard", "gate-tpu-merge"):
        assert "${{ needs.build-tpu.outputs.build }}" in _steps_text(jobs[name])
    writers = {n for n, j in jobs.items() if n != "gate-tpu-shard"}  # shards write only their own records
    for name in writers:
        assert jobs[name]["concurrency"] == {"group": "avatar-release-registry", "cancel-in-progress": False}, name
    shards = jobs["gate-tpu-shard"]["strategy"]["matrix"]["shard"]
    m = re.search(r'--shard "\$SHARD/(\d+)"', _steps_text(jobs["gate-tpu-shard"]))
    assert m and shards == list(range(int(m.group(1))))
    assert jobs["gate-tpu-merge"]["needs"] == ["build-tpu", "gate-tpu-shard"]


def test_the_example_workflow_installs_the_right_extras_logs_in_and_takes_keys_from_secrets():
    wf = yaml.safe_load(WORKFLOW.read_text())
    triggers = wf[True]  # YAML 1.1 reads the key `on` as true
    assert triggers["workflow_dispatch"]["inputs"]["action"]["type"] == "choice"
    assert wf["env"]["AVATAR_RELEASE_TRUST_POLICY"] == "examples/trust.toml"
    extras = {
        "build-gate-stage": {"compile", "gar"},
        "build-tpu": {"compile", "tpu", "gar"},
        "gate-tpu-shard": {"tpu", "gar"},
        "gate-tpu-merge": {"gar"},
    }
    for name, job in wf["jobs"].items():
        steps = job["steps"]
        install = next(s["run"] for s in steps if "pip install" in str(s.get("run", "")))
        got = set(re.search(r"-e '?\.\[([a-z,]+)\]", install).group(1).split(","))
        assert got == extras.get(name, {"gar"}), name
        assert any(s.get("uses", "").startswith("google-github-actions/auth@") for s in steps), name
        setup = next((s for s in steps if s.get("uses", "").startswith("actions/setup-python@")), None)
        assert setup is not None and setup["with"]["cache"] == "pip", name
        for s in steps:  # a key is only ever written from a secret, never inlined
            for line in str(s.get("run", "")).splitlines():
                if "gate.key" in line or "release.key" in line:
                    assert "BEGIN" not in line
            for value in (s.get("env") or {}).values():
                if "KEY_PEM" in str(value) or "secrets." in str(value):
                    assert str(value).startswith("${{ secrets.")


def test_the_shard_command_line_of_the_workflow_parses():
    code = "import sys; from avatar_release.cli import main; sys.exit(main(sys.argv[1:]))"
    out = subprocess.run([sys.executable, "-c", code, "gate", "run", "--help"], capture_output=True, text=True)
    assert "--shard K/N" in out.stdout and "--run-id" in out.stdout and "--twin" in out.stdout
