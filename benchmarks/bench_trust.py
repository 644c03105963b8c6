"""Trust cost: signature verification and the whole pre-load verification as shares of a cold load,
and signing + verifying gate evidence (DSSE attestations) as shares of the gate.

Pre-load verification = signed-statement check + identity/seal recomputation + size and sha256
of every blob (all before any decompression or unpickling). Goal: <= 2% of the cold load.
Goal for evidence: <= 1% of the gate. Each load is a fresh process (a real cold load); the median
of N runs is reported.

    python benchmarks/bench_trust.py [--runs 3] [--registry DIR] [--out benchmarks/results/trust.json]
    python benchmarks/bench_trust.py --smoke --registry DIR --out FILE   # one run, a stand-in gate; the tests run it

``--registry``: a registry whose dev channel holds an ungated tiny build (default: compile one); it
is copied, never changed. ``--smoke`` loads once per kind and stores a signed, passing stand-in gate
result (``tests/unit/test_copy.gate``) instead of running the gate, so the shares of the gate are
null; everything a pod checks is the same.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from _out import out_path, write_results  # noqa: E402 (benchmarks/_out.py, beside this file)

os.environ.setdefault("JAX_PLATFORMS", "cpu")  # a CPU build: never start the TPU plugin (libtpu may be installed)

_CHILD = r"""
import json, sys, time
from avatar_release.machine import configure_host_devices
configure_host_devices(8)
from avatar_release.registry import LocalRegistry
from avatar_release.runtime import TrustConfig, load
from avatar_release.trust import AcceptedState, load_public_key
reg = LocalRegistry(sys.argv[1])
trust = TrustConfig(load_public_key(sys.argv[2]), AcceptedState(sys.argv[3])) if sys.argv[2] != "-" else None
import jax  # imported before timing: the cold load is what the loader does
t0 = time.perf_counter()
from avatar_release.records import identity
b = load("prod", reg, trust=trust)
total = time.perf_counter() - t0
t = b.timings
t1 = time.perf_counter(); identity.manifest_identity(b.manifest); identity.manifest_seal(b.manifest)
ident = time.perf_counter() - t1
print(json.dumps({"total": total, "signature": t.signature, "verify": t.verify, "identity": ident,
                  "fetch": t.fetch, "deserialize": t.deserialize}))
"""


def _evidence_cost(reg, build_id: str, gate_result, runs: int) -> dict:
    """Median seconds to sign one gate result's attestation, and to verify a build's evidence as
    the promotion policy does (every envelope read and checked against the trust policy)."""
    import time

    from avatar_release.registry import read_manifest
    from avatar_release.trust.attest import attest
    from avatar_release.trust.evidence import gate_signing_key, verified
    from avatar_release.trust.policy import load_policy

    key, policy = gate_signing_key(), load_policy()
    _, manifest = read_manifest(reg, build_id)
    predicate = gate_result.model_dump(mode="json")
    sign, verify = [], []
    for _ in range(max(runs, 5)):
        t0 = time.perf_counter()
        attest(
            key, kind="gate-result", build_id=build_id, subject_digest=manifest.content_digest(), predicate=predicate
        )
        t1 = time.perf_counter()
        good, _ = verified(
            reg,
            build_id,
            kind="gate-result",
            trusted=policy.gate_keys(manifest.target),
            subject_digest=manifest.content_digest(),
        )
        assert good, "the gate's own attestation must verify"
        verify.append(time.perf_counter() - t1)
        sign.append(t1 - t0)
    return {"sign": statistics.median(sign), "verify": statistics.median(verify)}


def _gated(reg, build_id: str, *, stand_in: bool):
    """(a passing gate result stored with the build, the gate's seconds or None for a stand-in)."""
    if stand_in:
        from avatar_release.gates.store import latest_result
        from avatar_release.registry import read_manifest
        from tests.release_records import gate_with_frames  # signed by this machine's gate key, as the gate signs

        resolved, manifest = read_manifest(reg, build_id)
        gate_with_frames(reg, build_id, resolved.digest, manifest)
        return latest_result(reg, build_id)[0], None
    from avatar_release.gates import run_gate

    outcome = run_gate(build_id, reg, baseline="none")
    return outcome.result, outcome.result.seconds["total"]


def _share(part: float, whole: float | None, digits: int) -> float | None:
    return None if whole is None else round(part / whole, digits)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument(
        "--registry", help="a registry whose dev channel holds an ungated tiny build (default: compile one)"
    )
    ap.add_argument("--smoke", action="store_true", help="one run, a stand-in gate result: proves the benchmark runs")
    ap.add_argument("--out", help="write the JSON here (default benchmarks/results/trust.json; --smoke: nowhere)")
    args = ap.parse_args()
    os.environ.setdefault("AVATAR_RELEASE_PROJECT", str(ROOT))  # the bundled pipeline's specs, wherever it runs
    if args.smoke:
        args.runs = 1

    from avatar_release.machine import configure_host_devices

    configure_host_devices(8)
    from avatar_release.promote import promote
    from avatar_release.registry import LocalRegistry, read_manifest
    from avatar_release.trust import generate_keypair, load_private_key

    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        if args.registry:
            shutil.copytree(args.registry, tmp / "reg")
        reg = LocalRegistry(tmp / "reg")
        if not args.registry:
            from avatar_release.compile import compile_build

            compile_build("tiny", "cpu-8", registry=reg)
        build_id = read_manifest(reg, "dev")[0].build_id
        gate_result, gate_s = _gated(reg, build_id, stand_in=args.smoke)
        evidence = _evidence_cost(reg, build_id, gate_result, args.runs)
        priv, pub, _ = generate_keypair(tmp / "keys")
        key = load_private_key(priv)
        promote(reg, build_id, "staging", signing_key=key)
        promote(reg, build_id, "prod", signing_key=key)

        def child(pubkey: str) -> dict:
            out = subprocess.run(
                [sys.executable, "-c", _CHILD, str(tmp / "reg"), pubkey, str(tmp / "state.json")],
                capture_output=True,
                text=True,
                env={**os.environ, "PYTHONPATH": str(ROOT)},
                check=True,
            )
            return json.loads(out.stdout.strip().splitlines()[-1])

        signed = [child(str(pub)) for _ in range(args.runs)]
        plain = [child("-") for _ in range(args.runs)]

    med = lambda rows, k: statistics.median(r[k] for r in rows)  # noqa: E731
    sig_share = med(signed, "signature") / med(signed, "total")
    pre = (med(signed, "signature") + med(signed, "verify") + med(signed, "identity")) / med(signed, "total")
    result = {
        "runs": args.runs,
        "smoke": args.smoke,
        "build_id": build_id,
        "cold_load_s": {"with_key": round(med(signed, "total"), 4), "without_key": round(med(plain, "total"), 4)},
        "signature_s": round(med(signed, "signature"), 5),
        "blob_verify_s": round(med(signed, "verify"), 5),
        "identity_and_seal_s": round(med(signed, "identity"), 5),
        "gate_s": None if gate_s is None else round(gate_s, 3),
        "evidence_sign_s": round(evidence["sign"], 5),
        "evidence_verify_s": round(evidence["verify"], 5),
        "ratios": {
            "signature / cold load": round(sig_share, 4),
            "pre-load verification / cold load": round(pre, 4),
            "evidence signing / gate": _share(evidence["sign"], gate_s, 5),
            "evidence verification (promotion) / gate": _share(evidence["verify"], gate_s, 5),
        },
    }
    print(
        f"cold load (median of {args.runs} fresh processes): {med(signed, 'total'):.3f}s with a trust key, "
        f"{med(plain, 'total'):.3f}s without"
    )
    print(f"{'measure':<40} {'ratio':>8} {'goal':>7}")
    goals = {
        "signature / cold load": 0.02,
        "pre-load verification / cold load": 0.02,
        "evidence signing / gate": 0.01,
        "evidence verification (promotion) / gate": 0.01,
    }
    for name, v in result["ratios"].items():
        goal = goals[name]
        if v is None:
            print(f"{name:<42} {'-':>8} {'<= ' + str(goal):>8}  (no gate ran: --smoke)")
            continue
        print(f"{name:<42} {v:8.4f} {'<= ' + str(goal):>8}  {'ok' if v <= goal else 'MISSED'}")
    write_results(result, out_path(args.out, "trust", smoke=args.smoke), smoke=args.smoke)


if __name__ == "__main__":
    main()
