"""The host: configure XLA/JAX before the backend starts, describe the machine, diff two machines.

Nothing here runs at import. ``configure_*`` must be called by an entry point before anything
initialises the JAX backend.
"""

from __future__ import annotations

from ._diff import ALL_FIELDS, RUN_FIELDS, Machine, MachineDiff, diff_machines
from ._heap import KEEP_FREED_MEMORY_ENV, keep_freed_memory
from ._host import (
    backend_initialized,
    configure_compile_env,
    configure_for_manifest,
    configure_host_devices,
    current_platform,
    environment_record,
    host_cpu_features,
    missing_env_flags,
    toolchain,
    who,
)
from ._native_log import NativeNote, native_log_filter
from ._process import MAX_DEVICES, MAX_HOST_DEVICES, PROCESS_FLAGS, check_process_fields
from ._quiet import quiet_jax_import

__all__ = [
    "quiet_jax_import",
    "keep_freed_memory",
    "KEEP_FREED_MEMORY_ENV",
    "Machine",
    "MachineDiff",
    "diff_machines",
    "ALL_FIELDS",
    "RUN_FIELDS",
    "backend_initialized",
    "configure_compile_env",
    "configure_for_manifest",
    "configure_host_devices",
    "current_platform",
    "environment_record",
    "host_cpu_features",
    "missing_env_flags",
    "toolchain",
    "who",
    "NativeNote",
    "native_log_filter",
    "check_process_fields",
    "MAX_DEVICES",
    "MAX_HOST_DEVICES",
    "PROCESS_FLAGS",
]
