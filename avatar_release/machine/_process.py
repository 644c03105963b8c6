"""What a build's manifest may ask of the process that loads it, checked before XLA sees any of it.

A manifest configures its loader before JAX starts (``configure_for_manifest``): a CPU build's
device count becomes ``--xla_force_host_platform_device_count``, and its flag profile's
``env_flags`` join ``XLA_FLAGS``. XLA answers a value it cannot take with an abort, not an error:
an unknown flag name is fatal at start-up (jaxlib 0.10.2, ``parse_flags_from_env.cc``: "Unknown
flag in XLA_FLAGS"), a flag such as ``--xla_dump_to`` would have the loader write wherever the
manifest says, and executables loaded onto another number of devices than they were compiled for
fail a CHECK (``xla_sharding.cc``: "sharding's tile count and device count does not match"; measured
with a manifest asking for 2048 and for 16 devices: SIGABRT in ``verify`` and ``render``). The
identity check does not help: whoever can write the store can recompute it. So each such field is
held here to a bound or a list, and a violation is an IntegrityError (exit 4) naming the field,
its value and what is allowed, raised before anything from the manifest reaches the process.
(Executables are held to the device count they were compiled for by the loader,
``runtime._unpickle``; declared blob sizes against memory by ``runtime._blobs.check_bounds``.)
"""

from __future__ import annotations

import math
import re

from ..errors import IntegrityError
from ..records import Manifest

__all__ = ["MAX_HOST_DEVICES", "MAX_DEVICES", "PROCESS_FLAGS", "check_process_fields"]

# A CPU build's device count is the number of virtual devices XLA:CPU is asked for. XLA:CPU
# itself starts 2048 of them (measured 2026-12-05, jaxlib 0.10.2 on 2 cores: 1.6 s and 397 MB
# against 1.2 s and 180 MB for 8), but they all share the host's cores, and the CPU target
# (manifests/targets/cpu-8.toml) has 8: 64 times that is room for any CPU build that means it.
MAX_HOST_DEVICES = 512
# Other backends: the count is never applied to the process, only compared with the devices
# present, so the bound is the largest single slice there is: a TPU v7 (Ironwood) pod, 9,216
# chips (the targets in manifests/targets/ have 1 and 8).
MAX_DEVICES = 9216

_BOOL = r"true|false"
# The process-level XLA flags (``XLA_FLAGS``) a flag profile may set in ``env_flags``, with the
# values each may take. Each name is an XLA debug option that changes only how programs are
# compiled (the same options the profiles in manifests/flags/ pin per compile as
# ``compiler_options``), checked to be known to jaxlib 0.10.2 (set alone in XLA_FLAGS, a program
# compiles). Nothing that names a file or directory (``xla_dump_to``, autotune caches), nothing
# that sets the device count (``configure_host_devices`` owns it), and no libtpu flag: XLA_FLAGS
# is parsed by XLA:CPU too, which aborts on a name it does not know. A profile that needs another
# flag adds it here, checked the same way.
PROCESS_FLAGS: dict[str, str] = {
    "xla_backend_optimization_level": r"[0-3]",
    "xla_cpu_copy_insertion_use_region_analysis": _BOOL,
    "xla_cpu_enable_fast_math": _BOOL,
    "xla_cpu_fast_math_honor_division": _BOOL,
    "xla_cpu_fast_math_honor_functions": _BOOL,
    "xla_cpu_fast_math_honor_infs": _BOOL,
    "xla_cpu_fast_math_honor_nans": _BOOL,
    "xla_cpu_multi_thread_eigen": _BOOL,
    "xla_gpu_deterministic_ops": _BOOL,
    "xla_gpu_exclude_nondeterministic_ops": _BOOL,
    "xla_gpu_require_complete_aot_autotune_results": _BOOL,
}
_FLAG = re.compile(r"--(?P<name>[a-z0-9_]+)(?:=(?P<value>\S*))?")


def _refuse(manifest: Manifest, field: str, value: object, allowed: str) -> IntegrityError:
    return IntegrityError(
        f"build {manifest.build_id}: manifest field {field} is {value!r}; {allowed}. Refused before "
        "anything from the manifest reaches XLA: a forged or corrupted manifest — republish the build"
    )


def _flag_error(flag: str) -> str | None:
    """Why ``flag`` may not join XLA_FLAGS, or None."""
    m = _FLAG.fullmatch(flag)
    if m is None:
        return "expected one --name=value with no spaces (XLA_FLAGS is split on whitespace)"
    name, value = m["name"], m["value"]
    if name not in PROCESS_FLAGS:
        return (
            f"{name!r} is not an XLA flag a flag profile may set (known: {', '.join(sorted(PROCESS_FLAGS))}; "
            "avatar_release/machine/_process.py PROCESS_FLAGS)"
        )
    allowed = PROCESS_FLAGS[name]
    if (value is None and allowed != _BOOL) or (value is not None and not re.fullmatch(allowed, value)):
        return f"--{name} takes {allowed.replace('|', ' or ')}"
    return None


def check_process_fields(manifest: Manifest) -> None:
    """Refuse a manifest whose device count, mesh or process flags are out of bounds or unknown."""
    p = manifest.platform
    cpu = p.backend == "cpu"
    most = MAX_HOST_DEVICES if cpu else MAX_DEVICES
    if not 1 <= p.device_count <= most:
        what = "the host devices XLA:CPU would be asked for" if cpu else "the largest device slice there is"
        raise _refuse(
            manifest, "platform.device_count", p.device_count, f"expected 1 to {most} for a {p.backend} build ({what})"
        )
    if not p.mesh_shape or len(p.mesh_shape) != len(p.mesh_axes) or any(n < 1 for n in p.mesh_shape):
        raise _refuse(
            manifest,
            "platform.mesh_shape",
            p.mesh_shape,
            f"expected one size of at least 1 for each of platform.mesh_axes {p.mesh_axes}",
        )
    if math.prod(p.mesh_shape) != p.device_count:
        raise _refuse(
            manifest,
            "platform.mesh_shape",
            p.mesh_shape,
            f"expected sizes whose product is platform.device_count, {p.device_count}",
        )
    for i, flag in enumerate(manifest.flags.env_flags):
        error = _flag_error(flag) if isinstance(flag, str) else "expected a string"
        if error:
            raise _refuse(manifest, f"flags.env_flags[{i}]", flag, error)
