"""The pipeline's own code, called by the toolchain: what it raises is the author's to fix.

Any exception the pipeline raises while it is imported, resolved, validated, created, initialised,
loaded or traced is an input error (exit 2, ContractError), not a crash of the toolchain: the
message names the contract member that was called and the innermost ``file:line`` of the traceback
that lies inside the project (not in an installed package, not in the toolchain), where the author
can look first. A factory that returns None is told it may have forgotten ``return``.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from pathlib import Path
from types import TracebackType
from typing import Any

from ..errors import AvatarReleaseError, ContractError

__all__ = ["CONTRACT_PAGE", "author_frame", "author_error", "calling", "returned", "defined_at"]

# A page of the docs site, not a path: the repository's docs/ is not in the project a user is writing.
CONTRACT_PAGE = "docs site: Reference > The pipeline contract"
_PACKAGE_FOLDERS = ("site-packages", "dist-packages")  # what pip, venv, conda and Debian install into
_TOOLCHAIN = Path(__file__).resolve().parents[1]  # avatar_release/: never the author's frame


def _frames(tb: TracebackType | None) -> Iterator[tuple[str, int, str]]:
    while tb is not None:
        code = tb.tb_frame.f_code
        yield code.co_filename, tb.tb_lineno, code.co_name
        tb = tb.tb_next


def _inside(filename: str, root: Path) -> str | None:
    """``filename`` relative to ``root`` when the project wrote it (not installed, not the toolchain's)."""
    if not filename or filename.startswith("<"):
        return None
    path = Path(filename).resolve()
    if path.is_relative_to(_TOOLCHAIN) or any(part in _PACKAGE_FOLDERS for part in path.parts):
        return None
    try:
        return path.relative_to(root).as_posix()
    except ValueError:
        return None


def author_frame(exc: BaseException, root: str | os.PathLike | None) -> str | None:
    """The innermost frame of ``exc``'s traceback inside the project, as ``file:line (in function)``;
    through its causes and contexts when the exception itself has none (a wrapper's re-raise)."""
    if root is None:
        return None
    base = Path(root).resolve()
    seen: set[int] = set()
    e: BaseException | None = exc
    while e is not None and id(e) not in seen:
        seen.add(id(e))
        found = None
        for filename, line, name in _frames(e.__traceback__):
            rel = _inside(filename, base)
            if rel is not None:
                found = f"{rel}:{line} (in {name})"
        if found:
            return found
        e = e.__cause__ or e.__context__
    return None


def _text(exc: BaseException) -> str:
    msg = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
    msg = msg if len(msg) <= 300 else msg[:297] + "..."
    return f"{type(exc).__name__}: {msg}" if msg else type(exc).__name__


def author_error(exc: BaseException, where: str, member: str, root: str | os.PathLike | None) -> ContractError:
    """ContractError: ``member`` (the pipeline's code) raised ``exc``, at its innermost project frame."""
    frame = author_frame(exc, root)
    at = f" at {frame}" if frame else ""
    return ContractError(
        f"{where}: {member} raised {_text(exc)}{at}. This is the pipeline's code: fix it there. "
        f"The pipeline contract: {CONTRACT_PAGE}"
    )


@contextlib.contextmanager
def calling(where: str, member: str, root: str | os.PathLike | None) -> Iterator[None]:
    """Within: an exception from the pipeline's code is a ContractError naming ``member``; the
    toolchain's own errors (AvatarReleaseError) pass through unchanged."""
    try:
        yield
    except AvatarReleaseError:
        raise
    except Exception as e:  # noqa: BLE001 - anything the author's code raises is theirs to fix
        raise author_error(e, where, member, root) from e


def returned(value: Any, where: str, member: str) -> Any:
    """``value``, unless the factory ``member`` returned None (a function without ``return``)."""
    if value is None:
        raise ContractError(
            f"{where}: factory {member} returned None; did it forget `return`? The pipeline contract: {CONTRACT_PAGE}"
        )
    return value


def defined_at(fn: Any, root: str | os.PathLike | None) -> str:
    """Where the pipeline defines ``fn``: ``file:line`` relative to the project, or "" (not its code)."""
    code = getattr(getattr(fn, "__func__", fn), "__code__", None)
    if code is None or root is None:
        return ""
    rel = _inside(code.co_filename, Path(root).resolve())
    return f"{rel}:{code.co_firstlineno}" if rel else ""
