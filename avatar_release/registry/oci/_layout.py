"""Which tags an avatar-release repository uses: one object, the current names, and the retired ones.

A :class:`TagLayout` is a list of generations of tag names (:class:`TagNames`): the first is what
this client writes, and every generation listed is read. This client reads the current layout
only (the support window of on-disk formats, ``avatar_release.records.window``): the layout of
before 2026-12-01 (``_b.``, ``_r.``, ``_history``, ``_pending``) is *retired*, named only to
recognise a repository written in it, which is refused naming ``avatar-release registry
migrate``, and to move it (:meth:`TagLayout.migration`: the same manifests under today's names).
Names that would not fit an OCI tag (128 characters) are skipped when read and refused, with the
limit, when written.
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

__all__ = ["TagNames", "TagLayout", "TagMigration", "LAYOUT_1", "LAYOUT_2", "CURRENT"]


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
LAYOUT_1 = TagNames(V1_BUILD_PREFIX, V1_RECORD_PREFIX, V1_HISTORY_TAG, V1_PENDING_TAG)  # retired: migrated, not read


@dataclass(frozen=True)
class TagLayout:
    """Generations of tag names: ``generations[0]`` is written, all are read in order; ``retired``
    ones are recognised (and migrated), never read."""

    generations: tuple[TagNames, ...] = (LAYOUT_2,)
    retired: tuple[TagNames, ...] = (LAYOUT_1,)

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

    # ---- retired layouts ------------------------------------------------------------------
    @property
    def retired_history_tags(self) -> tuple[str, ...]:
        """The history tags of retired layouts: one there means a repository this client must migrate."""
        return tuple(g.history for g in self.retired)

    def migration(self, tags: Iterable[str]) -> list[tuple[str, str]]:
        """(tag of a retired layout, its name in the current one) for each such tag among ``tags``."""
        now, out = self.current, []
        for tag in sorted(tags):
            for old in self.retired:
                if tag == old.history:
                    out.append((tag, now.history))
                elif tag == old.pending:
                    out.append((tag, now.pending))
                elif tag.startswith(old.build):
                    out.append((tag, now.build + tag.removeprefix(old.build)))
                elif tag.startswith(old.record):
                    out.append((tag, now.record + tag.removeprefix(old.record)))
                else:
                    continue
                break
        return out  # (a new name over MAX_TAG cannot be written: the caller says which)


CURRENT = TagLayout()


@dataclass(frozen=True)
class TagMigration:
    """What :meth:`OciRegistry.migrate_tags` did: tags of a retired layout copied to today's name,
    those already there, and those whose new name would not fit an OCI tag."""

    moved: tuple[tuple[str, str], ...] = ()
    present: tuple[str, ...] = ()
    too_long: tuple[str, ...] = ()


def _fitting(tags: Iterable[str]) -> list[str]:
    return [t for t in tags if len(t) <= MAX_TAG]
