"""mkdocs hooks (``hooks:`` in mkdocs.yml): the pages that are made, not written.

* ``cli.md``: the CLI reference, rendered from the click commands by ``gen_cli_reference.py`` on
  every build, so the site can never describe options or exit codes the commands no longer have.
* ``specs.md``: the spec formats (pipeline, target, flags, levers, band), rendered from the
  pydantic models by ``gen_spec_reference.py``: fields, defaults and the JSON Schema that
  ``avatar-release specs schema`` prints.
* ``local-oci-registry.md``: the walkthrough in ``examples/`` (it lives beside the examples it
  drives), its links into docs/ made links between pages.

All are added to the site's files in memory: nothing is written into docs/, and a ``docs/cli.md``
(or ``docs/specs.md``) left by running a generator by hand is replaced by a fresh rendering.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

from mkdocs.config.defaults import MkDocsConfig
from mkdocs.structure.files import File, Files

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent


def _render(script: str) -> str:
    """The page a generator script beside this file renders (its ``render()``)."""
    spec = importlib.util.spec_from_file_location(script, HERE / f"{script}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.render()


def _walkthrough() -> str:
    """The walkthrough as a page of the site: its links into docs/ (``../docs/registries.md``, right
    where the file lives) become links between pages (``registries.md``)."""
    return (ROOT / "examples" / "local-oci-registry.md").read_text(encoding="utf-8").replace("](../docs/", "](")


def on_files(files: Files, config: MkDocsConfig) -> Files:
    generated = [
        File.generated(config, "cli.md", content=_render("gen_cli_reference")),
        File.generated(config, "specs.md", content=_render("gen_spec_reference")),
        File.generated(config, "local-oci-registry.md", content=_walkthrough()),
    ]
    for page in generated:
        old = files.get_file_from_path(page.src_uri)
        if old is not None:
            files.remove(old)
        files.append(page)
    return files
