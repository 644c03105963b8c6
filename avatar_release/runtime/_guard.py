"""The zero-compile guard: count XLA backend compiles while serving.

A loaded build must never compile. JAX reports every backend compile as a duration event
(``/jax/core/compile/backend_compile_duration``); deserializing an executable reports none.
One process-wide listener (installed on first use, never at import) feeds every active
guard. In strict mode the runtime raises as soon as a stage call is seen to compile,
naming the stage and the shapes that caused it.

XLA:GPU can also choose code while a program *runs*: a cuDNN convolution compiled without the
device carries algorithm -1, "which means that we autotune at runtime" (openxla/xla,
xla/service/gpu/autotuning/conv_algorithm_picker.cc), and that choice is made inside the
executable on its first run, where JAX records no event (its compile event is recorded only
around ``backend.compile``: jax/_src/interpreters/pxla.py, ``dispatch.BACKEND_COMPILE_EVENT``).
The loader therefore counts such convolutions in each deserialized program
(``tuned_at_first_run``), and the stream records a stage's first call as a compile when it has any:
a pod that tunes at start is a pod that compiles.
"""

from __future__ import annotations

import re
import threading
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

__all__ = ["CompileGuard", "COMPILE_EVENT", "tuned_at_first_run"]

# A cuDNN convolution whose algorithm the compile left to the first run (the same marker
# compile/_autotune.py counts into a manifest's ``autotune`` record).
_TUNED_AT_FIRST_RUN = re.compile(r'custom_call_target="__cudnn\$conv[A-Za-z]*".*"algo_id"\s*:\s*"-1"')


def tuned_at_first_run(hlo_text: str) -> int:
    """cuDNN convolutions in a compiled program that choose their algorithm on its first run."""
    return sum(1 for line in hlo_text.splitlines() if _TUNED_AT_FIRST_RUN.search(line))


COMPILE_EVENT = "/jax/core/compile/backend_compile_duration"

_lock = threading.Lock()
_installed = False
_active: list[CompileGuard] = []


def _listener(event: str, duration_secs: float, **kwargs: str | int) -> None:
    # jax.monitoring's EventDurationListenerWithMetadata (called positionally: event, duration)
    if event != COMPILE_EVENT:
        return
    with _lock:
        guards = list(_active)
    for g in guards:
        g._record(duration_secs, kwargs)


def _install() -> None:
    global _installed
    with _lock:
        if _installed:
            return
        # Lazy (heavy): JAX starts only after XLA_FLAGS are set; the guard installs itself on first load.
        import jax.monitoring

        jax.monitoring.register_event_duration_secs_listener(_listener)
        _installed = True


@dataclass
class CompileGuard:
    """Counts compiles from ``start()`` on; ``context`` labels what was running."""

    strict: bool = True
    count: int = 0
    seconds: float = 0.0
    events: list[dict[str, Any]] = field(default_factory=list)
    context: str = "outside any stage call"

    def start(self) -> CompileGuard:
        _install()
        with _lock:
            if self not in _active:
                _active.append(self)
        return self

    def stop(self) -> None:
        with _lock:
            if self in _active:
                _active.remove(self)

    def _record(self, duration: float, meta: Mapping[str, object]) -> None:
        self.count += 1
        self.seconds += duration
        self.events.append(
            {"during": self.context, "seconds": round(duration, 4), **{k: str(v) for k, v in meta.items()}}
        )

    def record_first_run_tuning(self, convolutions: int) -> None:
        """Count a stage's first run as a compile: it chooses ``convolutions`` cuDNN algorithms
        (XLA measures candidates on the device), which JAX reports as no event of its own."""
        self._record(
            0.0,
            {
                "autotune_at_first_run": f"{convolutions} cuDNN convolution(s) choose their "
                "algorithm on this first run (compiled without the device: algorithm -1)"
            },
        )

    def __enter__(self) -> CompileGuard:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def __hash__(self) -> int:
        return id(self)

    def __eq__(self, other: object) -> bool:
        return self is other
