"""What the promotion policy and a pod's trust checks cost, against what a user waits for anyway.

A real tiny cpu-8 build (compiled into a temporary registry unless ``--registry`` is given), gated
for real (``gate --baseline none``: prod is empty, the first release), then, side by side in one run:

* **promote**: the wall time of ``avatar-release promote BUILD --to staging`` and ``promote staging
  --to prod`` (processes, as a user runs them; prod includes signing the release approval with the
  first-use release key and the channel statement), against the policy's own decision
  (``check_promotion``, in-process, median of ``--repeat``): every signed verdict verified, the
  review and release-approval rules, the revocation check, the target-spec check. Goal: <= 5%.
* **a pod's swap**: ``runtime.load`` of the prod channel with a trust key, as a following pod loads
  a new build (the process already warm: median of ``--repeat`` loads), and the first, cold load of
  the process; the trust checks (signed statement + timestamp, and the revocation scan of the
  build's attestations) against the whole load. Goal: <= 2% of a cold load.

    python benchmarks/bench_policy.py [--registry DIR] [--out benchmarks/results/policy.json]
    python benchmarks/bench_policy.py --smoke --registry DIR --gated   # one repeat; what the tests run

``--gated``: the build on ``--registry``'s dev channel already carries a passing ``--baseline none``
gate, signed by the identity in ``$AVATAR_RELEASE_CONFIG_DIR`` (the tests hand their session's build,
gated once for the whole run): it is promoted under that identity instead of gated again under one
of the benchmark's own. The gate is not what is measured here (its wall time is then null).
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
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from _out import out_path, write_results  # noqa: E402 (benchmarks/_out.py, beside this file)


def _cli(*args: str, env: dict) -> tuple[dict, float]:
    t0 = time.perf_counter()
    out = subprocess.run(
        [sys.executable, "-m", "avatar_release", *args, "--json"], capture_output=True, text=True, env=env, cwd=ROOT
    )
    wall = time.perf_counter() - t0
    if out.returncode != 0:
        raise SystemExit(f"avatar-release {' '.join(args)} failed ({out.returncode}):\n{out.stdout}\n{out.stderr}")
    return json.loads(out.stdout), wall


def _gated_build(registry: str) -> str:
    """The build on dev, refused unless its newest gate result passed (``--gated``)."""
    from avatar_release.gates.store import latest_result
    from avatar_release.registry import open_registry, read_manifest

    reg = open_registry(registry, create=False)
    resolved, _ = read_manifest(reg, "dev")
    found = latest_result(reg, resolved.build_id)
    if found is None or found[0].status != "passed":
        raise SystemExit(f"--gated: {resolved.build_id} on dev has no passing gate ({found and found[0].status})")
    return resolved.build_id


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--registry", help="a registry whose dev channel holds an ungated build, prod empty")
    ap.add_argument("--repeat", type=int, default=20)
    ap.add_argument(
        "--gated",
        action="store_true",
        help="dev already passed a --baseline none gate signed by $AVATAR_RELEASE_CONFIG_DIR's identity",
    )
    ap.add_argument("--smoke", action="store_true")
    ap.add_argument("--out")
    args = ap.parse_args(argv)
    if args.smoke:
        args.repeat = 1
    tmp = Path(tempfile.mkdtemp(prefix="bench-policy-"))
    if not args.gated:  # a first-use identity of its own (gate, reviewer and release keys), never the user's
        os.environ["AVATAR_RELEASE_CONFIG_DIR"] = str(tmp / "config")
    os.environ.pop("AVATAR_RELEASE_TRUST_POLICY", None)
    os.environ.setdefault("AVATAR_RELEASE_PROJECT", str(ROOT))  # the bundled pipeline's specs, wherever it runs
    env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
    registry = args.registry
    if registry is None:
        registry = str(tmp / "reg")
        _cli("compile", "--pipeline", "tiny", "--target", "cpu-8", "--registry", registry, env=env)
    r = ["--registry", registry]
    if args.gated:  # its gate and its signed state are the identity's we run under: promoted as it is
        build, gate_wall = _gated_build(registry), None
    else:
        if args.registry is not None:  # someone else's registry (the tests'): sign its state as this promoter's
            shutil.rmtree(Path(registry) / "records" / "release-state", ignore_errors=True)
            _cli("registry", "upgrade", *r, env=env)
        gated, gate_wall = _cli("gate", "dev", "--baseline", "none", "--report", str(tmp / "report"), *r, env=env)
        build = gated["build_id"]
    keys, _ = _cli("keys", "generate", "--out", str(tmp / "keys"), "--name", "release", env=env)
    sign = ["--sign-key", keys["private_key"]]
    _, staging_wall = _cli("promote", build, "--to", "staging", *sign, *r, env=env)
    _, prod_wall = _cli("promote", "staging", "--to", "prod", *sign, *r, env=env)

    # In this process from here on: the policy's decision, then the pod's loads.
    from avatar_release.machine import configure_compile_env
    from avatar_release.specs import load_target

    configure_compile_env(load_target("cpu-8"))
    from avatar_release.promote.policy import check_promotion
    from avatar_release.promote.signed import SignedChannels
    from avatar_release.registry import open_registry, read_manifest
    from avatar_release.runtime import TrustConfig, load
    from avatar_release.trust.keys import load_public_key
    from avatar_release.trust.policy import load_policy
    from avatar_release.trust.state_pod import PinnedRoot
    from avatar_release.trust.state_read import load_state

    reg = open_registry(registry, create=False)
    resolved, manifest = read_manifest(reg, build)
    policy_s = {}
    for channel in ("staging", "prod"):
        times = []
        for _ in range(args.repeat):
            t0 = time.perf_counter()  # the decision reads the signed release state, then decides
            policy = load_policy()
            check_promotion(
                reg, resolved, manifest, channel, policy, channels=SignedChannels(reg, load_state(reg, policy))
            )
            times.append(time.perf_counter() - t0)
        policy_s[channel] = statistics.median(times)

    trust = TrustConfig(load_public_key(keys["public_key"]))
    first = load("prod", reg, trust=trust).timings
    loads = [load("prod", reg, trust=trust).timings for _ in range(max(args.repeat // 4, 1))]
    swap = sorted(loads, key=lambda t: t.total())[len(loads) // 2]
    # A pod pinning the registry's root: the signed release state through tuf.ngclient, with prod's
    # gate evidence and release approval, instead of the statement and timestamp.
    pinned = TrustConfig(root=PinnedRoot(reg.get_record("release-state", "1.root.json"), "root.json"))
    load("prod", reg, trust=pinned)
    rooted = sorted(
        (load("prod", reg, trust=pinned).timings for _ in range(max(args.repeat // 4, 1))), key=lambda t: t.total()
    )
    rooted_swap = rooted[len(rooted) // 2]

    def share(t) -> dict:
        checks = t.signature + t.revocation
        return {
            "load_seconds": round(t.total(), 4),
            "statement_seconds": round(t.signature, 5),
            "revocation_seconds": round(t.revocation, 5),
            "trust_checks_share": round(checks / t.total(), 4),
        }

    doc = {
        "benchmark": "policy-and-trust-cost",
        "smoke": args.smoke,
        "repeat": args.repeat,
        "cores": os.cpu_count(),
        "build_id": build,
        "gate_wall_seconds": None if gate_wall is None else round(gate_wall, 2),  # --gated: not gated here
        "promote": {
            ch: {
                "cli_wall_seconds": round(w, 3),
                "policy_seconds": round(policy_s[ch], 5),
                "policy_share": round(policy_s[ch] / w, 4),
            }
            for ch, w in (("staging", staging_wall), ("prod", prod_wall))
        },
        "pod": {
            "cold_load": share(first),
            "swap_load": share(swap),
            "trust_checks_share_of_cold_load": round((swap.signature + swap.revocation) / first.total(), 4),
            "pinned_root_swap_load": share(rooted_swap),
            "pinned_root_checks_share_of_cold_load": round(
                (rooted_swap.signature + rooted_swap.revocation) / first.total(), 4
            ),
        },
        "goal": {"policy_share_at_most": 0.05, "trust_checks_share_of_cold_load_at_most": 0.02},
    }
    doc["met"] = (
        all(v["policy_share"] <= 0.05 for v in doc["promote"].values())
        and doc["pod"]["trust_checks_share_of_cold_load"] <= 0.02
    )
    return write_results(doc, out_path(args.out, None, smoke=args.smoke), smoke=args.smoke, echo=True)


if __name__ == "__main__":
    main()
