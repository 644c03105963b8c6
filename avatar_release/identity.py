"""A build's identity: one hash over everything that changes the binary or what it computes.

Computed by the compiler when it names a build (``<pipeline>-<target>-<identity[:12]>``) and
recomputed by the loader from the manifest it is about to serve: a manifest whose fields
were edited, or whose executable entries were swapped in from another build, no longer
hashes to the identity it carries.
"""

from __future__ import annotations

from ._digest import canonical_json, sha256_digest

__all__ = ["identity_digest", "manifest_identity", "manifest_seal", "build_id_for"]


def identity_digest(*, pipeline, entry, config, overrides, source, weights, target, flags, jax, jaxlib, platform,
                    executables, noise) -> str:
    return sha256_digest(canonical_json({
        "pipeline": pipeline, "entry": entry, "config": config, "overrides": overrides, "source": source,
        "weights": weights, "target": target, "flags": flags, "jax": jax, "jaxlib": jaxlib, "platform": platform,
        "executables": [list(e) for e in executables], "noise": noise,
    }))


def manifest_identity(m) -> str:
    """The identity a manifest's own fields hash to."""
    return identity_digest(
        pipeline=m.pipeline, entry=m.model_entry, config=m.config, overrides=m.overrides, source=m.source_digest,
        weights=m.weights.raw_digest, target=m.target, flags=m.flags.digest, jax=m.toolchain.jax,
        jaxlib=m.toolchain.jaxlib, platform=m.platform.model_dump(mode="json"),
        executables=[(e.key, e.format, e.hlo_digest, e.fingerprint) for e in m.executables],
        noise=m.program.noise_recipe,
    )


def build_id_for(pipeline: str, target: str, identity: str) -> str:
    return f"{pipeline}-{target}-{identity.split(':')[1][:12]}"


def manifest_seal(m) -> str:
    """Identity + the digests of the exact executable and weights bytes of this build.

    Not part of the build id (serialized bytes differ between two compiles of the same
    program), but fixed once a build is published.
    """
    return sha256_digest(canonical_json({
        "identity": m.identity,
        "weights": [m.weights.blob.digest if m.weights.blob else None, m.weights.raw_digest],
        "executables": [[e.key, e.blob.digest, e.raw_digest] for e in m.executables],
    }))
