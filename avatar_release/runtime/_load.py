"""ref -> resolve once -> identity and seal -> (signature) -> check the environment -> bound the
declared sizes -> verify every blob -> decompress (streamed, bounded) -> deserialize with explicit
devices -> check each program's fingerprint -> place weights. Imports no torch.
What a pod trusts, and the signature's checks before any of it: ``_trusted``.

A chunked build (v7+) loads on two paths side by side: threads fetch, verify, decompress and
deserialize the executables (several programs at once) while the weight chunks stream and are
placed (``_weights``); each path keeps its order (a blob verified before it is unpickled, a chunk
before it is placed), and neither waits on the other. The revocation check runs beside both
(``_beside``): no executable is unpickled before its verdict, nor the build returned. A pod's swap
passes the build it serves: what the new build shares with it byte for byte (``_reuse``) is taken
from it, not fetched, deserialized or placed again.

Order matters for safety: the serialized executable is a pickle, and unpickling untrusted
bytes can run code. Every blob's size and sha256 are verified against the manifest (whose
own digest was resolved from the registry) before any byte is decompressed or unpickled, and
the sizes it declares are bounded before anything is fetched or allocated (``_blobs``). Once
loaded, never run, each executable must report the fingerprint the build identity covers.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from ..errors import AvatarReleaseError, EnvironmentMismatch, InputError, IntegrityError
from ..machine import RUN_FIELDS, Machine, current_platform, diff_machines, missing_env_flags
from ..records import ExecutableEntry, Manifest, StatementPayload, check_identity
from ..registry import Registry, Resolved, open_registry, read_manifest
from ..trust.revocation import check_not_revoked
from ..trust.state_pod import VerifiedChannel
from ._beside import RevocationBeside
from ._blobs import check_bounds
from ._guard import CompileGuard, tuned_at_first_run
from ._inflate import StreamTimes, fetch_inflated
from ._reuse import Program, Shared, program_of, shared_with
from ._trusted import TrustConfig, check_trusted, resolve_channel, revocation_keys
from ._unpickle import check_fingerprint, deserialize_and_load, tree_from_text
from ._weights import place_weights, sharding_of, stream_weights

# only for annotations: JAX starts only after XLA_FLAGS are set
if TYPE_CHECKING:
    import jax
    from jax.sharding import Mesh

__all__ = [
    "LoadedBuild",
    "LoadedStage",
    "LoadTimings",
    "load",
    "check_environment",
    "check_trusted",
    "revocation_keys",
    "resolve_channel",
    "devices_for",
    "place_weights",
]


@dataclass
class LoadTimings:
    resolve: float = 0.0
    fetch: float = 0.0
    verify: float = 0.0
    decompress: float = 0.0
    deserialize: float = 0.0
    weights: float = 0.0
    signature: float = 0.0  # statement fetch + ed25519 verification (0 without a trust key)
    revocation: float = 0.0  # reading the build's attestations for a revocation, beside deserialize + weights
    revocation_wait: float = 0.0  # the wait for its verdict once they were done: total() counts this
    # the weight chunks' path (fetch + verify + decompress + place run side by side
    # inside ``weights``): chunks, bytes, workers and each step's seconds summed over workers
    weight_path: dict | None = None
    # the wall of the executables' path (fetch .. deserialize) run beside the weights'; 0 where the
    # loader did not load it (a stand-in build: deserialize + weights then)
    side_by_side: float = 0.0
    # a swap: what the new build took from the build served (programs, tensors, their raw bytes)
    shared: dict | None = None

    def deserialize_and_weights(self) -> float:
        """Seconds from the executables' first fetch to the last weight placed, side by side (without
        that wall, deserialize + weights)."""
        return self.side_by_side or self.deserialize + self.weights

    def total(self) -> float:
        if self.side_by_side:
            return self.resolve + self.signature + self.revocation_wait + self.side_by_side
        before = self.resolve + self.signature + self.revocation
        return before + self.fetch + self.verify + self.decompress + self.deserialize + self.weights

    def to_json(self) -> dict[str, Any]:
        """Each step's seconds, the wall of deserialize + weights, and the total (a pod's health)."""
        steps = {k: round(v, 4) for k, v in vars(self).items() if isinstance(v, float) and k != "side_by_side"}
        return {
            **steps,
            "deserialize_and_weights": round(self.deserialize_and_weights(), 4),
            "total": round(self.total(), 4),
            "weight_path": self.weight_path,
            "shared": self.shared,
        }


@dataclass
class LoadedStage:
    entry: ExecutableEntry
    executable: Any  # a jax Compiled, callable(params_dict, *inputs)
    input_shardings: list
    params: dict  # device arrays keyed as the executable expects
    # GPU: cuDNN convolutions the program chooses an algorithm for on its first run (_guard.py);
    # the stream counts that run as a compile. ``ran``: whether it has run in this process.
    tuned_at_first_run: int = 0
    ran: bool = False


@dataclass
class LoadedBuild:
    resolved: Resolved
    manifest: Manifest
    registry: str
    mesh: Any
    stages: dict[tuple[str, str], LoadedStage]
    timings: LoadTimings
    guard: CompileGuard = field(default_factory=CompileGuard)

    @property
    def build_id(self) -> str:
        return self.manifest.build_id

    @property
    def digest(self) -> str:
        return self.resolved.digest


def devices_for(manifest: Manifest) -> list[jax.Device]:
    """The devices a build runs on here: the first ``device_count`` of its backend's."""
    # Lazy (heavy): JAX starts only after XLA_FLAGS are set (avatar_release.machine.configure_*).
    import jax

    p = manifest.platform
    return jax.devices(p.backend)[: p.device_count]


def _describe(devices: list[jax.Device]) -> str:
    kinds = sorted({d.device_kind for d in devices})
    return f"{devices[0].platform if devices else 'none'}: {'/'.join(kinds) or 'no devices'} x {len(devices)}"


def check_environment(manifest: Manifest) -> None:
    """Refuse to load on a machine that differs from the build's, listing every field."""
    # Lazy (heavy): JAX starts only after XLA_FLAGS are set (avatar_release.machine.configure_*).
    import jax
    import jaxlib

    p = manifest.platform
    try:
        devices = devices_for(manifest)
    except RuntimeError as e:
        expected = f"{p.backend}: {p.device_kind} x {p.device_count}" + (f" ({p.topology})" if p.topology else "")
        described = _describe(jax.devices())
        raise EnvironmentMismatch(
            f"build {manifest.build_id} was compiled for another machine; refusing to load:\n"
            f"  platform: expected {expected!r}, actual {described!r} (this machine has no {p.backend!r} backend: "
            f"{str(e).splitlines()[0][:160]})\n"
            f"fix: run it on a host with {p.device_count} {p.device_kind} devices, or compile a build for this "
            "machine's target",
            {
                "backend": (p.backend, jax.default_backend()),
                "device_kind": (p.device_kind, "/".join(sorted({d.device_kind for d in jax.devices()}))),
                "platform": (expected, described),
            },
        ) from None
    actual = current_platform(devices, p.mesh_axes, p.mesh_shape, p.topology)
    if len(jax.devices()) != len(devices) and p.backend == "cpu":
        actual = actual.model_copy(update={"device_count": len(jax.devices("cpu"))})
    diffs = diff_machines(
        Machine.of_build(manifest), Machine.of_platform(actual, jax=None, jaxlib=jaxlib.__version__), fields=RUN_FIELDS
    ).differences
    missing = missing_env_flags(manifest)
    if missing:
        diffs["flag_profile"] = (
            f"{manifest.flags.name} v{manifest.flags.version} with XLA_FLAGS {missing}",
            "those flags absent from XLA_FLAGS",
        )
    if diffs:
        lines = "\n".join(f"  {k}: expected {e!r}, actual {a!r}" for k, (e, a) in diffs.items())
        fix = ""
        if "device_count" in diffs and p.backend == "cpu":
            fix = (
                f"\nfix: start the process with XLA_FLAGS=--xla_force_host_platform_device_count="
                f"{p.device_count} (the avatar-release CLI does this)"
            )
        raise EnvironmentMismatch(
            f"build {manifest.build_id} was compiled for another environment; refusing to load:\n{lines}{fix}",
            diffs,
        )


def load(
    ref: str,
    registry: Registry | str | None = None,
    *,
    strict: bool = True,
    trust: TrustConfig | None = None,
    workers: int | None = None,
    serving: LoadedBuild | None = None,
) -> LoadedBuild:
    """Load a build (channel, build id or digest) ready to serve, or refuse with a reason.

    resolve once -> (signature) -> check the machine -> bound, fetch and verify every blob ->
    decompress -> deserialize (fingerprints checked) -> place the weights. With ``trust``, only
    a channel whose signed statement verifies is loaded, and the signature is checked before
    any blob is fetched, decompressed or unpickled. ``serving``: the build this process serves
    now (a swap); what the new one shares with it byte for byte is taken from it (``_reuse``).
    """
    reg = registry if registry is not None and not isinstance(registry, str) else open_registry(registry, create=False)
    t = LoadTimings()
    accepted: StatementPayload | VerifiedChannel | None = None
    if trust is not None and trust.root is not None:
        t0 = time.perf_counter()
        resolved, manifest, accepted = resolve_channel(reg, ref, trust)
        check_identity(manifest)
        t.signature = time.perf_counter() - t0
    else:
        resolved, manifest = _resolve(reg, ref, t)
    if trust is not None and trust.root is None:
        t0 = time.perf_counter()
        accepted = check_trusted(reg, resolved, trust, manifest)
        t.signature = time.perf_counter() - t0
    revoked = (reg, resolved.build_id, manifest.content_digest(), revocation_keys(trust))
    try:
        check_environment(manifest)
        _require_weights(manifest)
        # Bound what the manifest declares before fetching or allocating anything; then fetch and
        # verify every blob before decompressing or unpickling any of them.
        check_bounds(manifest)
    except AvatarReleaseError:
        check_not_revoked(*revoked, what=f"load {ref}")  # a revoked build is named as such first
        raise
    with RevocationBeside(*revoked, what=f"load {ref}") as beside:  # its verdict named before any failure here
        mesh, loaded = _side_by_side(reg, manifest, t, workers, serving, beside)  # executables, weight chunks
    t.revocation, t.revocation_wait = beside.seconds, beside.wait
    if isinstance(accepted, StatementPayload) and trust is not None and trust.state is not None:
        trust.state.accept(accepted)  # only once the whole build loaded
    return LoadedBuild(resolved, manifest, reg.uri, mesh, loaded, t, CompileGuard(strict=strict))


def _resolve(reg: Registry, ref: str, t: LoadTimings) -> tuple[Resolved, Manifest]:
    """Resolve ``ref`` once (everything after is fetched by digest) and check the manifest names itself."""
    t0 = time.perf_counter()
    resolved, manifest = read_manifest(reg, ref)
    if manifest.build_id != resolved.build_id:
        raise IntegrityError(
            f"manifest {resolved.digest} says build {manifest.build_id}, the registry calls it {resolved.build_id}"
        )
    check_identity(manifest)
    t.resolve = time.perf_counter() - t0
    return resolved, manifest


def _require_weights(manifest: Manifest) -> None:
    w = manifest.weights
    if not w.materialized or w.chunks is None:
        raise InputError(
            f"build {manifest.build_id} was compiled from abstract shapes ({manifest.weights.source}): it carries "
            "no weights to serve; compile it with a checkpoint (--weights FILE) to make a servable build"
        )


def _stream_executables(
    reg: Registry, manifest: Manifest, t: LoadTimings, cleared: Callable[[], None]
) -> dict[str, bytes | bytearray]:
    """{executable key: payload}, each streamed through the store's and our own sha256 into a
    buffer of its declared (bounded) raw size, checked against its raw digest; the seconds split
    into waiting on the store (fetch), the stored bytes' hash (verify) and zstd (decompress).
    Returned once ``cleared()`` (the revocation verdict) returns: nothing is unpickled before."""
    payloads: dict[str, bytes | bytearray] = {}
    fetched: dict[tuple[str, int, str], bytes | bytearray] = {}  # a program shared across buckets: fetched once
    spent = StreamTimes()
    for e in manifest.executables:
        blob = (e.blob.digest, e.raw_size, e.raw_digest)
        if blob not in fetched:
            out, times = fetch_inflated(
                reg,
                e.blob,
                (e.raw_size, e.raw_digest),
                where=f"build {manifest.build_id}: executable {e.key}",
                keep=True,
            )
            assert out is not None  # keep=True: the raw bytes come back
            fetched[blob] = out
            spent.add(times)
        payloads[e.key] = fetched[blob]
    t.fetch, t.verify, t.decompress = spent.fetch, spent.verify, spent.decompress
    cleared()
    return payloads


def _side_by_side(
    reg: Registry,
    manifest: Manifest,
    t: LoadTimings,
    workers: int | None,
    serving: LoadedBuild | None,
    revocation: RevocationBeside,
) -> tuple[Mesh, dict[tuple[str, str], LoadedStage]]:
    """(mesh, loaded stages) of a v7+ build: its executables (streamed, verified, deserialized once
    ``revocation`` clears them, fingerprints checked) on threads of their own while its weight
    chunks stream and are placed as their shards (``_weights.stream_weights``, stopped by a
    revocation) into stages that hold the manifest's shardings until the programs join them. A
    failure of either path is raised once the other has stopped, the executables' first. What the
    new build shares with ``serving`` is neither fetched nor loaded again."""
    # Lazy (heavy): JAX starts only after XLA_FLAGS are set (avatar_release.machine.configure_*).
    from jax.sharding import Mesh

    p = manifest.platform
    mesh = Mesh(np.array(devices_for(manifest)).reshape(p.mesh_shape), tuple(p.mesh_axes))
    shared = shared_with(serving, manifest, mesh)
    to_load = [e for e in manifest.executables if e.key not in shared.programs]
    programs_of = (
        manifest if len(to_load) == len(manifest.executables) else manifest.model_copy(update={"executables": to_load})
    )
    # each stage with only the tensors still to place (the manifest's shardings, no program yet)
    placing = {(e.stage, e.bucket): LoadedStage(_unshared(e, shared), None, [], {}) for e in manifest.executables}
    needed = {s.name for ls in placing.values() for s in ls.entry.params}
    chunks = [c for c in manifest.weights.chunks or [] if any(x.name in needed for x in c.tensors)]
    weights_of = (
        manifest
        if len(chunks) == len(manifest.weights.chunks or [])
        else manifest.model_copy(update={"weights": manifest.weights.model_copy(update={"chunks": chunks})})
    )

    t0 = time.perf_counter()
    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="executables") as pool:
        loading = pool.submit(_programs_side_by_side, reg, programs_of, t, mesh, revocation.cleared)
        try:
            if needed:  # (none: every tensor taken from the serving build)
                t.weight_path = stream_weights(
                    reg, weights_of, placing, mesh, workers=workers, stop=revocation.stop
                ).to_json()
        except BaseException:
            if loading.exception() is not None:  # waits: the executables' own failure is named first
                loading.result()
            raise
        t.weights = time.perf_counter() - t0
        fresh = loading.result()
    loaded = {
        key: _joined(manifest, e, fresh.get(key), shared, placing[key], mesh)
        for e in manifest.executables
        for key in [(e.stage, e.bucket)]
    }
    t.side_by_side = time.perf_counter() - t0
    t.shared = shared.to_json() if serving is not None else None
    return mesh, loaded


def _unshared(e: ExecutableEntry, shared: Shared) -> ExecutableEntry:
    """``e`` with only the tensors still to place: those the serving build does not share."""
    return e.model_copy(update={"params": [s for s in e.params if (s.name, tuple(s.sharding)) not in shared.arrays]})


# Executables fetched and deserialized at once (XLA deserializes with the GIL released).
PROGRAM_THREADS = 4


def _programs_side_by_side(
    reg: Registry, manifest: Manifest, t: LoadTimings, mesh: Mesh, cleared: Callable[[], None]
) -> dict[tuple[str, str], LoadedStage]:
    """Every executable of ``manifest`` streamed, verified and deserialized, several at once: dealt,
    largest first, to up to ``PROGRAM_THREADS`` threads, each running ``_stream_executables`` (back
    once ``cleared()``) then ``_deserialize_all`` over its share (one program's entries together)."""
    groups: dict[str, list[ExecutableEntry]] = {}
    for e in manifest.executables:
        groups.setdefault(e.raw_digest, []).append(e)
    n = min(PROGRAM_THREADS, os.cpu_count() or 1, len(groups))
    if n <= 1:
        return _deserialize_all(manifest, _stream_executables(reg, manifest, t, cleared), t, mesh) if groups else {}
    shares: list[list[ExecutableEntry]] = [[] for _ in range(n)]
    for entries in sorted(groups.values(), key=lambda es: -es[0].raw_size):
        min(shares, key=lambda s: sum(e.raw_size for e in s)).extend(entries)

    def one(share: list[ExecutableEntry]) -> tuple[LoadTimings, dict[tuple[str, str], LoadedStage]]:
        part, own = manifest.model_copy(update={"executables": share}), LoadTimings()
        return own, _deserialize_all(part, _stream_executables(reg, part, own, cleared), own, mesh)

    loaded: dict[tuple[str, str], LoadedStage] = {}
    with ThreadPoolExecutor(max_workers=n, thread_name_prefix="programs") as pool:
        for own, stages in pool.map(one, shares):  # the first failure, in manifest order of the shares
            loaded.update(stages)
            t.fetch, t.verify = t.fetch + own.fetch, t.verify + own.verify
            t.decompress, t.deserialize = t.decompress + own.decompress, t.deserialize + own.deserialize
    return loaded


def _joined(
    manifest: Manifest, e: ExecutableEntry, fresh: LoadedStage | None, shared: Shared, placed: LoadedStage, mesh: Mesh
) -> LoadedStage:
    """One stage of the new build: its program (deserialized here, or the serving build's same one,
    whose fingerprint is checked against this manifest) with its weights (placed here, or taken)."""
    if fresh is None:
        same = shared.programs[e.key]
        check_fingerprint(manifest, e, same.executable)
        # the same program object: if it already ran, XLA already chose its code on that first run
        fresh = LoadedStage(
            e,
            same.executable,
            [sharding_of(mesh, s) for s in e.inputs],
            {},
            tuned_at_first_run=same.tuned_at_first_run,
            ran=same.ran,
        )
    fresh.params = dict(placed.params)
    for s in e.params:
        key = (s.name, tuple(s.sharding))
        if key in shared.arrays:
            fresh.params[s.name.split(".", 1)[1]] = shared.arrays[key]
    return fresh


def _deserialize_all(
    manifest: Manifest, payloads: dict[str, bytes | bytearray], t: LoadTimings, mesh: Mesh
) -> dict[tuple[str, str], LoadedStage]:
    """The loaded stages: every executable deserialized onto the build's devices, its fingerprint
    compared with the manifest's (the program the identity names, not another)."""
    # Lazy (heavy): JAX starts only after XLA_FLAGS are set (avatar_release.machine.configure_*).
    import jax

    devices = devices_for(manifest)
    t0 = time.perf_counter()
    where = f"build {manifest.build_id}"
    loaded: dict[tuple[str, str], LoadedStage] = {}
    backend = jax.extend.backend.get_backend(manifest.platform.backend) if hasattr(jax, "extend") else None
    # A program shared across buckets (compile/_share.py: one blob, several entries) is deserialized
    # once; each entry still has its fingerprint checked against the loaded executable.
    shared: dict[Program, Any] = {}
    for e in manifest.executables:
        same = program_of(e)
        exe: Any = shared.get(same)
        again = exe is not None
        if e.format == "jax-export":
            exe = exe if again else _portable(payloads[e.key], e, manifest)
        else:
            payload = payloads.pop(e.key)
            if exe is None:
                in_tree = tree_from_text(e.in_tree, e, "in")
                out_tree = tree_from_text(e.out_tree, e, "out")
                exe = deserialize_and_load(
                    payload,
                    in_tree,
                    out_tree,
                    backend=backend or devices[0].client,
                    execution_devices=devices,
                    what=f"{where}: executable {e.key}",
                )
            check_fingerprint(manifest, e, exe)
        shared[same] = exe
        # GPU: a shared program's convolutions are chosen on its first run, whichever entry runs it first;
        # counted once, on the entry that loaded it.
        loaded[(e.stage, e.bucket)] = LoadedStage(
            e,
            exe,
            [sharding_of(mesh, s) for s in e.inputs],
            {},
            tuned_at_first_run=0 if again else _tuned_at_first_run(manifest, e, exe),
        )
    t.deserialize = time.perf_counter() - t0
    return loaded


def _tuned_at_first_run(manifest: Manifest, entry: ExecutableEntry, exe: Any) -> int:
    """GPU builds: the loaded program's convolutions left to its first run, read from the program
    itself; where its text cannot be read, what the build's manifest recorded (its ``autotune``)."""
    if manifest.platform.backend != "gpu":
        return 0
    try:
        return tuned_at_first_run(exe.as_text() or "")
    except Exception:  # noqa: BLE001 - a backend that cannot print a loaded program: the build's own record
        found = manifest.autotune.executables.get(entry.key) if manifest.autotune else None
        return found.convolutions_at_run_time if found else 0


def _portable(payload: bytes | bytearray, entry: ExecutableEntry, manifest: Manifest) -> Callable[..., Any]:
    """A portable (jax-export) stage: StableHLO that XLA compiles on its first call."""
    # Lazy (heavy): JAX starts only after XLA_FLAGS are set (avatar_release.machine.configure_*).
    import jax

    try:
        exported = jax.export.deserialize(bytearray(payload))
    except Exception as e:  # noqa: BLE001
        raise IntegrityError(f"build {manifest.build_id}: {entry.key}: not a jax.export payload ({e})") from None
    return jax.jit(exported.call)
