"""Markdown pieces of the report: numbers, milliseconds, ratios and tables, formatted alike
in every section."""

from __future__ import annotations

from typing import Any


def fmt(v: Any, digits: int = 2) -> str:
    if v is None:
        return "-"
    if isinstance(v, bool):
        return "yes" if v else "no"
    if isinstance(v, int):
        return f"{v:,}"
    if isinstance(v, float):
        if v.is_integer() and abs(v) >= 1:
            return f"{int(v):,}"
        if abs(v) >= 1000:
            return f"{v:,.0f}"
        if abs(v) >= 100:
            return f"{v:.0f}"
        return f"{v:.{digits}f}"
    return str(v)


def ms(v: float | None) -> str:
    return "-" if v is None else f"{v * 1000:,.0f}"


def ratio(a: float | None, b: float | None) -> float | None:
    """a / b, None when either is missing or b is 0."""
    if a is None or not b:
        return None
    return a / b


def rx(v: float | None) -> str:
    return "-" if v is None else f"{v:.2f}x"


def table(headers: list[str], rows: list[list[Any]]) -> str:
    out = ["| " + " | ".join(headers) + " |", "|" + "|".join("---" for _ in headers) + "|"]
    for row in rows:
        out.append("| " + " | ".join(c if isinstance(c, str) else fmt(c) for c in row) + " |")
    return "\n".join(out)


def verdict(ok: bool | None) -> str:
    return "n/a" if ok is None else ("**met**" if ok else "**not met**")


def counter_value(name: str, value: float) -> str:
    """Bytes in MB, seconds with 3 decimals, counts as integers."""
    if "bytes" in name:
        return f"{value / 1e6:,.1f} MB"
    if "seconds" in name:
        return f"{value:,.3f} s"
    return f"{int(value):,}" if float(value).is_integer() else fmt(value)


def counters_table(columns: dict[str, dict[str, float]]) -> str:
    """One row per counter that moved in any column (a run), one column per run; '' if none moved."""
    names = sorted({k for delta in columns.values() for k, v in delta.items() if v})
    if not names:
        return ""
    rows = [[f"`{n}`"] + [counter_value(n, delta[n]) if n in delta else "-" for delta in columns.values()]
            for n in names]
    return table(["counter (change over the run)", *columns], rows)
