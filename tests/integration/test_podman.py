"""deploy/ run for real: the image built from deploy/Containerfile, the StatefulSet's pod of
deploy/serving.cpu.yaml started by `podman kube play`, a render streamed from it, SIGTERM drained.

What stands in, and why (this machine cannot pull images and runs no kubelet):
- the base image is made from this machine's interpreter (tests/integration/installs.py) and
  passed as the Containerfile's BASE; the Containerfile itself is used unchanged;
- podman plays no StatefulSet: its pod template is played as a Deployment, and its trust-state
  claim template as a PersistentVolumeClaim (a podman volume) of the same name;
- the pod is played as written except for what a cluster would supply: the image name,
  the registry (a local store on a hostPath instead of GAR), the channel (`dev`, where the test's
  build is), a hostPort to reach it, and the trust key Secret as a hostPath file;
- podman on this host needs runc and explicit ulimits (a containers.conf made here), and the
  build's pip reaches the machine's package mirror through the host's CA and pip indexes.

Needs podman, runc and catatonit (Debian packages); skips without them unless
AVATAR_RELEASE_REQUIRE_PODMAN is set. CI does not install them (see docs/how-to/serve-on-kubernetes.md).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest
import yaml

from tests.integration.installs import REPO, build_base_tar, build_wheel_venv, elf_files
from tests.tools import binary

pytestmark = pytest.mark.slow

PORT = 18080


@pytest.fixture(scope="module")
def podman_env(tmp_path_factory):
    for tool in ("podman", "runc", "catatonit"):
        binary(tool)
    d = tmp_path_factory.mktemp("podman")
    conf = d / "containers.conf"
    conf.write_text(
        '[containers]\ndefault_ulimits = ["nofile=20000:20000", "nproc=4096:4096"]\n'
        '[engine]\nruntime = "runc"\ncgroup_manager = "cgroupfs"\n'
    )
    env = {**os.environ, "CONTAINERS_CONF": str(conf)}
    env.pop("XLA_FLAGS", None)
    return d, env


def _podman(env, *args, check=True, timeout=900) -> subprocess.CompletedProcess:
    out = subprocess.run(["podman", *args], env=env, capture_output=True, text=True, timeout=timeout)
    if check and out.returncode != 0:
        raise AssertionError(f"podman {' '.join(args[:3])} exited {out.returncode}:\n{out.stderr[-3000:]}")
    return out


@pytest.fixture(scope="module")
def serve_image(podman_env):
    d, env = podman_env
    # The base's system libraries: whatever the serving install's compiled code links against.
    _, venv = build_wheel_venv(d)
    site = next((venv / "lib").glob("python3*/site-packages"))
    build_base_tar(d / "base.tar", elf_files(site))
    base = "localhost/avatar-test-host-python:3.11"
    _podman(
        env,
        "import",
        "--change",
        "ENV PATH=/usr/local/bin:/usr/bin:/bin",
        "--change",
        "ENV HOME=/root",
        str(d / "base.tar"),
        base,
    )
    pip_conf = d / "pip.conf"
    pip_conf.write_text(
        "[global]\nextra-index-url = file:///opt/pypi/simple file:///opt/pypi-more/simple\n"
        "find-links = /opt/wheels\ncert = /etc/ssl/certs/ca-certificates.crt\n"
        "disable-pip-version-check = true\n"
    )
    mounts = [
        f"{pip_conf}:/etc/pip.conf:ro",
        "/etc/ssl/certs/ca-certificates.crt:/etc/ssl/certs/ca-certificates.crt:ro",
    ]
    mounts += [f"{p}:{p}:ro" for p in ("/opt/pypi", "/opt/pypi-more", "/opt/wheels") if Path(p).is_dir()]
    tag = "localhost/avatar-serve:test"
    _podman(
        env,
        "build",
        "-q",
        "-f",
        str(REPO / "deploy" / "Containerfile"),
        "--build-arg",
        f"BASE={base}",
        *[a for m in mounts for a in ("-v", m)],
        "-t",
        tag,
        str(REPO),
        timeout=1800,
    )
    yield tag
    _podman(env, "rmi", "-f", tag, base, check=False)


def _kube_yaml(out: Path, image: str, registry: Path, keys: Path, claim_name: str) -> Path:
    docs = list(yaml.safe_load_all((REPO / "deploy" / "serving.cpu.yaml").read_text()))
    (sts,) = [d for d in docs if d["kind"] == "StatefulSet"]
    (claim,) = sts["spec"]["volumeClaimTemplates"]
    dep = {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": sts["metadata"],
        "spec": {"replicas": 1, "selector": sts["spec"]["selector"], "template": sts["spec"]["template"]},
    }
    pvc = {"apiVersion": "v1", "kind": "PersistentVolumeClaim", "metadata": {"name": claim_name}, "spec": claim["spec"]}
    pod = dep["spec"]["template"]["spec"]
    pod["volumes"].append({"name": claim["metadata"]["name"], "persistentVolumeClaim": {"claimName": claim_name}})
    (c,) = pod["containers"]
    c["image"] = image
    c["args"] = ["dev" if a == "prod" else a for a in c["args"]]
    for e in c["env"]:
        if e["name"] == "AVATAR_RELEASE_REGISTRY":
            e["value"] = "/registry"
    c["ports"][0]["hostPort"] = PORT
    c["volumeMounts"].append({"name": "registry", "mountPath": "/registry"})
    for init in pod.get("initContainers", []):
        init["image"] = image
    for v in pod["volumes"]:
        if v["name"] == "trust":  # the Secret's one file, as a hostPath here
            v.pop("secret")
            v["hostPath"] = {"path": str(keys), "type": "Directory"}
        if v["name"] == "node-cache":  # the node's blob cache: a fresh directory of this test
            v["hostPath"] = {"path": str(out / "node-cache"), "type": "DirectoryOrCreate"}
    pod["volumes"].append({"name": "registry", "hostPath": {"path": str(registry), "type": "Directory"}})
    path = out / "serving.yaml"
    path.write_text(yaml.safe_dump_all([pvc, dep]))
    return path


def _get(path: str, timeout=10):
    return urllib.request.urlopen(f"http://127.0.0.1:{PORT}{path}", timeout=timeout)


def test_the_container_image_serves_the_deployment_under_podman_kube_play(
    podman_env, serve_image, registry_copy, tmp_path
):
    from avatar_release.promote.actions import refresh_timestamp, sign_channel
    from avatar_release.registry import LocalRegistry
    from avatar_release.trust.keys import generate_keypair, load_private_key

    _, env = podman_env
    root, result = registry_copy
    priv, pub, _ = generate_keypair(tmp_path / "keys", "release")
    reg = LocalRegistry(root)
    key = load_private_key(priv)
    sign_channel(reg, "dev", key)
    refresh_timestamp(reg, "dev", key)
    trust = tmp_path / "trust"
    trust.mkdir()
    shutil.copy(pub, trust / "trust.pub")
    # The pod runs as uid 10001: it reads the store and may sweep its tmp/.
    subprocess.run(["chmod", "-R", "a+rX", str(root), str(trust)], check=True)
    os.chmod(root / "tmp", 0o1777)
    claim = f"avatar-trust-state-{os.getpid()}-{time.time_ns() % 10**9}"  # podman keeps volumes after `kube down`
    kube = _kube_yaml(tmp_path, serve_image, root, trust, claim)

    _podman(env, "kube", "play", str(kube))
    try:
        t0, ready = time.time(), None
        while time.time() - t0 < 300:
            try:
                ready = json.loads(_get("/readyz").read())
                break
            except (urllib.error.URLError, ConnectionError, OSError):
                time.sleep(1)
        assert ready and ready["ready"] is True and ready["build_id"] == result.build_id, _podman(
            env, "logs", "avatar-serve-cpu-pod-0-serve", check=False
        ).stderr[-3000:]
        req = urllib.request.Request(
            f"http://127.0.0.1:{PORT}/render",
            data=json.dumps({"seconds": 0.4}).encode(),
            method="POST",
            headers={"Content-Type": "application/json"},
        )
        with urllib.request.urlopen(req, timeout=300) as resp:
            data = resp.read()
            assert resp.headers["X-Compiles"] == "0" and resp.headers["X-Build-Id"] == result.build_id
        assert data[4:8] == b"ftyp" and b"moof" in data
        metrics = _get("/metrics").read().decode()
        assert "avatar_serve_compiles_total 0.0" in metrics
        assert 'avatar_serve_requests_total{route="/render",status="200"} 1.0' in metrics
        # SIGTERM (pod stop): drain, exit 0, and say so in the log.
        _podman(env, "pod", "stop", "-t", "90", "avatar-serve-cpu-pod-0")
        state = _podman(env, "inspect", "avatar-serve-cpu-pod-0-serve", "--format", "{{.State.ExitCode}}").stdout
        assert state.strip() == "0"
        log = _podman(env, "logs", "avatar-serve-cpu-pod-0-serve").stderr
        events = [json.loads(x)["event"] for x in log.splitlines() if x.startswith("{")]
        assert "draining" in events and events[-1] == "stopped"
    finally:
        _podman(env, "kube", "down", str(kube), check=False)
        _podman(env, "volume", "rm", "-f", claim, check=False)
