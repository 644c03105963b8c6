"""Where one OCI repository lives: ``oci://HOST[:PORT]/REPO[?ca=PATH]``.

``oci://`` speaks plain HTTP to ``localhost``, ``127.0.0.1`` and ``[::1]`` and HTTPS to
anything else; ``oci+http://`` and ``oci+https://`` force one or the other. HTTPS verifies the
server against the system CAs, or against the CA file named by ``?ca=PATH`` (or, for every
registry, ``$AVATAR_RELEASE_REGISTRY_CA``). Credentials never appear in the URI: they come
from the container tools' login files (see :mod:`._auth`).
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from urllib.parse import parse_qsl

from ...errors import InputError

__all__ = ["OciLocation", "parse_oci_uri", "LOCAL_HOSTS", "CA_ENV"]

CA_ENV = "AVATAR_RELEASE_REGISTRY_CA"
LOCAL_HOSTS = ("localhost", "127.0.0.1", "[::1]")
_REPO_RE = re.compile(r"^[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*(?:/[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*)*$")
_HOST_RE = re.compile(
    r"^(?:[A-Za-z0-9](?:[A-Za-z0-9-]*[A-Za-z0-9])?(?:\.[A-Za-z0-9](?:[A-Za-z0-9-]*[A-Za-z0-9])?)*"
    r"|\[[0-9a-fA-F:]+\])(?::[0-9]{1,5})?$"
)


@dataclass(frozen=True)
class OciLocation:
    """Where one repository lives: ``{scheme}://{host}/v2/{repo}/``; ``ca`` a CA bundle for HTTPS."""

    scheme: str
    host: str
    repo: str
    ca: str | None = None

    @property
    def root(self) -> str:
        return f"{self.scheme}://{self.host}"

    @property
    def base(self) -> str:
        return f"{self.root}/v2/{self.repo}"

    @property
    def hostname(self) -> str:
        return hostname_of(self.host)

    def verify(self) -> str | bool:
        """What TLS verification uses: the URI's CA file, then $AVATAR_RELEASE_REGISTRY_CA, then the system CAs."""
        return self.ca or os.environ.get(CA_ENV) or True


def hostname_of(netloc: str) -> str:
    """``host:port`` -> ``host`` (``[::1]:5000`` -> ``[::1]``)."""
    if netloc.startswith("["):
        return netloc.split("]")[0] + "]"
    return netloc.rsplit(":", 1)[0]


def parse_oci_uri(uri: str) -> OciLocation:
    """``oci://HOST[:PORT]/REPO[?ca=PATH]`` (and ``oci+http://``, ``oci+https://``) -> OciLocation."""
    scheme, sep, rest = uri.partition("://")
    forced = {"oci": None, "oci+http": "http", "oci+https": "https"}
    if not sep or scheme not in forced:
        raise InputError(f"registry {uri!r}: expected oci://HOST[:PORT]/REPO (or oci+http://, oci+https://)")
    rest, _, query = rest.partition("?")
    params = dict(parse_qsl(query, keep_blank_values=True)) if query else {}
    if any(c in rest for c in "#@ \\") or set(params) - {"ca"} or (query and not params.get("ca")):
        raise InputError(
            f"registry {uri!r}: no credentials, query (other than ?ca=PATH) or fragment allowed in an oci:// URI; "
            "expected oci://HOST[:PORT]/REPO[?ca=PATH]; log in with `docker login HOST` instead of credentials"
        )
    host, _, repo = rest.partition("/")
    if not host or not _HOST_RE.match(host):
        raise InputError(f"registry {uri!r}: invalid host {host!r}; expected HOST or HOST:PORT")
    repo = repo.rstrip("/")
    if not repo or len(repo) > 255 or not _REPO_RE.match(repo):
        raise InputError(
            f"registry {uri!r}: invalid repository {repo!r}; expected lowercase path components "
            "of letters and digits joined by '.', '_', '__' or '-', separated by '/', e.g. oci://HOST:5000/team/avatar"
        )
    default = "http" if hostname_of(host) in LOCAL_HOSTS else "https"
    return OciLocation(forced[scheme] or default, host, repo, params.get("ca") or None)
