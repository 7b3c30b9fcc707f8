"""``graphveil run``: one configured session (or a sweep of them) from YAML to complete run directories."""

from __future__ import annotations

import json
import math
import statistics
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
import yaml

from graphveil.contract.errors import ConfigError
from graphveil.contract.host import PluginHost, default_host, read_only
from graphveil.data.loaders import DataOptions
from graphveil.run.config import RunConfig, config_from_dict
from graphveil.run.outputs import RunDirectory, dumps, format_table
from graphveil.run.records_store import RecordsStore
from graphveil.run.session import TrainingSession, assembled_data_options, resolved_config

if TYPE_CHECKING:
    from graphveil.engine.data_parallel import DataParallel

TAIL_COLUMNS = [
    ("epsilon", "ε spent", ".3f"), ("noise_multiplier", "σ", ".3f"), ("steps", "steps", "d"),
    ("seconds", "time (s)", ".0f"),
]


def result_columns(session: TrainingSession) -> list[tuple[str, str, str]]:
    """The run table's columns: name, the task's metrics, ε, σ, steps, time."""
    metrics = [(m.key, m.header, m.fmt) for m in session.task.metrics]
    return [("name", "run", ""), *metrics, *TAIL_COLUMNS]


def planned_unit(config: RunConfig, host: PluginHost | None = None) -> str | None:
    """The privacy unit a run of ``config`` reports (``privacy.json``'s ``unit``), from its
    assembled components before any data is read; ``None`` for a run without privacy."""
    if not config.privacy.enabled:
        return None
    session = TrainingSession(config, host=host)
    session.assemble()
    return session.sampler.unit.value


def run_training(config: RunConfig, *, host: PluginHost | None = None,
                 graph: Any = None,
                 session: TrainingSession | None = None,
                 records_store: RecordsStore | None = None,
                 data_parallel: DataParallel | None = None) -> dict[str, Any] | None:
    """Assemble (refusing mismatches before any data is read), prepare, train, evaluate, save.

    ``data_parallel`` (``graphveil run --nproc``): this process is one rank of a group that
    splits every step (:class:`TrainingSession`); rank 0 alone evaluates and writes the run
    directory, the other ranks train and return ``None``.

    ``config.resolved.yaml`` holds the validated config (the data source's full option set as
    the assembly validated it, :func:`~graphveil.run.session.resolved_config`): the sampling
    seed only if the user fixed one, a noise seed only if the user set
    ``privacy.research_noise_seed`` (recorded in
    ``privacy.json`` too); CSPRNG noise has no seed to write. ``records_store`` keeps the
    degree-capped Ē across runs on the same graph (see :class:`TrainingSession`).

    The run directory appears under its final name only when everything has been written.
    """
    if config.threads:
        torch.set_num_threads(config.threads)
    started = time.perf_counter()
    session = session or TrainingSession(config, host=host, graph=graph, records_store=records_store,
                                         data_parallel=data_parallel)
    session.assemble()
    session.prepare()
    if not session.writes:  # a data-parallel rank > 0: its steps are rank 0's; nothing to write
        session.train()
        return None
    out = RunDirectory(config.output.dir or RunDirectory.default_for(config.name))
    try:
        out.write_yaml("config.resolved.yaml", session.resolved_config())
        train = session.train(on_step=lambda _s, m: out.log_metrics(m))
        evaluation = session.evaluate()
        report = session.privacy_report()
        out.write_json("privacy.json", report)
        out.write_json("evaluation.json", evaluation)
        session.encoder.save(out.path / ("adapter" if session.task.model_family == "encoder" else "model"))
        row = {"name": config.name, **evaluation, "epsilon": report["epsilon"],
               # no Gaussian noise (non-private, or a release with its own mechanism): σ shows as "-"
               "noise_multiplier": report["noise_multiplier"] or None, "steps": train["steps"],
               "seconds": time.perf_counter() - started}
        out.log_metrics({"final": True, **row})
        session.host.hook.graphveil_run_end(run_dir=out.final, report=read_only({**report, **evaluation}))
        run_dir = out.commit()
    except BaseException:
        out.discard()
        raise
    return {"run_dir": run_dir, "row": row, "table": format_table([row], result_columns(session)),
            "session": session}


# ------------------------------------------------------------------------------------ sweeps


def read_cells(paths: Sequence[Path], key: Callable[[dict[str, Any]], str]) -> dict[str, dict[str, Any]]:
    """The result lines of resumable JSON-lines files (benchmarks), one per ``key(cell)``; later
    files and lines win. Missing files count as empty."""
    cells: dict[str, dict[str, Any]] = {}
    for path in paths:
        if Path(path).is_file():
            for line in Path(path).read_text().splitlines():
                if line.strip():
                    cell = json.loads(line)
                    cells[key(cell)] = cell
    return cells


def mean_ci95(values: list[float]) -> tuple[float, float]:
    """Mean and the half-width of its 95 % confidence interval (Student t, n − 1 d.o.f.).

    One value gives a half-width of ``nan`` (no spread to estimate).
    """
    from scipy import stats

    clean = [v for v in values if v is not None and not math.isnan(v)]
    if not clean:
        return math.nan, math.nan
    mean = statistics.fmean(clean)
    if len(clean) < 2 or not math.isfinite(mean):  # one value, or ε = ∞ of non-private runs
        return mean, math.nan
    half = float(stats.t.ppf(0.975, len(clean) - 1)) * statistics.stdev(clean) / math.sqrt(len(clean))
    return mean, half


def sweep_cell(config: RunConfig, target_epsilon: float | None, seed: int, out_dir: Path,
               host: PluginHost) -> RunConfig:
    """The config of one (ε, seed) cell: seed for sampling, split key and (if the model takes
    a ``seed`` option) model initialisation."""
    raw = config.model_dump(mode="json", exclude={"sweep"})
    if config.training.epochs is not None:
        del raw["training"]["steps"]  # planned from the epochs once the data is read
    raw["seed"] = seed
    raw["data"]["split"]["seed"] = seed
    section = "encoder" if config.encoder is not None else "model"
    if "seed" in host.get(section, config.network.name).params_model.model_fields:
        raw[section]["seed"] = seed
    if target_epsilon is None:
        raw["privacy"] = {"enabled": False}
    else:
        raw["privacy"] = {**raw["privacy"], "enabled": True, "target_epsilon": target_epsilon,
                          "noise_multiplier": None}
    label = "nonprivate" if target_epsilon is None else f"eps{target_epsilon:g}"
    raw["name"] = f"{config.name}-{label}-seed{seed}"
    raw["output"]["dir"] = str(out_dir / label / f"seed{seed}")
    # the cell's data options are checked at its assemble: their errors name the sweep's file
    return config_from_dict(raw, f"{config.name} sweep cell ({label}, seed {seed})").from_origin(config.origin)


def run_sweep(config: RunConfig, *, host: PluginHost | None = None, graph: Any = None,
              resume: bool = False) -> dict[str, Any]:
    """Run every (target ε, seed) cell of ``config.sweep``; one table row per ε with mean ± 95 % CI.

    Each cell is a complete run directory under ``<output.dir>/<eps…|nonprivate>/seed<k>``; the
    sweep folder also gets ``results.jsonl`` (one line per cell) and ``table.txt``. The folder
    appears under its final name only when every cell has finished.

    ``resume`` (``graphveil sweep``): the ``<output.dir>.partial`` folder of an earlier attempt is
    kept, each of its complete cells (a run directory exists under its final name only once
    complete) is read instead of run, and a sweep that stops keeps its partial folder.

    :raises ConfigError: if a complete cell was run with another config than this sweep's.
    """
    if config.sweep is None:
        raise ValueError("config has no sweep section")
    host = host or default_host()
    # every cell has this data section (its split key aside): a bad option is refused before the
    # sweep folder opens (each cell's run checks its own again when it is assembled)
    data_options = assembled_data_options(config, host, reads_data=graph is None)
    final = Path(config.output.dir or RunDirectory.default_for(config.name))
    out = RunDirectory(final, resume=resume)
    columns, cells = None, []
    progress = _cell_progress(len(config.sweep.target_epsilon) * len(config.sweep.seeds),
                              config.output.progress, config.name)
    try:
        for eps in config.sweep.target_epsilon:
            for seed in config.sweep.seeds:
                cell = sweep_cell(config, eps, seed, out.path, host)
                row = completed_cell(cell, data_options) if resume else None
                if row is None:
                    result = run_training(cell, host=host, graph=graph)
                    columns = columns or result_columns(result["session"])
                    row = result["row"]
                    out.log_metrics({"target_epsilon": eps, "seed": seed, **row})  # a kept cell is logged already
                cells.append({"target_epsilon": eps, "seed": seed, **row})
                progress.update(1)
        if columns is None:  # every cell was read from an earlier attempt: the task names the metrics
            session = TrainingSession(sweep_cell(config, None, config.sweep.seeds[0], out.path, host), host=host)
            session.assemble()
            columns = result_columns(session)
        rows = [_summary_row(eps, [c for c in cells if c["target_epsilon"] == eps], columns)
                for eps in config.sweep.target_epsilon]
        (out.path / "results.jsonl").write_text("".join(dumps(c) + "\n" for c in cells), encoding="utf-8")
        table = _sweep_table(rows, columns, len(config.sweep.seeds))
        (out.path / "table.txt").write_text(table + "\n", encoding="utf-8")
        run_dir = out.commit()
    except BaseException:
        if resume:
            out.close()
        else:
            out.discard()
        raise
    finally:
        progress.close()
    return {"run_dir": run_dir, "rows": rows, "table": table}


def completed_cell(cell: RunConfig, data_options: DataOptions | None = None) -> dict[str, Any] | None:
    """The result row of the sweep cell ``cell`` if its run directory is complete, else None.

    ``data_options``: the sweep's data options as its runs' assembly validates them
    (:func:`~graphveil.run.session.assembled_data_options`; the run directory's resolved config
    holds them in full).

    :raises ConfigError: if that directory holds a run of another config (the sweep changed).
    """
    run_dir = Path(cell.output.dir)
    if not run_dir.is_dir():
        return None
    # the output section (folder, progress bar) says where and how, not what was run
    saved = yaml.safe_load((run_dir / "config.resolved.yaml").read_text(encoding="utf-8"))
    saved.pop("output", None)
    wanted = resolved_config(cell, data_options)
    wanted.pop("output", None)
    wanted = json.loads(dumps(wanted))
    if saved != wanted:
        changed = sorted(k for k in set(saved) | set(wanted) if saved.get(k) != wanted.get(k))
        raise ConfigError(f"sweep cell {run_dir} was run with another config (differs in: {', '.join(changed)}); "
                          "resume with the same config and overrides, or choose another output folder")
    lines = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text(encoding="utf-8").splitlines()
             if line.strip()]
    final = [x for x in lines if x.get("final") is True]  # run_training's last line: the result row
    if not final:
        return None
    # dumps wrote ε = ∞ of a non-private cell as "inf"
    return {k: float(v) if v in ("inf", "-inf") else v for k, v in final[-1].items() if k != "final"}


def _cell_progress(total: int, enabled: bool, name: str) -> Any:
    from tqdm.auto import tqdm

    return tqdm(total=total, disable=not enabled, desc=f"{name} sweep", unit="cell", dynamic_ncols=True)


def _summary_row(eps: float | None, results: list[dict[str, Any]], columns: list[tuple[str, str, str]]) -> dict[str, Any]:
    row: dict[str, Any] = {"target": "non-private" if eps is None else f"ε = {eps:g}"}
    for key, _, _ in columns[1:]:
        values = [r.get(key) for r in results]
        if all(isinstance(v, int | float) for v in values):
            row[key] = mean_ci95([float(v) for v in values])
    return row


def _sweep_table(rows: list[dict[str, Any]], columns: list[tuple[str, str, str]], seeds: int) -> str:
    def fmt(value: tuple[float, float] | None, spec: str, scale: float = 1.0) -> str:
        if value is None:
            return "-"
        mean, half = value
        if math.isinf(mean):
            return "∞"
        spec = spec if spec != "d" else ".0f"
        text = format(mean * scale, spec)
        return text if math.isnan(half) or half == 0 else f"{text} ± {format(half * scale, spec)}"

    metric_keys = {k for k, _, _ in columns[1:-len(TAIL_COLUMNS)]}
    flat = []
    for r in rows:
        cells = {"target": r["target"]}
        for key, _, spec in columns[1:]:
            # accuracies as percentages, as paper tables print them
            pct = key in metric_keys and key.endswith("accuracy")
            cells[key] = fmt(r.get(key), ".2f" if pct else spec, 100.0 if pct else 1.0)
        flat.append(cells)
    headers = [("target", "privacy", "")] + [
        (k, f"{h} (%)" if k in metric_keys and k.endswith("accuracy") else h, "") for k, h, _ in columns[1:]]
    return (format_table(flat, headers)
            + f"\nmean ± 95 % CI (Student t) over {seeds} seeds; each seed sets sampling, split key and init")
