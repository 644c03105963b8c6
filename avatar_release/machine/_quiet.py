"""JAX's import without the CUDA plugin's "no driver" lines, on a host with the plugin and no GPU.

With the ``[gpu]`` extra installed (to compile for GPU targets from a CPU host), importing JAX
loads the plugin's kernels, and each of three logs through absl before absl is set up, straight to
file descriptor 2::

    WARNING: All log messages before absl::InitializeLog() is called are written to STDERR
    I0000 00:00:1796182187.942414   17999 cudart_stub.cc:31] Could not find cuda drivers on your machine, GPU will not be used.

Nothing reads them (a CPU or TPU process never wanted a GPU, a GPU compile needs none), and no
setting turns them off (``TF_CPP_MIN_LOG_LEVEL`` and ``JAX_PLATFORMS`` do not). So, once per
process and only where such a plugin is installed, the first ``import jax`` runs with fd 2 going
to a temporary file, and everything in it but those lines is written back in order, as soon as
the import ends (also when it fails). :func:`quiet_jax_import` arranges it; the configure
functions of :mod:`._host` and the CLI call it before JAX starts.
"""

from __future__ import annotations

import contextlib
import importlib.abc
import importlib.machinery
import importlib.util
import os
import re
import sys
import tempfile
from collections.abc import Iterator, Sequence
from types import ModuleType

__all__ = ["quiet_jax_import", "PLUGIN_NOISE"]

_PLUGINS = ("jax_cuda12_plugin", "jax_cuda13_plugin")
PLUGIN_NOISE = re.compile(
    rb"^[IW]\d{4} [\d:.]+\s+\d+ cudart_stub\.cc:\d+\] Could not find cuda drivers on your "
    rb"machine, GPU will not be used\.$"
)
_PREINIT = b"WARNING: All log messages before absl::InitializeLog() is called are written to STDERR"


def quiet_jax_import() -> None:
    """Before JAX starts: drop the CUDA plugin's no-driver lines at its import (see the module)."""
    if "jax" in sys.modules or any(isinstance(f, _QuietJax) for f in sys.meta_path):
        return
    if not any(importlib.util.find_spec(p) is not None for p in _PLUGINS):
        return
    sys.meta_path.insert(0, _QuietJax())


def keep(lines: Sequence[bytes]) -> list[bytes]:
    """``lines`` without the plugin's no-driver lines and the absl notice written just before each."""
    out: list[bytes] = []
    for i, line in enumerate(lines):
        text = line.rstrip(b"\r\n")
        if PLUGIN_NOISE.match(text):
            continue
        if text == _PREINIT and i + 1 < len(lines) and PLUGIN_NOISE.match(lines[i + 1].rstrip(b"\r\n")):
            continue
        out.append(line)
    return out


@contextlib.contextmanager
def _filtered_fd2() -> Iterator[None]:
    with contextlib.suppress(Exception):
        sys.stderr.flush()
    saved = os.dup(2)
    with tempfile.TemporaryFile() as held:
        os.dup2(held.fileno(), 2)
        try:
            yield
        finally:
            with contextlib.suppress(Exception):
                sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)
            held.seek(0)
            rest = b"".join(keep(held.read().splitlines(keepends=True)))
            if rest:
                os.write(2, rest)


class _QuietLoader(importlib.abc.Loader):
    """Runs a module's import under the filter; for the JAX plugin, its ``initialize()`` too (JAX
    calls it when the first backend starts, and that is where the third line comes from)."""

    def __init__(self, inner: importlib.abc.Loader):
        self.inner = inner

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType | None:
        return self.inner.create_module(spec)

    def exec_module(self, module: ModuleType) -> None:
        with _filtered_fd2():
            self.inner.exec_module(module)
        init = getattr(module, "initialize", None)
        if module.__name__ in _JAX_PLUGINS and callable(init):

            def initialize() -> object:
                with _filtered_fd2():
                    return init()

            module.initialize = initialize  # type: ignore[attr-defined]


_JAX_PLUGINS = ("jax_plugins.xla_cuda12", "jax_plugins.xla_cuda13")


class _QuietJax(importlib.abc.MetaPathFinder):
    """Wraps the loaders of ``jax`` and of the CUDA PJRT plugin in the filter, once each."""

    def __init__(self) -> None:
        self.pending = {"jax", *_JAX_PLUGINS}

    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname not in self.pending:
            return None
        self.pending.discard(fullname)
        if fullname == "jax":  # the plugin is imported by jax's first backend, later
            self.pending -= {p for p in _JAX_PLUGINS if importlib.util.find_spec(p.split(".")[0]) is None}
        if not self.pending:
            with contextlib.suppress(ValueError):
                sys.meta_path.remove(self)
        spec = importlib.machinery.PathFinder.find_spec(fullname, path)
        if spec is None or spec.loader is None:
            return spec
        spec.loader = _QuietLoader(spec.loader)
        return spec
