"""One compiled tiny build per test session, shared read-only by the integration tests; and the
registries teams run (htpasswd over TLS, token auth), started by the tests that ask for them."""

from __future__ import annotations

import shutil

import pytest

from tests.oci_logins import basic_server, logins, pki, token_setup  # noqa: F401 (fixtures)


@pytest.fixture(scope="session")
def built_registry(tmp_path_factory):
    """A local registry holding one tiny cpu-8 build, published to dev."""
    from avatar_release.compile import compile_build
    from avatar_release.registry import LocalRegistry

    root = tmp_path_factory.mktemp("registry") / "reg"
    reg = LocalRegistry(root)
    result = compile_build("tiny", "cpu-8", registry=reg)
    return root, result


@pytest.fixture
def registry_copy(built_registry, tmp_path):
    """A private copy of the built registry that a test may damage."""
    root, result = built_registry
    dest = tmp_path / "reg"
    shutil.copytree(root, dest)
    return dest, result
