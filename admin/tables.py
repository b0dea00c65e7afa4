"""Plain-text tables for the admin CLI: left-aligned text, right-aligned numbers, no dependency."""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Sequence
from decimal import Decimal

_ISO_TIME = re.compile(r"^(\d{4}-\d\d-\d\d)T(\d\d:\d\d:\d\d)(\.\d+)?(\+00:00|Z)?$")


def decimal_text(value: Decimal | float) -> str:
    """``1,234.5`` → ``1,234.50``: thousands separated, up to 8 decimals, at least cents. A Decimal
    (money) is written digit for digit; a float would round past ~16 digits."""
    text = f"{value:,.8f}".rstrip("0")
    return text + "0" * max(0, 2 - len(text.split(".")[1]))


def cell_text(value: object) -> str:
    """One value as a table cell shows it."""
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, Decimal):  # money
        return decimal_text(value)
    if isinstance(value, float):  # a latency, a threshold: as measured, not as cents (found by QA: 15.00 ms)
        return f"{value:,.3f}".rstrip("0").rstrip(".")
    if isinstance(value, int):
        return f"{value:,}"
    if isinstance(value, list):
        return ",".join(map(str, value))
    if isinstance(value, str) and (m := _ISO_TIME.match(value)):
        return f"{m[1]} {m[2]}"  # stored times are UTC
    return str(value)


def width(text: str) -> int:
    """Columns a terminal gives ``text``: two for a wide or full-width character (CJK, most emoji),
    none for a mark, a format character (zero-width space, joiner, soft hyphen) or a character
    joined to the one before it by a zero-width joiner (an emoji sequence: 👨‍👩‍👧 is one emoji).
    Found by QA: ``emoji 😀 é 中文`` shifted its row's columns by 3, Thai and Devanagari marks by 2."""
    if text.isascii():
        return len(text)
    columns, joined = 0, False
    for c in text:
        if joined:
            joined = False
            continue
        if c == "\u200d":
            joined = True
            continue
        if unicodedata.category(c) in ("Mn", "Me", "Cf"):
            continue
        columns += 2 if unicodedata.east_asian_width(c) in "WF" else 1
    return columns


def _pad(text: str, columns: int, right: bool) -> str:
    fill = " " * max(0, columns - width(text))
    return fill + text if right else text + fill


def _is_number(value: object) -> bool:
    return isinstance(value, (int, float, Decimal)) and not isinstance(value, bool)


def format_table(headers: Sequence[str], rows: Sequence[Sequence[object]]) -> str:
    """Columns padded to their widest cell, a dashed rule under the header."""
    cells = [[cell_text(v) for v in row] for row in rows]
    numeric = [any(_is_number(r[i]) for r in rows) and all(_is_number(r[i]) or r[i] is None for r in rows)
               for i in range(len(headers))]
    for i in range(len(headers)):  # one number of decimals down a column: the figures line up
        if not numeric[i] or not any(isinstance(r[i], (float, Decimal)) for r in rows):
            continue
        places = max(len(c[i].partition(".")[2]) for c in cells)
        for c, raw in zip(cells, rows, strict=True):
            if raw[i] is not None and places:  # (no decimals down the column: no bare point, "100.")
                c[i] += ("" if "." in c[i] else ".") + "0" * (places - len(c[i].partition(".")[2]))
    widths = [max([width(h), *(width(r[i]) for r in cells)]) for i, h in enumerate(headers)]

    def line(values: Sequence[str]) -> str:
        return "  ".join(_pad(v, w, num) for v, w, num in zip(values, widths, numeric, strict=True))

    out = [line(list(headers)), "  ".join("-" * w for w in widths)]
    out += [line(r) for r in cells]
    return "\n".join(s.rstrip() for s in out)


def format_record(pairs: Sequence[tuple[str, object]]) -> str:
    """``field  value`` lines for one object."""
    width = max(len(k) for k, _ in pairs)
    return "\n".join(f"{k.ljust(width)}  {cell_text(v)}" for k, v in pairs)
