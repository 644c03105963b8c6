"""Compiled builds shared by the whole test session: one compile per build identity, not one per module.

A test that needs a build as its starting point (a candidate to gate, a second build to swap to)
asks the session's ``build_cache`` fixture instead of ``compile_build``. The cache keys a build by
what goes into its build id, read from the build's plan before anything compiles: the pipeline spec
and its entry, the config with the overrides applied, the pipeline's source digest, the weights
(their label, and the bytes of a weights file), the target spec, the flag profile, the platform and
the executable format. The first request compiles the build into the cache's own registry; every
request (the first included) then publishes that build's blobs and manifest into the test's
registry as ``compile_build`` would (a new registry's signed state started, dev moved unless
``move_dev=False``), so each test holds its own copy and may damage it.

The cache directory is shared by pytest-xdist's workers (the session's temporary root), with one
file lock per build (``made_once``, which other session-wide entries use too): a build the other
worker is compiling is waited for, not compiled twice.

What it never is: a JAX compilation cache. Each build is compiled by ``compile_build`` exactly as a
user's compile runs; a program loaded from a build still counts every compile it triggers, so the
zero-compile tests see what a pod would.

Tests of compile itself (progress, identity, faults while publishing, ``keep_compiled``) call
``compile_build`` directly.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import pickle
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

from filelock import FileLock

__all__ = ["BuildCache", "cache_dir", "made_once"]


def cache_dir(basetemp: Path) -> Path:
    """Where the session's builds live: beside the workers' own temporary roots under pytest-xdist
    (their common parent is new each session), inside the session's root otherwise."""
    shared = basetemp.parent if os.environ.get("PYTEST_XDIST_WORKER") else basetemp
    return shared / "build-cache"


def made_once(entry: Path, make: Callable[[Path], None]) -> Path:
    """``entry``, made by ``make(entry)`` in whichever process of the session asks first; the others
    wait on its file lock and find it made. A marker written after ``make`` returns says the entry is
    complete: one left half made by a process that died is cleared and made again."""
    done = entry / ".made"
    with FileLock(str(entry) + ".lock"):
        if not done.is_file():
            shutil.rmtree(entry, ignore_errors=True)
            entry.mkdir(parents=True)
            make(entry)
            done.write_text("")
    return entry


def _plain(value: Any) -> Any:
    """A JSON-able view of a spec, config or platform (pydantic model, dataclass or plain value)."""
    if hasattr(value, "model_dump"):
        return value.model_dump(mode="json")
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return dataclasses.asdict(value)
    return value


class BuildCache:
    """Builds compiled once per session (see the module docstring); ``compiles`` counts this
    process's real compiles, ``served`` every build handed to a test."""

    def __init__(self, root: Path):
        from avatar_release.compile import compile_build

        self._compile_build = compile_build  # the real one, even while in_place_of_compile_build is patched in
        self.root = root
        self.root.mkdir(parents=True, exist_ok=True)
        self.compiles = 0
        self.served = 0

    def identity(
        self,
        pipeline: str,
        target: str,
        *,
        overrides: dict[str, str] | None = None,
        weights_path: str | None = None,
        executable_format: str = "xla-executable",
    ) -> str:
        """The cache key: a digest over what goes into the build id, from the build's plan."""
        from avatar_release.compile._plan import plan_build  # the plan, not the compile: a second or two

        plan = plan_build(
            pipeline,
            target,
            weights_path=weights_path,
            overrides=dict(overrides or {}),
            executable_format=executable_format,
            progress=lambda msg: None,
        )
        doc = {
            "spec": _plain(plan.spec),
            "config": _plain(plan.config),
            "overrides": plan.overrides,
            "source": plan.source_digest,
            "weights": plan.weights_label,
            "weights_file": hashlib.sha256(Path(weights_path).read_bytes()).hexdigest() if weights_path else None,
            "target": _plain(plan.target),
            "flags": plan.flags.digest(),
            "platform": _plain(plan.platform),
            "format": plan.executable_format,
            "project": str(plan.project.root),
        }
        text = json.dumps(doc, sort_keys=True, default=str)
        return f"{plan.spec.name}-{plan.target.name}-{hashlib.sha256(text.encode()).hexdigest()[:16]}"

    def compile(
        self,
        pipeline: str = "tiny",
        target: str = "cpu-8",
        *,
        registry: Any,
        overrides: dict[str, str] | None = None,
        weights_path: str | None = None,
        executable_format: str = "xla-executable",
        move_dev: bool = True,
    ) -> Any:
        """What ``compile_build(pipeline, target, registry=registry, ...)`` returns, the build
        compiled at most once per session and published into ``registry``."""
        result, _ = self._compile(pipeline, target, registry, overrides, weights_path, executable_format, move_dev)
        return result

    def compile_with_program_texts(
        self, pipeline: str, target: str, *, registry: Any, overrides: dict[str, str] | None = None
    ) -> tuple[Any, dict[str, str]]:
        """``compile``, and each executable's compiled program as text (``as_text()`` of the objects
        ``compile_build(keep_compiled=True)`` returns, kept beside the build when it compiled): for
        tests that read the programs XLA made, which a build compiled for another platform
        cannot be loaded here to show."""
        return self._compile(pipeline, target, registry, overrides, None, "xla-executable", True, program_texts=True)

    def _compile(
        self,
        pipeline: str,
        target: str,
        registry: Any,
        overrides: dict[str, str] | None,
        weights_path: str | None,
        executable_format: str,
        move_dev: bool,
        *,
        program_texts: bool = False,
    ) -> tuple[Any, dict[str, str]]:
        from avatar_release.registry import LocalRegistry

        key = self.identity(
            pipeline, target, overrides=overrides, weights_path=weights_path, executable_format=executable_format
        )

        def make(entry: Path) -> None:
            result = self._compile_build(
                pipeline,
                target,
                registry=LocalRegistry(entry / "reg"),
                overrides=overrides,
                weights_path=weights_path,
                executable_format=executable_format,
                move_dev=False,
                keep_compiled=program_texts,
            )
            assert result.manifest is not None
            if program_texts:
                texts = {key: compiled.as_text() for key, compiled in result.compiled.items()}
                (entry / "program-texts.json").write_text(json.dumps(texts))
                result = dataclasses.replace(result, compiled=None, weight_tensors=None)  # not picklable, not needed
            (entry / "manifest.json").write_bytes(result.manifest.to_json_bytes())
            (entry / "result.pickle").write_bytes(pickle.dumps(result))
            with open(self.root / "compiles.log", "a") as log:  # every real compile of the session
                log.write(f"{key} {os.environ.get('PYTEST_XDIST_WORKER', 'main')}\n")
            self.compiles += 1

        entry = made_once(self.root / key, make)
        self.served += 1
        cached = pickle.loads((entry / "result.pickle").read_bytes())
        texts: dict[str, str] = {}
        if program_texts:
            kept = entry / "program-texts.json"
            assert kept.is_file(), f"{key} was compiled for the session without its program texts: ask for them first"
            texts = json.loads(kept.read_text())
        published = self._publish(
            cached, LocalRegistry(entry / "reg"), (entry / "manifest.json").read_bytes(), registry, move_dev=move_dev
        )
        return published, texts

    def in_place_of_compile_build(self) -> Any:
        """A ``compile_build`` answered from this cache, for code that calls it itself (``calibrate``):
        patch it over ``avatar_release.compile.compile_build`` while that code runs."""

        def compile_build(
            pipeline: str = "tiny",
            target: str = "cpu-8",
            *,
            registry: Any,
            overrides: dict[str, str] | None = None,
            weights_path: str | None = None,
            executable_format: str = "xla-executable",
            move_dev: bool = True,
            progress: Any = None,
        ) -> Any:
            return self.compile(
                pipeline,
                target,
                registry=registry,
                overrides=overrides,
                weights_path=weights_path,
                executable_format=executable_format,
                move_dev=move_dev,
            )

        return compile_build

    @staticmethod
    def _publish(cached: Any, source: Any, manifest_bytes: bytes, registry: Any, *, move_dev: bool) -> Any:
        """Step 5 of compile_build, from the cache: every blob, the manifest last, then the signed
        state of a new registry and the dev channel."""
        from avatar_release.registry import read_manifest
        from avatar_release.trust.policy import load_policy
        from avatar_release.trust.state_moves import open_state, publish_to_dev
        from avatar_release.trust.state_read import state_exists

        for ref in cached.manifest.blobs():
            if not registry.has_blob(ref.digest):
                registry.put_blob(source.get_blob(ref.digest, ref.size))
        digest, created = registry.put_build(cached.build_id, manifest_bytes)
        if not state_exists(registry) and not registry.list_channels() and not registry.history():
            open_state(registry, load_policy(), init_if_new=True)
        if move_dev:
            resolved, manifest = read_manifest(registry, digest)
            publish_to_dev(registry, resolved, manifest, reason=f"compile {cached.pipeline} for {cached.target}")
        return dataclasses.replace(cached, digest=digest, created=created, registry=registry.uri)
