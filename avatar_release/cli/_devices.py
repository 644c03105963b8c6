"""Setting up this process's devices before JAX starts: from a target (compile, calibrate) or from
a build's manifest once it is checked (render, serve, gate, rebuild)."""

from __future__ import annotations

from ..machine import configure_compile_env, configure_for_manifest
from ..records import Manifest, check_identity
from ..registry import Registry, Resolved, read_manifest
from ..runtime import TrustConfig, check_trusted
from ..specs import load_target

__all__ = ["prepare_devices_for_target", "prepare_devices_for_build"]


def prepare_devices_for_target(target_name: str) -> None:
    configure_compile_env(load_target(target_name))


def prepare_devices_for_build(registry: Registry, ref: str, trust: TrustConfig | None = None
                               ) -> tuple[Resolved, Manifest]:
    """Read the manifest (no JAX needed), check it, and only then apply what it asks of this process
    (its device count and its flag profile's XLA flags): nothing from a manifest acts before its
    identity and, with a trust key, the channel's signed statement for it are verified."""
    resolved, manifest = read_manifest(registry, ref)
    if trust is not None:
        check_identity(manifest)
        check_trusted(registry, resolved, trust, manifest)
    configure_for_manifest(manifest)
    return resolved, manifest
