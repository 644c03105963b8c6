"""One compiled tiny build per test session, shared read-only by the integration tests (also gated
once, for tests that need a gated baseline or a promotable first build); and the registries teams
run (htpasswd over TLS, token auth), started by the tests that ask for them."""

from __future__ import annotations

import shutil
from types import SimpleNamespace

import pytest

from tests.oci_logins import basic_server, logins, pki, token_setup  # noqa: F401 (fixtures)


@pytest.fixture(scope="session")
def built_registry(tmp_path_factory, build_cache):
    """A local registry holding one tiny cpu-8 build, published to dev (compiled once per session:
    both xdist workers share it through the build cache)."""
    from avatar_release.registry import LocalRegistry

    root = tmp_path_factory.mktemp("registry") / "reg"
    result = build_cache.compile("tiny", "cpu-8", registry=LocalRegistry(root))
    return root, result


@pytest.fixture
def registry_copy(built_registry, tmp_path):
    """A private copy of the built registry that a test may damage."""
    root, result = built_registry
    dest = tmp_path / "reg"
    shutil.copytree(root, dest)
    return dest, result


@pytest.fixture(scope="session")
def gated_registry(built_registry, tmp_path_factory):
    """The built registry with its build gated on its own (``--baseline none``, two fresh serving
    processes), once per session: both xdist workers share it beside the build cache
    (tests/build_cache.py's ``made_once``, as for builds). A baseline for candidates, a first build that may be
    promoted. Returns (root, the build, its stored verdict: ``result``, ``digest`` and the HTML
    ``report`` that gate wrote in ``report_dir``); copy it before changing it."""
    from avatar_release.gates import run_gate
    from avatar_release.gates.store import latest_result
    from avatar_release.registry import LocalRegistry
    from tests.build_cache import cache_dir, made_once

    root, build = built_registry

    def gate(entry):
        shutil.copytree(root, entry / "reg")
        outcome = run_gate(build.build_id, LocalRegistry(entry / "reg"), baseline="none", report_dir=entry / "report")
        assert outcome.result.status == "passed", outcome.result.gates

    shared = made_once(cache_dir(tmp_path_factory.getbasetemp()) / f"gated-{build.build_id}", gate)
    result, digest = latest_result(LocalRegistry(shared / "reg"), build.build_id)
    verdict = SimpleNamespace(
        result=result, digest=digest, report_dir=shared / "report", report=shared / "report" / "index.html"
    )
    return shared / "reg", build, verdict


@pytest.fixture
def gated_copy(gated_registry, tmp_path):
    """A private copy of the gated registry that a test may damage: (root, the build, its verdict)."""
    root, result, outcome = gated_registry
    dest = tmp_path / "gated-reg"  # beside registry_copy's, for a test that wants both
    shutil.copytree(root, dest)
    return dest, result, outcome


# Every attention kernel routed to Pallas (Mosaic on the TPU target).
TPU_KERNELS = {"attention_kernel": "blocksparse", "fused_preattn": "true", "dit.attention": "flash"}


@pytest.fixture(scope="session")
def tpu_registry(tmp_path_factory, build_cache):
    """tiny for tpu-v6e-8 with every attention kernel on Pallas, published to dev, and each program
    as XLA compiled it (text): compiled once per session (the build cache) for the TPU target's
    tests and the tpu benchmark's smoke row. Returns (root, the build, {executable key: program text});
    copy it before changing it."""
    from avatar_release.registry import LocalRegistry
    from tests.tools import need_extra

    need_extra("tpu")
    root = tmp_path_factory.mktemp("tpu") / "reg"
    result, texts = build_cache.compile_with_program_texts(
        "tiny", "tpu-v6e-8", registry=LocalRegistry(root), overrides=TPU_KERNELS
    )
    return root, result, texts
