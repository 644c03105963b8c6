"""The example release workflow's shell steps, run in order against a local registry.

`examples/release.github-actions.yml` is what a team copies into `.github/workflows/`. The schema
test (tests/unit/test_deploy.py) says it is a valid workflow; this says its shell does what its
comments promise. A few lines here play the part of the Actions runner for this one file: jobs in
`needs` order, `if:` conditions, matrix legs, `${{ … }}` expressions, `$GITHUB_OUTPUT` →
`steps.*.outputs` → job `outputs` → `needs.*.outputs`, `$RUNNER_TEMP` and `$GITHUB_STEP_SUMMARY`.
`uses:` steps (checkout, setup-python, the registry login, artifact upload) are GitHub's actions
and are not run; `pip install` lines are not run either (this environment already has every
extra; tests/unit/test_deploy.py checks each job asks for the extras it needs).

Two stand-ins, both said here: the registry is a local directory store (GAR needs Google; the
workflow only ever passes it through `$AVATAR_RELEASE_REGISTRY`), and there is no v6e-8 here. The
TPU jobs' compile and compile gate run for real (libtpu compiles on a CPU host); the v6e-8 runner
legs — the shards and their merge — first show what they do on this host with the TPU build (a
clear refusal pointing at the compile gate), then run their same shell on the cpu-8 build with the
cpu-8 gate key, so `--shard K/2` and `gate merge` are exercised end to end.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from tests.helpers import cli_json

pytestmark = [pytest.mark.slow, pytest.mark.extra("compile", "tpu")]

ROOT = Path(__file__).resolve().parents[2]
WORKFLOW = ROOT / "examples" / "release.github-actions.yml"
EXPR = re.compile(r"\$\{\{\s*(.+?)\s*\}\}")


def _lookup(ctx: dict, path: str):
    """`steps.compile.outputs.build` in the runner's context; an unknown name is a test failure
    (a typo in the workflow would reach GitHub as an empty string)."""
    node = ctx
    for part in path.split("."):
        if not isinstance(node, dict) or part not in node:
            raise AssertionError(f"the workflow reads {path!r}, which the runner context does not have")
        node = node[part]
    return node


def _expand(text: str, ctx: dict) -> str:
    return EXPR.sub(lambda m: str(_lookup(ctx, m.group(1))), text)


def _condition(expr: str | None, ctx: dict) -> bool:
    """The `if:` forms the workflow uses: `a == 'b'` joined by `&&`."""
    if expr is None:
        return True
    for part in expr.split("&&"):
        m = re.fullmatch(r"\s*([\w.-]+)\s*==\s*'([^']*)'\s*", part)
        assert m, f"unsupported if: {expr!r}"
        if str(_lookup(ctx, m.group(1))) != m.group(2):
            return False
    return True


class Runner:
    def __init__(self, workspace: Path, base_env: dict[str, str], secrets: dict[str, str], registry: str):
        self.wf = yaml.safe_load(WORKFLOW.read_text())
        self.workspace, self.base_env, self.secrets, self.registry = workspace, base_env, secrets, registry
        self.log: list[dict] = []
        self.events: list[tuple[str, list[str]]] = []

    def run_event(self, event: str, inputs: dict | None = None, *, hooks: dict | None = None) -> dict:
        """Run every job whose `if:` holds for `event`, dependencies first; return each job's outputs.
        `hooks[job](outputs, needs) -> (needs, env)` may re-point a job before it runs; that env
        is applied over every step's own."""
        github = {"event_name": event, "actor": "release-bot", "sha": "0" * 40, "run_id": "4242", "run_attempt": "1"}
        jobs, done, outputs = self.wf["jobs"], [], {}
        pending = [
            name for name, job in jobs.items() if _condition(job.get("if"), {"github": github, "inputs": inputs or {}})
        ]
        while pending:
            ready = [n for n in pending if all(d in done for d in _needs(jobs[n]))]
            assert ready, f"jobs wait on each other: {pending}"
            name = ready[0]
            needs = {d: {"outputs": outputs.get(d, {})} for d in _needs(jobs[name])}
            env: dict = {}
            if hooks and name in hooks:
                needs, env = hooks[name](outputs, needs)
            outputs[name] = self.run_job(name, github, inputs or {}, needs, env)
            done.append(name)
            pending.remove(name)
        self.events.append((event, list(done)))
        return outputs

    def run_job(self, name, github, inputs, needs, extra_env, *, legs=None, expect_rc=0) -> dict:
        """One job, every matrix leg (or `legs`); a step exiting other than `expect_rc` fails the test,
        and a job expected to fail stops at its first failing step, as the runner would."""
        job = self.wf["jobs"][name]
        if legs is None and "strategy" in job:
            ((key, values),) = job["strategy"]["matrix"].items()
            legs = [{key: v} for v in values]
        legs = legs or [{}]
        job_outputs: dict = {}
        for matrix in legs:
            steps: dict = {}
            ctx = {
                "github": github,
                "inputs": inputs,
                "needs": needs,
                "matrix": matrix,
                "steps": steps,
                "secrets": self.secrets,
                "vars": {"AVATAR_RELEASE_REGISTRY": self.registry},
            }
            env = dict(self.base_env)
            for scope in (self.wf.get("env", {}), job.get("env", {})):
                env.update({k: _expand(str(v), ctx) for k, v in scope.items()})
            for i, step in enumerate(job["steps"]):
                if "run" not in step:
                    continue  # a GitHub action (checkout, setup-python, login, upload): not shell
                script = _expand(step["run"], ctx)
                if script.strip().startswith("python3 -m pip install"):
                    continue
                step_env = {**env, **{k: _expand(str(v), ctx) for k, v in step.get("env", {}).items()}, **extra_env}
                out_file = self.workspace / f"out-{name}-{i}"
                out_file.write_text("")
                step_env.update(
                    GITHUB_OUTPUT=str(out_file),
                    RUNNER_TEMP=str(self.workspace / "runner-temp"),
                    GITHUB_STEP_SUMMARY=str(self.workspace / "summary.md"),
                    GITHUB_WORKSPACE=str(self.workspace),
                )
                proc = subprocess.run(
                    ["bash", "-e", "-o", "pipefail", "-c", script],
                    cwd=self.workspace,
                    env=step_env,
                    capture_output=True,
                    text=True,
                    timeout=1800,
                )
                self.log.append(
                    {
                        "job": name,
                        "matrix": matrix,
                        "step": step.get("name", script[:40]),
                        "rc": proc.returncode,
                        "stderr": proc.stderr[-3000:],
                    }
                )
                if proc.returncode != 0 and proc.returncode == expect_rc:
                    return {
                        "failed_step": step.get("name", ""),
                        "rc": proc.returncode,
                        "stderr": proc.stderr,
                        "stdout": proc.stdout,
                    }
                assert proc.returncode == 0, (
                    f"{name} {matrix} step {step.get('name', i)!r} exited "
                    f"{proc.returncode}:\n{proc.stdout[-2000:]}\n{proc.stderr[-3000:]}"
                )
                if "id" in step:
                    steps[step["id"]] = {
                        "outputs": dict(line.split("=", 1) for line in out_file.read_text().splitlines() if "=" in line)
                    }
            job_outputs = {k: _expand(str(v), ctx) for k, v in job.get("outputs", {}).items()}
        assert expect_rc == 0, f"{name} was expected to exit {expect_rc} and passed"
        return job_outputs


def _needs(job) -> list[str]:
    n = job.get("needs", [])
    return [n] if isinstance(n, str) else list(n)


@pytest.fixture
def workspace(tmp_path):
    """A checkout as the runner sees it: the project (manifests/, model/, kernels/) and
    examples/trust.toml naming keys whose private halves are this test's secrets (the shipped
    placeholders' were thrown away)."""
    from avatar_release.trust.keys import generate_keypair

    ws = tmp_path / "ws"
    (ws / "examples" / "keys").mkdir(parents=True)
    (ws / "runner-temp").mkdir()
    keys = tmp_path / "secret-keys"
    secrets = {}
    for name in ("ci-gate-cpu", "ci-gate-tpu", "ana", "bo", "release"):
        priv, pub, _ = generate_keypair(keys, name)
        shutil.copy(pub, ws / "examples" / "keys" / f"{name}.pub")
        secrets[name] = priv.read_text()
    shutil.copy(WORKFLOW, ws / "examples" / WORKFLOW.name)
    shutil.copy(ROOT / "examples" / "trust.toml", ws / "examples" / "trust.toml")
    # The project the workflow's commands find upward from the checkout: its specs and the pipeline's code.
    for folder in ("manifests", "model", "kernels"):
        shutil.copytree(ROOT / folder, ws / folder, ignore=shutil.ignore_patterns("__pycache__"))
    return (
        ws,
        {
            "AVATAR_RELEASE_GATE_KEY_CPU": secrets["ci-gate-cpu"],
            "AVATAR_RELEASE_GATE_KEY_TPU": secrets["ci-gate-tpu"],
            "AVATAR_RELEASE_SIGNING_KEY": secrets["release"],
        },
        keys,
    )


def _cli(ws, env, *args) -> dict:
    """`avatar-release ARGS --json` through the installed script, as the workflow's steps run it."""
    return cli_json(ws, *args, env=env, program=("avatar-release",), timeout=None)


def test_the_example_workflow_runs_push_then_a_manual_prod_release_then_a_rollback(workspace, build_cache, tmp_path):
    from avatar_release.registry import open_registry
    from avatar_release.trust.statements import read_timestamp

    ws, secrets, keys = workspace
    registry = tmp_path / "registry"
    base_env = {k: v for k, v in os.environ.items() if k not in ("XLA_FLAGS", "AVATAR_RELEASE_TRUST_POLICY")}
    runner = Runner(ws, base_env, secrets, str(registry))

    # 0. An earlier release is in prod (another build: the k-split lever), put there by hand
    #    through the same policy, so this push gates against prod and a rollback has a target.
    env = {
        **base_env,
        "AVATAR_RELEASE_REGISTRY": str(registry),
        "AVATAR_RELEASE_ACTOR": "earlier-release",
        "AVATAR_RELEASE_TRUST_POLICY": str(ws / "examples" / "trust.toml"),
        "AVATAR_RELEASE_GATE_KEY": str(keys / "ci-gate-cpu.key"),
    }
    # the release manager initialises the registry's signed state once (the workflow's header says so)
    _cli(ws, env, "registry", "init", "--sign-key", str(keys / "release.key"))
    # The build `compile --set matmul_k_split=2` publishes (the session's build cache holds it: the
    # workflow's own compile, below, is the one this test is about); dev then points at it, signed.
    old = build_cache.compile(
        "tiny", "cpu-8", registry=open_registry(str(registry)), overrides={"matmul_k_split": "2"}, move_dev=False
    ).build_id
    _cli(ws, env, "promote", old, "--to", "dev")
    assert _cli(ws, env, "gate", old, "--baseline", "none")["status"] == "passed"
    _cli(ws, env, "promote", old, "--to", "staging")
    _cli(ws, env, "approve", "staging", "--key", str(keys / "release.key"))  # the second role
    _cli(ws, env, "promote", "staging", "--to", "prod", "--sign-key", str(keys / "release.key"))

    # 1. A push. The cpu-8 path compiles, gates against prod (found by the step's `ls`), stages.
    #    The TPU path compiles for v6e-8 on this CPU host and runs the compile gate. The v6e-8 legs
    #    first run as written, on the TPU build: this host refuses (exit 5) and says where to go;
    #    then their same shell runs on the cpu-8 build, signed with the cpu-8 gate key.
    refusals = []

    def on_cpu(outputs, needs):
        if not refusals:
            github = {
                "event_name": "push",
                "actor": "release-bot",
                "sha": "0" * 40,
                "run_id": "4242",
                "run_attempt": "1",
            }
            refusals.append(runner.run_job("gate-tpu-shard", github, {}, needs, {}, legs=[{"shard": 0}], expect_rc=5))
        moved = {**needs, "build-tpu": {"outputs": {"build": outputs["build-gate-stage"]["build"]}}}
        return moved, {"GATE_KEY_PEM": secrets["AVATAR_RELEASE_GATE_KEY_CPU"]}

    first = runner.run_event("push", hooks={"gate-tpu-shard": on_cpu, "gate-tpu-merge": on_cpu})
    assert runner.events[-1][1] == ["build-gate-stage", "build-tpu", "gate-tpu-shard", "gate-tpu-merge"]
    new, tpu = first["build-gate-stage"]["build"], first["build-tpu"]["build"]
    assert len({old, new, tpu}) == 3
    (refusal,) = refusals
    assert refusal["rc"] == 5 and "gate compile" in refusal["stderr"] + refusal["stdout"]

    gate = json.loads((ws / "gate.json").read_text())
    assert gate["status"] == "passed" and gate["result"]["baseline"]["build_id"] == old
    assert gate["result"]["tier"] == 2  # the k-split lever: judged by the band, not bit for bit
    assert json.loads((ws / "compile-gate.json").read_text())["status"] == "passed"
    shards = [json.loads((ws / f"shard-{k}.json").read_text())["shard"] for k in range(2)]
    assert sorted((s["index"], s["count"]) for s in shards) == [(0, 2), (1, 2)]
    assert all(s["build_id"] == new and s["run_id"] == "4242-1" for s in shards)  # from the workflow's env
    merged = json.loads((ws / "gate-tpu.json").read_text())
    assert merged["status"] == "passed" and merged["result"]["build_id"] == new
    assert (ws / "gate-report" / "index.html").is_file() and (ws / "gate-report-tpu" / "index.html").is_file()
    summary = (ws / "summary.md").read_text()
    assert new in summary and "staging" in summary  # gate and promote appended their step summaries
    # No raw C++ log reaches a step's output: the compiler's glog lines are summarised (and listed
    # under "xla_log" in the compile's JSON).
    raw = [
        (e["job"], line)
        for e in runner.log
        for line in e["stderr"].splitlines()
        if re.match(r"[IWEF]\d{4} \d\d:\d\d:", line) or "Contact Shardy" in line
    ]
    assert not raw, raw[:3]
    # ... and there is nothing to summarise: no build of tiny makes the partitioner fall back to
    # replicating a tensor (the SPMD rematerialization warning), on cpu-8 or on tpu-v6e-8.
    for name in ("compile.json", "compile-tpu.json"):
        assert json.loads((ws / name).read_text())["xla_log"] == [], name
    ls = _cli(ws, env, "ls")
    assert ls["channels"]["staging"] == new and ls["channels"]["prod"] == old

    # 2. By hand: promote-prod (staging -> prod, signed); then rollback-prod.
    runner.run_event("workflow_dispatch", {"action": "promote-prod"})
    assert runner.events[-1][1] == ["promote-prod"]
    assert _cli(ws, env, "ls")["channels"]["prod"] == new
    runner.run_event("workflow_dispatch", {"action": "rollback-prod"})
    assert runner.events[-1][1] == ["rollback-prod"]
    assert _cli(ws, env, "ls")["channels"]["prod"] == old
    history = _cli(ws, env, "history", "prod")
    assert [e["to_build"] for e in history["entries"]][-3:] == [old, new, old]

    # 3. The schedule: prod's signed timestamp is re-signed for the current head (staging has no
    #    signed move; the step tolerates that, as its `|| true` says).
    reg = open_registry(str(registry), create=False)
    before = read_timestamp(reg, "prod")
    runner.run_event("schedule")
    assert runner.events[-1][1] == ["refresh-timestamps"]
    after = read_timestamp(reg, "prod")
    assert after is not None and after.payload.build_id == old
    assert before is None or after.payload.issued_at >= before.payload.issued_at
