"""Where the signed release state lives in a registry, and how its files are read and written.

Every role's metadata is a record of the namespace ``release-state`` (any backend stores it:
a directory, an OCI registry, Artifact Registry): ``N.root.json`` for every root version,
``N.<role>.json`` for every version of the other roles (TUF's consistent snapshots: nothing is
overwritten, so a reader always finds the files a snapshot names), and ``timestamp.json``, the
one file that changes in place, by compare-and-swap on its version.

Also the fetcher that lets python-tuf's client (``tuf.ngclient``) read that namespace through the
registry protocol instead of HTTP, and the key conversions between this project's Ed25519 keys
and TUF's.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from ..errors import ConflictError, IntegrityError
from ..records.stored import RELEASE_STATE
from ..registry import Registry

if TYPE_CHECKING:
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey
    from securesystemslib.signer import Signer, SSlibKey
    from tuf.api.metadata import Metadata
    from tuf.ngclient.fetcher import FetcherInterface

__all__ = [
    "NAMESPACE",
    "META_URL",
    "PROD_ROLES_FIELD",
    "versioned_name",
    "parse_name",
    "list_versions",
    "put_new",
    "swap_timestamp",
    "tuf_key",
    "tuf_signer",
    "public_key_of",
    "to_bytes",
    "registry_fetcher",
]

NAMESPACE = RELEASE_STATE.name
META_URL = "avatar-release-state:/metadata/"  # what ngclient is told; the fetcher maps it to records
# The top-level targets' field that says whose evidence a pod demands for prod ("gate", "approver").
PROD_ROLES_FIELD = "x-avatar-release-prod-requires"
_NAME = re.compile(r"^(\d+)\.([a-z][a-z-]*)\.json$")


def versioned_name(role: str, version: int) -> str:
    return f"{version}.{role}.json"


def parse_name(name: str) -> tuple[int, str] | None:
    m = _NAME.match(name)
    return (int(m.group(1)), m.group(2)) if m else None


def list_versions(registry: Registry) -> dict[str, int]:
    """{role: the highest version the registry holds a file of}."""
    newest: dict[str, int] = {}
    for name in registry.list_records(NAMESPACE):
        parsed = parse_name(name)
        if parsed:
            newest[parsed[1]] = max(newest.get(parsed[1], 0), parsed[0])
    return newest


def to_bytes(md: Metadata) -> bytes:
    from tuf.api.serialization.json import JSONSerializer

    return md.to_bytes(JSONSerializer(compact=True))


def put_new(registry: Registry, name: str, data: bytes) -> None:
    """Write a versioned file that must not exist yet (the same bytes again are a no-op)."""

    def write(old: bytes | None) -> bytes:
        if old is not None and old != data:
            raise ConflictError(
                f"release state: {name} was written by another promoter at the same time; nothing "
                "was changed here, run the command again"
            )
        return data

    registry.update_record(NAMESPACE, name, write)


def swap_timestamp(registry: Registry, data: bytes, expected_version: int | None) -> None:
    """Replace ``timestamp.json`` if it still has ``expected_version`` (None: there is none yet)."""

    def write(old: bytes | None) -> bytes:
        found = None
        if old is not None:
            try:
                found = int(json.loads(old)["signed"]["version"])
            except (ValueError, KeyError, TypeError):
                raise IntegrityError("release state: timestamp.json is not TUF timestamp metadata") from None
        if found != expected_version:
            raise ConflictError(
                f"release state: the timestamp moved from version {expected_version} to {found} while "
                "this command ran (another promoter); nothing was changed here, run it again"
            )
        return data

    registry.update_record(NAMESPACE, "timestamp.json", write)


def tuf_key(public_key: Ed25519PublicKey) -> SSlibKey:
    from securesystemslib.signer import SSlibKey

    return SSlibKey.from_crypto(public_key)


def tuf_signer(private_key: Ed25519PrivateKey) -> Signer:
    from securesystemslib.signer import CryptoSigner

    return CryptoSigner(private_key)


def public_key_of(key: Any) -> Ed25519PublicKey:
    """The Ed25519 public key of a TUF key from signed metadata (our DSSE checks take these)."""
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

    if getattr(key, "keytype", None) != "ed25519":
        raise IntegrityError(
            f"release state: key {getattr(key, 'keyid', '?')} is a {getattr(key, 'keytype', '?')} "
            "key; avatar-release signs with Ed25519 only"
        )
    return Ed25519PublicKey.from_public_bytes(bytes.fromhex(key.keyval["public"]))


def registry_fetcher(registry: Registry) -> FetcherInterface:
    """A ``tuf.ngclient`` fetcher that reads the namespace through ``registry`` (any backend)."""
    from tuf.api.exceptions import DownloadHTTPError
    from tuf.ngclient.fetcher import FetcherInterface

    class RegistryFetcher(FetcherInterface):
        def _fetch(self, url: str) -> Iterator[bytes]:
            name = url.rsplit("/", 1)[-1]
            data = registry.get_record(NAMESPACE, name)
            if data is None:
                raise DownloadHTTPError(f"{name}: not in the registry's release state", 404)
            return iter([data])

    return RegistryFetcher()
