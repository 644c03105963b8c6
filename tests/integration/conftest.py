"""One compiled tiny build per test session, shared read-only by the integration tests; and the
registries teams run (htpasswd over TLS, token auth), started by the tests that ask for them."""

from __future__ import annotations

import shutil

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
