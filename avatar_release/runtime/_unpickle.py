"""A restricted unpickler for serialized XLA executables: the second layer of safe loading.

The first layer is the digest (and, with a trust key, the signature) checked before any byte
is unpickled. This one limits what the pickle stream may construct to the classes jax's own
executable serialization uses (``ALLOWED``). Anything else (``os.system``, ``builtins.eval``,
a gadget class) is refused before it is looked up. ``tests/unit/test_unpickle.py`` records
the classes a real executable needs and fails if they ever change, so a jax upgrade that
needs a new class fails loudly instead of silently widening this list.
"""

from __future__ import annotations

import io
import pickle

from ..errors import IntegrityError

__all__ = ["ALLOWED", "deserialize_and_load", "classes_in"]

# (module, name) pairs a jax 0.10.2 executable pickle refers to, recorded by the test above.
ALLOWED: frozenset[tuple[str, str]] = frozenset({
    ("jax", "P"),
    ("jax._src.core", "ManualAxisType"),
    ("jax._src.core", "MemorySpace"),
    ("jax._src.core", "ShapedArray"),
    ("jax._src.interpreters.pxla", "AllArgsInfo"),
    ("jax._src.interpreters.pxla", "UnloadedMeshExecutable"),
    ("jax._src.layout", "Layout"),
    ("jax._src.linear_util", "DebugInfo"),
    ("jax._src.mesh", "AbstractDevice"),
    ("jax._src.mesh", "AbstractMesh"),
    ("jax._src.mesh", "AxisType"),
    ("jax._src.mesh", "Mesh"),
    ("jax._src.named_sharding", "_unpickle_named_sharding"),
    ("jax._src.stages", "ArgInfo"),
    ("jaxlib._jax", "DeviceList"),
    ("ml_dtypes", "bfloat16"),
    ("numpy", "dtype"),
    ("numpy", "ndarray"),
    ("numpy._core.multiarray", "_reconstruct"),
})


def _unpickler_class():
    from jax.experimental.serialize_executable import _JaxPjrtUnpickler

    class Restricted(_JaxPjrtUnpickler):
        def find_class(self, module, name):
            if (module, name) not in ALLOWED:
                raise IntegrityError(
                    f"executable pickle refers to {module}.{name}, which is not on the allow-list of classes "
                    "an XLA executable needs; refusing to load it (a tampered or foreign payload)"
                )
            return super().find_class(module, name)

    return Restricted


def deserialize_and_load(payload: bytes, in_tree, out_tree, *, backend, execution_devices):
    """jax.experimental.serialize_executable.deserialize_and_load, with the restricted unpickler."""
    import jax

    try:
        unloaded, args_info_flat, no_kwargs = _unpickler_class()(
            io.BytesIO(payload), backend, execution_devices).load()
    except IntegrityError:
        raise
    except (pickle.UnpicklingError, EOFError, ValueError, TypeError, AttributeError) as e:
        raise IntegrityError(f"executable payload does not unpickle as an XLA executable ({type(e).__name__}: {e})") from None
    args_info = in_tree.unflatten(args_info_flat)
    return jax.stages.Compiled(unloaded.load(), [], args_info, out_tree, no_kwargs=no_kwargs)


def classes_in(payload: bytes, *, backend, execution_devices) -> set[tuple[str, str]]:
    """Every (module, name) the stream looks up, recorded while unpickling a TRUSTED payload.

    For the allow-list test only: it runs the real unpickler, so never call it on bytes
    that have not been verified.
    """
    from jax.experimental.serialize_executable import _JaxPjrtUnpickler

    seen: set[tuple[str, str]] = set()

    class Recording(_JaxPjrtUnpickler):
        def find_class(self, module, name):
            seen.add((module, name))
            return super().find_class(module, name)

    Recording(io.BytesIO(payload), backend, execution_devices).load()
    return seen
