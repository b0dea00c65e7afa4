"""Inline SVG bar charts for the dashboard: rendered on the server, no JavaScript, no CDN.

    ┌ title ───────────────── max ┐
    │        ▇                    │   one <rect class="bar"> per day, height ∝ value,
    │   ▃    █  ▅      ▂          │   a <title> tooltip per bar ("2026-03-01: $0.12")
    └ first day ─────── last day ─┘
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from decimal import Decimal
from html import escape

from markupsafe import Markup

from admin.tables import decimal_text

WIDTH, HEIGHT, PAD_TOP, PAD_BOTTOM, PAD_X = 640, 180, 24, 22, 8


@dataclass(frozen=True, slots=True)
class Series:
    """Values per day for one chart; ``fmt`` renders a value for labels and tooltips."""

    chart_id: str
    title: str
    days: Sequence[str]
    values: Sequence[float]
    fmt: Callable[[float], str]
    colour: str = "#3b6fd8"


def usd(value: float | Decimal) -> str:
    """``$1,234.50``, ``$0.000015``: up to money's 8 decimals, so a cost never reads as zero."""
    return f"${decimal_text(value)}"


def count(value: float) -> str:
    return f"{int(value):,}"


def bar_chart(series: Series) -> Markup:
    """An accessible SVG (role="img", aria-label) with one bar per day, zero days included."""
    n = max(len(series.values), 1)
    top = max(series.values, default=0.0)
    plot_h = HEIGHT - PAD_TOP - PAD_BOTTOM
    slot = (WIDTH - 2 * PAD_X) / n
    bar_w = max(slot * 0.8, 1.0)
    parts = [
        f'<svg id="{escape(series.chart_id)}" class="chart" viewBox="0 0 {WIDTH} {HEIGHT}" role="img" '
        f'aria-label="{escape(series.title)}" xmlns="http://www.w3.org/2000/svg">',
        f'<text x="{PAD_X}" y="14" class="chart-title">{escape(series.title)}</text>',
        f'<text x="{WIDTH - PAD_X}" y="14" text-anchor="end" class="chart-max">max {escape(series.fmt(top))}</text>',
        f'<line x1="{PAD_X}" y1="{HEIGHT - PAD_BOTTOM}" x2="{WIDTH - PAD_X}" y2="{HEIGHT - PAD_BOTTOM}" '
        'class="axis"/>',
    ]
    for i, (day, value) in enumerate(zip(series.days, series.values, strict=True)):
        h = 0.0 if top <= 0 else plot_h * value / top
        x = PAD_X + i * slot + (slot - bar_w) / 2
        y = HEIGHT - PAD_BOTTOM - h
        parts.append(
            f'<rect class="bar" data-day="{escape(day)}" data-value="{value}" x="{x:.2f}" y="{y:.2f}" '
            f'width="{bar_w:.2f}" height="{h:.2f}" fill="{series.colour}">'
            f"<title>{escape(day)}: {escape(series.fmt(value))}</title></rect>")
    if series.days:
        parts.append(f'<text x="{PAD_X}" y="{HEIGHT - 6}" class="chart-label">{escape(series.days[0])}</text>')
        parts.append(f'<text x="{WIDTH - PAD_X}" y="{HEIGHT - 6}" text-anchor="end" class="chart-label">'
                     f"{escape(series.days[-1])}</text>")
    parts.append("</svg>")
    return Markup("".join(parts))
