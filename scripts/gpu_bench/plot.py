"""Line charts for the report: a PNG through matplotlib where it is installed, else an SVG
written here, so a machine without matplotlib still gets its plot.

A chart is a few named series of (x, y) points sharing one x axis; x is drawn on a log2
scale when the values are powers of two apart (a sweep over -np), else linearly.
"""

from __future__ import annotations

import math
from pathlib import Path
from xml.sax.saxutils import escape

Series = dict[str, list[tuple[float, float]]]
COLORS = ("#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f")
WIDTH, HEIGHT = 720, 420
LEFT, RIGHT, TOP, BOTTOM = 70, 20, 40, 50


def line_chart(series: Series, stem: Path, title: str, xlabel: str, ylabel: str) -> Path | None:
    """Draw the chart to `stem`.png (matplotlib) or `stem`.svg; None when there is nothing to draw."""
    series = {name: sorted(points) for name, points in series.items() if points}
    if not series:
        return None
    try:  # appended, not with_suffix: a stem like "model.gguf-throughput" keeps its name
        return png_chart(series, stem.with_name(stem.name + ".png"), title, xlabel, ylabel)
    except ImportError:
        return svg_chart(series, stem.with_name(stem.name + ".svg"), title, xlabel, ylabel)


def _log_x(series: Series) -> bool:
    xs = sorted({x for points in series.values() for x, _ in points})
    return len(xs) > 2 and xs[0] > 0 and xs[-1] / xs[0] >= 8


def png_chart(series: Series, path: Path, title: str, xlabel: str, ylabel: str) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7.2, 4.2))
    for i, (name, points) in enumerate(series.items()):
        ax.plot([x for x, _ in points], [y for _, y in points], "o-", ms=4, color=COLORS[i % len(COLORS)], label=name)
    xs = sorted({x for points in series.values() for x, _ in points})
    if _log_x(series):
        ax.set_xscale("log", base=2)
    ax.set_xticks(xs)
    ax.set_xticklabels([f"{x:g}" for x in xs])
    ax.set_ylim(bottom=0)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def nice_ticks(top: float, count: int = 5) -> list[float]:
    """0 and multiples of a 1, 2 or 5 step, up to at least `top`."""
    if top <= 0:
        return [0.0, 1.0]
    raw = top / count
    magnitude = 10 ** math.floor(math.log10(raw))
    step = next(m * magnitude for m in (1, 2, 5, 10) if m * magnitude >= raw)
    return [i * step for i in range(int(math.ceil(top / step)) + 1)]


def svg_chart(series: Series, path: Path, title: str, xlabel: str, ylabel: str) -> Path:
    xs = sorted({x for points in series.values() for x, _ in points})
    log = _log_x(series)
    ticks = nice_ticks(max(y for points in series.values() for _, y in points))
    plot_w, plot_h = WIDTH - LEFT - RIGHT, HEIGHT - TOP - BOTTOM

    def sx(x: float) -> float:
        """Points stay 5% clear of the frame's sides."""
        lo, hi = (math.log2(xs[0]), math.log2(xs[-1])) if log else (xs[0], xs[-1])
        v = math.log2(x) if log else x
        inner = plot_w * 0.9
        return LEFT + plot_w * 0.05 + (inner * (v - lo) / (hi - lo) if hi > lo else inner / 2)

    def sy(y: float) -> float:
        return TOP + plot_h * (1 - y / ticks[-1])

    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{HEIGHT}" '
           f'font-family="sans-serif" font-size="12">',
           f'<rect width="{WIDTH}" height="{HEIGHT}" fill="white"/>',
           f'<text x="{WIDTH / 2}" y="22" text-anchor="middle" font-size="14">{escape(title)}</text>']
    for t in ticks:
        out.append(f'<line x1="{LEFT}" y1="{sy(t):.1f}" x2="{WIDTH - RIGHT}" y2="{sy(t):.1f}" stroke="#ddd"/>')
        out.append(f'<text x="{LEFT - 6}" y="{sy(t) + 4:.1f}" text-anchor="end">{t:g}</text>')
    for x in xs:
        out.append(f'<line x1="{sx(x):.1f}" y1="{TOP}" x2="{sx(x):.1f}" y2="{TOP + plot_h}" stroke="#eee"/>')
        out.append(f'<text x="{sx(x):.1f}" y="{TOP + plot_h + 16}" text-anchor="middle">{x:g}</text>')
    out.append(f'<rect x="{LEFT}" y="{TOP}" width="{plot_w}" height="{plot_h}" fill="none" stroke="#333"/>')
    out.append(f'<text x="{LEFT + plot_w / 2}" y="{HEIGHT - 12}" text-anchor="middle">{escape(xlabel)}</text>')
    out.append(f'<text x="16" y="{TOP + plot_h / 2}" text-anchor="middle" '
               f'transform="rotate(-90 16 {TOP + plot_h / 2})">{escape(ylabel)}</text>')
    for i, (name, points) in enumerate(series.items()):
        color = COLORS[i % len(COLORS)]
        coords = " ".join(f"{sx(x):.1f},{sy(y):.1f}" for x, y in points)
        out.append(f'<polyline points="{coords}" fill="none" stroke="{color}" stroke-width="2"/>')
        out += [f'<circle cx="{sx(x):.1f}" cy="{sy(y):.1f}" r="3.5" fill="{color}"/>' for x, y in points]
        ly = TOP + 16 + 18 * i
        out.append(f'<line x1="{LEFT + 12}" y1="{ly - 4}" x2="{LEFT + 36}" y2="{ly - 4}" stroke="{color}" '
                   f'stroke-width="2"/>')
        out.append(f'<text x="{LEFT + 42}" y="{ly}">{escape(name)}</text>')
    out.append("</svg>")
    path.write_text("\n".join(out) + "\n")
    return path
