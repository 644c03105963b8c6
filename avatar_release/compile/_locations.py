"""Source locations in a lowered program, made independent of where the files lie.

JAX writes the Python call stack of every operation into the program it lowers (MLIR
locations, then the stack frames in the HLO metadata the executable carries): absolute file
names of the project's model code and of the toolchain. The same project compiled from another
folder, by another user or on another machine therefore gave another scheduled-HLO digest,
fingerprint and build id (measured, jax 0.10.2: the executables grew by the length of the longer
path). Which frames are recorded depended on the machine too: jax leaves out the standard
library's folder and everything under it, which holds site-packages for a plain interpreter but
not for a virtual environment, so in a venv torch's and torchax's frames were recorded
as well (the example project's motion executable grew by 2,840 bytes).

While a stage is traced and lowered:

* only frames of code outside installed packages are recorded: the project's (and any other
  folder on ``sys.path``), never site-packages', nor the toolchain's own, wherever they are
  installed;
* every file name is relative to the deepest root it lies under: the project or a ``sys.path``
  folder (``/home/ann/proj/avatars/model.py`` becomes ``avatars/model.py``); an absolute name under
  none of them keeps only its base name. Line numbers stay: they move only with the source;
* the traceback options are pinned to jax's defaults, so a ``JAX_TRACEBACK_IN_LOCATIONS_LIMIT``
  or ``JAX_INCLUDE_FULL_TRACEBACKS_IN_LOCATIONS`` in one machine's environment cannot change the
  program.

jax's own function description in the serialized executable ("stage_fn at <file>:<line>", pickled
with it) still names the toolchain's file: the serialized bytes differ between any two compiles
anyway, and the identity does not cover them (records/identity.py).
"""

from __future__ import annotations

import contextlib
import os
import re
import sys
import sysconfig
import threading
from collections.abc import Iterable, Iterator
from pathlib import Path

__all__ = ["portable_locations", "location_pattern", "import_roots", "installed_roots"]

FULL_TRACEBACKS = True  # jax's default: profiles keep the call stack, now with portable names
TRACEBACK_FRAMES = 100  # jax's default frame limit
PACKAGE_FOLDERS = ("site-packages", "dist-packages")  # what pip, venv, conda and Debian install into


def _folders(entries: Iterable[object]) -> set[str]:
    """Each absolute folder as given and resolved (a symlinked folder), with a trailing separator;
    never the file system's root (a prefix of everything)."""
    out: set[str] = set()
    for entry in entries:
        if not isinstance(entry, (str, os.PathLike)) or not os.path.isabs(entry):  # "": the current folder
            continue
        for path in (os.path.abspath(entry), os.path.realpath(entry)):
            if Path(path).parent != Path(path):
                out.add(path.rstrip(os.sep) + os.sep)
    return out


def import_roots(project_root: str | os.PathLike | None = None) -> list[str]:
    """The folders a file name is made relative to: the project, every ``sys.path`` folder and
    the folder the toolchain is imported from (an editable install need not be on ``sys.path``),
    deepest first."""
    return sorted(_folders([project_root, Path(__file__).resolve().parents[2], *sys.path]), key=lambda r: (-len(r), r))


def installed_roots() -> list[str]:
    """The folders whose frames are left out: every site-packages on ``sys.path`` and the
    interpreter's, and the toolchain's package (an editable install lies in a checkout)."""
    here = Path(__file__).parent.parent  # avatar_release/, as imported and resolved (_folders)
    paths = sysconfig.get_paths()
    return sorted(
        _folders(
            [
                here,
                paths.get("purelib"),
                paths.get("platlib"),
                *(p for p in sys.path if isinstance(p, str) and Path(p).name in PACKAGE_FOLDERS),
            ]
        )
    )


def location_pattern(roots: Iterable[str]) -> str:
    """The regex jax removes from every source file name: the deepest root a name starts with
    (``re`` takes the first alternative that matches; pass the roots deepest first), else every
    folder of an absolute name under none of them."""
    return "^(?:" + "".join(re.escape(r) + "|" for r in roots) + "/.*/)"


@contextlib.contextmanager
def portable_locations(project_root: str | os.PathLike | None = None) -> Iterator[None]:
    """Within: programs traced and lowered in this thread carry portable source locations.

    The naming and traceback options are jax's thread-local form (``jax.config.update`` would set
    them for the whole process, for good); the frames left out are jax's per-process list, held
    while any scope is open. Both are restored on exit.
    """
    # Lazy (heavy): JAX starts only after XLA_FLAGS are set. jax._src.config: the scoped form of
    # these options (public jax offers only the process-wide jax.config.update).
    from jax._src import config as jax_config

    pattern = location_pattern(import_roots(project_root))
    with (
        _frames_left_out(installed_roots()),
        jax_config.hlo_source_file_canonicalization_regex(pattern),
        jax_config.include_full_tracebacks_in_locations(FULL_TRACEBACKS),
        jax_config.traceback_in_locations_limit(TRACEBACK_FRAMES),
    ):
        yield


_lock = threading.Lock()
_held: dict[str, int] = {}  # folder -> open scopes that need it left out (only folders added here)


@contextlib.contextmanager
def _frames_left_out(folders: Iterable[str]) -> Iterator[None]:
    """jax records no frame of a file under ``folders`` while this is open (in every thread: jax
    keeps one list per process); a folder jax already leaves out is not touched."""
    # jax._src.source_info_util: register_exclusion is public (jax.extend) but for good; taking an
    # exclusion back needs the list it appends to and the two caches it clears.
    from jax._src import source_info_util

    with _lock:
        mine = [f for f in folders if f in _held or f not in source_info_util._exclude_paths]
        for f in mine:
            if f not in _held:
                source_info_util.register_exclusion(f)
            _held[f] = _held.get(f, 0) + 1
    try:
        yield
    finally:
        with _lock:
            for f in mine:
                _held[f] -= 1
                if not _held[f]:
                    del _held[f]
                    source_info_util._exclude_paths.remove(f)
            source_info_util._exclude_path_regex.cache_clear()
            source_info_util.is_user_filename.cache_clear()
