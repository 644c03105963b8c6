"""Markdown for a CI job's summary page: appended to ``$GITHUB_STEP_SUMMARY`` when it is set.

Only ``gate`` (and ``gate merge``) and ``promote`` write one: the verdict table, the worst frames
and the report path; the move and its next step. Nothing is written outside GitHub Actions.
"""

from __future__ import annotations

import os
from pathlib import Path

from ..promote import MoveResult
from ..records import GateResult
from ..records.gate import BitExactDetails, FrameDifference

__all__ = ["gate_summary", "promote_summary", "append_step_summary"]

_WORST = 5  # frames listed per gate


def append_step_summary(markdown: str) -> Path | None:
    """Append to the file GitHub Actions names in ``GITHUB_STEP_SUMMARY``; None when unset."""
    path = os.environ.get("GITHUB_STEP_SUMMARY")
    if not path:
        return None
    with open(path, "a", encoding="utf-8") as f:
        f.write(markdown.rstrip("\n") + "\n\n")
    return Path(path)


def _cell(text: object) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")


def gate_summary(result: GateResult, digest: str, report: str | None, next_command: str | None) -> str:
    """A gate result as Markdown: verdict, one row per gate, the worst frames, where the report is."""
    icon = {"passed": "✅", "failed": "❌", "needs-review": "👀"}.get(result.status, "")
    base = result.baseline.build_id if result.baseline else "none"
    lines = [
        f"### Gate {icon} `{result.status}`: `{result.build_id}`",
        "",
        f"baseline `{base}`"
        + (f", tier {result.tier}" if result.tier else "")
        + f", gate set {result.gate_set.name} v{result.gate_set.version}, {result.seconds.get('total', 0):.1f}s",
        "",
        "| gate | verdict | evidence |",
        "|---|---|---|",
    ]
    lines += [f"| {g.name} | {g.status} | {_cell(g.summary)} |" for g in result.gates]
    worst = _worst_frames(result)
    if worst:
        lines += [
            "",
            f"Worst frames vs the baseline ({len(worst)} lowest PSNR):",
            "",
            "| frame | PSNR dB | max abs diff |",
            "|---|---|---|",
        ]
        lines += [f"| {_cell(f.label)} | {f.psnr_db} | {f.max_abs_diff} |" for f in worst]
    lines += ["", f"result `{digest}`"]
    if report:
        lines.append(f"report `{report}` (uploaded as an artifact when the workflow keeps it)")
    if next_command:
        lines += ["", f"next: `{next_command}`"]
    return "\n".join(lines)


def promote_summary(r: MoveResult, next_command: str | None) -> str:
    d, e = r.decision, r.entry
    if e is None:  # not r.changed
        text = f"### Promote: `{d.channel}` already points at `{d.build_id}`"
    else:
        text = (
            f"### Promoted ✅ `{d.channel}`: `{r.previous or '(empty)'}` → `{d.build_id}`\n\n"
            f"history #{e.sequence} by {e.who}"
            + (f", gate result `{d.gate_result_digest}`" if d.gate_result_digest else "")
        )
    return text + (f"\n\nnext: `{next_command}`" if next_command else "")


def _worst_frames(result: GateResult) -> list[FrameDifference]:
    """The frames that differ most from the baseline (bit-exact's evidence lists each differing one)."""
    be = result.evidence(BitExactDetails)
    frames = (be.frames if be is not None else None) or []
    return sorted(frames, key=lambda f: (f.psnr_db is None, f.psnr_db or 0.0))[:_WORST]
