"""The OCI distribution client: location, transport, login, artifact encoding, registry mapping
(the tests run it against a distribution registry held in memory, ``tests/oci_memory.py``).

``oci://HOST[:PORT]/REPO[?ca=PATH]`` opens :class:`OciRegistry`; Google Artifact Registry is the
same client with a Google access-token strategy (:mod:`.._gar`).
"""

from ._auth import (
    AnonymousAuth,
    Auth,
    Challenge,
    Credentials,
    LoginAuth,
    TokenAuth,
    auth_files,
    find_credentials,
    parse_challenge,
)
from ._layout import LAYOUT_1, LAYOUT_2, TagLayout, TagMigration, TagNames
from ._location import CA_ENV, OciLocation, parse_oci_uri
from ._registry import OciRegistry, Referrer, default_lock_dir
from ._transport import HttpResponse, HttpSession, Reply, RetryPolicy, Transport

__all__ = [
    "OciRegistry",
    "Referrer",
    "OciLocation",
    "parse_oci_uri",
    "CA_ENV",
    "RetryPolicy",
    "Transport",
    "Reply",
    "Auth",
    "AnonymousAuth",
    "TokenAuth",
    "LoginAuth",
    "Credentials",
    "Challenge",
    "find_credentials",
    "auth_files",
    "parse_challenge",
    "default_lock_dir",
    "HttpSession",
    "HttpResponse",
    "TagLayout",
    "TagNames",
    "TagMigration",
    "LAYOUT_1",
    "LAYOUT_2",
]
