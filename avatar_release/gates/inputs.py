"""The project files a gate decides by, with the digests its results name them by.

A gate result names the band it was judged against (``band_digest``), the target spec it ran under
(``target_spec_digest``) and the lever list that decided its tier (``levers_digest``); a trust
policy's ``[gate_inputs]`` pins which ones may decide a verdict that promotes. This module lists
the files in force in the project with those same digests, and writes them as that section
(``avatar-release gate inputs``), so a policy author never computes a digest by hand.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from .._digest import sha256_digest
from ..errors import AvatarReleaseError
from ..records import Band, parse_record
from ..specs import list_specs, load_target, manifests_dir
from ..trust.policy import GateInputPins
from .tier import levers_path, read_levers

__all__ = ["GateInputFile", "gate_input_files", "gate_inputs_toml"]

Kind = Literal["band", "target", "levers"]
_KIND_NAMES = {"band": "band", "target": "target spec", "levers": "lever list"}


@dataclass(frozen=True)
class GateInputFile:
    """One project file a gate may decide by, and the digest a gate result names it by."""

    kind: Kind
    name: str  # band: its file name; target: the target's name; levers: "levers.toml"
    path: Path
    digest: str | None  # None: the file does not load (``error`` says why)
    about: str = ""  # one line on what it says
    error: str | None = None

    def allowed(self, pins: GateInputPins) -> bool | None:
        """Whether ``pins`` allow this file to decide a verdict that promotes; None: they pin nothing of its kind."""
        if self.kind == "target":
            return None if pins.targets is None else self.digest in pins.targets.get(self.name, ())
        allowed = pins.bands if self.kind == "band" else pins.levers
        return None if allowed is None else self.digest in allowed

    def to_json(self, pins: GateInputPins) -> dict[str, object]:
        return {
            "kind": self.kind,
            "name": self.name,
            "path": str(self.path),
            "digest": self.digest,
            "about": self.about,
            "error": self.error,
            "allowed": self.allowed(pins),
        }


def gate_input_files(extra_bands: Iterable[str | Path] = ()) -> list[GateInputFile]:
    """Every band under ``manifests/bands/`` (and ``extra_bands``), every target spec and the lever list."""
    folder = manifests_dir()
    bands = sorted((folder / "bands").glob("*.json")) + [Path(b) for b in extra_bands]
    files = [_band(p) for p in dict.fromkeys(bands)]
    files += [_target(name, folder / "targets" / f"{name}.toml") for name in list_specs("targets")]
    return files + [_levers()]


def _band(path: Path) -> GateInputFile:
    try:
        data = path.read_bytes()
        band = parse_record(Band, data, where=str(path))
    except (OSError, AvatarReleaseError) as e:
        return GateInputFile("band", path.name, path, None, error=str(e))
    return GateInputFile(
        "band",
        path.name,
        path,
        sha256_digest(data),
        f"{band.pipeline} on {band.target}: PSNR >= {band.psnr_floor_db} dB, max abs diff <= "
        f"{band.max_abs_diff_ceiling}",
    )


def _target(name: str, path: Path) -> GateInputFile:
    try:
        spec = load_target(name)
    except AvatarReleaseError as e:
        return GateInputFile("target", name, path, None, error=str(e))
    return GateInputFile(
        "target",
        name,
        path,
        spec.digest(),
        f"{spec.platform} x {spec.device_count}" + (f", {spec.topology}" if spec.topology else ""),
    )


def _levers() -> GateInputFile:
    path = levers_path()
    try:
        doc, digest, _ = read_levers(path)
    except AvatarReleaseError as e:
        return GateInputFile("levers", path.name, path, None, error=str(e))
    return GateInputFile(
        "levers",
        path.name,
        path,
        digest,
        f"{len(doc.get('options', {}))} compiler option(s)" + (", toolchain" if "toolchain" in doc else ""),
    )


# ----------------------------------------------------------------------------- the section
_KEPT = (
    "allowed by the policy now, no file here has it (an earlier one: keep it while builds gated under it "
    "may still roll back)"
)


def _status(f: GateInputFile, pins: GateInputPins, policy: str) -> str:
    allowed = f.allowed(pins)
    if allowed is None:
        return f"not pinned: {policy} pins no {_KIND_NAMES[f.kind]} yet"
    return "pinned" if allowed else f"NOT allowed by {policy} now"


def _comment(f: GateInputFile, root: Path, pins: GateInputPins, policy: str) -> str:
    try:
        where = str(f.path.resolve().relative_to(root.resolve()))
    except ValueError:
        where = str(f.path)
    if f.digest is None:
        return f"{where} does not load: {' '.join(str(f.error).split())}"
    return f"{where}: {f.about}; {_status(f, pins, policy)}"


def _str(s: str) -> str:
    return '"' + s.replace("\\", "\\\\").replace('"', '\\"') + '"'


def gate_inputs_toml(files: list[GateInputFile], pins: GateInputPins, policy: str) -> str:
    """``files`` as a ``[gate_inputs]`` section to paste into a trust policy, each line saying what the
    file is and whether ``pins`` (those of the policy in force, named ``policy``) allow it now. Digests
    the policy allows that no file here has (an earlier band, kept for rollbacks) are kept, marked."""
    root = manifests_dir()
    lines = [
        f"# The files a gate decides by in {root}, by the digest its results name them by.",
        f"# Pasted into the trust policy ({policy}), only these decide a verdict that promotes.",
        "[gate_inputs]",
    ]
    for kind, key, allowed in (("band", "bands", pins.bands), ("levers", "levers", pins.levers)):
        found = [f for f in files if f.kind == kind]
        lines.append(f"{key} = [")
        for f in found:
            lines.append(
                f"    # {_comment(f, root, pins, policy)}"
                if f.digest is None
                else f"    {_str(f.digest)},  # {_comment(f, root, pins, policy)}"
            )
        lines += [f"    {_str(d)},  # {_KEPT}" for d in allowed or () if d not in {f.digest for f in found}]
        lines.append("]")
    lines += ["", "[gate_inputs.targets]  # target -> its spec digest (a list: any of them)"]
    targets = {f.name: f for f in files if f.kind == "target"}
    pinned = pins.targets or {}
    for name, f in targets.items():
        if f.digest is None:
            lines.append(f"# {name}: {_comment(f, root, pins, policy)}")
            continue
        also = [d for d in pinned.get(name, ()) if d != f.digest]
        value = _str(f.digest) if not also else "[" + ", ".join(map(_str, (f.digest, *also))) + "]"
        lines.append(
            f"{_str(name)} = {value}  # {_comment(f, root, pins, policy)}"
            + (f"; the others are {_KEPT}" if also else "")
        )
    lines += [
        f"{_str(name)} = [{', '.join(map(_str, digests))}]  # {_KEPT}"
        for name, digests in pinned.items()
        if name not in targets
    ]
    return "\n".join(lines) + "\n"
