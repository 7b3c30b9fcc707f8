"""What ``graphveil report`` reads: sweep folders and run directories, as cells and summary rows.

A *source* is one folder given on the command line:

* a sweep folder (``graphveil sweep`` / ``graphveil run`` with a ``sweep`` section): its
  ``results.jsonl`` lists the cells, each a complete run directory ``<eps…|nonprivate>/seed<k>``;
* a single run directory (``graphveil run``): ``privacy.json``, ``evaluation.json``,
  ``config.resolved.yaml``.

Every cell is one run: its metrics, and from its own ``privacy.json`` the claimed ε, δ, σ, unit
and accountant. A non-private run that trained no step is the *base* (e.g. the base encoder of the
relational demo); other non-private runs are the non-private baseline. Cells with the same
source, kind and target ε form one summary row: mean ± 95 % CI (Student t, n − 1 d.o.f., over
seeds, :func:`graphveil.run.runner.mean_ci95`) of each metric.
"""

from __future__ import annotations

import copy
import json
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from graphveil.contract.errors import ConfigError

#: the metric plotted when ``--metric`` is not given: the first of these every source holds, else
#: the first metric the sources' task declares
PREFERRED_METRICS = ("test_accuracy", "mrr")

PRIVATE, NONPRIVATE, BASE = "private", "non-private", "base"


class ReportError(ConfigError):
    """A folder ``graphveil report`` cannot read, or sources it cannot put in one report."""


@dataclass
class Cell:
    """One run of a source."""

    run_dir: Path
    kind: str  # PRIVATE, NONPRIVATE or BASE
    target_epsilon: float | None
    seed: int | None
    values: dict[str, float]  # the task's metrics
    privacy: dict[str, Any]  # the run's privacy.json
    config: dict[str, Any]  # the run's config.resolved.yaml

    @property
    def epsilon(self) -> float:
        """The ε the run claims (∞ for a non-private run)."""
        return _number(self.privacy.get("epsilon", math.inf))


@dataclass
class Source:
    """One folder given to ``graphveil report``."""

    path: Path
    label: str
    cells: list[Cell]
    metrics: list[tuple[str, str, str]] = field(default_factory=list)  # the task's (key, header, format)

    def private_runs(self) -> dict[float, Cell]:
        """Per claimed target ε (ε spent for a run without a target), its first private cell."""
        runs: dict[float, Cell] = {}
        for cell in self.cells:
            if cell.kind == PRIVATE:
                runs.setdefault(cell.target_epsilon if cell.target_epsilon is not None else cell.epsilon, cell)
        return dict(sorted(runs.items()))


@dataclass
class Row:
    """One line of the report's table: the cells of one (source, kind, target ε)."""

    source: str
    kind: str
    target_epsilon: float | None
    cells: list[Cell]
    stats: dict[str, tuple[float, float]]  # metric → (mean, 95 % CI half-width)

    @property
    def n(self) -> int:
        return len(self.cells)

    @property
    def epsilon(self) -> float:
        """The row's claim: the largest ε any of its runs claims."""
        return max(c.epsilon for c in self.cells)

    def spread(self, key: str) -> tuple[float, float] | None:
        """(min, max) of a privacy.json number over the row's runs; None if absent."""
        values = [c.privacy.get(key) for c in self.cells]
        numbers = [float(v) for v in values if isinstance(v, int | float) and not isinstance(v, bool)]
        return (min(numbers), max(numbers)) if numbers else None

    def distinct(self, key: str) -> str:
        """The distinct values of a privacy.json field over the row's runs, joined."""
        values = sorted({str(c.privacy.get(key)) for c in self.cells if c.privacy.get(key) is not None})
        return ", ".join(values) if values else "-"


def _number(value: Any) -> float:
    if isinstance(value, str) and value in ("inf", "-inf"):
        return float(value)
    return math.nan if value is None else float(value)


def _read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ReportError(f"{path}: missing (not a complete run directory)") from None
    except json.JSONDecodeError as exc:
        raise ReportError(f"{path}: not valid JSON ({exc})") from None


def _read_run(run_dir: Path, target_epsilon: float | None, seed: int | None,
              row: dict[str, Any] | None = None) -> Cell:
    """One run directory as a cell; ``row``: its line of a sweep's results.jsonl."""
    privacy = _read_json(run_dir / "privacy.json")
    evaluation = row if row is not None else _read_json(run_dir / "evaluation.json")
    try:
        config = yaml.safe_load((run_dir / "config.resolved.yaml").read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ReportError(f"{run_dir / 'config.resolved.yaml'}: missing (not a complete run directory)") from None
    values = {k: float(v) for k, v in evaluation.items()
              if isinstance(v, int | float) and not isinstance(v, bool)}
    if privacy.get("private"):
        kind = PRIVATE
    else:
        kind = BASE if privacy.get("steps") == 0 else NONPRIVATE
    return Cell(run_dir, kind, target_epsilon, seed, values, privacy, config)


def load_source(path: Path) -> Source:
    """A sweep folder or a run directory as a :class:`Source` (metrics not yet named).

    :raises ReportError: for a missing folder, an unfinished sweep, a folder that is neither,
        or one that holds no result.
    """
    path = Path(path)
    if not path.is_dir():
        partial = path.with_name(path.name + ".partial")
        hint = (f"; {partial} is an unfinished sweep: run its graphveil sweep command again with "
                f"--output {path} to finish it") if partial.is_dir() else ""
        raise ReportError(f"{path}: no such directory{hint}")
    if path.name.endswith(".partial"):
        raise ReportError(f"{path}: an unfinished run or sweep (its .partial folder); finish it first")
    results = path / "results.jsonl"
    if results.is_file():
        lines = [line for line in results.read_text(encoding="utf-8").splitlines() if line.strip()]
        if not lines:
            raise ReportError(f"{results}: holds no results")
        cells = []
        for number, line in enumerate(lines, 1):
            try:
                row = json.loads(line)
            except json.JSONDecodeError as exc:
                raise ReportError(f"{results}, line {number}: not valid JSON ({exc})") from None
            if not isinstance(row, dict) or "target_epsilon" not in row or "seed" not in row:
                raise ReportError(f"{results}, line {number}: not a sweep cell (no target_epsilon/seed); "
                                  "graphveil report reads sweep folders and run directories")
            eps = row["target_epsilon"]
            label = "nonprivate" if eps is None else f"eps{float(eps):g}"
            cells.append(_read_run(path / label / f"seed{row['seed']}", None if eps is None else float(eps),
                                   int(row["seed"]), row))
        name = cells[0].config.get("name", path.name).rsplit("-", 2)[0]  # <name>-<label>-seed<k>
        return Source(path, name, cells)
    if (path / "privacy.json").is_file():
        cell = _read_run(path, None, None)
        privacy_section = cell.config.get("privacy") or {}
        if cell.kind == PRIVATE and privacy_section.get("noise_multiplier") is None:
            cell.target_epsilon = privacy_section.get("target_epsilon")
        return Source(path, str(cell.config.get("name", path.name)), [cell])
    raise ReportError(f"{path}: neither a sweep folder (results.jsonl) nor a run directory (privacy.json)")


def resolved_raw(cell: Cell) -> dict[str, Any]:
    """The run's ``config.resolved.yaml`` as a config to validate again: without a sweep section, and
    without ``training.steps`` when the run planned its steps from ``training.epochs`` (the dump
    holds both; a sweep cell drops the same field)."""
    raw = {k: v for k, v in copy.deepcopy(cell.config).items() if k != "sweep"}
    training = raw.get("training") or {}
    if training.get("epochs") is not None:
        training.pop("steps", None)
    return raw


def name_metrics(sources: Sequence[Source], host: Any) -> None:
    """Set each source's metric columns from its task (the plugin that ran it declares them)."""
    from graphveil.run.config import config_from_dict
    from graphveil.run.session import TrainingSession

    for source in sources:
        cell = source.cells[0]
        config = config_from_dict(resolved_raw(cell), str(cell.run_dir))
        session = TrainingSession(config, host=host)
        session.assemble()  # no data read; the task configured as the run's was
        source.metrics = [(m.key, m.header, m.fmt) for m in session.task.metrics]


def choose_metric(sources: Sequence[Source], wanted: str | None) -> tuple[str, str, str]:
    """The metric to plot: ``wanted``, or :data:`PREFERRED_METRICS`' first that every source
    holds, else the first declared by every source.

    :raises ReportError: if ``wanted`` is missing from a source, or the sources share no metric.
    """
    def held(source: Source) -> list[str]:
        return [k for k, _, _ in source.metrics if all(k in c.values for c in source.cells)]

    common = [k for k in held(sources[0]) if all(k in held(s) for s in sources[1:])]
    if wanted is not None:
        missing = [str(s.path) for s in sources if wanted not in held(s)]
        if missing:
            raise ReportError(f"--metric {wanted!r} is not in the results of {', '.join(missing)} "
                              f"(metrics every source holds: {', '.join(common) or 'none'})")
        key = wanted
    elif not common:
        listing = "; ".join(f"{s.path} has {', '.join(held(s)) or 'none'}" for s in sources)
        raise ReportError(f"the sources hold no common metric, so they cannot share a plot ({listing}); "
                          "report them separately")
    else:
        key = next((k for k in PREFERRED_METRICS if k in common), common[0])
    return next(m for m in sources[0].metrics if m[0] == key)


def summarise(sources: Sequence[Source], metrics: Sequence[str]) -> list[Row]:
    """One row per (source, kind, target ε), in order: base, non-private, then private by ε."""
    from graphveil.run.runner import mean_ci95

    order = {BASE: 0, NONPRIVATE: 1, PRIVATE: 2}
    rows = []
    for source in sources:
        groups: dict[tuple[str, float | None], list[Cell]] = {}
        for cell in source.cells:
            eps = cell.target_epsilon if cell.target_epsilon is not None else (
                cell.epsilon if cell.kind == PRIVATE else None)
            groups.setdefault((cell.kind, eps), []).append(cell)
        for (kind, eps), cells in sorted(groups.items(), key=lambda g: (order[g[0][0]], g[0][1] or 0.0)):
            stats = {m: mean_ci95([c.values[m] for c in cells if m in c.values]) for m in metrics}
            rows.append(Row(source.label, kind, eps, cells, stats))
    return rows


def label_sources(sources: Sequence[Source]) -> None:
    """Make the sources' labels distinct (a config name given twice gets its folder's name)."""
    seen: dict[str, int] = {}
    for s in sources:
        seen[s.label] = seen.get(s.label, 0) + 1
    for s in sources:
        if seen[s.label] > 1:
            s.label = f"{s.label} ({s.path.name})"
