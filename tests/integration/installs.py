"""The serving install, two ways, for tests: a wheel of this checkout in a fresh venv, and a
stand-in for `python:3.11-slim` made from this machine's own interpreter.

No base image can be pulled here, so tests/integration/test_podman.py builds deploy/Containerfile
on top of this: the running interpreter's prefix (standard library, no site-packages), a shell, and
exactly the shared libraries they and the serving install's compiled modules link against (found
with `ldd`), imported as a one-layer image with `podman import`. Test support, not product code.
"""

from __future__ import annotations

import io
import os
import re
import subprocess
import sys
import sysconfig
import tarfile
from pathlib import Path

_SKIP = {
    "site-packages",
    "test",
    "idlelib",
    "tkinter",
    "turtledemo",
    "lib2to3",
    "__pycache__",
    "config-3.11-x86_64-linux-gnu",
}  # the static libpython: for embedding, not for running
_LDD = re.compile(r"(?:=>\s*)?(/\S+)\s+\(0x")


REPO = Path(__file__).resolve().parents[2]


def build_wheel_venv(out: Path) -> tuple[Path, Path]:
    """(wheel, venv) for a wheel of this checkout installed in a fresh venv. Dependencies come from
    pip's configured indexes; nothing comes from the repository but the wheel."""
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "-q",
            "--no-deps",
            "--no-build-isolation",
            "-w",
            str(out / "dist"),
            str(REPO),
        ],
        check=True,
        cwd=out,
    )
    (wheel,) = (out / "dist").glob("avatar_release-*.whl")
    venv = out / "venv"
    # Without PYTHONPATH: a checkout on it (its egg-info) would read as "already installed" to pip.
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, env=env)
    subprocess.run(
        # --no-compile: pip would byte-compile every installed module (jax's thousands) up front; the
        # pod's first imports compile what they use, which is what the tests run.
        [
            str(venv / "bin" / "python"),
            "-m",
            "pip",
            "install",
            "-q",
            "--disable-pip-version-check",
            "--no-compile",
            str(wheel),
        ],
        check=True,
        cwd=out,
        env=env,
    )
    return wheel, venv


def _needed(elves: list[Path]) -> set[str]:
    """Every shared library the given ELF files load, as ldd names them (and as resolved)."""
    found: set[str] = set()
    for chunk in range(0, len(elves), 200):
        out = subprocess.run(["ldd", *map(str, elves[chunk : chunk + 200])], capture_output=True, text=True)
        for m in _LDD.finditer(out.stdout):
            found.add(m.group(1))
    return found


def _entries(path: str) -> list[str]:
    """The path as the loader opens it (through /lib → usr/lib) plus the file a symlink ends at."""
    canonical = os.path.join(os.path.realpath(os.path.dirname(path)), os.path.basename(path))
    return [canonical, os.path.realpath(path)]


def elf_files(root: Path) -> list[Path]:
    """Every ELF file under `root` (shared objects and programs such as imageio-ffmpeg's ffmpeg)."""
    found = []
    for p in root.rglob("*"):
        if p.is_file() and not p.is_symlink():
            with open(p, "rb") as f:
                if f.read(4) == b"\x7fELF":
                    found.append(p)
    return found


def build_base_tar(out: Path, extra_elves: list[Path] = ()) -> Path:
    """Write the root filesystem tarball; `extra_elves` are compiled modules the image will install
    (their system libraries must be in the base, as they are in a Debian slim image)."""
    python = Path(sysconfig.get_config_var("BINDIR")) / f"python{sys.version_info.major}.{sys.version_info.minor}"
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    libdir = Path(sysconfig.get_config_var("LIBDIR"))
    files: list[str] = [str(python.resolve())]
    files += [str(p) for p in libdir.glob("libpython3*.so*")]
    for root, dirs, names in os.walk(stdlib):
        dirs[:] = [d for d in dirs if d not in _SKIP]
        files += [os.path.join(root, n) for n in names]
    shell = Path(os.path.realpath("/bin/sh"))
    files.append(str(shell))
    elves = [
        python.resolve(),
        *libdir.glob("libpython3*.so*"),
        shell,
        *extra_elves,
        *(p for p in (stdlib / "lib-dynload").glob("*.so") if "tkinter" not in p.name),
    ]
    # System libraries only: a wheel's own bundled libraries (numpy.libs/...) come with the wheel.
    libs = sorted({e for p in _needed(elves) for e in _entries(p) if e.startswith(("/usr/", "/lib"))})
    # libstdc++/libgcc_s: what manylinux wheels expect of the system, as a slim image has them.
    for name in ("libstdc++.so.6", "libgcc_s.so.1"):
        hit = next(
            (
                d / name
                for d in (Path("/usr/lib/x86_64-linux-gnu"), Path("/lib/x86_64-linux-gnu"))
                if (d / name).exists()
            ),
            None,
        )
        if hit:
            libs += _entries(str(hit))
    with tarfile.open(out, "w") as tar:
        added: set[str] = set()

        def add_dirs(path: str) -> None:
            parts = Path(path).parts[1:-1]
            for i in range(1, len(parts) + 1):
                d = "/".join(parts[:i])
                if d not in added:
                    added.add(d)
                    info = tarfile.TarInfo(d)
                    info.type, info.mode = tarfile.DIRTYPE, 0o755  # /root too: the pod's user reads it
                    tar.addfile(info)

        def add_link(name: str, target: str) -> None:
            add_dirs("/" + name)
            info = tarfile.TarInfo(name)
            info.type, info.linkname = tarfile.SYMTYPE, target
            tar.addfile(info)
            added.add(name)

        for name, target in (("lib", "usr/lib"), ("lib64", "usr/lib64"), ("bin", "usr/bin"), ("sbin", "usr/sbin")):
            if os.path.islink("/" + name):
                add_link(name, target)
        for path in [*files, *libs]:
            name = path.lstrip("/")
            if name in added or not os.path.lexists(path):
                continue
            add_dirs(path)
            tar.add(path, arcname=name, recursive=False)
            added.add(name)
        add_link("usr/bin/sh", shell.name)
        for n in ("python", "python3", f"python{sys.version_info.major}.{sys.version_info.minor}"):
            add_link(f"usr/local/bin/{n}", str(python.resolve()))
        for d, mode in (("tmp", 0o1777), ("etc", 0o755)):
            if d not in added:
                info = tarfile.TarInfo(d)
                info.type, info.mode = tarfile.DIRTYPE, mode
                tar.addfile(info)
        passwd = b"root:x:0:0:root:/root:/bin/sh\n"
        info = tarfile.TarInfo("etc/passwd")
        info.size = len(passwd)
        tar.addfile(info, io.BytesIO(passwd))
    return out
