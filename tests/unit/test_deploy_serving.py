"""The serving pod's deploy files: valid Kubernetes for 1.31, probes on the app's real routes, the
arguments the CLI accepts, a grace period that covers the drain, the Containerfile runtime-only."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from tests.tools import module

ROOT = Path(__file__).resolve().parents[2]
K8S_VERSION = "1.31.0"
FILES = {"tpu": ROOT / "deploy" / "serving.tpu.yaml", "cpu": ROOT / "deploy" / "serving.cpu.yaml"}


def _docs(variant: str) -> dict[str, dict]:
    return {d["kind"]: d for d in yaml.safe_load_all(FILES[variant].read_text())}


@pytest.mark.parametrize("variant", sorted(FILES))
def test_serving_manifests_are_valid_kubernetes(variant):
    kv = module("kubernetes_validate")
    docs = _docs(variant)
    assert set(docs) == {"StatefulSet", "Service", "PodDisruptionBudget"}
    for doc in docs.values():
        kv.validate(doc, K8S_VERSION, strict=True)


@pytest.mark.parametrize("variant", sorted(FILES))
def test_probes_args_and_grace_match_the_pod(variant, monkeypatch):
    from avatar_release.cli import cli

    monkeypatch.setenv("AVATAR_RELEASE_REGISTRY", "memory://pod")  # the manifest's env names the real one
    from avatar_release.serving import create_app

    dep = _docs(variant)["StatefulSet"]
    pod = dep["spec"]["template"]["spec"]
    (c,) = pod["containers"]
    routes = {r.path for r in create_app(None).routes}
    assert c["startupProbe"]["httpGet"]["path"] == c["readinessProbe"]["httpGet"]["path"] == "/readyz"
    assert c["livenessProbe"]["httpGet"]["path"] == "/livez" and {"/readyz", "/livez"} <= routes
    env = {e["name"]: e.get("value") for e in c["env"]}
    ports = {p["name"]: p["containerPort"] for p in c["ports"]}
    assert env["AVATAR_RELEASE_HOST"] == "0.0.0.0" and int(env["AVATAR_RELEASE_PORT"]) == ports["http"]
    # the kubelet probes the pod's own probe listener, which the Service does not expose: a flood of
    # the render port cannot fail a probe
    assert int(env["AVATAR_RELEASE_PROBE_PORT"]) == ports["probes"] != ports["http"]
    assert {c[p]["httpGet"]["port"] for p in ("startupProbe", "readinessProbe", "livenessProbe")} == {"probes"}
    service = _docs(variant)["Service"]
    assert [p["targetPort"] for p in service["spec"]["ports"]] == ["http"]
    # the registry's root (what the pod pins) is read from the mounted Secret
    mount = next(m for m in c["volumeMounts"] if m["name"] == "trust")
    assert env["AVATAR_RELEASE_TRUST_ROOT"].startswith(mount["mountPath"] + "/")
    assert next(v for v in pod["volumes"] if v["name"] == "trust")["secret"]["secretName"]
    # the CLI accepts the arguments, and the grace period covers preStop + the drain
    ctx = cli.get_command(None, "serve").make_context("serve", list(c["args"]))
    assert ctx.params["follow"] is True and ctx.params["channel"] == "prod"
    pre_stop = int(c["lifecycle"]["preStop"]["exec"]["command"][-1])
    assert pod["terminationGracePeriodSeconds"] > pre_stop + ctx.params["grace"]
    assert dep["spec"]["updateStrategy"]["type"] == "RollingUpdate" and dep["spec"]["serviceName"]
    # what the pod trusted (the signed state's metadata) persists across restarts: it lives on the
    # pod's own claim, never an emptyDir, so a restarted pod still refuses metadata older than it saw
    state = next(m for m in c["volumeMounts"] if env["AVATAR_RELEASE_STATE_DIR"] == m["mountPath"])
    assert state["name"] not in {v["name"] for v in pod["volumes"]}
    (claim,) = dep["spec"]["volumeClaimTemplates"]
    assert claim["metadata"]["name"] == state["name"] and claim["spec"]["accessModes"] == ["ReadWriteOnce"]
    if variant == "tpu":
        assert pod["nodeSelector"] == {
            "cloud.google.com/gke-tpu-accelerator": "tpu-v6e-slice",
            "cloud.google.com/gke-tpu-topology": "2x4",
        }
        assert c["resources"]["limits"]["google.com/tpu"] == "8"
    else:
        assert "nodeSelector" not in pod and "google.com/tpu" not in str(c["resources"])


def test_the_containerfile_is_runtime_only_and_execs_the_server():
    text = (ROOT / "deploy" / "Containerfile").read_text()
    assert 'ENTRYPOINT ["avatar-release", "serve"]' in text  # exec form: the server itself gets SIGTERM
    assert "[compile]" not in text and "torch" not in text.split("FROM", 1)[1]
    assert "USER 10001" in text and "AVATAR_RELEASE_HOST=0.0.0.0" in text


@pytest.mark.parametrize("variant", sorted(FILES))
def test_the_pods_of_a_node_share_one_node_cache_the_server_can_write(variant, monkeypatch, tmp_path):
    from avatar_release.registry import CachedRegistry, OciRegistry, with_node_cache

    pod = _docs(variant)["StatefulSet"]["spec"]["template"]["spec"]
    (c,) = pod["containers"]
    env = {e["name"]: e.get("value") for e in c["env"]}
    mount = next(m for m in c["volumeMounts"] if m["mountPath"] == env["AVATAR_RELEASE_CACHE_DIR"])
    volume = next(v for v in pod["volumes"] if v["name"] == mount["name"])
    # a directory of the node, not of the pod (an emptyDir would pull every blob once per pod)
    assert volume["hostPath"]["path"] == env["AVATAR_RELEASE_CACHE_DIR"]
    assert volume["hostPath"]["type"] == "DirectoryOrCreate"
    # hostPath ignores fsGroup: the init container hands the directory to the server's user
    (init,) = pod["initContainers"]
    user = pod["securityContext"]["runAsUser"]
    assert init["command"] == ["chown", f"{user}:{user}", env["AVATAR_RELEASE_CACHE_DIR"]]
    assert init["securityContext"]["capabilities"] == {"drop": ["ALL"], "add": ["CHOWN"]}
    assert {m["name"] for m in init["volumeMounts"]} == {mount["name"]}
    # what the server makes of that environment: a registry read through the cache there
    cached = with_node_cache(
        OciRegistry("oci://registry.example:5000/avatar", lock_dir=tmp_path),
        {**env, "AVATAR_RELEASE_CACHE_DIR": str(tmp_path / "cache")},
    )
    assert isinstance(cached, CachedRegistry)
    assert cached.cache.max_bytes >= 20 << 30 and cached.cache.concurrency == int(
        env["AVATAR_RELEASE_PULL_CONCURRENCY"]
    )
