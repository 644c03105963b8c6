"""The compile gate: what can be proven about a build on a host without its hardware.

A TPU build compiled on a CPU-only machine cannot run there, so the output gates (twin
baseline, bit-exact, similarity band) cannot run either. These checks need no device:

  every-bucket       every stage x bucket has a serialized executable whose blob is present
                     and hashes to its digest
  flags-present      the flag profile recorded is the pinned one (same digest as the file in
                     manifests/flags/), and every Mosaic kernel carries each kernel flag it pins
  fits-memory        per-device memory (XLA's memory_analysis) within the target's capacity
  no-host-callbacks  no custom call into the Python host on the serving path
  reproducible       a recompile from the manifest gives the same scheduled-HLO digest (and
                     executable fingerprint, where the backend reports one: compile-only TPU
                     clients do not) for every executable (skip with reproduce=False)

The result is stored as the record ``compile-gates/<build id>``. The promotion policy never
reads it: a build leaves dev only on output-gate results from a matching environment.
"""

from __future__ import annotations

import platform as _platform
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ..compile import rebuild_manifest
from ..errors import AvatarReleaseError
from ..machine import who
from ..records import CompileCheck, CompileGateResult, Manifest, parse_record, utcnow
from ..records.stored import COMPILE_GATES
from ..registry import Registry, read_manifest
from ..runtime import check_blobs
from ..specs import load_flag_profile
from ..trust.evidence import gate_signing_key, sign_and_store

__all__ = ["run_compile_gate", "load_compile_gate", "CompileGateOutcome"]

_NAMESPACE = COMPILE_GATES.name


@dataclass
class CompileGateOutcome:
    result: CompileGateResult
    stored: bool

    @property
    def passed(self) -> bool:
        return self.result.status == "passed"


def _every_bucket(registry: Registry, m: Manifest) -> CompileCheck:
    have = {(e.stage, e.bucket): e for e in m.executables}
    missing = [f"{s}/{b.name}" for s in m.program.stages for b in m.buckets if (s, b.name) not in have]
    portable = [e.key for e in m.executables if e.format != "xla-executable"]
    bad = [f"{c.what}: {c.error}" for c in check_blobs(registry, m, only={e.key for e in m.executables}) if not c.ok]
    problems = (
        [f"no executable for {k}" for k in missing]
        + [f"{k} is portable StableHLO (compiles in the pod)" for k in portable]
        + bad
    )
    n = len(m.program.stages) * len(m.buckets)
    if problems:
        return CompileCheck(
            name="every-bucket",
            status="failed",
            summary="; ".join(problems[:6]),
            details={"missing": missing, "portable": portable, "unreadable": bad},
        )
    return CompileCheck(
        name="every-bucket",
        status="passed",
        summary=f"{n} executables ({len(m.program.stages)} stages x {len(m.buckets)} buckets), "
        "every blob present and verified",
        details={"executables": sorted(e.key for e in m.executables)},
    )


def _flags_present(m: Manifest) -> CompileCheck:
    problems: list[str] = []
    details: dict[str, Any] = {}
    try:
        pinned = load_flag_profile(m.flags.name)
        details["pinned_digest"] = pinned.digest()
        if pinned.digest() != m.flags.digest:
            problems.append(
                f"flag profile {m.flags.name} was {m.flags.digest[:19]} at compile, the pinned file is "
                f"now {pinned.digest()[:19]} (v{pinned.version}); recompile under the pinned profile"
            )
    except AvatarReleaseError as exc:
        problems.append(f"flag profile {m.flags.name}: {exc}")
    wanted = m.flags.kernel_flags if m.platform.backend == "tpu" else {}
    kernels = 0
    for e in m.executables:
        for k in e.kernels:
            if k.backend != "mosaic":
                continue
            kernels += 1
            absent = {f: v for f, v in wanted.items() if k.flags.get(f) != v}
            if absent:
                problems.append(f"{e.key}: kernel {k.name} lacks {absent} in its compiled Mosaic config")
    details["mosaic_kernels"] = kernels
    details["kernel_flags"] = dict(wanted)
    if problems:
        return CompileCheck(name="flags-present", status="failed", summary="; ".join(problems[:6]), details=details)
    extra = f"; {kernels} Mosaic kernel(s) carry {', '.join(wanted)}" if kernels and wanted else ""
    return CompileCheck(
        name="flags-present",
        status="passed",
        summary=f"profile {m.flags.name} v{m.flags.version} is the pinned one{extra}",
        details=details,
    )


def _fits(m: Manifest) -> CompileCheck:
    fit = m.memory_fit
    if fit is None:
        return CompileCheck(
            name="fits-memory", status="skipped", summary=f"target {m.target} declares no device memory capacity"
        )
    gib = 2**30
    summary = (
        f"{fit.total_bytes / gib:.2f} GiB of {fit.capacity_bytes / gib:.2f} GiB per device "
        f"(weights {fit.weights_bytes / gib:.2f} GiB {fit.weight_sharding}, peak {fit.peak_stage})"
    )
    return CompileCheck(
        name="fits-memory", status="passed" if fit.fits else "failed", summary=summary, details=fit.model_dump()
    )


def _no_callbacks(m: Manifest, rebuilt: Manifest | None = None) -> CompileCheck:
    found = {e.key: e.host_callbacks for e in m.executables if e.host_callbacks}
    if rebuilt is not None:
        found.update({e.key: e.host_callbacks for e in rebuilt.executables if e.host_callbacks})
    if found:
        return CompileCheck(
            name="no-host-callbacks",
            status="failed",
            summary="host callbacks on the serving path: "
            + "; ".join(f"{k}: {', '.join(v)}" for k, v in sorted(found.items())),
            details=found,
        )
    return CompileCheck(
        name="no-host-callbacks", status="passed", summary="no custom call into the Python host in any executable"
    )


def _reproducible(registry: Registry, ref: str, progress: Callable[[str], None]) -> tuple[CompileCheck, Manifest]:
    report, again = rebuild_manifest(ref, registry, progress=progress)
    if report.identical:
        fps = sum(e.fingerprint is not None for e in again.executables)
        what = "scheduled HLO and fingerprint" if fps else "scheduled HLO (this backend reports no fingerprint)"
        check = CompileCheck(
            name="reproducible",
            status="passed",
            summary=f"recompiled from the manifest: identical {what} for {len(again.executables)} executables",
            details={
                "hlo_digests": {e.key: e.hlo_digest for e in again.executables},
                "fingerprints": {e.key: e.fingerprint for e in again.executables},
            },
        )
    else:
        check = CompileCheck(
            name="reproducible",
            status="failed",
            summary="recompiling from the manifest differs: "
            + "; ".join(f"{d['what']}" for d in report.differences[:6]),
            details={"differences": report.differences},
        )
    return check, again


def run_compile_gate(
    registry: Registry,
    ref: str,
    *,
    reproduce: bool = True,
    store: bool = True,
    progress: Callable[[str], None] = lambda msg: None,
) -> CompileGateOutcome:
    # Lazy (heavy): JAX starts only after XLA_FLAGS are set (avatar_release.machine.configure_*).
    import jax
    import jaxlib

    t0 = time.perf_counter()
    resolved, m = read_manifest(registry, ref)
    checks = [_every_bucket(registry, m), _flags_present(m), _fits(m)]
    rebuilt = None
    if reproduce:
        progress(f"recompiling {m.build_id} from its manifest for {m.target}")
        check, rebuilt = _reproducible(registry, resolved.build_id, progress)
        checks.append(_no_callbacks(m, rebuilt))
        checks.append(check)
    else:
        checks.append(_no_callbacks(m))
        checks.append(CompileCheck(name="reproducible", status="skipped", summary="not asked (reproduce=False)"))
    status = "failed" if any(c.status == "failed" for c in checks) else "passed"
    result = CompileGateResult(
        status=status,
        build_id=m.build_id,
        build_digest=resolved.digest,
        pipeline=m.pipeline,
        target=m.target,
        checks=checks,
        host={"backend": jax.default_backend(), "jaxlib": jaxlib.__version__, "machine": _platform.machine()},
        seconds=round(time.perf_counter() - t0, 3),
        created_at=utcnow(),
        created_by=who(),
    )
    if store:
        registry.put_record(_NAMESPACE, m.build_id, result.to_json_bytes())
        sign_and_store(
            registry,
            gate_signing_key(),
            kind="compile-gate",
            build_id=m.build_id,
            subject_digest=m.content_digest(),
            predicate=result.model_dump(mode="json"),
        )
    return CompileGateOutcome(result, store)


def load_compile_gate(registry: Registry, build_id: str) -> CompileGateResult | None:
    """The stored compile gate of a build, or None; IntegrityError if the record is damaged."""
    raw = registry.get_record(_NAMESPACE, build_id)
    if raw is None:
        return None
    return parse_record(CompileGateResult, raw, where=f"registry record {_NAMESPACE}/{build_id}")
