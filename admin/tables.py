"""Plain-text tables for the admin CLI: left-aligned text, right-aligned numbers, no dependency."""

from __future__ import annotations

from collections.abc import Sequence


def _cell(value: object) -> str:
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        return f"{value:.8f}".rstrip("0").rstrip(".") if abs(value) < 1 else f"{value:,.2f}"
    if isinstance(value, int):
        return f"{value:,}"
    if isinstance(value, list):
        return ",".join(map(str, value))
    return str(value)


def format_table(headers: Sequence[str], rows: Sequence[Sequence[object]]) -> str:
    """Columns padded to their widest cell, a dashed rule under the header."""
    cells = [[_cell(v) for v in row] for row in rows]
    numeric = [all(isinstance(r[i], (int, float)) and not isinstance(r[i], bool) or r[i] is None for r in rows)
               and bool(rows) for i in range(len(headers))]
    widths = [max([len(h), *(len(r[i]) for r in cells)]) for i, h in enumerate(headers)]

    def line(values: Sequence[str]) -> str:
        return "  ".join(v.rjust(w) if num else v.ljust(w) for v, w, num in zip(values, widths, numeric, strict=True))

    out = [line(list(headers)), "  ".join("-" * w for w in widths)]
    out += [line(r) for r in cells]
    return "\n".join(s.rstrip() for s in out)


def format_record(pairs: Sequence[tuple[str, object]]) -> str:
    """``field  value`` lines for one object."""
    width = max(len(k) for k, _ in pairs)
    return "\n".join(f"{k.ljust(width)}  {_cell(v)}" for k, v in pairs)
