"""Deserializing XLA executables: a restricted unpickler, then the program checked against its identity.

The first layer is the digest (and, with a trust key, the signature) checked before any byte
is unpickled. This one limits what the pickle stream may construct to the classes jax's own
executable serialization uses, recorded per jax minor version (``ALLOWED_BY_JAX``; the running
jax's list: ``allowed_classes``). Anything else (``os.system``, ``builtins.eval``, a gadget class)
is refused before it is looked up, and so is every class under a jax whose list was never
recorded. ``tests/integration/test_trust_loading.py`` records the classes a real executable needs
under the installed jax and fails if they ever change, so a jax upgrade that needs a new class
fails loudly instead of silently widening the list.

Any other failure while unpickling or loading (a malformed stream, an unknown device id, a
pytree that does not match the recorded one, an executable XLA cannot read) is an
IntegrityError naming the executable: the bytes already matched their digests, so a payload
that does not deserialize is a tampered or foreign one, never a crash.

Before the real unpickler runs, the stream is read once with stand-ins for every class (nothing
is constructed, nothing reaches XLA) to list the devices the program was compiled for: XLA
CHECK-fails, aborting the process, when an executable is loaded onto another number of devices
than it was compiled for (``xla_sharding.cc``: "sharding's tile count and device count does not
match"), which a manifest asking for another device count than its programs' would bring about.
Those devices must be exactly the ones it is to load on, or it is refused by name. (This reads the
devices from jax's side of the pickle, which a forger writes too; XLA's own copy inside the
serialized executable is not parsed here.)

The third layer, ``check_fingerprint``: once loaded (never run), the backend's fingerprint of
the executable must be the one the manifest records, which the build identity covers
(``avatar_release.records.identity``): a program swapped in under an unchanged build id is refused.
"""

from __future__ import annotations

import io
import pickle
import re
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Literal

from ..errors import IntegrityError
from ..records import ExecutableEntry, Manifest

if TYPE_CHECKING:  # only for annotations: JAX starts only after XLA_FLAGS are set
    import jax
    from jax.experimental.serialize_executable import _JaxPjrtUnpickler
    from jax.tree_util import PyTreeDef
    from jaxlib.xla_client import Client

__all__ = [
    "ALLOWED",
    "ALLOWED_BY_JAX",
    "allowed_classes",
    "deserialize_and_load",
    "classes_in",
    "tree_from_text",
    "loaded_fingerprint",
    "check_fingerprint",
]

# (module, name) pairs a jax 0.10.2 executable pickle refers to, recorded by the test above.
_JAX_0_10: frozenset[tuple[str, str]] = frozenset(
    {
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
    }
)
# jax 0.11 pickles one more: the layout of an argument left to the compiler is the singleton
# AUTO marker. Recorded 2026-12-04 with jax/jaxlib 0.11.2 (CPU, Python 3.12.1) on a jitted,
# FSDP-sharded bf16 program (the classes of the 0.10 list, every one, plus this); the H200 check
# (benchmarks/gpu_check.sh) is where a whole build meets it.
ALLOWED_BY_JAX: dict[str, frozenset[tuple[str, str]]] = {
    "0.10": _JAX_0_10,
    "0.11": _JAX_0_10 | {("jax._src.layout", "AutoLayoutSingleton")},
}
ALLOWED = _JAX_0_10  # the pinned jax's (pyproject.toml: jax==0.10.2)


def allowed_classes(jax_version: str | None = None) -> frozenset[tuple[str, str]]:
    """The allow-list for ``jax_version`` (default: the running jax's), by minor version. A jax whose
    list was never recorded is refused: its pickles may need classes nobody has looked at."""
    if jax_version is None:
        # Lazy (heavy): called only where JAX has started (the unpickler's own module imports it).
        import jax

        jax_version = jax.__version__
    minor = ".".join(jax_version.split(".")[:2])
    if minor not in ALLOWED_BY_JAX:
        raise IntegrityError(
            f"jax {jax_version}: no allow-list of the classes an executable pickle may name is recorded for jax "
            f"{minor} (recorded: {', '.join(sorted(ALLOWED_BY_JAX))}); refusing to unpickle. Record one: run "
            "tests/integration/test_trust_loading.py under that jax and add its classes to ALLOWED_BY_JAX "
            "(avatar_release/runtime/_unpickle.py)"
        )
    return ALLOWED_BY_JAX[minor]


def _unpickler_class() -> type[_JaxPjrtUnpickler]:
    # Lazy (heavy): JAX starts only after XLA_FLAGS are set (avatar_release.machine.configure_*).
    from jax.experimental.serialize_executable import _JaxPjrtUnpickler

    allowed = allowed_classes()

    class Restricted(_JaxPjrtUnpickler):
        def find_class(self, module: str, name: str) -> Any:
            _refuse_class(module, name, allowed)
            return super().find_class(module, name)

    return Restricted


def _refuse_class(module: str, name: str, allowed: frozenset[tuple[str, str]]) -> None:
    if (module, name) not in allowed:
        raise IntegrityError(
            f"executable pickle refers to {module}.{name}, which is not on the allow-list of classes "
            "an XLA executable needs; refusing to load it (a tampered or foreign payload)"
        )


class _StandIn:
    """What the device scan builds in place of every object the stream makes: accepts anything."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        pass

    def __setstate__(self, state: Any) -> None:
        pass

    def append(self, item: Any) -> None:
        pass

    def extend(self, items: Any) -> None:
        pass

    def __setitem__(self, key: Any, value: Any) -> None:
        pass


class _DeviceScan(pickle.Unpickler):
    """Reads an executable pickle with stand-ins for every (allow-listed) class and for the
    executable itself, recording the persistent ids: which devices it names, whether it holds one."""

    def __init__(self, payload: bytes | bytearray, allowed: frozenset[tuple[str, str]]) -> None:
        super().__init__(io.BytesIO(payload))
        self.allowed, self.executables = allowed, 0
        self.devices: set[int] = set()

    def find_class(self, module: str, name: str) -> Any:
        _refuse_class(module, name, self.allowed)
        return _StandIn

    def persistent_load(self, pid: Any) -> Any:
        if isinstance(pid, tuple) and len(pid) == 2 and pid[0] == "device" and isinstance(pid[1], int):
            self.devices.add(pid[1])
        elif isinstance(pid, tuple) and pid[:1] == ("exec",):
            self.executables += 1
        return _StandIn()


def _check_devices(payload: bytes | bytearray, execution_devices: Sequence[jax.Device]) -> None:
    """Refuse an executable pickle naming other devices than ``execution_devices`` (before XLA sees it)."""
    scan = _DeviceScan(payload, allowed_classes())
    scan.load()
    if not scan.executables:
        return  # no program in it: the real unpickler says what it is instead
    here = {d.id for d in execution_devices}
    if scan.devices != here:
        raise IntegrityError(
            f"the program was compiled for {len(scan.devices)} device(s) (ids {sorted(scan.devices)[:16]}), and "
            f"the manifest's platform.device_count asks to load it on {len(here)} (ids {sorted(here)[:16]}); "
            "refused before XLA sees it (a forged or mismatched manifest)"
        )


def deserialize_and_load(
    payload: bytes | bytearray,
    in_tree: PyTreeDef,
    out_tree: PyTreeDef,
    *,
    backend: Client,
    execution_devices: Sequence[jax.Device],
    what: str = "executable",
) -> jax.stages.Compiled:
    """jax.experimental.serialize_executable.deserialize_and_load, with the restricted unpickler.

    Every failure is an IntegrityError naming ``what``; nothing is run.
    """
    # Lazy (heavy): JAX starts only after XLA_FLAGS are set (avatar_release.machine.configure_*).
    import jax

    try:
        _check_devices(payload, execution_devices)
        loaded = _unpickler_class()(io.BytesIO(payload), backend, execution_devices).load()
    except IntegrityError as e:
        raise IntegrityError(f"{what}: {e}") from None
    except Exception as e:  # noqa: BLE001 - whatever a malformed stream raises, it is not ours to crash on
        raise IntegrityError(f"{what}: payload does not unpickle as an XLA executable ({_say(e)})") from None
    if not (isinstance(loaded, tuple) and len(loaded) == 3):
        raise IntegrityError(
            f"{what}: payload unpickles to {type(loaded).__name__}, not an XLA executable's "
            "(executable, args_info, no_kwargs) triple"
        )
    unloaded, args_info_flat, no_kwargs = loaded
    try:
        args_info = in_tree.unflatten(args_info_flat)
    except Exception as e:  # noqa: BLE001
        raise IntegrityError(f"{what}: its argument info does not match the recorded in_tree ({_say(e)})") from None
    try:
        return jax.stages.Compiled(unloaded.load(), [], args_info, out_tree, no_kwargs=no_kwargs)
    except Exception as e:  # noqa: BLE001
        raise IntegrityError(f"{what}: XLA cannot load the deserialized executable ({_say(e)})") from None


def _say(e: BaseException) -> str:
    return f"{type(e).__name__}: {str(e).splitlines()[0][:200] if str(e) else repr(e)}"


_TREE_RE = re.compile(r"^PyTreeDef\(")


def tree_from_text(text: str, entry: ExecutableEntry, side: Literal["in", "out"]) -> PyTreeDef:
    """Rebuild an executable's pytree structure from its recorded text (never a pickle)."""
    # Lazy (heavy): JAX starts only after XLA_FLAGS are set (avatar_release.machine.configure_*).
    import jax

    if side == "in":
        keys = [p.name.split(".", 1)[1] for p in entry.params]
        tree = jax.tree_util.tree_structure((({k: 0 for k in keys}, *[0] * len(entry.inputs)), {}))
    else:
        tree = jax.tree_util.tree_structure(tuple([0] * len(entry.outputs)))
    if str(tree) != text or not _TREE_RE.match(text):
        raise IntegrityError(
            f"executable {entry.key}: recorded {side}_tree {text[:120]!r} does not match its declared "
            f"params/inputs/outputs ({str(tree)[:120]!r})"
        )
    return tree


def loaded_fingerprint(executable: jax.stages.Compiled) -> str | None:
    """The fingerprint the backend reports for a loaded executable (None where it reports none)."""
    try:
        runtime = executable.runtime_executable()
        if runtime is None:
            return None
        raw = runtime.fingerprint
    except Exception:  # noqa: BLE001 - not every backend reports one
        return None
    return raw.decode() if isinstance(raw, bytes) else (None if raw is None else str(raw))


def check_fingerprint(manifest: Manifest, entry: ExecutableEntry, executable: jax.stages.Compiled) -> str:
    """Refuse an executable whose loaded fingerprint is not the manifest's; say what was checked.

    Applies to "xla-executable" stages that record a fingerprint (every manifest version the support
    window reads records the loaded one), on a backend that reports one.
    """
    if entry.format != "xla-executable":
        return f"program not checked: a {entry.format} stage is compiled in the pod"
    if entry.fingerprint is None:
        return "program not checked: the compiling client reported no fingerprint (compile-only)"
    actual = loaded_fingerprint(executable)
    if actual is None:
        return "program not checked: this backend reports no fingerprint"
    if actual != entry.fingerprint:
        raise IntegrityError(
            f"build {manifest.build_id}: executable {entry.key}: the loaded program's fingerprint is {actual}, "
            f"the manifest (and the build identity) says {entry.fingerprint}: another program was put in its "
            "place; refusing it"
        )
    return f"program fingerprint {actual} matches"


def classes_in(payload: bytes, *, backend: Client, execution_devices: Sequence[jax.Device]) -> set[tuple[str, str]]:
    """Every (module, name) the stream looks up, recorded while unpickling a TRUSTED payload.

    For the allow-list test only: it runs the real unpickler, so never call it on bytes
    that have not been verified.
    """
    # Lazy (heavy): JAX starts only after XLA_FLAGS are set (avatar_release.machine.configure_*).
    from jax.experimental.serialize_executable import _JaxPjrtUnpickler

    seen: set[tuple[str, str]] = set()

    class Recording(_JaxPjrtUnpickler):
        def find_class(self, module: str, name: str) -> Any:
            seen.add((module, name))
            return super().find_class(module, name)

    Recording(io.BytesIO(payload), backend, execution_devices).load()
    return seen
