"""A stage module as a JAX function of its parameters, with their shapes: without touching
the values, so a module on the ``meta`` device (production shapes, weights never
materialised) traces exactly like one holding real weights.

``torchax.extract_jax`` copies every parameter into a JAX array first; for an 18.5B-parameter
pipeline that is 37 GB of bf16 the compile never needs. The traced program only needs each
parameter's name, shape and dtype: the values are arguments of the compiled executable.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from ..pipeline import JaxStage
from ._outputs import unpack

if TYPE_CHECKING:  # only for annotations: torch loads only while tracing a PyTorch stage
    import torch

__all__ = ["stage_function"]


def stage_function(module: torch.nn.Module | JaxStage) -> tuple[dict[str, tuple[tuple[int, ...], Any]], Callable]:
    """-> ({name: (shape, dtype)} for every parameter and buffer, jax_func(states, args)).

    ``jax_func`` has the calling convention of ``torchax.extract_jax``'s: a dict of JAX arrays
    keyed by those names, and a tuple of positional JAX inputs. ``module`` is a torch module
    (traced through torchax; what it returns, opened one level as a ``_outputs.Returned``) or a
    contract ``JaxStage`` (called as it is).
    """
    if isinstance(module, JaxStage):
        return _jax_stage_function(module)
    # Lazy (compile extra): torch and torchax load only while tracing a PyTorch stage.
    import torchax
    from torchax.interop import JittableModule

    env = torchax.default_env()
    jm = JittableModule(module, dedup_parameters=True)
    shapes = {k: (tuple(v.shape), v.dtype) for k, v in {**jm.buffers, **jm.params}.items()}
    param_keys, buffer_keys = list(jm.params), list(jm.buffers)

    def jax_func(states: Mapping[str, Any], args: Sequence[Any]) -> Any:
        params = {k: states[k] for k in param_keys}
        buffers = {k: states[k] for k in buffer_keys}
        params, buffers, args = env.j2t_iso((params, buffers, tuple(args)))
        with env:
            out = jm.functional_call("forward", params, buffers, *args)
        # Opened here, before torch leaves become JAX arrays: torch's pytree does not see into a
        # dataclass (a diffusers output class), so t2j_iso would leave its tensors behind.
        return unpack(out).map(env.t2j_iso)

    return shapes, jax_func


def _jax_stage_function(stage: JaxStage) -> tuple[dict[str, tuple[tuple[int, ...], Any]], Callable]:
    shapes = {k: (tuple(v.shape), v.dtype) for k, v in stage.params.items()}  # numpy or JAX arrays

    def jax_func(states: Mapping[str, Any], args: Sequence[Any]) -> Any:
        return stage.fn({k: states[k] for k in shapes}, *args)

    return shapes, jax_func
