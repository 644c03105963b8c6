"""Sharded gates: the gate set split over N machines, then merged into one gate result.

    avatar-release gate BUILD --shard K/N [--twin 1|2]   # on each machine (a Job's index K)
    avatar-release gate merge BUILD [--baseline ...]     # anywhere, once every shard is stored

A shard renders its slice of the gate set (requests dealt round-robin: request i goes to shard
i mod N) in fresh processes, both twins or the one named by ``--twin`` (so the twins may run on
different hosts), counts compiles as a whole gate would, and stores the frames and a signed
partial (``GateShard``, attestation kind ``gate-shard``). The merge reads only partials whose
signature verifies under a gate key the trust policy names for the build's target, checks that
they cover the gate set exactly once, ran this build on this gate set and in one environment,
then reassembles both twins in gate-set order and decides exactly as ``run_gate`` does (the
same public steps of ``steps``: check_inputs, compare -> store_result -> write_reports), so tiers,
band and review are the same code.

The engine that runs the shards (a Kubernetes Indexed Job, a CI matrix) is not ours: nothing
here schedules, queues or retries; a shard that never ran is reported missing by the merge.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from .._digest import canonical_json, sha256_digest
from ..errors import EnvironmentMismatch, GateInfraError, InputError, IntegrityError, TrustError
from ..machine import Machine, diff_machines, who
from ..records import GateSetRecord, GateShard, GateShardRun, Manifest, parse_record, utcnow
from ..registry import Registry, read_manifest
from ..trust.attest import verify_envelope
from ..trust.policy import load_policy
from ._fresh import GateRun, chunk_ticks, fresh_run
from .run import GateOutcome
from .steps import (
    GateInputs,
    ProcessRun,
    Progress,
    TwinRuns,
    check_inputs,
    check_run_environment,
    compare,
    never_promotes,
    store_result,
    tool_versions,
    write_reports,
)
from .store import get_frames, put_frames, save_shard, shard_envelopes

__all__ = ["ShardOutcome", "parse_shard", "shard_requests", "run_shard", "merge_shards"]

# {shard index: {twin: (shard, that twin's run, the partial's digest)}}: what a merge rests on.
Chosen = dict[int, dict[int, tuple[GateShard, GateShardRun, str]]]


@dataclass
class ShardOutcome:
    shard: GateShard
    digest: str  # of the stored partial

    @property
    def label(self) -> str:
        return f"{self.shard.index}/{self.shard.count}"


def parse_shard(text: str) -> tuple[int, int]:
    """'K/N' -> (K, N), K 0-based (a Kubernetes Job's JOB_COMPLETION_INDEX)."""
    try:
        k, n = (int(x) for x in text.split("/"))
    except ValueError:
        raise InputError(f"--shard {text!r}: expected K/N, e.g. 0/3 (K counts from 0 to N-1)") from None
    if n < 1 or not 0 <= k < n:
        raise InputError(f"--shard {text}: K must be in 0..N-1 (K counts from 0, like JOB_COMPLETION_INDEX)")
    return k, n


def shard_requests(gs: GateSetRecord, index: int, count: int) -> list[str]:
    """The names of shard ``index`` of ``count``'s requests, in gate-set order."""
    if count > len(gs.requests):
        raise InputError(
            f"{count} shards for gate set {gs.name} v{gs.version}, which has {len(gs.requests)} "
            f"requests: a shard would render nothing; use at most {len(gs.requests)} shards"
        )
    return [r.name for i, r in enumerate(gs.requests) if i % count == index]


# ------------------------------------------------------------------------------------ one shard
def run_shard(
    ref: str,
    registry: Registry,
    *,
    shard: tuple[int, int],
    twins: tuple[int, ...] = (1, 2),
    run_id: str | None = None,
    progress: Progress = lambda m: None,
) -> ShardOutcome:
    """Render shard ``shard`` = (K, N) of the gate set in fresh processes and store signed partial evidence."""
    index, count = shard
    inputs = check_inputs(registry, ref, "none", None)  # the build, this machine, the gate set
    gs, manifest = inputs.gate_set, inputs.manifest
    names = shard_requests(gs, index, count)
    runs = [_shard_run(registry, inputs, shard, names, twin, progress) for twin in twins]
    record = GateShard(
        build_id=manifest.build_id,
        build_digest=inputs.resolved.digest,
        pipeline=manifest.pipeline,
        target=manifest.target,
        run_id=run_id,
        index=index,
        count=count,
        gate_set=gs,
        requests=names,
        runs=runs,
        tool=tool_versions(),
        created_at=utcnow(),
        created_by=who(),
    )
    progress(f"storing shard {index}/{count}'s signed partial evidence with the build")
    digest = save_shard(registry, record, subject_digest=manifest.content_digest())
    return ShardOutcome(record, digest)


def _shard_run(
    registry: Registry, inputs: GateInputs, shard: tuple[int, int], names: list[str], twin: int, progress: Progress
) -> GateShardRun:
    """One twin of the slice ``names`` in a fresh process; its frames stored, its counts recorded."""
    index, count = shard
    progress(
        f"shard {index}/{count} twin #{twin}: {len(names)} of {len(inputs.gate_set.requests)} requests "
        f"({', '.join(names)}) in a fresh process"
    )
    run = fresh_run(
        registry.uri,
        inputs.resolved.digest,
        inputs.gate_set.digest,
        label=_label(index, count, twin),
        requests=names,
        on_chunk=chunk_ticks(progress, f"shard {index}/{count} twin #{twin}", inputs.gate_set, names),
    )
    check_run_environment(run, inputs)
    progress(
        f"shard {index}/{count} twin #{twin}: {run.frames.shape[0]} frames, {run.compiles} compile(s), "
        f"{run.wall_seconds:.1f}s"
    )
    return GateShardRun(
        twin=twin,
        host=run.host,
        environment=inputs.env,
        frame_sha256=run.frame_sha256,
        frames_blob=put_frames(registry, run.frames),
        compiles=run.compiles,
        compile_events=run.compile_events,
        heavy_modules=run.heavy_modules,
        wall_seconds=round(run.wall_seconds, 3),
    )


# ------------------------------------------------------------------------------------ the merge
def merge_shards(
    ref: str,
    registry: Registry,
    *,
    baseline: str = "prod",
    report_dir: str | Path | None = None,
    band_file: str | Path | None = None,
    run_id: str | None = None,
    progress: Progress = lambda m: None,
) -> GateOutcome:
    """Check the stored shards of ``ref`` and decide its gate as one unsharded run would."""
    t_start = time.perf_counter()
    resolved, manifest = read_manifest(registry, ref)
    shards = _signed_shards(registry, manifest, run_id)
    progress(f"merging {len(shards)} shard run(s) of {manifest.build_id}")
    inputs = check_inputs(registry, resolved.digest, baseline, band_file, env=shards[0][0].runs[0].environment)
    chosen = _cover(shards, inputs.gate_set, resolved.digest)
    twins = _reassemble(registry, inputs.gate_set, chosen)
    comparison = compare(registry, inputs, twins)
    stored = store_result(registry, inputs, twins, comparison, t_start, progress)
    report, review_path = write_reports(report_dir, stored, twins, comparison)
    never = never_promotes(registry, inputs, stored.result)
    return GateOutcome(stored.result, stored.digest, report, review_path, never)


def _signed_shards(registry: Registry, manifest: Manifest, run_id: str | None) -> list[tuple[GateShard, str]]:
    """The verified partials of this build (of one run id: ``run_id``, else the newest's), oldest first."""
    policy = load_policy()
    trusted, subject = policy.gate_keys(manifest.target), manifest.content_digest()
    shards, bad = [], []
    for name, envelope in shard_envelopes(registry, manifest.build_id):
        try:
            att = verify_envelope(
                envelope, f"gate shard {name}", trusted=trusted, kind="gate-shard", subject_digest=subject
            )
        except (TrustError, IntegrityError) as e:
            bad.append(str(e))
            continue
        data = canonical_json(att.predicate)
        shards.append((parse_record(GateShard, data, where=f"gate shard {name}"), sha256_digest(data)))
    shards.sort(key=lambda sd: sd[0].created_at)
    if not shards:
        why = f" ({'; '.join(bad[-3:])})" if bad else ""
        raise GateInfraError(
            f"no signed gate shards of {manifest.build_id}{why}: run `avatar-release gate "
            f"{manifest.build_id} --shard K/N` for K in 0..N-1 first, signed with a gate key the "
            f"trust policy {policy.path} accepts for target {manifest.target}"
        )
    want = run_id if run_id is not None else shards[-1][0].run_id
    picked = [(s, d) for s, d in shards if s.run_id == want]
    if not picked:
        runs = sorted({str(s.run_id) for s, _ in shards})
        raise GateInfraError(f"no signed gate shards of {manifest.build_id} with run id {run_id!r} (found {runs})")
    return picked


def _cover(shards: list[tuple[GateShard, str]], gs: GateSetRecord, build_digest: str) -> Chosen:
    """-> {index: {twin: (shard, run, partial digest)}}: the newest run of each (index, twin),
    refused unless the shards cover the gate set exactly once, in one environment, for this build."""
    count = shards[-1][0].count
    for s, d in shards:
        _check_shard(s, d, gs, build_digest, count)
    chosen: Chosen = {}
    for s, d in shards:  # oldest first: a rerun of a shard replaces it
        for r in s.runs:
            chosen.setdefault(s.index, {})[r.twin] = (s, r, d)
    missing = [f"{k}/{count} twin #{t}" for k in range(count) for t in (1, 2) if t not in chosen.get(k, {})]
    if missing:
        raise GateInfraError(
            f"the shards do not cover gate set {gs.name} v{gs.version}: missing {', '.join(missing)}; "
            "run them (avatar-release gate BUILD --shard K/N) and merge again"
        )
    names = [n for k in range(count) for n in chosen[k][1][0].requests]
    if sorted(names) != sorted(r.name for r in gs.requests) or len(set(names)) != len(names):
        raise GateInfraError(f"the shards rendered {sorted(names)}, the gate set is {[r.name for r in gs.requests]}")
    _check_one_environment([r for by_twin in chosen.values() for _, r, _ in by_twin.values()])
    return chosen


def _check_shard(s: GateShard, digest: str, gs: GateSetRecord, build_digest: str, count: int) -> None:
    """One partial belongs to this merge: one split, this build, this gate set, its own slice."""
    where = f"shard {s.index}/{s.count} ({digest}, on {', '.join(r.host for r in s.runs)})"
    if s.count != count:
        raise GateInfraError(
            f"{where}: split {s.count} ways, the newest shard {count} ways; merge one split "
            "(rerun the odd shards, or give each split its own --run-id)"
        )
    if s.build_digest != build_digest:
        raise GateInfraError(f"{where}: ran build {s.build_digest}, merging {build_digest}")
    if s.gate_set.digest != gs.digest:
        raise GateInfraError(
            f"{where}: ran gate set {s.gate_set.name} v{s.gate_set.version} ({s.gate_set.digest}), "
            f"this avatar-release's is {gs.digest}; run every shard with one version"
        )
    if s.requests != shard_requests(gs, s.index, count):
        raise GateInfraError(f"{where}: rendered {s.requests}, its slice is {shard_requests(gs, s.index, count)}")


def _check_one_environment(runs: list[GateShardRun]) -> None:
    """Every run saw one environment: hashes only compare within one."""
    first = runs[0]
    for r in runs[1:]:
        if r.environment.fingerprint != first.environment.fingerprint:
            diff = diff_machines(
                Machine.of_environment(first.environment), Machine.of_environment(r.environment), cpu_features="equal"
            )
            raise EnvironmentMismatch(
                f"shard runs on {first.host} and {r.host} saw different environments ({diff.inline(first.host, r.host)}); "
                "hashes only compare within one environment: run every shard on matching machines",
                diff.differences,
            )


def _label(index: int, count: int, twin: int) -> str:
    return f"shard {index}/{count} twin #{twin}"


def _reassemble(registry: Registry, gs: GateSetRecord, chosen: Chosen) -> TwinRuns:
    """Both twins, request by request in gate-set order, as if each had rendered the whole set; every
    shard's process, and the signed partial the verdict rests on for each."""
    a, runs_a = _reassembled_twin(registry, gs, chosen, 1)
    b, runs_b = _reassembled_twin(registry, gs, chosen, 2)
    partials = {_label(k, s.count, t): d for k, by_twin in chosen.items() for t, (s, _, d) in by_twin.items()}
    return TwinRuns(a, b, runs=runs_a + runs_b, partials=partials)


def _reassembled_twin(
    registry: Registry, gs: GateSetRecord, chosen: Chosen, twin: int
) -> tuple[GateRun, list[ProcessRun]]:
    """Twin ``twin`` of every shard joined into one run of the whole gate set, and its processes."""
    frames_of = {r.name: r.frames for r in gs.requests}
    per_request: dict[str, tuple[np.ndarray, list[str]]] = {}
    processes: list[ProcessRun] = []
    for k in sorted(chosen):
        shard, run, _ = chosen[k][twin]
        frames = get_frames(registry, run.frames_blob)
        at = 0
        for name, hashes in zip(shard.requests, run.frame_sha256):
            n = frames_of[name] if frames.dtype == np.uint8 else len(hashes)  # audio, tensors: a unit per chunk
            per_request[name] = (frames[at : at + n], hashes)
            at += n
        processes.append(ProcessRun(_label(k, shard.count, twin), run.compiles, run.compile_events, run.host))
    shard_runs = [chosen[k][twin][1] for k in sorted(chosen)]
    order = [r.name for r in gs.requests]
    parts = [per_request[n][0] for n in order]
    if parts and parts[0].dtype != np.uint8:  # delivered chunks: each shard padded to its own longest
        width = max(p.shape[1] for p in parts)
        parts = [np.pad(p, ((0, 0), (0, width - p.shape[1]))) for p in parts]
    joined = GateRun(
        frames=np.concatenate(parts),
        frame_sha256=[per_request[n][1] for n in order],
        compiles=sum(r.compiles for r in shard_runs),
        compile_events=[e for r in shard_runs for e in r.compile_events],
        chunks=[],
        environment=shard_runs[0].environment.model_dump(mode="json"),
        heavy_modules=sorted({m for r in shard_runs for m in r.heavy_modules}),
        seconds={},
        wall_seconds=sum(r.wall_seconds for r in shard_runs),
        host="",
    )
    return joined, processes
