"""The zero-compile guard: count XLA backend compiles while serving.

A loaded build must never compile. JAX reports every backend compile as a duration event
(``/jax/core/compile/backend_compile_duration``); deserializing an executable reports none.
One process-wide listener (installed on first use, never at import) feeds every active
guard. In strict mode the runtime raises as soon as a stage call is seen to compile,
naming the stage and the shapes that caused it.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field

__all__ = ["CompileGuard", "COMPILE_EVENT"]

COMPILE_EVENT = "/jax/core/compile/backend_compile_duration"

_lock = threading.Lock()
_installed = False
_active: list["CompileGuard"] = []


def _listener(event: str, duration: float, **kwargs) -> None:
    if event != COMPILE_EVENT:
        return
    with _lock:
        guards = list(_active)
    for g in guards:
        g._record(duration, kwargs)


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
    events: list[dict] = field(default_factory=list)
    context: str = "outside any stage call"

    def start(self) -> "CompileGuard":
        _install()
        with _lock:
            if self not in _active:
                _active.append(self)
        return self

    def stop(self) -> None:
        with _lock:
            if self in _active:
                _active.remove(self)

    def _record(self, duration: float, meta: dict) -> None:
        self.count += 1
        self.seconds += duration
        self.events.append({"during": self.context, "seconds": round(duration, 4),
                            **{k: str(v) for k, v in meta.items()}})

    def __enter__(self) -> "CompileGuard":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    def __hash__(self) -> int:
        return id(self)

    def __eq__(self, other) -> bool:
        return self is other
