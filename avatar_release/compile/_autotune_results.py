"""XLA:GPU's autotune results, in the text form a build keeps them.

A host with the GPUs writes them with ``xla_gpu_dump_autotune_results_to=<file>.textproto`` (XLA's
``AutotuneResults`` message: a ``version: N`` line and one ``results { device: ... hlo: ... result
{ ... } }`` block per config it chose); a compile reads them back with
``xla_gpu_load_autotune_results_from``. This module only reads their outline (bounded size, UTF-8,
the version, the blocks) and merges several into one; XLA checks the rest when it loads them (a
wrong version is its "Version mismatch in autotune results").

Merging keeps each distinct block once, sorted, so the same measurements give the same bytes, and
so the same build identity, whatever order the stages were compiled in.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from .._digest import sha256_digest
from ..errors import InputError

__all__ = ["AutotuneResults", "MAX_RESULTS_BYTES", "read_results", "merge_results"]

MAX_RESULTS_BYTES = 64 << 20  # the tiny pipeline's would be kilobytes; 720p's, some hundreds of configs
_CONTROL = re.compile(r"[\x00-\x08\x0b\x0c\x0e-\x1f]")
_NAME = re.compile(r"([A-Za-z_][A-Za-z0-9_]*)\s*:?\s*")
_SCALAR = re.compile(r"([A-Za-z_][A-Za-z0-9_]*)\s*:\s*([^\s{}]+)")


@dataclass(frozen=True)
class AutotuneResults:
    text: bytes  # canonical: the scalar fields, then every block once, sorted
    version: int
    entries: int  # ``results`` blocks: one chosen config each

    @property
    def digest(self) -> str:
        return sha256_digest(self.text)


def read_results(data: bytes, *, where: str) -> AutotuneResults:
    """One results file, refused with the reason when it is not XLA's text form."""
    return merge_results([data], where=where)


def merge_results(parts: list[bytes], *, where: str) -> AutotuneResults:
    """Several results files (one per compiled stage) as one: the same version, each block once."""
    scalars: dict[str, str] = {}
    blocks: set[str] = set()
    for i, data in enumerate(parts):
        what = where if len(parts) == 1 else f"{where} (part {i + 1} of {len(parts)})"
        part_scalars, part_blocks = _outline(data, what)
        for name, value in part_scalars.items():
            if scalars.setdefault(name, value) != value:
                raise InputError(
                    f"{what}: {name}: {value}, where an earlier part says {scalars[name]}: results from "
                    "different XLA versions cannot be merged"
                )
        blocks.update(part_blocks)
    version = scalars.get("version")
    if version is None or not version.isdigit():
        raise InputError(
            f"{where}: no `version: N` line: expected XLA's AutotuneResults in text form (what "
            "xla_gpu_dump_autotune_results_to writes to a .textproto file)"
        )
    head = "".join(f"{k}: {v}\n" for k, v in sorted(scalars.items()))
    text = (head + "".join(b + "\n" for b in sorted(blocks))).encode()
    entries = sum(1 for b in blocks if b.startswith("results"))
    return AutotuneResults(text=text, version=int(version), entries=entries)


def _outline(data: bytes, where: str) -> tuple[dict[str, str], list[str]]:
    """(top-level scalar fields, top-level ``name { ... }`` blocks as text) of a text proto."""
    if len(data) > MAX_RESULTS_BYTES:
        raise InputError(f"{where}: {len(data)} bytes, more than {MAX_RESULTS_BYTES} allowed for autotune results")
    try:
        text = data.decode()
    except UnicodeDecodeError as e:
        raise InputError(
            f"{where}: not UTF-8 text at byte {e.start}: expected the text form of XLA's "
            "AutotuneResults (dump it to a file ending in .textproto, not .pb)"
        ) from None
    control = _CONTROL.search(text)
    if control is not None:
        raise InputError(
            f"{where}: not text: a control character at character {control.start()}: expected the text "
            "form of XLA's AutotuneResults (dump it to a file ending in .textproto, not .pb)"
        )
    scalars: dict[str, str] = {}
    blocks: list[str] = []
    pos, n = 0, len(text)
    while True:
        pos = _skip_blank(text, pos)
        if pos >= n:
            return scalars, blocks
        m = _NAME.match(text, pos)
        if m is None:
            raise InputError(f"{where}: line {_line(text, pos)}: expected a field name, found {text[pos : pos + 20]!r}")
        if text.startswith("{", m.end()):
            end = _block_end(text, m.end(), where)
            blocks.append(text[pos:end].strip())
            pos = end
            continue
        s = _SCALAR.match(text, pos)
        if s is None:
            raise InputError(f"{where}: line {_line(text, pos)}: field {m.group(1)} has no value")
        if scalars.setdefault(s.group(1), s.group(2)) != s.group(2):
            raise InputError(
                f"{where}: line {_line(text, pos)}: {s.group(1)} given twice ({scalars[s.group(1)]}, then {s.group(2)})"
            )
        pos = s.end()


def _skip_blank(text: str, pos: int) -> int:
    """Past whitespace and ``#`` comments."""
    while pos < len(text):
        if text[pos] == "#":
            nl = text.find("\n", pos)
            pos = len(text) if nl < 0 else nl + 1
        elif text[pos].isspace():
            pos += 1
        else:
            break
    return pos


def _line(text: str, pos: int) -> int:
    return text.count("\n", 0, pos) + 1


def _block_end(text: str, start: int, where: str) -> int:
    """The index after the ``}`` closing the ``{`` at ``start``; braces inside quoted strings (an
    instruction's HLO text is one) do not count."""
    depth, i, n = 0, start, len(text)
    while i < n:
        c = text[i]
        if c in "\"'":
            i += 1
            while i < n and text[i] != c:
                i += 2 if text[i] == "\\" else 1
        elif c == "{":
            depth += 1
        elif c == "}":
            depth -= 1
            if depth == 0:
                return i + 1
        i += 1
    raise InputError(f"{where}: a block opened on line {_line(text, start)} is never closed (a truncated file?)")
