"""Which tags an avatar-release repository uses: one object, current names first, older after.

A :class:`TagLayout` is a list of generations of tag names (:class:`TagNames`). The first is
what this client writes; every generation is read, in order, so a repository written by an
older client keeps working and the next write moves it on (see the tag layout in
:mod:`._artifact`). Names that would not fit an OCI tag (128 characters) are skipped when read
and refused, with the limit, when written.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from ...errors import InputError
from .._protocol import check_name
from ._artifact import (
    BUILD_PREFIX,
    HISTORY_TAG,
    MAX_TAG,
    PENDING_TAG,
    RECORD_PREFIX,
    RECORD_SEP,
    V1_BUILD_PREFIX,
    V1_HISTORY_TAG,
    V1_PENDING_TAG,
    V1_RECORD_PREFIX,
)

__all__ = ["TagNames", "TagLayout", "LAYOUT_1", "LAYOUT_2", "CURRENT"]


@dataclass(frozen=True)
class TagNames:
    """One generation of the bookkeeping tags."""

    build: str  # prefix of a build's commit marker: <build>.<build id>
    record: str  # prefix of a side record: <record><namespace>.N.<name>
    history: str
    pending: str

    def build_tag(self, build_id: str) -> str:
        return self.build + build_id

    def record_tag(self, namespace: str, name: str) -> str:
        return f"{self.record}{namespace}{RECORD_SEP}{name}"

    def record_prefix(self, namespace: str) -> str:
        return f"{self.record}{namespace}{RECORD_SEP}"


LAYOUT_2 = TagNames(BUILD_PREFIX, RECORD_PREFIX, HISTORY_TAG, PENDING_TAG)  # 2026-12-01: "_avr." ...
LAYOUT_1 = TagNames(V1_BUILD_PREFIX, V1_RECORD_PREFIX, V1_HISTORY_TAG, V1_PENDING_TAG)  # read, never written


@dataclass(frozen=True)
class TagLayout:
    """Generations of tag names: ``generations[0]`` is written, all are read in order."""

    generations: tuple[TagNames, ...] = (LAYOUT_2, LAYOUT_1)

    @property
    def current(self) -> TagNames:
        return self.generations[0]

    # ---- builds ---------------------------------------------------------------------------
    def build_tag(self, build_id: str) -> str:
        """The tag a build is committed under (written); InputError when the id cannot be one."""
        check_name("build", build_id)
        tag = self.current.build_tag(build_id)
        if len(tag) > MAX_TAG:
            raise InputError(
                f"build id {build_id!r} is {len(build_id)} characters; an OCI tag holds {MAX_TAG}, "
                f"so this backend takes build ids of at most {MAX_TAG - len(self.current.build)}"
            )
        return tag

    def build_tags(self, build_id: str) -> list[str]:
        """Where a build may be committed, current layout first (only names that fit a tag)."""
        check_name("build", build_id)
        return _fitting(g.build_tag(build_id) for g in self.generations)

    def build_prefixes(self, prefix: str = "") -> tuple[str, ...]:
        return tuple(g.build + prefix for g in self.generations)

    def build_ids(self, tags: list[str], prefix: str = "") -> dict[str, str]:
        """build id -> its tag, among ``tags``, for ids starting with ``prefix``; the newest layout wins."""
        out: dict[str, str] = {}
        for gen in reversed(self.generations):  # older first, so a newer tag overwrites
            for tag in tags:
                if tag.startswith(gen.build + prefix):
                    out[tag.removeprefix(gen.build)] = tag
        return dict(sorted(out.items()))

    def build_id_of_tag(self, tag: str) -> str:
        for gen in self.generations:
            if tag.startswith(gen.build):
                return tag.removeprefix(gen.build)
        return tag

    # ---- side records ---------------------------------------------------------------------
    def record_tag(self, namespace: str, name: str) -> str:
        check_name("record namespace", namespace)
        check_name("record", name)
        tag = self.current.record_tag(namespace, name)
        if len(tag) > MAX_TAG:
            raise InputError(
                f"record {namespace}/{name}: the OCI tag {tag[:40]}... would be {len(tag)} characters, over "
                f"the {MAX_TAG} a registry accepts; use a shorter namespace or name"
            )
        return tag

    def record_tags(self, namespace: str, name: str) -> list[str]:
        return _fitting(g.record_tag(namespace, name) for g in self.generations)

    def record_prefixes(self, namespace: str) -> tuple[str, ...]:
        return tuple(g.record_prefix(namespace) for g in self.generations)

    def record_names(self, tags: list[str], namespace: str) -> list[str]:
        names = set()
        for tag in tags:
            for prefix in self.record_prefixes(namespace):
                if tag.startswith(prefix):
                    names.add(tag.removeprefix(prefix))
                    break
        return sorted(names)

    # ---- the journal ----------------------------------------------------------------------
    @property
    def history_tags(self) -> tuple[str, ...]:
        return tuple(g.history for g in self.generations)

    @property
    def pending_tags(self) -> tuple[str, ...]:
        return tuple(g.pending for g in self.generations)


CURRENT = TagLayout()


def _fitting(tags: Iterable[str]) -> list[str]:
    return [t for t in tags if len(t) <= MAX_TAG]
