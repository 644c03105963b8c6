"""mkdocs hooks (``hooks:`` in mkdocs.yml): the pages that are made, not written.

* ``reference/cli.md``: the CLI reference, rendered from the click commands by
  ``gen_cli_reference.py`` on every build, so the site can never describe options or exit codes the
  commands no longer have.
* ``reference/specs.md``: the spec formats (pipeline, target, flags, levers, band), rendered from
  the pydantic models by ``gen_spec_reference.py``: fields, defaults and the JSON Schema that
  ``avatar-release specs schema`` prints.
* ``how-to/local-oci-registry.md``: the walkthrough in ``examples/`` (it lives beside the examples
  it drives), its links into docs/ made links between pages.

All are added to the site's files in memory: nothing is written into docs/, and a
``docs/reference/cli.md`` (or ``specs.md``) left by running a generator by hand is replaced by a
fresh rendering.
"""

from __future__ import annotations

import importlib.util
import posixpath
import re
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


# Where the walkthrough is published, and its links into docs/ as written in examples/.
WALKTHROUGH = "how-to/local-oci-registry.md"
_DOCS_LINK = re.compile(r"\]\(\.\./docs/([^)#\s]+)")


def _walkthrough() -> str:
    """The walkthrough as a page of the site: its links into docs/ (``../docs/how-to/registries.md``,
    right where the file lives) become links between pages, relative to where it is published."""
    text = (ROOT / "examples" / "local-oci-registry.md").read_text(encoding="utf-8")
    here = posixpath.dirname(WALKTHROUGH)
    return _DOCS_LINK.sub(lambda m: "](" + posixpath.relpath(m.group(1), here), text)


def on_files(files: Files, config: MkDocsConfig) -> Files:
    generated = [
        File.generated(config, "reference/cli.md", content=_render("gen_cli_reference")),
        File.generated(config, "reference/specs.md", content=_render("gen_spec_reference")),
        File.generated(config, WALKTHROUGH, content=_walkthrough()),
    ]
    for page in generated:
        old = files.get_file_from_path(page.src_uri)
        if old is not None:
            files.remove(old)
        files.append(page)
    return files
