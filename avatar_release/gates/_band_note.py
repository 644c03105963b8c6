"""Whether a similarity band was measured on this machine: a band is evidence for its own hardware."""

from __future__ import annotations

from ..records import Band, EnvironmentRecord

__all__ = ["band_measured_elsewhere"]


def band_measured_elsewhere(band: Band, env: EnvironmentRecord) -> str | None:
    """What differs between the machine a band was measured on and this one (None: the same).

    Reassociation noise depends on the hardware (an XLA:CPU with AMX or AVX-512 BF16 computes a
    bf16 matmul in another order than one without), so a band is evidence for its own machine:
    the gate still applies it, and says so when it comes from another."""
    theirs = band.environment
    if theirs.fingerprint == env.fingerprint:
        return None
    diffs = [
        f"{f} {getattr(theirs, f)} here {getattr(env, f)}"
        for f in ("backend", "device_kind", "device_count", "jax", "jaxlib")
        if getattr(theirs, f) != getattr(env, f)
    ]
    ours, its = set(env.cpu_features or []), set(theirs.cpu_features or [])
    if ours != its:
        diffs.append(
            "cpu features"
            + "".join(f" +{x}" for x in sorted(ours - its))
            + "".join(f" -{x}" for x in sorted(its - ours))
        )
    return (
        f"the band was measured on another machine ({'; '.join(diffs) or 'its fingerprint differs'}): "
        "`avatar-release gate calibrate` on this hardware measures its own"
    )
