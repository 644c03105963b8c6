"""One description of a machine, and one diff: ``expected`` vs ``actual``, field by field.

Every comparison of "the machine" goes through here: the loader (the build's target vs this
host), the gates (the baseline's gate machine vs this one; the build vs this one), the
promotion policy (the build's target vs where it was gated) and the CLI (through the loader).
Each says which fields it compares; none keeps a field list of its own.
"""

from __future__ import annotations

from dataclasses import dataclass
from dataclasses import fields as dc_fields
from typing import Literal

from ..records import EnvironmentRecord, Manifest, Platform

__all__ = ["Machine", "MachineDiff", "diff_machines", "RUN_FIELDS", "ALL_FIELDS"]

ALL_FIELDS = ("backend", "platform_version", "device_kind", "device_count", "jax", "jaxlib", "cpu_features")
# What must match for a compiled executable to run here: the XLA runtime (jaxlib, not jax),
# the backend and its version, the devices, and the ISA extensions XLA:CPU generated code for.
RUN_FIELDS = ("jaxlib", "backend", "platform_version", "device_kind", "device_count", "cpu_features")


@dataclass(frozen=True)
class Machine:
    """A machine as far as an XLA executable can tell: runtime versions, backend, devices."""

    backend: str
    platform_version: str | None = None
    device_kind: str | None = None
    device_count: int | None = None
    jax: str | None = None
    jaxlib: str | None = None
    cpu_features: tuple[str, ...] | None = None  # recorded for XLA:CPU only

    @classmethod
    def of_build(cls, manifest: Manifest) -> Machine:
        """What a build was compiled for (its target's platform and the compiling toolchain)."""
        p = manifest.platform
        # A build compiled from a topology records no live platform version ("topology:..."): no
        # device reports that string, so it is not compared (the device kind and count, and jaxlib
        # with the plugin it pins, still are).
        version = None if p.platform_version.startswith("topology:") else p.platform_version
        return cls(
            backend=p.backend,
            platform_version=version,
            device_kind=p.device_kind,
            device_count=p.device_count,
            jax=manifest.toolchain.jax,
            jaxlib=manifest.toolchain.jaxlib,
            cpu_features=None if p.cpu_features is None else tuple(p.cpu_features),
        )

    @classmethod
    def of_platform(cls, platform: Platform, *, jax: str | None, jaxlib: str | None) -> Machine:
        """A live machine described as a Platform record (``machine.current_platform``)."""
        return cls(
            backend=platform.backend,
            platform_version=platform.platform_version,
            device_kind=platform.device_kind,
            device_count=platform.device_count,
            jax=jax,
            jaxlib=jaxlib,
            cpu_features=None if platform.cpu_features is None else tuple(platform.cpu_features),
        )

    @classmethod
    def of_environment(cls, env: EnvironmentRecord) -> Machine:
        """Where a gate ran (an EnvironmentRecord)."""
        return cls(
            backend=env.backend,
            platform_version=env.platform_version,
            device_kind=env.device_kind,
            device_count=env.device_count,
            jax=env.jax,
            jaxlib=env.jaxlib,
            cpu_features=None if env.cpu_features is None else tuple(env.cpu_features),
        )

    def describe(self) -> str:
        return f"{self.backend}: {self.device_kind} x {self.device_count}"


@dataclass(frozen=True)
class MachineDiff:
    """Every field that differs, as {field: (expected, actual)}; empty (falsy) when they match."""

    differences: dict[str, tuple[object, object]]

    def __bool__(self) -> bool:
        return bool(self.differences)

    def lines(self, expected: str = "expected", actual: str = "actual", indent: str = "  ") -> str:
        return "\n".join(f"{indent}{k}: {expected} {e!r}, {actual} {a!r}" for k, (e, a) in self.differences.items())

    def inline(self, expected: str = "expected", actual: str = "actual") -> str:
        return "; ".join(f"{k}: {expected} {e}, {actual} {a}" for k, (e, a) in self.differences.items())


def diff_machines(
    expected: Machine,
    actual: Machine,
    *,
    fields: tuple[str, ...] = ALL_FIELDS,
    cpu_features: Literal["subset", "equal"] = "subset",
) -> MachineDiff:
    """Compare ``fields`` of two machines.

    ``cpu_features="subset"``: the expected ISA extensions must all be present on the actual
    machine (code built for fewer runs on more); ``"equal"``: the sets must be the same (two
    gate machines whose outputs are compared bit for bit). Fields the expected side does not
    record (None) are not compared.
    """
    known = {f.name for f in dc_fields(Machine)}
    unknown = [f for f in fields if f not in known]
    if unknown:
        raise ValueError(f"unknown machine field(s) {unknown}; known: {sorted(known)}")
    out: dict[str, tuple[object, object]] = {}
    for name in fields:
        e, a = getattr(expected, name), getattr(actual, name)
        if e is None:
            continue
        if name == "cpu_features" and cpu_features == "subset":
            missing = sorted(set(e) - set(a or ()))
            if missing:
                out[name] = (list(e), f"{list(a or ())} (missing {missing})")
        elif e != a:
            out[name] = (list(e) if isinstance(e, tuple) else e, list(a) if isinstance(a, tuple) else a)
    return MachineDiff(out)
