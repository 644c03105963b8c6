"""Retries against a real registry server (docker-registry), decided by urllib3's ``Retry``: a 429
or 503 with ``Retry-After`` waits what the registry asks (bounded), other transient answers back
off, and giving up names the host, the operation, the attempts and the last status."""

from __future__ import annotations

import time
import types
import uuid
from email.utils import formatdate

import pytest
import requests

from avatar_release.errors import RegistryError
from avatar_release.registry import OciRegistry
from avatar_release.registry.oci import RetryPolicy
from tests.oci_memory import MemoryResponse


class Busy(requests.Session):
    """A real session in front of the server that answers the first ``times`` blob GETs itself."""

    def __init__(self, status: int, headers: dict[str, str], times: int):
        super().__init__()
        self.status, self.headers_, self.left = status, headers, times

    def request(self, method, url, **kw):
        if method == "GET" and "/blobs/" in url and self.left > 0:
            self.left -= 1
            return MemoryResponse(
                self.status, dict(self.headers_), b'{"errors":[{"code":"TOOMANYREQUESTS","message":"slow down"}]}', url
            )
        return super().request(method, url, **kw)


@pytest.fixture
def waits(monkeypatch) -> list[float]:
    """What the retries slept, recorded instead of slept."""
    slept: list[float] = []
    import urllib3.util.retry as retry_module

    monkeypatch.setattr(retry_module, "time", types.SimpleNamespace(sleep=slept.append, time=time.time))
    return slept


def _uri_with_blob(oci_server, tmp_path) -> tuple[str, str]:
    uri = f"oci://{oci_server.host}/t/{uuid.uuid4().hex[:10]}"
    return uri, OciRegistry(uri, lock_dir=tmp_path / "locks").put_blob(b"payload")


@pytest.mark.parametrize(("retry_after", "expected"), [("2", 2), ("3600", 7)])
def test_a_429_with_retry_after_waits_what_the_registry_asks_up_to_the_bound(
    oci_server, tmp_path, waits, retry_after, expected
):
    uri, digest = _uri_with_blob(oci_server, tmp_path)
    policy = RetryPolicy(attempts=4, base_delay=0.01, max_delay=0.05, max_retry_after=7)
    reg = OciRegistry(
        uri, session=Busy(429, {"Retry-After": retry_after}, times=1), retry=policy, lock_dir=tmp_path / "locks"
    )
    assert reg.get_blob(digest, 7) == b"payload"
    assert waits == [expected]


def test_a_retry_after_date_is_honoured_and_a_malformed_one_backs_off(oci_server, tmp_path, waits):
    uri, digest = _uri_with_blob(oci_server, tmp_path)
    policy = RetryPolicy(attempts=4, base_delay=0.01, max_delay=0.05, max_retry_after=30)
    dated = OciRegistry(
        uri,
        session=Busy(503, {"Retry-After": formatdate(time.time() + 20, usegmt=True)}, times=1),
        retry=policy,
        lock_dir=tmp_path / "locks",
    )
    assert dated.get_blob(digest, 7) == b"payload"
    assert len(waits) == 1 and 15 <= waits[0] <= 21
    waits.clear()
    garbled = OciRegistry(
        uri, session=Busy(503, {"Retry-After": "soon"}, times=2), retry=policy, lock_dir=tmp_path / "locks"
    )
    assert garbled.get_blob(digest, 7) == b"payload"
    assert all(w <= 0.05 for w in waits)  # urllib3's backoff (the first retry goes at once), not a crash


def test_giving_up_names_host_operation_attempts_and_the_last_status(oci_server, tmp_path, waits):
    uri, digest = _uri_with_blob(oci_server, tmp_path)
    policy = RetryPolicy(attempts=3, base_delay=0.01, max_delay=0.05, max_retry_after=30)
    reg = OciRegistry(uri, session=Busy(429, {"Retry-After": "1"}, times=10), retry=policy, lock_dir=tmp_path / "locks")
    with pytest.raises(RegistryError) as err:
        reg.get_blob(digest, 7)
    msg = str(err.value)
    assert (
        f"registry {uri.removeprefix('oci://')}: pull blob {digest} failed after 3 attempt(s), last: HTTP 429 "
        "(TOOMANYREQUESTS: slow down)"
    ) in msg
    assert "is up and reachable from here" in msg and waits == [1, 1]
