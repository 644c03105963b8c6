"""Release approvals: the second role prod needs, so that one key alone never reaches prod.

A release approval is an attestation (kind ``release-approval``) signed by an approver the trust
policy names under ``[release] approvers``, about the build's manifest content digest and the
digest of the *gate result it approves* (the signed verdict that lets the build into prod now):
a re-gate, or prod moving, needs a new approval. With ``[release] roles = 2`` (the default) an
approval signed by a key that also signed that gate result does not count: the gate key alone
(leaked from a CI log, say) can get a build to staging, never to prod.

On one laptop the first-use identity holds both roles (its release key is the approver), and
``promote --to prod`` signs the approval itself; in CI the approver is a person or a separate job
with its own key, running ``avatar-release approve BUILD --key KEY``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ..errors import NeedsApproval, Refusal
from ..gates import SignedVerdict
from ..records import Manifest, utcnow
from ..registry import Registry
from ..trust import key_id
from ..trust.evidence import sign_and_store, verified
from ..trust.policy import TrustPolicy

if TYPE_CHECKING:
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

__all__ = ["Approval", "release_approvals", "check_release_roles", "sign_approval"]


@dataclass(frozen=True)
class Approval:
    build_id: str
    approver: str
    gate_result_digest: str
    at: str
    note: str
    key_ids: tuple[str, ...]
    digest: str  # of the predicate's canonical bytes

    def describe(self) -> str:
        return f"{self.approver} ({self.digest})"

    def to_json(self) -> dict[str, Any]:
        return {
            "build_id": self.build_id,
            "approver": self.approver,
            "gate_result_digest": self.gate_result_digest,
            "at": self.at,
            "note": self.note,
            "key_ids": list(self.key_ids),
            "digest": self.digest,
        }


def release_approvals(
    registry: Registry, build_id: str, manifest: Manifest, verdict: SignedVerdict, policy: TrustPolicy
) -> tuple[list[Approval], list[str]]:
    """(approvals that count for this verdict, why each other signed approval does not)."""
    if not policy.approvers:
        return [], []
    good, _ = verified(
        registry,
        build_id,
        kind="release-approval",
        trusted=policy.approver_keys(),
        subject_digest=manifest.content_digest(),
    )
    counted: list[Approval] = []
    ignored: list[str] = []
    for att, digest in good:
        p = att.predicate
        who = p.get("approver")
        if p.get("build_id") != build_id or p.get("gate_result_digest") != verdict.digest:
            ignored.append(f"an approval by {who} is of another gate result ({p.get('gate_result_digest')})")
        elif not policy.owns_name(who, att.key_ids):
            ignored.append(f"an approval names {who!r}, whose key did not sign it")
        elif policy.roles == 2 and set(att.key_ids) & set(verdict.key_ids):
            ignored.append(
                f"the approval by {who} is signed by the key that signed the gate result: one key "
                "cannot hold both roles"
            )
        else:
            counted.append(
                Approval(
                    build_id,
                    str(who),
                    verdict.digest,
                    str(p.get("at", "")),
                    str(p.get("note", "")),
                    att.key_ids,
                    digest,
                )
            )
    return counted, ignored


def check_release_roles(
    registry: Registry, build_id: str, manifest: Manifest, verdict: SignedVerdict, policy: TrustPolicy, *, what: str
) -> list[Approval]:
    """The approvals that let the build into prod (none needed with ``roles = 1``), or NeedsApproval."""
    if policy.roles == 1:
        return []
    if not policy.approvers:
        raise Refusal(
            f"{what}: prod needs gate evidence and a release approval by another key, and the trust "
            f'policy {policy.path} names no approver. Add `[release] approvers = ["NAME"]` (a key under '
            "[keys] that is not a gate key), or `roles = 1` to let gate evidence alone reach prod"
        )
    counted, ignored = release_approvals(registry, build_id, manifest, verdict, policy)
    if not counted:
        why = f" ({'; '.join(ignored[-3:])})" if ignored else ""
        raise NeedsApproval(
            f"{what}: prod needs a release approval of gate result {verdict.digest} signed by an approver the "
            f"trust policy {policy.path} names ({', '.join(policy.approvers)}), with a key other than the gate's"
            f"{why}. Approve it: avatar-release approve {build_id} --key APPROVER.key"
        )
    return counted


def sign_approval(
    registry: Registry,
    build_id: str,
    manifest: Manifest,
    verdict: SignedVerdict,
    policy: TrustPolicy,
    private_key: Ed25519PrivateKey,
    *,
    approver: str | None = None,
    note: str = "",
) -> Approval:
    """Sign and store an approval of ``verdict`` for prod with ``private_key``, once the policy says
    that key is an approver's and is not the key that signed the verdict."""
    kid = key_id(private_key.public_key())
    names = [n for n in policy.approvers if key_id(policy.keys[n]) == kid]
    if not names:
        raise Refusal(
            f"approve {build_id}: key {kid} is not a release approver's in the trust policy {policy.path} "
            f"(approvers: {', '.join(policy.approvers) or 'none'}); sign with an approver's key (--key)"
        )
    if approver is not None and approver not in names:
        raise Refusal(
            f"approve {build_id}: the trust policy {policy.path} knows {approver!r} by another key; "
            f"key {kid} is {', '.join(names)}'s"
        )
    if policy.roles == 2 and kid in verdict.key_ids:
        raise Refusal(
            f"approve {build_id}: key {kid} signed the gate result {verdict.digest}; a release approval "
            "must come from another key (two roles), so the gate key alone never reaches prod"
        )
    who = approver or names[0]
    predicate = {
        "build_id": build_id,
        "gate_result_digest": verdict.digest,
        "approver": who,
        "note": note,
        "at": utcnow(),
    }
    sign_and_store(
        registry,
        private_key,
        kind="release-approval",
        build_id=build_id,
        subject_digest=manifest.content_digest(),
        predicate=predicate,
    )
    counted, ignored = release_approvals(registry, build_id, manifest, verdict, policy)
    mine = [a for a in counted if a.approver == who]
    if not mine:  # cannot happen after the checks above; never report an approval that does not count
        raise Refusal(f"approve {build_id}: the approval was stored but does not count ({'; '.join(ignored)})")
    return mine[-1]
