"""One timing rule for the benchmarks that time a JAX call: the first call compiles and warms, then
the median of ``repeat`` calls, each waited on (``jax.block_until_ready``)."""

from __future__ import annotations

import statistics
import time

__all__ = ["median_seconds"]


def median_seconds(fn, *args, repeat: int = 5) -> float:
    import jax

    jax.block_until_ready(fn(*args))  # compile + warm
    samples = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        jax.block_until_ready(fn(*args))
        samples.append(time.perf_counter() - t0)
    return statistics.median(samples)
