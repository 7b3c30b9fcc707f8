"""``graphveil report``: a markdown report with privacy–utility plots of sweeps and runs.

    graphveil report RUN_DIR... [--output DIR] [--metric KEY] [--no-progress]

Each RUN_DIR is a sweep folder (``graphveil sweep``) or a single run directory. Writes into
``--output`` (default: the first RUN_DIR's ``report/``) ``report.md`` with the table — per
(source, privacy setting): n runs, mean ± 95 % CI over seeds (Student t) of each metric, the
claimed ε, δ, σ, privacy unit and accountant — and three PNGs it embeds:

* ``utility_vs_epsilon.png``: the metric against ε, one line per source, the non-private
  baseline as a band, the base (no training) and majority class as dotted lines;
* ``epsilon_vs_steps.png``: ε after t steps at each private run's σ, from the run's accountant;
* ``sigma_vs_epsilon.png``: σ calibrated for a target ε by every accountant that applies to the
  config (:mod:`graphveil.apps.report_accounting`, the code ``graphveil privacy`` runs).
"""

from __future__ import annotations

import argparse
import math
import shutil
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from graphveil.apps.report_data import (
    BASE,
    NONPRIVATE,
    PRIVATE,
    ReportError,
    Row,
    Source,
    choose_metric,
    label_sources,
    load_source,
    name_metrics,
    summarise,
)
from graphveil.contract.errors import PrivacyError

FILES = {"utility": "utility_vs_epsilon.png", "steps": "epsilon_vs_steps.png", "sigma": "sigma_vs_epsilon.png"}


def add_report_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Add ``report`` to a ``graphveil`` sub-parser set."""
    p = subparsers.add_parser("report", help="markdown report and privacy–utility plots of sweeps and runs",
                              description=__doc__.split("\n\n")[0])
    p.add_argument("run_dirs", nargs="+", metavar="RUN_DIR", help="sweep folders and/or run directories")
    p.add_argument("--output", help="folder for report.md and the PNGs (default: the first RUN_DIR's report/)")
    p.add_argument("--metric", help="the metric to plot, e.g. test_accuracy, mrr, prec1 "
                                    "(default: test_accuracy or mrr, whichever the results hold)")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.set_defaults(func=cmd_report)
    return p


def cmd_report(args: argparse.Namespace) -> int:
    from graphveil.contract.host import default_host

    out = Path(args.output) if args.output else Path(args.run_dirs[0]) / "report"
    report = build_report([Path(p) for p in args.run_dirs], out, metric=args.metric, host=default_host(),
                          progress=not args.no_progress)
    print(report["table"])
    print(f"report: {report['path']}")
    return 0


# ------------------------------------------------------------------------------------ building


def build_report(paths: Sequence[Path], output: Path, *, metric: str | None = None, host: Any = None,
                 progress: bool = False) -> dict[str, Any]:
    """Read the sources, compute the curves, write ``output/report.md`` and the PNGs.

    :returns: ``path`` (report.md), ``figures`` (name → Figure), ``rows``, ``metric``, ``table``
        (the markdown table), ``curves`` (the numbers drawn).
    :raises ReportError: on a folder that cannot be read, sources without a common metric, or an
        output folder that holds something other than an earlier report.
    """
    from graphveil.apps import report_plots as plots
    from graphveil.contract.host import default_host

    host = host or default_host()
    output = Path(output)
    if output.exists() and any(output.iterdir()) and not (output / "report.md").is_file():
        raise ReportError(f"--output {output} exists and is not an earlier report; choose another folder")
    sources = [load_source(p) for p in paths]
    label_sources(sources)
    name_metrics(sources, host)
    key, header, fmt = choose_metric(sources, metric)
    metrics = [key] + [k for k, _, _ in sources[0].metrics
                       if k != key and all(k in {m for m, _, _ in s.metrics} for s in sources[1:])]
    rows = summarise(sources, metrics)
    headers = {k: h for k, h, _ in sources[0].metrics}
    formats = {k: f for k, _, f in sources[0].metrics}
    scale = 100.0 if key.endswith("accuracy") else 1.0
    unit = f"{header} (%)" if scale == 100.0 else header

    curves = account(sources, progress=progress, host=host)
    several = len(sources) > 1
    figures = {
        "utility": plots.utility_figure(*utility_series(sources, rows, key, scale), metric=unit,
                                        title=f"{unit} vs ε (mean ± 95 % CI over seeds)"),
        "steps": plots.epsilon_steps_figure(
            [plots.Series(c["label"] if several else c["label"].split(": ", 1)[-1], c["steps"], c["epsilon"])
             for c in curves["steps"]],
            [(c["run_steps"], c["run_epsilon"]) for c in curves["steps"]],
            delta_text=_delta_text(curves["steps"]), title="ε vs DP-SGD steps (each run's accountant)"),
        "sigma": plots.sigma_figure(
            [plots.Series(c["label"] if several else c["label"].split(": ", 1)[-1], c["targets"], c["sigma"])
             for c in curves["sigma"]],
            [m for c in curves["sigma"] for m in c["runs"]],
            title="σ calibrated for a target ε (at each config's steps and δ)"),
    }
    table = markdown_table(rows, metrics, headers, formats)
    text = report_markdown(sources, rows, table, curves, key=key, unit=unit)

    staging = output.with_name(output.name + ".partial")
    if staging.exists():
        shutil.rmtree(staging)
    staging.mkdir(parents=True)
    try:
        for name, fig in figures.items():
            plots.save(fig, staging / FILES[name])
        (staging / "report.md").write_text(text, encoding="utf-8")
        if output.exists():
            shutil.rmtree(output)  # an earlier report (checked above)
        staging.rename(output)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return {"path": output / "report.md", "figures": figures, "rows": rows, "metric": key, "table": table,
            "curves": curves}


def account(sources: Sequence[Source], *, progress: bool, host: Any) -> dict[str, list[dict[str, Any]]]:
    """ε-after-t-steps curves (one per source and target ε) and σ-for-target curves (one per
    source and applicable accountant), each from the runs' own accounting."""
    from tqdm.auto import tqdm

    from graphveil.apps.report_accounting import RunAccounting, steps_grid, targets_grid

    steps, sigma = [], []
    jobs = [(s, eps, cell) for s in sources for eps, cell in s.private_runs().items()]
    bar = tqdm(total=len(jobs), disable=not progress, desc="accounting", unit="run", dynamic_ncols=True)
    firsts: dict[str, tuple[Source, RunAccounting]] = {}
    for source, eps, cell in jobs:
        accounting = RunAccounting.of(cell, host)
        firsts.setdefault(source.label, (source, accounting))
        if accounting.trains_privately:
            grid = steps_grid(accounting.steps)
            steps.append({"label": f"{source.label}: ε={eps:g} (σ={accounting.sigma:.3g})", "source": source.label,
                          "target_epsilon": eps, "sigma": accounting.sigma, "delta": accounting.delta,
                          "steps": grid, "epsilon": accounting.epsilons_after(grid),
                          "run_steps": accounting.steps, "run_epsilon": cell.epsilon, "run_dir": str(cell.run_dir)})
        bar.update(1)
    bar.close()
    for label, (source, accounting) in firsts.items():
        targets = targets_grid(list(source.private_runs()))
        names = accounting.applicable_accountants()
        bar = tqdm(total=len(targets) * len(names), disable=not progress, desc=f"σ curves ({label})",
                   unit="σ", dynamic_ncols=True)
        for name in names:
            values = []
            for target in targets:
                try:
                    values.append(accounting.calibrate(target, name))
                except PrivacyError:  # no σ in the accountant's range meets this target
                    values.append(math.nan)
                bar.update(1)
            runs = [(eps, float(c.privacy["noise_multiplier"])) for eps, c in source.private_runs().items()
                    if c.privacy.get("accountant") == name]
            if any(math.isfinite(v) for v in values):
                sigma.append({"label": f"{label}: {name}", "source": label, "accountant": name,
                              "targets": targets, "sigma": values, "runs": runs,
                              "steps": accounting.steps, "delta": accounting.delta})
        bar.close()
    return {"steps": steps, "sigma": sigma}


def utility_series(sources: Sequence[Source], rows: Sequence[Row], key: str, scale: float) -> tuple[list, list]:
    """The utility figure's lines (private rows per source) and horizontal references."""
    from graphveil.apps.report_plots import Level, Series

    series, levels = [], []
    for source in sources:
        mine = [r for r in rows if r.source == source.label]
        private = [r for r in mine if r.kind == PRIVATE]
        if private:
            series.append(Series(f"{source.label}, DP (mean ± 95 % CI)", [r.target_epsilon for r in private],
                                 [r.stats[key][0] * scale for r in private],
                                 [r.stats[key][1] * scale for r in private], group=source.label))
        for r in mine:
            mean, half = r.stats[key]
            if r.kind == NONPRIVATE:
                levels.append(Level(f"{source.label} non-private (± 95 % CI, n={r.n})", mean * scale, half * scale,
                                    group=source.label))
            elif r.kind == BASE:
                levels.append(Level(f"{source.label} base, no training (n={r.n})", mean * scale, style="dotted",
                                    group=source.label))
        majority = [c.values["majority_accuracy"] for c in source.cells if "majority_accuracy" in c.values]
        if key.endswith("accuracy") and majority:
            levels.append(Level(f"{source.label} majority class", sum(majority) / len(majority) * scale,
                                style="dotted"))
    if not series and not levels:
        raise ReportError("no run holds the metric to plot")
    return series, levels


# ------------------------------------------------------------------------------------ markdown


def _fmt(value: tuple[float, float], spec: str, scale: float) -> str:
    mean, half = value
    if math.isnan(mean):
        return "-"
    text = format(mean * scale, spec)
    return text if math.isnan(half) else f"{text} ± {format(half * scale, spec)}"


def _span(value: tuple[float, float] | None, spec: str) -> str:
    if value is None:
        return "-"
    lo, hi = value
    return format(lo, spec) if lo == hi else f"{format(lo, spec)}–{format(hi, spec)}"


def markdown_table(rows: Sequence[Row], metrics: Sequence[str], headers: dict[str, str],
                   formats: dict[str, str]) -> str:
    """One line per row: source, privacy setting, n, each metric (mean ± 95 % CI), then the claim."""
    def metric_header(k: str) -> str:
        return f"{headers.get(k, k)} (%)" if k.endswith("accuracy") else headers.get(k, k)

    cols = ["source", "privacy", "n", *(metric_header(k) for k in metrics), "ε claimed", "δ", "σ", "steps",
            "unit", "accountant"]
    lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    for r in rows:
        setting = (f"ε = {r.target_epsilon:g}" if r.kind == PRIVATE
                   else {NONPRIVATE: "non-private", BASE: "base (no training)"}[r.kind])
        private = r.kind == PRIVATE
        cells = [r.source, setting, str(r.n)]
        for k in metrics:
            pct = k.endswith("accuracy")
            cells.append(_fmt(r.stats[k], ".2f" if pct else formats.get(k, ".4f"), 100.0 if pct else 1.0))
        cells += [f"{r.epsilon:.3f}" if private else "∞",
                  _span(r.spread("delta"), ".0e") if private else "-",
                  _span(r.spread("noise_multiplier"), ".3f") if private else "-",
                  _span(r.spread("steps"), ".0f"),
                  r.distinct("unit") if private else "-",
                  r.distinct("accountant") if private else "- (non-private)"]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _delta_text(curves: Sequence[dict[str, Any]]) -> str:
    deltas = sorted({c["delta"] for c in curves})
    return f"δ = {deltas[0]:.0e}" if len(deltas) == 1 else "at each run's δ"


def report_markdown(sources: Sequence[Source], rows: Sequence[Row], table: str,
                    curves: dict[str, list[dict[str, Any]]], *, key: str, unit: str) -> str:
    seeds = sorted({r.n for r in rows})
    listing = "\n".join(f"- **{s.label}**: `{s.path}` ({len(s.cells)} run{'s' * (len(s.cells) != 1)})"
                        for s in sources)
    steps_note = ("; ".join(f"{c['label']}: {c['run_steps']} steps, ε = {c['run_epsilon']:.4g}" for c in curves["steps"])
                  or "no private run trains with DP-SGD")
    sigma_note = ("; ".join(f"{c['label']} at {c['steps']} steps, δ = {c['delta']:.0e}" for c in curves["sigma"])
                  or "no private run takes a calibrated σ")
    return f"""# Privacy–utility report

Sources:
{listing}

## {unit} against ε

![{unit} against ε]({FILES['utility']})

Mean ± 95 % confidence interval over seeds (Student t, n − 1 degrees of freedom; n runs per row:
{', '.join(map(str, seeds))}). Each seed sets the sampling, the split key and the initialisation; the
DP noise is fresh in every run. ε claimed is the largest ε the row's runs report in their
`privacy.json` (each at most its target); σ and steps give the range over the row's runs.
Plotted metric: `{key}`.

{table}

## ε against training steps

![ε against DP-SGD steps]({FILES['steps']})

Each run's own accountant, bound as in the run, re-evaluated after t steps at the run's σ and δ
(releases, if any, composed as in the run); the stars are the runs' claims ({steps_note}).

## σ against the target ε

![σ against the target ε]({FILES['sigma']})

The noise multiplier that each accountant applicable to the config calibrates for a target ε, by
the code `graphveil privacy calibrate` runs ({sigma_note}); the stars are the runs' own (ε, σ).
"""
