"""What the signed release state costs, with a long history beside a short one.

* promote: what a promotion adds for the signed state: verify the state from its root
  (``load_state``) and sign one move into it (``record_move``: move record, channel metadata,
  snapshot, timestamp), in a directory registry (goal: under 1 s with 1,000 moves in history,
  each prod move's gate result and approval listed in the evidence role as they were stored);
* rollback's read: the channel's whole signed history, walked back along the move chain;
* a pod's poll: ``verify_channel_state`` through tuf.ngclient from a pinned root, with the
  pod's trusted metadata already on disk (goal: under 50 ms), and the bytes that poll reads
  from the registry (goal: not growing with history).

Each size is a fresh registry with that many moves spread over dev, staging and prod; the sizes
are measured alternately, ``--repeats`` times each (min / median / max). Keys and the state this
"machine" remembers live in temporary folders (nothing of the user's is read or written).

    python benchmarks/bench_state.py [--moves 1000] [--repeats 7] [--out benchmarks/results/state.json]
    python benchmarks/bench_state.py --smoke --out FILE   # 30 moves, 2 repeats: the tests run it
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from _out import out_path, write_results  # noqa: E402 (benchmarks/_out.py, beside this file)

GOALS = {"promote_s": 1.0, "poll_s": 0.050}


class CountingRegistry:
    """A registry that counts the bytes read through it, records and blobs (what a poll costs on the wire)."""

    def __init__(self, inner):
        self._inner, self.read = inner, 0

    def __getattr__(self, name):
        return getattr(self._inner, name)

    def get_record(self, namespace, name):
        data = self._inner.get_record(namespace, name)
        self.read += len(data or b"")
        return data

    def get_blob(self, digest, size):
        data = self._inner.get_blob(digest, size)
        self.read += len(data)
        return data


def _evidence(reg, build_id: str, digest: str) -> list:
    """What a prod move names: a gate result signed by the gate key and a release approval of it
    signed by the release key (minimal predicates: a pod checks signatures, subject and links)."""
    from avatar_release._digest import canonical_json, sha256_digest
    from avatar_release.records import BlobRef
    from avatar_release.trust.attest import attest
    from avatar_release.trust.policy import local_identity

    ident = local_identity()
    gate = {"build_id": build_id, "status": "passed"}
    out = []
    for key, kind, predicate in (
        (ident.gate_key(), "gate-result", gate),
        (
            ident.release_key(),
            "release-approval",
            {"build_id": build_id, "gate_result_digest": sha256_digest(canonical_json(gate))},
        ),
    ):
        env = attest(key, kind=kind, build_id=build_id, subject_digest=digest, predicate=predicate)
        out.append(BlobRef(digest=reg.put_blob(env), size=len(env), media_type="application/vnd.dsse.envelope.v1+json"))
    return out


def _build(root: Path, moves: int):
    from avatar_release.registry import LocalRegistry
    from avatar_release.trust.policy import load_policy
    from avatar_release.trust.state_write import init_state, record_evidence, record_move

    reg = LocalRegistry(root)
    policy = load_policy()
    state = init_state(reg, policy)
    for i in range(moves):
        channel = ("dev", "staging", "prod")[i % 3]
        digest = f"sha256:{i:064x}"
        evidence = _evidence(reg, f"b-{i}", digest) if channel == "prod" else []
        for ref, kind in zip(evidence, ("gate-result", "release-approval")):  # listed as they are stored
            state = record_evidence(reg, policy, build_id=f"b-{i}", envelope=ref, kind=kind)
        state, _ = record_move(
            reg,
            policy,
            state,
            channel,
            action="promote",
            build_id=f"b-{i}",
            manifest_digest=digest,
            manifest_size=1000,
            who="bench",
            reason="",
            gate_result_digest=None,
            evidence=evidence,
        )
    return reg


def _stats(xs: list[float]) -> dict:
    return {"min": min(xs), "median": statistics.median(xs), "max": max(xs), "runs": len(xs)}


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--moves", type=int, default=1000)
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--smoke", action="store_true")
    ap.add_argument("--out", default=None)
    args = ap.parse_args(argv)
    if args.smoke:
        args.moves, args.repeats = 30, 2
    tmp = Path(tempfile.mkdtemp(prefix="bench-state-"))
    os.environ["AVATAR_RELEASE_CONFIG_DIR"] = str(tmp / "config")
    os.environ.pop("AVATAR_RELEASE_TRUST_POLICY", None)

    from avatar_release.trust.policy import load_policy
    from avatar_release.trust.state_files import NAMESPACE
    from avatar_release.trust.state_pod import PinnedRoot, verify_channel_state
    from avatar_release.trust.state_read import load_state, moves
    from avatar_release.trust.state_write import record_move

    sizes = {"short": 3, "long": args.moves}
    regs = {k: _build(tmp / f"reg-{k}", n) for k, n in sizes.items()}
    policy = load_policy()
    out: dict = {
        k: {"moves": n, "promote_s": [], "history_read_s": [], "poll_s": [], "poll_bytes": []} for k, n in sizes.items()
    }
    for rep in range(args.repeats):
        for k, reg in regs.items():  # alternated: short, long, short, long, ...
            os.environ["AVATAR_RELEASE_STATE_DIR"] = str(tmp / f"machine-{k}")
            t0 = time.perf_counter()
            state = load_state(reg, policy)
            record_move(
                reg,
                policy,
                state,
                "dev",
                action="promote",
                build_id=f"x-{rep}",
                manifest_digest=f"sha256:{rep + 10**6:064x}",
                manifest_size=1000,
                who="bench",
                reason="",
                gate_result_digest=None,
                evidence=(),
            )
            out[k]["promote_s"].append(time.perf_counter() - t0)
            t0 = time.perf_counter()
            chain = moves(reg, load_state(reg, policy).holder("prod"))
            out[k]["history_read_s"].append(time.perf_counter() - t0)
            out[k]["prod_history_moves"] = len(chain)
            root = PinnedRoot(reg.get_record(NAMESPACE, "1.root.json"), "bench")
            verify_channel_state(reg, "prod", root)  # the pod has trusted this state before (a poll, not a start)
            counting = CountingRegistry(reg)
            t0 = time.perf_counter()
            verify_channel_state(counting, "prod", root)
            out[k]["poll_s"].append(time.perf_counter() - t0)
            out[k]["poll_bytes"].append(counting.read)
    doc = {"smoke": args.smoke, "goals": GOALS}
    for k in sizes:
        r = out[k]
        doc[k] = {
            "moves": r["moves"],
            "prod_history_moves": r["prod_history_moves"],
            "promote_s": _stats(r["promote_s"]),
            "history_read_s": _stats(r["history_read_s"]),
            "poll_s": _stats(r["poll_s"]),
            "poll_bytes": _stats(r["poll_bytes"]),
        }
    doc["long_over_short"] = {
        m: doc["long"][m]["median"] / doc["short"][m]["median"] for m in ("promote_s", "poll_s", "poll_bytes")
    }
    doc["meets_goals"] = {
        "promote_s": doc["long"]["promote_s"]["median"] < GOALS["promote_s"],
        "poll_s": doc["long"]["poll_s"]["median"] < GOALS["poll_s"],
        "poll_bytes_flat": doc["long"]["poll_bytes"]["max"] <= doc["short"]["poll_bytes"]["max"] * 1.1,
    }
    return write_results(doc, out_path(args.out, "state", smoke=args.smoke), smoke=args.smoke, echo=args.out is None)


if __name__ == "__main__":
    main()
