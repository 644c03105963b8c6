"""`copy` into an htpasswd + TLS registry with the login `compile` used (issue 42 item 5.5)."""

from __future__ import annotations

import json

from tests.helpers import cli
from tests.oci_logins import USERS, auths, basic_uri


def test_copy_to_a_basic_auth_tls_registry_sends_the_login_with_every_blob(built_registry, basic_server, pki, logins):
    root, result = built_registry
    logins(auths(basic_server.host, "ana", USERS["ana"]))
    uri = basic_uri(basic_server, pki["ca"])
    res = cli("copy", result.build_id, "--registry", root, "--to", uri, "--json")
    assert res.exit_code == 0, res.output
    report = json.loads(res.stdout)
    assert report["blobs_copied"] >= 2 and report["build_id"] == result.build_id
    assert cli("verify", result.build_id, "--no-programs", "--registry", uri).exit_code == 0
