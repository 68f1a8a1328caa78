"""Inline SVG charts for the HTML reports: line charts with markers and bar charts.

No dependencies, no scripts: each function returns an `<svg>` string. Output is
deterministic (fixed number formatting, no random ids).
"""

from __future__ import annotations

import math
from html import escape
from typing import Sequence

PALETTE = ["#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#17becf"]


def _nice_ticks(lo: float, hi: float, n: int = 5, integer: bool = False) -> list[float]:
    if hi <= lo:
        hi = lo + 1.0
    raw = (hi - lo) / n
    mag = 10 ** math.floor(math.log10(raw))
    step = next(m * mag for m in (1, 2, 2.5, 5, 10) if m * mag >= raw)
    if integer:
        step = max(1.0, float(math.ceil(step)))
    start = math.floor(lo / step) * step
    ticks = []
    v = start
    while v <= hi + step * 1e-9:
        if v >= lo - step * 1e-9:
            ticks.append(round(v, 10))
        v += step
    return ticks


def _fmt(v: float) -> str:
    if v == 0:
        return "0"
    a = abs(v)
    if a >= 1e6:
        return f"{v / 1e6:.3g}M"
    if a >= 1e4:
        return f"{v / 1e3:.3g}k"
    if a >= 100:
        return f"{v:.0f}"
    if a >= 1:
        return f"{v:.3g}"
    return f"{v:.2g}"


class Frame:
    """Axes geometry shared by the chart kinds."""

    def __init__(self, width: int, height: int, x0: float, x1: float, y0: float, y1: float,
                 *, left: int = 62, right: int = 16, top: int = 34, bottom: int = 46) -> None:
        self.w, self.h = width, height
        self.l, self.r, self.t, self.b = left, right, top, bottom
        self.x0, self.x1 = x0, (x1 if x1 > x0 else x0 + 1)
        self.y0, self.y1 = y0, (y1 if y1 > y0 else y0 + 1)

    def X(self, x: float) -> float:
        return self.l + (x - self.x0) / (self.x1 - self.x0) * (self.w - self.l - self.r)

    def Y(self, y: float) -> float:
        return self.h - self.b - (y - self.y0) / (self.y1 - self.y0) * (self.h - self.t - self.b)

    def axes(self, title: str, xlabel: str, ylabel: str, *, yfmt=_fmt, xfmt=_fmt,
             xticks: Sequence[float] | None = None, yint: bool = False) -> list[str]:
        out = [f'<rect x="0" y="0" width="{self.w}" height="{self.h}" fill="#fff"/>',
               f'<text x="{self.l}" y="20" font-size="14" font-weight="bold">{escape(title)}</text>']
        for v in _nice_ticks(self.y0, self.y1, integer=yint):
            y = self.Y(v)
            out.append(f'<line x1="{self.l}" y1="{y:.1f}" x2="{self.w - self.r}" y2="{y:.1f}" stroke="#e5e5e5"/>')
            out.append(f'<text x="{self.l - 6}" y="{y + 4:.1f}" font-size="11" text-anchor="end">{yfmt(v)}</text>')
        for v in (xticks if xticks is not None else _nice_ticks(self.x0, self.x1, 6)):
            x = self.X(v)
            out.append(f'<line x1="{x:.1f}" y1="{self.h - self.b}" x2="{x:.1f}" y2="{self.h - self.b + 4}" stroke="#444"/>')
            out.append(f'<text x="{x:.1f}" y="{self.h - self.b + 16}" font-size="11" text-anchor="middle">{xfmt(v)}</text>')
        out.append(f'<line x1="{self.l}" y1="{self.h - self.b}" x2="{self.w - self.r}" y2="{self.h - self.b}" stroke="#444"/>')
        out.append(f'<line x1="{self.l}" y1="{self.t}" x2="{self.l}" y2="{self.h - self.b}" stroke="#444"/>')
        out.append(f'<text x="{(self.l + self.w - self.r) / 2:.1f}" y="{self.h - 8}" font-size="12" text-anchor="middle">{escape(xlabel)}</text>')
        out.append(f'<text x="14" y="{(self.t + self.h - self.b) / 2:.1f}" font-size="12" text-anchor="middle" '
                   f'transform="rotate(-90 14 {(self.t + self.h - self.b) / 2:.1f})">{escape(ylabel)}</text>')
        return out


def _wrap(parts: list[str], w: int, h: int) -> str:
    return (f'<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" viewBox="0 0 {w} {h}" '
            'font-family="Helvetica, Arial, sans-serif">' + "".join(parts) + "</svg>")


def line_chart(series: Sequence[dict], *, title: str, xlabel: str, ylabel: str,
               width: int = 720, height: int = 280, y_min: float | None = 0.0,
               y_max: float | None = None, hlines: Sequence[tuple[float, str]] = (),
               markers: Sequence[dict] = (), yfmt=_fmt, xticks: Sequence[float] | None = None,
               step: bool = False, yint: bool = False) -> str:
    """series: {"label", "points": [(x, y)], "color"?, "dots"?: bool, "dash"?: bool}.
    markers: {"x", "y", "label", "color"?} drawn as rings with a label."""
    pts = [p for s in series for p in s["points"] if p[1] is not None]
    if not pts:
        f = Frame(width, height, 0, 1, 0, 1)
        parts = f.axes(title, xlabel, ylabel)
        parts.append(f'<text x="{width / 2}" y="{height / 2}" text-anchor="middle" fill="#888">no data</text>')
        return _wrap(parts, width, height)
    xs = [p[0] for p in pts]
    ys = [p[1] for p in pts] + [v for v, _ in hlines]
    lo = min(ys) if y_min is None else y_min
    hi = max(ys) if y_max is None else y_max
    if y_max is None:
        hi = hi + (hi - lo) * 0.08 if hi > lo else hi + 1
    f = Frame(width, height, min(xs), max(xs), lo, hi)
    parts = f.axes(title, xlabel, ylabel, yfmt=yfmt, xticks=xticks, yint=yint)
    for v, label in hlines:
        y = f.Y(v)
        parts.append(f'<line x1="{f.l}" y1="{y:.1f}" x2="{width - f.r}" y2="{y:.1f}" stroke="#999" stroke-dasharray="5,4"/>')
        parts.append(f'<text x="{width - f.r - 4}" y="{y - 4:.1f}" font-size="10" fill="#666" text-anchor="end">{escape(label)}</text>')
    legend_x = f.l + 8
    for i, s in enumerate(series):
        color = s.get("color") or PALETTE[i % len(PALETTE)]
        p = [(x, y) for x, y in s["points"] if y is not None]
        if not p:
            continue
        coords = []
        prev = None
        for x, y in p:
            if step and prev is not None:
                coords.append(f"{f.X(x):.1f},{f.Y(prev):.1f}")
            coords.append(f"{f.X(x):.1f},{f.Y(y):.1f}")
            prev = y
        # later series are thinner and dashed, so a curve equal to an earlier one stays visible
        dash = ' stroke-dasharray="7,4"' if s.get("dash", i % 2 == 1) else ""
        width_ = s.get("width", max(1.5, 3.5 - 1.0 * i))
        parts.append(f'<polyline fill="none" stroke="{color}" stroke-width="{width_}"{dash} points="{" ".join(coords)}"/>')
        if s.get("dots", len(p) <= 40):
            for x, y in p:
                parts.append(f'<circle cx="{f.X(x):.1f}" cy="{f.Y(y):.1f}" r="3" fill="{color}"/>')
        label = escape(s.get("label", ""))
        parts.append(f'<rect x="{legend_x}" y="{f.t - 2}" width="12" height="4" fill="{color}"/>')
        parts.append(f'<text x="{legend_x + 16}" y="{f.t + 3}" font-size="11">{label}</text>')
        legend_x += 24 + 6.5 * len(s.get("label", ""))
    for m in markers:
        color = m.get("color", "#000")
        x, y = f.X(m["x"]), f.Y(m["y"])
        parts.append(f'<circle cx="{x:.1f}" cy="{y:.1f}" r="8" fill="none" stroke="{color}" stroke-width="2"/>')
        anchor = "end" if x > width * 0.7 else "start"
        dx = -11 if anchor == "end" else 11
        parts.append(f'<text x="{x + dx:.1f}" y="{y + 16:.1f}" font-size="11" fill="{color}" text-anchor="{anchor}">{escape(m["label"])}</text>')
    return _wrap(parts, width, height)


def bar_chart(bars: Sequence[tuple[str, float | None]], *, title: str, ylabel: str,
              width: int = 720, height: int = 260, color: str = PALETTE[1], yfmt=_fmt,
              xlabel: str = "") -> str:
    """Categorical bars with value labels."""
    vals = [v for _, v in bars if v is not None]
    hi = max(vals) if vals else 1.0
    hi = hi * 1.15 if hi > 0 else 1.0
    f = Frame(width, height, 0, max(1, len(bars)), 0, hi, bottom=64)
    parts = f.axes(title, xlabel, ylabel, yfmt=yfmt, xticks=[])
    slot = (width - f.l - f.r) / max(1, len(bars))
    for i, (label, v) in enumerate(bars):
        x = f.l + i * slot + slot * 0.15
        w = slot * 0.7
        if v is not None:
            y = f.Y(v)
            parts.append(f'<rect x="{x:.1f}" y="{y:.1f}" width="{w:.1f}" height="{f.Y(0) - y:.1f}" fill="{color}"/>')
            parts.append(f'<text x="{x + w / 2:.1f}" y="{y - 4:.1f}" font-size="11" text-anchor="middle">{yfmt(v)}</text>')
        else:
            parts.append(f'<text x="{x + w / 2:.1f}" y="{f.Y(0) - 4:.1f}" font-size="11" text-anchor="middle" fill="#888">n/a</text>')
        parts.append(f'<text x="{x + w / 2:.1f}" y="{height - f.b + 16}" font-size="11" text-anchor="middle">{escape(label)}</text>')
    return _wrap(parts, width, height)


def timeline_bars(points: Sequence[tuple[float, float]], *, title: str, ylabel: str, xlabel: str,
                  width: int = 720, height: int = 200, color: str = PALETTE[1],
                  x_range: tuple[float, float] | None = None, bar_w: float | None = None) -> str:
    """Counts over time as thin bars (preemptions per window)."""
    if x_range is None:
        xs = [x for x, _ in points] or [0.0, 1.0]
        x_range = (min(xs), max(xs))
    hi = max([v for _, v in points] + [1])
    f = Frame(width, height, x_range[0], x_range[1], 0, hi * 1.1)
    parts = f.axes(title, xlabel, ylabel, yint=True)
    px = bar_w if bar_w is not None else max(2.0, (width - f.l - f.r) / max(60, len(points) or 1) * 0.8)
    for x, v in points:
        if not v:
            continue
        y = f.Y(v)
        parts.append(f'<rect x="{f.X(x) - px / 2:.1f}" y="{y:.1f}" width="{px:.1f}" height="{f.Y(0) - y:.1f}" fill="{color}"/>')
    if not any(v for _, v in points):
        parts.append(f'<text x="{width / 2}" y="{height / 2}" text-anchor="middle" fill="#888">none</text>')
    return _wrap(parts, width, height)
