"""What a chunk's deadline means on this host: the target's playback rate, met or not.

Every chunk has to render in its playback time (frames / fps): that is the target's deadline,
recorded with the build. Whether a miss is a fault depends on where the build runs. A build for
several CPU devices (``cpu-8``) runs on virtual devices that XLA carves out of one host's cores
(``--xla_force_host_platform_device_count``): there a chunk slower than playback only says this
host is slower than real hardware, and it is labelled so. Anywhere else the loader has already
checked that the devices are the build's own (backend, device kind and count), so a miss is a miss.
The real-time factor (media seconds per rendered second) says how far off a host is either way.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, Protocol

from .._progress import counted
from ..records import Manifest

__all__ = ["Pace", "PaceTally", "pace_of"]


class _Timed(Protocol):
    @property
    def seconds(self) -> float: ...

    @property
    def deadline(self) -> float: ...


@dataclass
class PaceTally:
    """Chunks against their playback time, summed as they come (a render, a request, a pod's life)."""

    chunks: int = 0
    media_seconds: float = 0.0  # the chunks' playback time (their deadlines)
    render_seconds: float = 0.0
    over_deadline: int = 0

    def add(self, seconds: float, deadline: float) -> None:
        self.chunks += 1
        self.media_seconds += deadline
        self.render_seconds += seconds
        self.over_deadline += seconds > deadline

    @classmethod
    def of(cls, chunks: Iterable[_Timed]) -> PaceTally:
        tally = cls()
        for c in chunks:
            tally.add(c.seconds, c.deadline)
        return tally

    @property
    def realtime_factor(self) -> float | None:
        """Media seconds per rendered second (1.0: exactly real time; None: nothing rendered)."""
        return round(self.media_seconds / self.render_seconds, 4) if self.render_seconds > 0 else None


@dataclass(frozen=True)
class Pace:
    """The deadline's meaning for one build on this host."""

    target: str
    backend: str
    device_kind: str
    devices: int
    host_cores: int
    emulated: bool  # virtual host devices: misses say "this host is slower than the target", not a fault

    @property
    def where(self) -> str:
        if self.emulated:
            return f"{self.devices} emulated {self.backend} devices on {self.host_cores} host cores"
        return f"{self.devices} x {self.device_kind}"

    def misses(self, tally: PaceTally) -> int:
        """The chunks of ``tally`` that missed their deadline: those over their playback time on the
        build's own hardware; none on emulated devices (there they only say the host is slower)."""
        return 0 if self.emulated else tally.over_deadline

    def miss_label(self) -> str:
        """How one chunk over its deadline is shown in progress lines."""
        return "slower than playback (emulated host)" if self.emulated else "MISSED"

    def chunk_line(
        self, index: int, *, frames: int, bucket: str, seconds: float, deadline: float, compiles: int
    ) -> str:
        """One chunk's progress line: its frames, its render time against its deadline, its compiles."""
        kept = (
            f"over its {deadline:.2f}s deadline: {self.miss_label()}"
            if seconds > deadline
            else f"deadline {deadline:.2f}s met"
        )
        return (
            f"chunk {index}: {counted(frames, 'frame')} ({bucket}) in {seconds:.2f}s, {kept}, "
            f"{counted(compiles, 'compile')}"
        )

    def summary(self, tally: PaceTally) -> str:
        """One line for a render's report: the deadline, this host's pace, what chunks over it mean."""
        rtf, over, n = tally.realtime_factor, tally.over_deadline, tally.chunks
        pace = f"{rtf:.2f}x real time" if rtf is not None else "no chunks"
        head = f"deadline: each chunk in its playback time (the {self.target} target's); here {pace} on {self.where}"
        if not over:
            return f"{head}; every chunk in time"
        if self.emulated:
            return (
                f"{head}; {over} of {n} chunks slower than playback: expected on emulated devices "
                "(this host is slower than the target), not a deadline miss"
            )
        return f"{head}; {over} of {n} chunks MISSED their deadline on the build's own hardware"

    def to_json(self, tally: PaceTally) -> dict[str, Any]:
        return {
            "target": self.target,
            "where": self.where,
            "emulated": self.emulated,
            "chunks": tally.chunks,
            "realtime_factor": tally.realtime_factor,
            "chunks_over_deadline": tally.over_deadline,
            "misses_on_target": self.misses(tally),
        }


def pace_of(manifest: Manifest, host_cores: int | None = None) -> Pace:
    """The build's deadline on this host (see the module's docstring for the rule)."""
    p = manifest.platform
    cores = host_cores if host_cores is not None else (os.cpu_count() or 1)
    return Pace(
        target=manifest.target,
        backend=p.backend,
        device_kind=p.device_kind,
        devices=p.device_count,
        host_cores=cores,
        emulated=p.backend == "cpu" and p.device_count > 1,
    )
