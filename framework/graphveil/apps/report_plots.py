"""The three figures of ``graphveil report`` (matplotlib, no pyplot state: each call returns its
own :class:`~matplotlib.figure.Figure`, which tests inspect and :func:`save` writes as PNG).

* :func:`utility_figure` — the metric against the claimed ε (log x), mean with 95 % CI error bars
  over seeds, one line per source; the non-private baseline as a horizontal band (mean ± CI), the
  base (no training) and the majority-class accuracy as dotted lines;
* :func:`epsilon_steps_figure` — ε after t steps at each run's σ, one line per (source, target ε),
  the run's own (steps, ε) marked;
* :func:`sigma_figure` — the σ each accountant calibrates for a target ε (log-log), one line per
  (source, accountant), the runs' (ε, σ) marked.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from matplotlib.figure import Figure
from matplotlib.ticker import FuncFormatter, LogLocator, MaxNLocator, NullFormatter

#: README-sized figures: 7 × 4.4 in at 150 dpi is 1050 × 660 px
SIZE = (7.0, 4.4)
DPI = 150
_MARKERS = "osD^vP*X"
_STYLES = ("-", "--", ":", "-.")


@dataclass
class Series:
    """One line: points (x, y, CI half-width of y or nan) and its legend label."""

    label: str
    x: list[float]
    y: list[float]
    err: list[float] | None = None
    group: str = ""  # references (Level) of the same group share its colour


@dataclass
class Level:
    """A horizontal reference: value ± half-width (nan: a line without band)."""

    label: str
    value: float
    half: float = math.nan
    style: str = "band"  # "band" (non-private baseline) or "dotted" (base, majority class)
    group: str = ""


def _figure() -> tuple[Figure, object]:
    fig = Figure(figsize=SIZE, dpi=DPI, layout="constrained")
    ax = fig.add_subplot()
    ax.grid(True, which="major", alpha=0.3)
    return fig, ax


def _log_x(ax: object, values: Sequence[float]) -> None:
    """Log x with the plotted values themselves as tick labels (1, 2, 4, 8, 16 rather than 10^0)."""
    ax.set_xscale("log")
    ticks = sorted({v for v in values if v > 0 and math.isfinite(v)})
    if ticks:  # a margin of a third of an octave-ish on both sides, also around a single point
        ax.set_xlim(ticks[0] / 1.4, ticks[-1] * 1.4)
    if 0 < len(ticks) <= 10:
        ax.set_xticks(ticks)
        ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
        ax.xaxis.set_minor_formatter(NullFormatter())
    else:
        ax.xaxis.set_major_locator(LogLocator())


def utility_figure(series: Sequence[Series], levels: Sequence[Level], *, metric: str, title: str) -> Figure:
    """The metric (y, ``metric`` names it with its unit) against the claimed ε (log x)."""
    fig, ax = _figure()
    colors = {}
    for i, s in enumerate(series):
        err = [e if math.isfinite(e) else 0.0 for e in s.err] if s.err else None
        container = ax.errorbar(s.x, s.y, yerr=err, marker=_MARKERS[i % len(_MARKERS)], capsize=4,
                                linewidth=1.8, markersize=6, label=s.label)
        colors.setdefault(s.group or s.label, container.lines[0].get_color())
    for i, level in enumerate(levels):
        color = colors.get(level.group, f"C{len(series) + i}")
        if level.style == "band":
            ax.axhline(level.value, color=color, linestyle="--", linewidth=1.4, label=level.label)
            if math.isfinite(level.half):
                ax.axhspan(level.value - level.half, level.value + level.half, color=color, alpha=0.15)
        else:
            ax.axhline(level.value, color="0.35" if "majority" in level.label else color,
                       linestyle=":", linewidth=1.6, label=level.label)
    _log_x(ax, [x for s in series for x in s.x])
    ax.set_xlabel("target ε (each run claims ε ≤ target; log scale)")
    ax.set_ylabel(metric)
    ax.set_title(title)
    ax.legend(fontsize="small", loc="best")
    return fig


def epsilon_steps_figure(series: Sequence[Series], marks: Sequence[tuple[float, float]], *,
                         delta_text: str, title: str) -> Figure:
    """ε (y) against DP-SGD steps (x); ``marks`` are the runs' own (steps, ε)."""
    fig, ax = _figure()
    for s in series:
        ax.plot(s.x, s.y, linewidth=1.8, label=s.label)
    if marks:
        ax.plot([m[0] for m in marks], [m[1] for m in marks], linestyle="none", marker="*", markersize=11,
                color="black", label="the runs' claimed ε")
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_xlabel("DP-SGD steps at the run's σ")
    ax.set_ylabel(f"ε spent ({delta_text})")
    ax.set_xlim(left=0)
    ax.set_ylim(bottom=0)
    ax.set_title(title)
    ax.legend(fontsize="small", loc="upper left")
    return fig


def sigma_figure(series: Sequence[Series], marks: Sequence[tuple[float, float]], *, title: str) -> Figure:
    """σ (y, log) against the target ε (x, log); ``marks`` are the runs' own (ε, σ)."""
    fig, ax = _figure()
    for i, s in enumerate(series):
        # dashed after the first: two accountants with the same analysis draw the same curve
        ax.plot(s.x, s.y, marker=_MARKERS[i % len(_MARKERS)], markersize=5, linewidth=1.8, label=s.label,
                linestyle=_STYLES[i % len(_STYLES)])
    if marks:
        ax.plot([m[0] for m in marks], [m[1] for m in marks], linestyle="none", marker="*", markersize=11,
                color="black", label="the runs' (ε, σ)")
    _log_x(ax, [x for s in series for x in s.x])
    ax.set_yscale("log")
    ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:.3g}"))
    ax.yaxis.set_minor_formatter(FuncFormatter(_sparse_minor))
    ax.set_xlabel("target ε (log scale)")
    ax.set_ylabel("noise multiplier σ (noise std σ·C, log scale)")
    ax.set_title(title)
    ax.legend(fontsize="small", loc="upper right")
    return fig


def _sparse_minor(value: float, _pos: int) -> str:
    """Minor log ticks labelled at 2, 3 and 5 of each decade only (9 labels a decade crowd)."""
    if value <= 0:
        return ""
    mantissa = value / 10 ** math.floor(math.log10(value))
    return f"{value:.3g}" if any(math.isclose(mantissa, m, rel_tol=1e-6) for m in (2, 3, 5)) else ""


def save(fig: Figure, path: Path) -> Path:
    """Write ``fig`` as a PNG (Agg canvas, no display needed)."""
    fig.savefig(path, dpi=DPI, format="png")
    return path
