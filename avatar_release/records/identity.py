"""A build's identity (what its id names) and its seal (which bytes it is made of).

**Identity** — one hash over everything that changes the binary or what it computes: the
pipeline and its config, the source and weights digests, target, flags, toolchain, platform
(from v6, for GPU targets, with the digest of the target description compiled for),
each executable's key, format, scheduled-HLO digest and fingerprint, the noise recipe and
(from manifest version 3) the manifest's schema version and the flag profile's full contents
(before, only its digest string, which nothing tied to the options the manifest carries). Computed by the compiler when it
names a build (``<pipeline>-<target>-<identity[:12]>``) and recomputed by the loader and
``verify`` from the manifest they are about to trust.

It does **not** cover the executables' serialized bytes. Two compiles of one program serialize
to different bytes (measured on XLA:CPU, 2026-12-01: two compiles of tiny for cpu-8 in separate
processes give different ``raw_digest`` for every stage and equal fingerprints; compile-only TPU
clients likewise), so hashing the bytes would give one program two build ids and break
``rebuild``'s "same program, same id".

**Seal** — the identity plus the digest of every blob as stored (zstd) and as decompressed
(``raw_digest``), for the executables and the weights. Fixed once a build is published; the
loader and ``verify`` recompute it, and check every blob's stored and raw digest against it, so
a manifest whose entries are mixed in from another build is refused.

What each defends against. The threat is a writer of the registry who holds none of our keys.
Neither hash is keyed: such a writer can recompute both. The seal therefore only catches
*accidental* mixes and attackers who do not know the format. Against a deliberate swap of a
program under an unchanged build id the defences are:

1. **The program's fingerprint after loading.** The identity binds each executable's
   fingerprint, as the backend reports it for the deserialized executable (manifest v3; see
   ``avatar_release.records.build``). The loader deserializes each executable (never running
   it) and compares the fingerprint it reports with the manifest's; ``verify`` does the same.
   Swapping in another program changes the loaded fingerprint; changing the recorded
   fingerprint to match changes the identity and so the build id. The schema version is inside
   the identity, so relabelling a manifest as another version changes it too (and a version
   outside the support window is refused before any of this: ``records.window``).
2. **Signatures over the manifest digest** (signed statements, ``avatar_release.trust``): the
   only defence that does not rely on the attacker being unable to recompute something. It also
   covers what (1) cannot: builds whose backend reports no fingerprint (a compile-only TPU
   client), ``jax-export`` stages (compiled in the pod), and the 48 bits of the identity a build
   id carries.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from .._digest import canonical_json, sha256_digest
from ..errors import IntegrityError
from .build import BUILD_SCHEMA_VERSION, FlagProfileRecord, Manifest

__all__ = ["identity_digest", "identity_flags", "manifest_identity", "manifest_seal", "build_id_for", "check_identity"]


def identity_digest(
    *,
    pipeline: str,
    entry: str,
    config: dict[str, Any],
    overrides: dict[str, Any],
    source: str,
    weights: str,
    target: str,
    flags: dict[str, Any] | str,
    jax: str,
    jaxlib: str,
    platform: dict[str, Any],
    executables: Iterable[tuple[str, str, str, str | None]],
    noise: str,
    schema_version: int = BUILD_SCHEMA_VERSION,
    autotune_results: str | None = None,
) -> str:
    """The identity digest over these fields (``executables``: key, format, scheduled-HLO digest,
    fingerprint of each); ``flags`` is what :func:`identity_flags` gives for the schema version;
    ``autotune_results`` the digest of the autotune results the compile loaded (v7), covered only
    when there are any, so every identity before them stays what it was."""
    fields: dict[str, Any] = {
        "pipeline": pipeline,
        "entry": entry,
        "config": config,
        "overrides": overrides,
        "source": source,
        "weights": weights,
        "target": target,
        "flags": flags,
        "jax": jax,
        "jaxlib": jaxlib,
        "platform": platform,
        "executables": [list(e) for e in executables],
        "noise": noise,
        "schema_version": schema_version,  # (in every identity since manifest version 3)
    }
    if autotune_results is not None:
        fields["autotune_results"] = autotune_results
    return sha256_digest(canonical_json(fields))


def identity_flags(flags_record: FlagProfileRecord, schema_version: int | None = None) -> dict[str, Any]:
    """What the identity covers of the flag profile: the whole record (options, process flags,
    kernel flags, digest), so a registry writer cannot edit the XLA_FLAGS a pod applies or the
    compiler options without changing the build id. (So since manifest version 3, before every
    version the support window reads: ``schema_version`` no longer changes the answer.)"""
    return flags_record.model_dump(mode="json")


def manifest_identity(m: Manifest) -> str:
    """The identity a manifest's own fields hash to."""
    return identity_digest(
        pipeline=m.pipeline,
        entry=m.model_entry,
        config=m.config,
        overrides=m.overrides,
        source=m.source_digest,
        weights=m.weights.raw_digest,
        target=m.target,
        flags=identity_flags(m.flags, m.schema_version),
        jax=m.toolchain.jax,
        jaxlib=m.toolchain.jaxlib,
        platform=m.platform.model_dump(mode="json"),
        executables=[(e.key, e.format, e.hlo_digest, e.fingerprint) for e in m.executables],
        noise=m.program.noise_recipe,
        schema_version=m.schema_version,
        autotune_results=m.autotune.results if m.autotune else None,
    )


def build_id_for(pipeline: str, target: str, identity: str) -> str:
    return f"{pipeline}-{target}-{identity.split(':')[1][:12]}"


def manifest_seal(m: Manifest) -> str:
    """Identity + the stored and raw digests of every executable and of the weights.

    Not part of the build id (serialized bytes differ between two compiles of the same
    program), but fixed once a build is published.
    """
    doc: dict[str, Any] = {
        "identity": m.identity,
        "weights": [m.weights.blob.digest if m.weights.blob else None, m.weights.raw_digest],
        "executables": [[e.key, e.blob.digest, e.raw_digest] for e in m.executables],
    }
    if m.weights.chunks is not None:  # v5: every chunk's stored and raw digest (v8: and its BLAKE3)
        doc["weight_chunks"] = [
            [c.blob.digest, c.raw_digest] + ([c.raw_blake3] if c.raw_blake3 else []) for c in m.weights.chunks
        ]
    return sha256_digest(canonical_json(doc))


def check_identity(m: Manifest) -> None:
    """Refuse a manifest whose fields do not hash to the identity and build id it carries, or
    whose blobs are not the ones it was sealed with (IntegrityError naming both hashes)."""
    got = manifest_identity(m)
    if got != m.identity or build_id_for(m.pipeline, m.target, got) != m.build_id:
        raise IntegrityError(
            f"build {m.build_id}: its manifest fields hash to identity {got}, but it claims {m.identity}: "
            "the manifest was edited or mixes entries from another build; refusing it"
        )
    if m.seal is None:  # every manifest since version 2 is sealed when it is packaged
        raise IntegrityError(
            f"build {m.build_id}: manifest v{m.schema_version} carries no seal; "
            "every build since version 2 is sealed: refusing it"
        )
    sealed = manifest_seal(m)
    if sealed != m.seal:
        raise IntegrityError(
            f"build {m.build_id}: its executable and weights blobs are not the ones it was sealed with "
            f"(seal {m.seal}, its blobs hash to {sealed}: an entry was swapped in from another build); refusing it"
        )
