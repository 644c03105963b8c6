"""The support window the docs site states (Reference > Record formats) is the one the code reads:
every stored kind with its window, no kind missing, none extra. A new schema version that moves a
window fails here until the page says so."""

from __future__ import annotations

import re
from pathlib import Path

from avatar_release.records.window import support_windows

PAGE = Path(__file__).resolve().parents[2] / "docs" / "reference" / "records.md"


def _table() -> dict[str, str]:
    """{kind: "oldest..current"} from the page's support window table."""
    text = PAGE.read_text()
    section = text[text.index("## Support window") :]
    rows = re.findall(r"^\| `(avatar-release/[a-z-]+)` \| (\d+\.\.\d+) \|", section, flags=re.M)
    return dict(rows)


def test_the_records_page_states_every_kinds_support_window_as_the_code_reads_it():
    stated = _table()
    actual = {w.kind: f"{w.oldest}..{w.current}" for w in support_windows()}
    assert stated == actual, (
        f"docs/reference/records.md, the support window table, says {stated}; avatar_release/records/window.py "
        f"reads {actual}: update the table (a new schema version moved a window)"
    )
