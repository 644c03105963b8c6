"""A real OCI registry for tests: CNCF distribution (``docker-registry serve``) on 127.0.0.1.

The server gets a free port, a config file written here (filesystem storage in a temp
directory, deletes enabled, an HTTP secret) and is up once ``GET /v2/`` answers 200. It can
be stopped and started again on the same port and storage, to play an outage.

Without the binary the tests skip, unless ``AVATAR_RELEASE_REQUIRE_REGISTRY`` is set, where
a missing registry fails them (CI that must run them): :func:`tests.tools.binary` decides.
"""

from __future__ import annotations

import secrets
import socket
import ssl
import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from tests.tools import binary

__all__ = ["OciServer", "oci_server"]


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class OciServer:
    """One distribution process serving ``root``; ``host`` is ``127.0.0.1:PORT``."""

    def __init__(
        self,
        exe: str,
        root: Path,
        port: int | None = None,
        *,
        tls: tuple[Path, Path] | None = None,
        auth: str = "",
        ca: Path | None = None,
    ):
        """``tls``: (certificate, key) to serve HTTPS; ``auth``: the ``auth:`` section of the config
        (htpasswd or token), indented YAML; ``ca``: what the readiness probe trusts."""
        self.exe, self.root = exe, Path(root)
        self.port = port or _free_port()
        self.tls, self.auth, self.ca = tls, auth, ca
        self.proc: subprocess.Popen | None = None
        self.log = self.root / "registry.log"

    @property
    def host(self) -> str:
        return f"127.0.0.1:{self.port}"

    def uri(self, repo: str) -> str:
        return f"oci{'+https' if self.tls else ''}://{self.host}/{repo}"

    def _config(self) -> Path:
        cfg = self.root / "config.yml"
        cfg.write_text(
            "version: 0.1\n"
            "log:\n  level: error\n  accesslog:\n    disabled: true\n"
            f"storage:\n  filesystem:\n    rootdirectory: {self.root / 'data'}\n  delete:\n    enabled: true\n"
            f"http:\n  addr: {self.host}\n  secret: {secrets.token_hex(16)}\n"
            + (f"  tls:\n    certificate: {self.tls[0]}\n    key: {self.tls[1]}\n" if self.tls else "")
            + (f"auth:\n{self.auth}" if self.auth else "")
        )
        return cfg

    def start(self, timeout: float = 20.0) -> OciServer:
        self.root.mkdir(parents=True, exist_ok=True)
        cfg = self._config()
        with open(self.log, "ab") as log:
            self.proc = subprocess.Popen(
                [self.exe, "serve", str(cfg)], stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL
            )
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                tail = self.log.read_text()[-2000:]
                raise RuntimeError(f"docker-registry exited with {self.proc.returncode}: {tail}")
            if self._answers():
                return self
            time.sleep(0.05)
        self.stop()
        raise RuntimeError(f"docker-registry did not answer GET /v2/ on {self.host} within {timeout}s")

    def _answers(self) -> bool:
        """``GET /v2/`` answers: 200, or 401 from a registry that wants credentials."""
        scheme = "https" if self.tls else "http"
        context = ssl.create_default_context(cafile=str(self.ca)) if self.tls and self.ca else None
        try:
            with urllib.request.urlopen(f"{scheme}://{self.host}/v2/", timeout=1, context=context) as r:
                return r.status == 200
        except urllib.error.HTTPError as e:
            return e.code == 401
        except (urllib.error.URLError, ConnectionError, OSError):
            return False

    def stop(self) -> None:
        if self.proc is None:
            return
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=5)
        self.proc = None

    def restart(self) -> OciServer:
        self.stop()
        return self.start()


@pytest.fixture(scope="module")
def oci_server(tmp_path_factory):
    """A registry shared by one test module; tests use their own repositories in it."""
    exe = binary("docker-registry")
    server = OciServer(exe, tmp_path_factory.mktemp("oci-registry")).start()
    try:
        yield server
    finally:
        server.stop()
