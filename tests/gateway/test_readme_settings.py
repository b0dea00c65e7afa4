"""The README's settings table (``## Settings``) names every setting with its true default (found by a
docs QA: a dozen settings were only in running text, under three spellings, and one in none)."""

from __future__ import annotations

import re
from pathlib import Path

from gateway.settings import Settings

README = Path(__file__).resolve().parents[2] / "README.md"
NOT_LISTED = {"engine_socket", "worker_index", "metrics_dir"}  # set by `pagegate serve --workers` for its own processes
ROW = re.compile(r"^\| `PAGEGATE_([A-Z0-9_]+)` \| ([^|]+) \|")


def _table() -> dict[str, str]:
    text = README.read_text()
    section = text[text.index("\n## Settings\n"):]
    section = section[:section.index("\n## ", 1)]
    return {m.group(1).lower(): m.group(2).strip() for m in map(ROW.match, section.splitlines()) if m}


def _written(default: object) -> str:
    if default is None:
        return "(unset)"
    if isinstance(default, bool):
        return f"`{str(default).lower()}`"
    return f"`{default}`"


def test_every_setting_is_in_the_table_once_with_its_default() -> None:
    table = _table()
    fields = {name: field for name, field in Settings.model_fields.items() if name not in NOT_LISTED}
    assert sorted(table) == sorted(fields), "the README's ## Settings table and gateway/settings.py differ"
    for name, field in fields.items():
        documented = table[name]
        if name == "admin_jwt_secret":  # (the placeholder is not printed: it is not a value to use)
            assert documented == "(built-in placeholder)"
        elif field.default == "":
            assert documented == "(empty)", name
        elif isinstance(field.default, float) and documented.strip("`").replace(".", "", 1).isdigit():
            assert float(documented.strip("`")) == field.default, name
        else:
            assert documented == _written(field.default), (name, documented, field.default)
