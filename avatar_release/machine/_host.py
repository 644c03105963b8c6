"""The machine a process runs on: device setup, toolchain and platform fingerprints.

Nothing here runs at import. ``configure_host_devices`` must be called by an entry point
before anything initialises the JAX backend.
"""

from __future__ import annotations

import getpass
import os
import platform as _platform
import socket
import sys
from collections.abc import Sequence
from importlib import metadata
from typing import TYPE_CHECKING

from .. import __version__
from .._digest import canonical_json, sha256_digest
from ..errors import EnvironmentMismatch, InputError
from ..records import EnvironmentRecord, Manifest, Platform, Toolchain, check_identity
from ._heap import keep_freed_memory
from ._process import MAX_HOST_DEVICES, check_process_fields
from ._quiet import quiet_jax_import

if TYPE_CHECKING:
    import jax

    from ..specs import TargetSpec

__all__ = [
    "configure_host_devices",
    "configure_compile_env",
    "backend_initialized",
    "toolchain",
    "host_cpu_features",
    "current_platform",
    "configure_for_manifest",
    "missing_env_flags",
    "environment_record",
    "who",
]

# ISA extensions XLA:CPU may generate code for. A build made on a host with one of them
# can crash (SIGILL) on a host without it, so the loader requires build ⊆ host.
_ISA_FLAGS = (
    "sse4_1",
    "sse4_2",
    "avx",
    "avx2",
    "fma",
    "f16c",
    "bmi1",
    "bmi2",
    "avx512f",
    "avx512bw",
    "avx512cd",
    "avx512dq",
    "avx512vl",
    "avx512_bf16",
    "avx512_vnni",
    "avx512vbmi",
    "avx512_fp16",
    "avx_vnni",
    "amx_tile",
    "amx_bf16",
    "amx_int8",
)
_COUNT_FLAG = "--xla_force_host_platform_device_count"


def backend_initialized() -> bool:
    if "jax" not in sys.modules:
        return False
    # Lazy (heavy): only asks a JAX that is already imported; never starts one.
    from jax._src import xla_bridge

    return bool(getattr(xla_bridge, "_backends", None))


def configure_host_devices(count: int) -> None:
    """Ask XLA:CPU for ``count`` virtual devices. Must run before the backend starts."""
    if not 1 <= count <= MAX_HOST_DEVICES:  # a manifest's count is refused before (check_process_fields)
        raise InputError(
            f"{count} host devices asked for: expected 1 to {MAX_HOST_DEVICES} "
            "(avatar_release.machine.MAX_HOST_DEVICES)"
        )
    quiet_jax_import()
    flags = [f for f in os.environ.get("XLA_FLAGS", "").split() if not f.startswith(_COUNT_FLAG)]
    wanted = flags + [f"{_COUNT_FLAG}={count}"]
    if backend_initialized():
        # Lazy (heavy): JAX starts only after XLA_FLAGS are set (avatar_release.machine.configure_*).
        import jax

        have = len(jax.devices("cpu"))
        if have != count:
            raise EnvironmentMismatch(
                f"the JAX CPU backend already started with {have} devices, {count} are needed; "
                f"set XLA_FLAGS={_COUNT_FLAG}={count} before starting the process",
                {"device_count": (count, have)},
            )
        return
    os.environ["XLA_FLAGS"] = " ".join(wanted)


def configure_compile_env(target: TargetSpec) -> None:
    """Before JAX starts, for compiling ``target``: its device count (CPU) or the environment
    its compiler plugin reads (e.g. libtpu's, for a topology on a host without TPUs).

    Compiling never needs an accelerator (other platforms compile through a topology
    description), so JAX is limited to its CPU backend unless JAX_PLATFORMS says otherwise.
    Variables already set are left alone.
    """
    quiet_jax_import()
    if not backend_initialized():
        os.environ.setdefault("JAX_PLATFORMS", "cpu")
    if target.platform == "cpu":
        configure_host_devices(target.device_count)
        return
    # Read by the plugin when it first describes a topology, whatever backends already run.
    for key, value in target.compile_env.items():
        os.environ.setdefault(key, value)


def configure_for_manifest(manifest: Manifest) -> None:
    """Before JAX starts: the build's device count (CPU) and its flag profile's process flags; and
    for the process that will render it, freed chunk memory kept for the next chunk (``_heap``).

    The manifest's identity is checked first: process flags are applied only from a manifest
    whose fields (the flag profile included) hash to the build id it carries; then its device
    count, mesh and flags against their bounds and the known flags (``check_process_fields``):
    XLA aborts on what it cannot take, and an identity can be recomputed by whoever forged it.
    """
    check_identity(manifest)
    check_process_fields(manifest)
    keep_freed_memory()
    quiet_jax_import()
    if manifest.platform.backend == "cpu":
        if not backend_initialized():  # a CPU build runs on CPU: do not start other plugins
            os.environ.setdefault("JAX_PLATFORMS", "cpu")
        configure_host_devices(manifest.platform.device_count)
    have = os.environ.get("XLA_FLAGS", "").split()
    missing = [f for f in manifest.flags.env_flags if f not in have]
    if missing and not backend_initialized():
        os.environ["XLA_FLAGS"] = " ".join(have + missing)


def missing_env_flags(manifest: Manifest) -> list[str]:
    """Process-level XLA flags the build's flag profile pins that this process lacks."""
    have = os.environ.get("XLA_FLAGS", "").split()
    return [f for f in manifest.flags.env_flags if f not in have]


def _version(dist: str) -> str | None:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return None


def toolchain(*, with_compile_tools: bool) -> Toolchain:
    return Toolchain(
        python=_platform.python_version(),
        jax=_version("jax") or "?",
        jaxlib=_version("jaxlib") or "?",
        torch=_version("torch") if with_compile_tools else None,
        torchax=_version("torchax") if with_compile_tools else None,
        avatar_release=__version__,
    )


def host_cpu_features() -> list[str]:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("flags"):
                    have = set(line.split(":", 1)[1].split())
                    return [f for f in _ISA_FLAGS if f in have]
    except OSError:
        pass
    return []


def current_platform(
    devices: Sequence[jax.Device], mesh_axes: list[str], mesh_shape: list[int], topology: str | None = None
) -> Platform:
    """Describe ``devices`` (live or from a topology description) as a Platform record."""
    d0 = devices[0]
    backend = d0.platform
    try:
        version = d0.client.platform_version
        if backend == "gpu" and getattr(d0.client, "runtime_type", None) == "compile_only_runtime":
            # A GPU topology's client reports a version of its own ("PJRT C API\n<device name>"), not
            # the CUDA one a live device will: record it as a topology, as for clients that report
            # none. (A TPU topology's, "PJRT C API\nTFRT TPU v6 lite\nBuilt on ...", names libtpu's
            # build, which a live TPU on the same libtpu reports too: kept.)
            version = "topology:" + (topology or "?")
    except Exception:  # topology devices have no live client
        version = "topology:" + (topology or "?")
    return Platform(
        backend=backend,
        platform_version=str(version),
        device_kind=d0.device_kind,
        device_count=len(devices),
        mesh_axes=list(mesh_axes),
        mesh_shape=list(mesh_shape),
        topology=topology,
        cpu_features=host_cpu_features() if backend == "cpu" else None,
    )


def environment_record(backend: str | None = None) -> EnvironmentRecord:
    """This process's serving environment, with a fingerprint over it (JAX must be usable).

    Two gate runs are only compared when their fingerprints are equal: the same jax and
    jaxlib, backend and platform version, device kind and count, and for CPU backends the
    host's instruction-set features (XLA:CPU generates code for them).
    """
    # Lazy (heavy): JAX starts only after XLA_FLAGS are set (avatar_release.machine.configure_*).
    import jax

    devices = jax.devices(backend) if backend else jax.devices()
    d0 = devices[0]
    fields = {
        "backend": d0.platform,
        "platform_version": str(getattr(d0.client, "platform_version", "?")),
        "device_kind": d0.device_kind,
        "device_count": len(devices),
        "jax": _version("jax") or "?",
        "jaxlib": _version("jaxlib") or "?",
        "cpu_features": host_cpu_features() if d0.platform == "cpu" else None,
    }
    return EnvironmentRecord(fingerprint=sha256_digest(canonical_json(fields)), **fields)


def who() -> str:
    """Who is acting, for records and history: AVATAR_RELEASE_ACTOR (CI sets it), else user@host."""
    explicit = os.environ.get("AVATAR_RELEASE_ACTOR")
    if explicit:
        return explicit
    try:
        return f"{getpass.getuser()}@{socket.gethostname()}"
    except Exception:  # noqa: BLE001 - no user database in some containers
        return "unknown"
