"""The spec formats page, written from the pydantic models the loaders validate with.

One section per kind of project file (``avatar_release.specs.SPEC_KINDS``: pipeline, target, flags,
levers, band): where the files live, a table of fields per model (type, required or the default,
what it means), then the JSON Schema that ``avatar-release specs schema KIND`` prints. Nothing is
typed by hand, so the page cannot drift from the models: the docs site makes it on every build
(``docs/hooks.py``), and this script writes it for reading without a site:

    python3 docs/gen_spec_reference.py              # writes docs/reference/specs.md
    python3 docs/gen_spec_reference.py --out -      # prints it
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]

_INTRO = """# Spec formats

Every file a project writes under `manifests/`, as the loaders read it. Unknown fields are errors
(with the closest allowed name); a missing field is reported with every field of its section.
The same schemas, as JSON Schema, come from the command line:

```
avatar-release specs schema            # every kind, keyed by kind
avatar-release specs schema pipeline   # one kind: pipeline, target, flags, levers, band
```

This page is generated from the models on every build of the site.
"""


def _type(prop: dict[str, Any]) -> str:
    """A field's type as a reader writes it: ``list[BucketSpec]``, ``int | null``, ``"fsdp" | "replicated"``."""
    if "$ref" in prop:
        return prop["$ref"].rsplit("/", 1)[-1]
    if "enum" in prop:
        return " | ".join(json.dumps(v) for v in prop["enum"])
    if "const" in prop:
        return json.dumps(prop["const"])
    if "anyOf" in prop:
        return " | ".join(_type(p) for p in prop["anyOf"])
    kind = prop.get("type", "any")
    if kind == "array":
        return f"list[{_type(prop.get('items', {}))}]"
    if kind == "object":
        extra = prop.get("additionalProperties")
        return f"table of {_type(extra)}" if isinstance(extra, dict) else "table"
    return {"string": "str", "integer": "int", "number": "float", "boolean": "bool"}.get(kind, kind)


def _limits(prop: dict[str, Any]) -> str:
    words = {"exclusiveMinimum": ">", "minimum": ">=", "maximum": "<=", "pattern": "matches"}
    return ", ".join(f"{op} `{prop[k]}`" for k, op in words.items() if k in prop)


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def _table(model: dict[str, Any]) -> list[str]:
    required = set(model.get("required", ()))
    rows = ["| field | type | required / default | meaning |", "|---|---|---|---|"]
    for name, prop in model.get("properties", {}).items():
        need = "**required**" if name in required else f"default `{json.dumps(prop.get('default'))}`"
        meaning = " ".join(x for x in (prop.get("description", ""), _limits(prop)) if x)
        rows.append(f"| `{name}` | {_cell(_type(prop))} | {_cell(need)} | {_cell(meaning)} |")
    return rows


def _section(kind: Any, schema: dict[str, Any]) -> list[str]:
    out = [
        f"## {kind.name}",
        "",
        f"{kind.format} file at `{kind.where}`. " + _cell(schema.get("description", "")),
        "",
        f"### {schema.get('title', kind.name)}",
        "",
        *_table(schema),
        "",
    ]
    for name, sub in sorted(schema.get("$defs", {}).items()):
        if "properties" in sub:
            out += [f"### {name}", "", _cell(sub.get("description", "")), "", *_table(sub), ""]
    out += [
        "JSON Schema (`avatar-release specs schema " + kind.name + "`):",
        "",
        "```json",
        json.dumps(schema, indent=2, sort_keys=True),
        "```",
        "",
    ]
    return out


def render() -> str:
    if str(ROOT) not in sys.path:  # this checkout's models, installed or not
        sys.path.insert(0, str(ROOT))
    from avatar_release.specs import SPEC_KINDS, spec_schema  # on first use, not when the hook loads this file

    lines = [_INTRO]
    for kind in SPEC_KINDS.values():
        lines += _section(kind, spec_schema(kind.name))
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "--out", default=str(ROOT / "docs" / "reference" / "specs.md"), help="file to write, or - for stdout"
    )
    args = parser.parse_args(argv)
    text = render()
    if args.out == "-":
        sys.stdout.write(text)
    else:
        Path(args.out).write_text(text, encoding="utf-8")


if __name__ == "__main__":
    main()
