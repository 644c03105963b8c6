"""Matmul flops of a traced stage, with and without scan trip counts.

XLA's ``cost_analysis()`` counts a while loop's body once. A stage whose blocks run as a scan
(``scan_layers``) would then report one block's work for a stack of 32. The traced program
still knows every scan's length, so its flops are counted here twice — each scan body once,
and each scan body ``length`` times — and the ratio scales XLA's per-device figures (flops,
bytes, transcendentals, optimal_seconds) to the whole stack. Only dots, convolutions and the
Pallas kernels' own cost estimates are counted: the work a transformer's time is made of.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any, cast

if TYPE_CHECKING:  # only for annotations: JAX starts only after XLA_FLAGS are set
    from jax.core import ShapedArray
    from jax.extend.core import ClosedJaxpr, Jaxpr, JaxprEqn

__all__ = ["loop_scale", "traced_flops"]


def _shape(atom: Any) -> tuple[int, ...]:
    # A dot's or a convolution's operands and results are arrays: jax types ``aval`` as the base class.
    return cast("ShapedArray", atom.aval).shape


def _dot_flops(eqn: JaxprEqn) -> float:
    (lc, rc), (lb, _rb) = eqn.params["dimension_numbers"]
    lhs, rhs = _shape(eqn.invars[0]), _shape(eqn.invars[1])
    contract = math.prod(lhs[d] for d in lc)
    batch = math.prod(lhs[d] for d in lb)
    lfree = math.prod(s for d, s in enumerate(lhs) if d not in lc and d not in lb)
    rfree = math.prod(s for d, s in enumerate(rhs) if d not in rc and d not in _rb)
    return 2.0 * batch * lfree * rfree * contract


def _conv_flops(eqn: JaxprEqn) -> float:
    out = _shape(eqn.outvars[0])
    rhs = _shape(eqn.invars[1])  # kernel: out features x in features / groups x spatial...
    dn = eqn.params["dimension_numbers"]
    spec = dn.rhs_spec  # (out feature dim, in feature dim, spatial dims...)
    per_output = math.prod(rhs[d] for d in spec[1:])  # in features x window
    return 2.0 * math.prod(out) * per_output


def _subjaxprs(eqn: JaxprEqn) -> Iterator[Jaxpr]:
    for value in eqn.params.values():
        for v in value if isinstance(value, (tuple, list)) else (value,):
            inner = getattr(v, "jaxpr", v)
            if hasattr(inner, "eqns"):
                yield cast("Jaxpr", inner)  # a jaxpr: it has equations


def traced_flops(jaxpr: Jaxpr | ClosedJaxpr, *, count_trips: bool) -> float:
    """Flops of a (closed) jaxpr; shard_map bodies (per-device shapes) scaled to the whole mesh."""
    jaxpr = getattr(jaxpr, "jaxpr", jaxpr)
    total = 0.0
    for eqn in jaxpr.eqns:
        name = eqn.primitive.name
        if name == "dot_general":
            total += _dot_flops(eqn)
        elif name == "conv_general_dilated":
            total += _conv_flops(eqn)
        elif name == "pallas_call":
            estimate = eqn.params.get("cost_estimate")
            total += float(getattr(estimate, "flops", 0) or 0)
            continue  # the kernel body is the estimate's business
        mult = 1.0
        if name == "scan" and count_trips:
            mult = float(eqn.params["length"])
        elif name == "shard_map":
            mesh = eqn.params.get("mesh")
            mult = float(getattr(mesh, "size", 1) or 1)
        subs = list(_subjaxprs(eqn))
        if name == "cond":  # one branch runs: count the dearest
            total += mult * max((traced_flops(s, count_trips=count_trips) for s in subs), default=0.0)
        else:
            total += mult * sum(traced_flops(s, count_trips=count_trips) for s in subs)
    return total


def loop_scale(jaxpr: Jaxpr | ClosedJaxpr) -> float:
    """flops with every scan counted ``length`` times / flops with each body counted once."""
    once = traced_flops(jaxpr, count_trips=False)
    full = traced_flops(jaxpr, count_trips=True)
    return full / once if once > 0 else 1.0


def pallas_kernels(jaxpr: Jaxpr | ClosedJaxpr) -> tuple[str, ...]:
    """Names of the Pallas kernels a traced program calls (their ``pallas_call`` name), sorted.

    How the compiler learns which kernels a pipeline used without knowing the pipeline: an
    interpreted kernel (CPU) is inlined as ordinary loops under this name's scope.
    """
    found: set[str] = set()

    def walk(jx: Jaxpr | ClosedJaxpr) -> None:
        for eqn in getattr(jx, "jaxpr", jx).eqns:
            if eqn.primitive.name == "pallas_call":
                name = eqn.params.get("name") or getattr(eqn.params.get("name_and_src_info"), "name", None)
                if name:
                    found.add(str(name))
                continue
            for sub in _subjaxprs(eqn):
                walk(sub)

    walk(jaxpr)
    return tuple(sorted(found))
