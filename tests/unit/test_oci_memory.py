"""The package's in-memory distribution server answers as distribution does, so the OCI client's
paths that need a particular server behaviour (pagination, resumed uploads, refused manifests)
run in the fast lane without a network."""

from __future__ import annotations

import json
import os

import pytest

from avatar_release._digest import sha256_digest
from avatar_release.errors import IntegrityError
from avatar_release.registry import OciRegistry
from avatar_release.registry.oci import RetryPolicy
from tests.oci_memory import MemoryDistribution, MemoryResponse

FAST = RetryPolicy(attempts=1, base_delay=0.001, max_delay=0.001)


def _registry(tmp_path, server: MemoryDistribution) -> OciRegistry:
    return OciRegistry("oci+http://registry.test/team/app", session=server, retry=FAST, lock_dir=tmp_path / "locks")


def test_listings_follow_link_pagination_to_the_last_page(tmp_path):
    server = MemoryDistribution(page_size=2)
    reg = _registry(tmp_path, server)
    for n in range(5):
        reg.put_record("reviews", f"r-{n}", b"x")
    server.sent.clear()
    assert reg.list_records("reviews") == [f"r-{n}" for n in range(5)]
    pages = [u for m, u, _ in server.sent if "/tags/list" in u]
    assert len(pages) == 3 and "last=" in pages[-1]  # 5 record tags + none else: 2 + 2 + 1


def test_a_chunked_push_resumes_after_a_failed_chunk_and_pulls_back_verified(tmp_path):
    failed = []

    def drop_second_patch(method, url, headers, data):
        if method == "PATCH" and headers.get("Content-Range", "").startswith(f"{1 << 16}-") and not failed:
            failed.append(url)
            return MemoryResponse(503, {}, b"", url)  # after the transport's one attempt: resume from the session
        return None

    server = MemoryDistribution(before=drop_second_patch)
    reg = _registry(tmp_path, server)
    data = os.urandom(5 * (1 << 16) + 17)
    src = tmp_path / "big.bin"
    src.write_bytes(data)
    digest = reg.push_blob_from(src, chunk_size=1 << 16)
    assert digest == sha256_digest(data) and failed
    assert [m for m, u, _ in server.sent if "/blobs/uploads/" in u and m == "GET"] == ["GET"]  # asked where it got to
    assert reg.pull_blob_to(digest, len(data), tmp_path / "out.bin").read_bytes() == data


def test_a_manifest_naming_a_missing_blob_is_refused_as_distribution_does(tmp_path):
    reg = _registry(tmp_path, MemoryDistribution())
    ghost = {"digest": sha256_digest(b"never pushed"), "size": 12, "media_type": "application/octet-stream"}
    with pytest.raises(IntegrityError, match="a blob it references is missing .*MANIFEST_BLOB_UNKNOWN"):
        reg.put_build("b-ghost", json.dumps({"build_id": "b-ghost", "weights": {"blob": ghost}}).encode())


def test_blobs_are_shared_by_the_repositories_of_one_server(tmp_path):
    server = MemoryDistribution()
    one = _registry(tmp_path, server)
    two = OciRegistry("oci+http://registry.test/team/other", session=server, retry=FAST, lock_dir=tmp_path / "l2")
    digest = one.put_blob(b"weights")
    assert two.has_blob(digest) and two.get_blob(digest, 7) == b"weights"
    assert two.list_builds() == [] and one.manifests.list_tags() == []
