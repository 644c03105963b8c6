"""External tools the tests drive: one place decides whether a test that lacks one skips or fails.

A test that needs a binary or an optional Python module asks here (``binary``, ``binary_if_present``, ``module``, or
the ``@pytest.mark.extra(name)`` marker, which ``tests/conftest.py`` answers through
``need_extra``). When the tool is there it gets it back. When it is not, the test skips with the
reason and the install hint, unless the tool's ``AVATAR_RELEASE_REQUIRE_*`` switch is set, where
it FAILS: CI (``.ci/run``) sets the switches of everything it installs, so a skip there means a
tool CI claims to run was never run, and that must be red, not a line in the skip list.

Which switch covers which tool (the one table; ``TOOLS`` and ``EXTRAS`` below are its code):

======================================  ==================  =====================================
tool                                    what it is          switch (``AVATAR_RELEASE_REQUIRE_``…)
======================================  ==================  =====================================
chromium (or chromium-browser,          binary              ``BROWSER``       (set by .ci/run)
google-chrome)
docker-registry (or registry)           binary              ``REGISTRY``      (set by .ci/run)
skopeo                                  binary              ``REGISTRY``      (set by .ci/run)
openssl                                 binary              ``REGISTRY``      (set by .ci/run)
oras (``oras.client``, [test])          Python module       ``REGISTRY``      (set by .ci/run)
bcrypt ([test])                         Python module       ``REGISTRY``      (set by .ci/run)
libtpu ([tpu])                          Python extra        ``TPU_COMPILER``  (set by .ci/run)
CUDA plugin ([gpu])                     Python extra        ``GPU_COMPILER``  (set by .ci/run)
mkdocs ([docs])                         Python extra        ``DOCS``          (set by .ci/run)
podman, runc, catatonit                 binaries            ``PODMAN``        (not set by CI: it
                                                                              does not install
                                                                              them)
torch, torchax, safetensors             Python extra        none: always skips
([compile]); google-auth ([gar]);
check-jsonschema, kubernetes-validate,
mypy ([test])
======================================  ==================  =====================================

A tool with no switch always skips when absent; CI installs its extra, and every skip of a run is
listed with its reason at the end (pytest ``-ra``, in ``addopts``), so one there is visible. Its hook
``pytest_runtest_makereport`` (imported by ``tests/conftest.py``) lists a skip decided here at the
test that asked, not at the line of this module that raised it.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import shutil
from dataclasses import dataclass
from types import ModuleType
from typing import NoReturn

import pytest

__all__ = ["EXTRAS", "TOOLS", "Tool", "absent", "binary", "binary_if_present", "module", "need_extra"]

_PREFIX = "AVATAR_RELEASE_REQUIRE_"


@dataclass(frozen=True)
class Tool:
    """A binary: the names it may go by (first found wins), its switch, and how to install it."""

    names: tuple[str, ...]
    switch: str | None
    install: str


TOOLS: dict[str, Tool] = {
    "chromium": Tool(("chromium", "chromium-browser", "google-chrome"), "BROWSER", "apt-get install chromium"),
    "docker-registry": Tool(("docker-registry", "registry"), "REGISTRY", "apt-get install docker-registry"),
    "skopeo": Tool(("skopeo",), "REGISTRY", "apt-get install skopeo"),
    "openssl": Tool(("openssl",), "REGISTRY", "apt-get install openssl"),
    "podman": Tool(("podman",), "PODMAN", "apt-get install podman runc catatonit"),
    "runc": Tool(("runc",), "PODMAN", "apt-get install podman runc catatonit"),
    "catatonit": Tool(("catatonit",), "PODMAN", "apt-get install podman runc catatonit"),
    "check-jsonschema": Tool(("check-jsonschema",), None, "pip install -e '.[test]'"),
}

# extra -> (modules it provides, switch). A module outside every extra's list is looked up in
# _MODULE_SWITCH (a [test] module whose tests belong to a switched group).
EXTRAS: dict[str, tuple[tuple[str, ...], str | None]] = {
    "compile": (("torch", "torchax", "safetensors"), None),
    "gar": (("google.auth",), None),  # without artifactregistry_v1, tags are listed over OCI
    "tpu": (("libtpu",), "TPU_COMPILER"),
    # the CUDA plugin (its PJRT library compiles for a GPU target description; no GPU needed)
    "gpu": (("jax_plugins.xla_cuda12", "jax_cuda12_plugin"), "GPU_COMPILER"),
    "docs": (("mkdocs",), "DOCS"),
    "test": (("oras.client", "bcrypt", "kubernetes_validate", "mypy"), None),
}
_MODULE_SWITCH = {"oras.client": "REGISTRY", "bcrypt": "REGISTRY"}


def _switch_var(switch: str) -> str:
    return _PREFIX + switch


def absent(why: str, switch: str | None) -> NoReturn:
    """Skip with ``why``; fail instead when ``switch`` (e.g. ``"REGISTRY"``) is set in the environment."""
    if switch is not None and os.environ.get(_switch_var(switch)):
        pytest.fail(f"{why}, and {_switch_var(switch)} is set: this run must not skip it", pytrace=False)
    pytest.skip(why, allow_module_level=True)  # as importorskip: a module may ask at import


def binary(name: str) -> str:
    """The path of the tool ``name`` (a key of ``TOOLS``), or skip / fail as its switch says."""
    tool = TOOLS[name]
    for candidate in tool.names:
        exe = shutil.which(candidate)
        if exe:
            return exe
    absent(f"{' / '.join(tool.names)} not found on PATH ({tool.install})", tool.switch)


def binary_if_present(name: str) -> str | None:
    """For a check a test adds when the tool is there: its path, or None (a failure under its switch)."""
    tool = TOOLS[name]
    if tool.switch is None or not os.environ.get(_switch_var(tool.switch)):
        return next((exe for exe in map(shutil.which, tool.names) if exe), None)
    return binary(name)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo) -> pytest.TestReport:
    """Point a skip raised in this module at the test's own file and line (as pytest does for a
    ``skipif`` mark): otherwise ``-ra`` folds every such skip into one line of tools.py."""
    report = yield
    if report.skipped and type(report.longrepr) is tuple and report.longrepr[0] == __file__:
        filename, line = item.reportinfo()[:2]
        report.longrepr = (str(filename), (line or 0) + 1, report.longrepr[2])
    return report


def _missing(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is None
    except (ImportError, ValueError):  # a parent package absent, or blocked in sys.modules
        return True


def _extra_of(name: str) -> str:
    for extra, (modules, _) in EXTRAS.items():
        if name in modules:
            return extra
    raise KeyError(f"{name}: not a module of any extra in tests/tools.py EXTRAS; add it to the table")


def module(name: str) -> ModuleType:
    """Import the optional module ``name`` (listed under an extra in ``EXTRAS``), or skip / fail."""
    extra = _extra_of(name)
    if _missing(name):
        switch = _MODULE_SWITCH.get(name, EXTRAS[extra][1])
        absent(f"{name} is not installed (pip install -e '.[{extra}]')", switch)
    return importlib.import_module(name)


def need_extra(extra: str) -> None:
    """Return when the extra's modules are importable; otherwise skip / fail as its switch says."""
    modules, switch = EXTRAS[extra]
    gone = [m for m in modules if _missing(m)]
    if gone:
        absent(f"needs the [{extra}] extra ({', '.join(gone)} not installed: pip install -e '.[{extra}]')", switch)
