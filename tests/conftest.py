"""Test setup: 8 virtual CPU devices, set explicitly before anything initialises JAX.

Two lanes (see README, "Two commands"):

* ``python3 -m pytest -n 2 --dist loadgroup -q``: everything, on both cores (pytest-xdist); a file's
  tests stay on one worker, so its module-scoped fixtures are made once (each benchmark smoke row is
  a group of its own); compiled builds are shared by both workers through ``build_cache``.
* ``python3 -m pytest -m "not slow" -n 2 -q``: the edit loop on both cores (pytest-xdist), about a minute on 2.

A test is ``slow`` when it compiles a pipeline, runs fresh-process gate workers, or otherwise takes
over ``FAST_LANE_LIMIT_S`` (a second) on an idle machine: the fast lane is many short tests. Tests
that use one of the compiling fixtures below are marked here, at collection, so a new test that
asks for a build lands in the right lane without remembering the marker; a test that compiles by
itself carries ``@pytest.mark.slow`` (or its module a ``pytestmark``). At the end of a run,
unmarked tests that took longer than ``FAST_LANE_LIMIT_S`` are listed.

Under pytest-xdist the groups start longest first (tests/durations.py, from tests/durations.json).

Optional extras: ``@pytest.mark.extra("gar")`` skips a test when the extra's modules are not
installed, or fails it where the extra's ``AVATAR_RELEASE_REQUIRE_*`` variable demands it; that
decision, for extras and external binaries alike, is ``tests/tools.py``'s (its table says which
switch covers which tool).
"""

import os
import sys

# Bytecode caches on, whatever the environment says: with PYTHONDONTWRITEBYTECODE set (as on
# these machines) every run, and every subprocess a test starts, recompiles the package and
# pytest rewrites every test module's asserts again (about 3 s per process of the fast lane).
os.environ.pop("PYTHONDONTWRITEBYTECODE", None)
sys.dont_write_bytecode = False

# The test processes render in-process as a pod does, and keep freed chunk memory as every process
# that loads a build does (avatar_release/machine/_heap.py): a steady tiny chunk 0.39 s -> 0.30 s.
from avatar_release.machine import keep_freed_memory  # noqa: E402 (after the bytecode switch)

keep_freed_memory()

os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8").strip()
os.environ.setdefault("JAX_PLATFORMS", "cpu")
# This run's own config directory: first use makes a gate key, a reviewer key ("ana") and a
# local trust policy there, never in the user's home.
os.environ.setdefault("AVATAR_RELEASE_CONFIG_DIR", __import__("tempfile").mkdtemp(prefix="avatar-release-config-"))
os.environ.setdefault("AVATAR_RELEASE_REVIEWER", "ana")
# ... and its own state directory (the signed release state each registry showed this machine),
# replaced for every test below: registries copied between tests are the same registry to it.
os.environ.setdefault("AVATAR_RELEASE_STATE_DIR", __import__("tempfile").mkdtemp(prefix="avatar-release-state-"))
for _var in ("AVATAR_RELEASE_TRUST_POLICY", "AVATAR_RELEASE_GATE_KEY"):
    os.environ.pop(_var, None)  # a developer's own policy must not decide what the tests see

import pytest  # noqa: E402

# The order groups start in: longest first, from the seconds a full run measured (tests/durations.py).
from tests.durations import group_of_nodeid, longest_first, record_duration, store_durations  # noqa: E402

# Shared fixture: the real OCI registry server (started only by the tests that ask for it).
from tests.oci_server import oci_server  # noqa: E402,F401

# ... and the serving app on loopback around a fake build (tests/serving_fakes.py).
from tests.serving_fakes import serve  # noqa: E402,F401

# need_extra answers the extra marker below; the hook lists a skip for a missing tool at the test
# that asked for it (a hook counts where pytest finds it: in this module's names).
from tests.tools import need_extra, pytest_runtest_makereport  # noqa: E402,F401

# Fixtures that compile a pipeline (or a batch of programs); a test using one, directly or
# through another fixture, is slow.
COMPILING_FIXTURES = frozenset(
    {
        "build_cache",  # below: builds compiled once per session (tests/build_cache.py)
        "built_registry",  # tests/integration/conftest.py: the session's tiny cpu-8 build (~40 s)
        "registry_copy",  # a private copy of built_registry
        "gated",  # tests/integration/test_gates.py: reference builds gated in fresh serving processes
        "tpu_registry",  # tests/integration/conftest.py: tiny for tpu-v6e-8 through libtpu, once per session
        "tpu_build",  # tests/integration/test_tpu_target.py: that build, for the module
        "gpu_build",  # tests/integration/test_gpu_target.py: tiny for gpu-h100-8 through the CUDA plugin
        "window_programs",  # tests/kernels/test_ulysses.py: four Ulysses programs over 8 devices
    }
)


@pytest.fixture(scope="session")
def build_cache(tmp_path_factory):
    """Builds compiled once per session, shared by modules and by both xdist workers; each test gets
    its own copy in its own registry (tests/build_cache.py). Never a JAX compilation cache."""
    from tests.build_cache import BuildCache, cache_dir

    return BuildCache(cache_dir(tmp_path_factory.getbasetemp()))


@pytest.fixture(autouse=True)
def _own_state_dir(tmp_path_factory, monkeypatch):
    """Each test starts with a machine that has seen no registry's signed state (a test that
    rolls a registry back, or copies one the session built, is not refused for another's)."""
    monkeypatch.setenv("AVATAR_RELEASE_STATE_DIR", str(tmp_path_factory.mktemp("state")))


# An unmarked test slower than this (setup + call + teardown) is reported at the end of the run (on a
# busy machine more are: judge them on an idle one).
FAST_LANE_LIMIT_S = 1.0


def pytest_addoption(parser):
    parser.addoption(
        "--store-durations",
        action="store_true",
        help="write each group's measured seconds to tests/durations.json (the order the groups start in)",
    )


def pytest_configure(config):
    # pytest-xdist declares it when installed; without it the marks below are still known names
    config.addinivalue_line("markers", "xdist_group(name): tests run on one worker under --dist loadgroup")
    # Groups start in the order collection leaves them (longest first, below), not xdist's default
    # of most tests first, which started the single-test groups (a smoke row, the workflow test)
    # last and left one core idle while the other finished them.
    if hasattr(config.option, "loadscopereorder"):
        config.option.loadscopereorder = False


@pytest.hookimpl(tryfirst=True)  # before -m deselects by marker
def pytest_collection_modifyitems(config, items):
    for item in items:
        if COMPILING_FIXTURES.intersection(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.slow)
        # Under `--dist loadgroup` a file's tests stay on one worker (its module-scoped fixtures made
        # once), as with loadfile, unless a test names its own group (the benchmark smokes' rows).
        if item.get_closest_marker("xdist_group") is None:
            item.add_marker(pytest.mark.xdist_group(group_of_nodeid(item.nodeid)))  # its file
    items[:] = longest_first(items, lambda item: item.get_closest_marker("xdist_group").args[0])


def pytest_runtest_setup(item):
    for mark in item.iter_markers("extra"):
        for name in mark.args:
            need_extra(name)


_unmarked_seconds: dict[str, float] = {}


def pytest_runtest_logreport(report):
    if "slow" not in report.keywords:
        _unmarked_seconds[report.nodeid] = _unmarked_seconds.get(report.nodeid, 0.0) + report.duration
    record_duration(report)


def pytest_sessionfinish(session):
    if session.config.getoption("store_durations") and not os.environ.get("PYTEST_XDIST_WORKER"):
        store_durations()


def pytest_terminal_summary(terminalreporter):
    from tests.build_cache import cache_dir

    factory = getattr(terminalreporter.config, "_tmp_path_factory", None)
    log = cache_dir(factory.getbasetemp()) / "compiles.log" if factory is not None else None
    if log is not None and log.is_file():  # what the session compiled for its tests (tests/build_cache.py)
        builds = log.read_text().split()[::2]
        terminalreporter.write_line(
            f"build cache: {len(builds)} build(s) compiled once each for the session: " + ", ".join(sorted(builds))
        )
    over = sorted(((s, n) for n, s in _unmarked_seconds.items() if s > FAST_LANE_LIMIT_S), reverse=True)
    if over:
        terminalreporter.section(f"tests not marked slow that took over {FAST_LANE_LIMIT_S:g} s")
        for seconds, nodeid in over:
            terminalreporter.write_line(f"{seconds:6.1f}s {nodeid}  (mark it slow if it does so on an idle machine)")
