"""``avatar-release gate``: prove a build's pixels before it may leave dev.

Order of work, and why:
  1. refuse bad input before any rendering: unknown build or baseline, a baseline that never
     passed, was gated elsewhere (environment fingerprint) or on another gate set, a tier-2
     candidate without a band;
  2. twin runs: the gate set rendered twice, each in a fresh process that only loads and
     serves (zero-recompile evidence comes from both);
  3. the twins must hash identical, or nothing is compared (non-deterministic);
  4. tier 1: every frame hash equals the baseline's; tier 2 (declared levers only): if not
     bit-exact, every frame inside the measured band, else ``needs-review`` with a blind page;
  5. the result (JSON), the frames, and a review when needed are stored with the build; the
     HTML report goes to ``report_dir``.

Each step is a public function of ``steps`` (shared with ``gate merge``, which replaces step 2 by
the shards' runs); this module only says the order.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

from ..records import GateResult
from ..registry import Registry
from .steps import (
    Progress,
    check_inputs,
    compare,
    effective_status,
    never_promotes,
    store_result,
    twin_runs,
    write_reports,
)

__all__ = ["GateOutcome", "run_gate", "effective_status"]


@dataclass
class GateOutcome:
    result: GateResult
    digest: str
    report: Path | None
    review_page: Path | None
    # Why this verdict cannot promote, said when the gate runs (None: it may): a comparison with
    # nothing while prod holds another build proves determinism only; a band, target spec or lever
    # list the trust policy does not pin ([gate_inputs]) decides nothing.
    never_promotes: str | None = None

    @property
    def passed(self) -> bool:
        return self.result.status == "passed"


def run_gate(
    ref: str,
    registry: Registry,
    *,
    baseline: str = "prod",
    report_dir: str | Path | None = None,
    band_file: str | Path | None = None,
    progress: Progress = lambda m: None,
    requests_of: str | None = None,
) -> GateOutcome:
    """Gate ``ref`` against ``baseline`` (a channel, a build, or "none"); the steps are in ``steps``.
    ``requests_of``: a build whose gate requests the runs render instead of ``ref``'s own (with
    ``baseline="none"``: a baseline re-gated for a candidate compiled with other requests)."""
    t_start = time.perf_counter()
    inputs = check_inputs(registry, ref, baseline, band_file, requests_of=requests_of)
    twins = twin_runs(registry, inputs, progress)
    comparison = compare(registry, inputs, twins)
    stored = store_result(registry, inputs, twins, comparison, t_start, progress)
    report, review_path = write_reports(report_dir, stored, twins, comparison)
    never = never_promotes(registry, inputs, stored.result)
    return GateOutcome(stored.result, stored.digest, report, review_path, never)
