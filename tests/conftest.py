"""Test setup: 8 virtual CPU devices, set explicitly before anything initialises JAX."""

import os

os.environ["XLA_FLAGS"] = (
    os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8"
).strip()
os.environ.setdefault("JAX_PLATFORMS", "cpu")

# Shared fixture: the real OCI registry server (started only by the tests that ask for it).
from tests.oci_server import oci_server  # noqa: E402,F401
