"""``graphveil privacy``: ε of a planned run, or the σ that meets a budget — no data touched.

    graphveil privacy epsilon   --method entity --clipping freq --nodes N --edges M --degree-cap K
                                --k-neg KNEG --sampling-rate GAMMA --sigma SIGMA --steps T [--delta D] [--json]
    graphveil privacy calibrate --method entity ... --target-epsilon E (no --sigma) [--json]
    graphveil privacy epsilon   --method edge --sampling-rate GAMMA --sigma SIGMA --steps T --delta D
                                [--accountant edge_pld]

    graphveil privacy epsilon   --config RUN.yaml --nodes N [--edges M] [--sigma S] [--set KEY=VALUE ...]
    graphveil privacy calibrate --config RUN.yaml --nodes N [--edges M] --target-epsilon E
    graphveil privacy epsilon   --method gap|dpdgc|rand_edge_sage|dp_mlp|dp_gcn|<method> --nodes N
                                [--unit U] [--batch-size B] [--steps T | --epochs E] [--set method.hops=3 ...]
                                (--sigma S | calibrate --target-epsilon E) [--delta D] [--edges M] [--json]

Relational methods (``entity``, ``edge``): the accountant is built through the plugin host
(``coupled_rdp`` for entity level, with Thm 3 for ``--clipping freq`` and Thm C.1 for
``--clipping standard``; ``edge_rdp`` for edge level, or ``--accountant edge_pld``: PLD, with the
RDP ε beside) and bound to profiles made from the flags with C = 1. δ defaults to the run's rule,
10^-(⌈log₁₀ n⌉+1) of the n privacy units (:func:`graphveil.privacy.default_delta`): ``--nodes``
entities at entity level, ``--edges`` relations at edge level, so the ε printed is the one a run
on data of that size reports (the paper's δ = 1/|E| by ``--delta``).

Every other method (paper 3's and paper 4's graph methods, any method plugin): the run config —
a file (``--config``), or the method's built-in wiring (``--method``, :data:`METHOD_CONFIGS`,
the bundled examples' components with the method's default options) — is assembled and bound
by the training session's own code with public sizes in place of the data
(:mod:`graphveil.run.planning`): ``--nodes`` training nodes, ``--edges`` undirected edges where the
default δ of an edge-level unit counts them. ``--unit``, ``--batch-size``, ``--steps``,
``--epochs``, ``--sigma``, ``--target-epsilon`` and ``--delta`` set ``privacy.unit``,
``sampler.batch_size``, ``training.*`` and ``privacy.*``; ``--set`` any other field. ε equals
what ``graphveil run`` of the same config writes to ``privacy.json`` on data of those sizes.
"""

from __future__ import annotations

import argparse
import copy
import json
import logging
import math
import sys
from collections.abc import Sequence
from typing import Any

from graphveil.contract.errors import ConfigError, GraphVeilError, PrivacyError
from graphveil.contract.profiles import (
    PrivacyUnit,
    SamplingKind,
    SamplingProfile,
    SensitivityKind,
    SensitivityProfile,
)

log = logging.getLogger(__name__)

_ACCOUNTANTS = {"entity": "coupled_rdp", "edge": "edge_rdp"}
#: the accountants ``--accountant`` may pick per relational method (the first is the default)
_ACCOUNTANT_CHOICES = {"entity": ("coupled_rdp",), "edge": ("edge_rdp", "edge_pld")}
_CLIPPING = {"freq": SensitivityKind.FREQ_CLIP_NODE, "standard": SensitivityKind.STANDARD_TUPLE_NODE}

_PER_NODE = {"sampler": {"name": "node_uniform_wor"}, "clipper": {"name": "per_node_clip"},
             "accountant": {"name": "node_rdp"}}
#: the bundled examples' node level: D = 168, Cora's largest out-degree (a graph above D is refused)
_NODE_GDP = "node/replacement/D=168/predictions"

#: ``--method NAME`` without a config file: the components of the bundled example
#: ``examples/<name>_cora.yaml`` with every option at its default (no data section: none is read).
#: A registered method not listed here starts from ``{method: {name: NAME}}`` and takes the rest
#: from ``--set``.
METHOD_CONFIGS: dict[str, dict[str, Any]] = {
    "gap": {"method": {"name": "gap"}, **_PER_NODE, "model": {"name": "mlp"},
            "task": {"name": "node_classification", "features": "released:gap_aggregates"},
            "training": {"epochs": 100}, "privacy": {"unit": _NODE_GDP}},
    "dpdgc": {"method": {"name": "dpdgc"}, **_PER_NODE, "model": {"name": "linkx"},
              "task": {"name": "node_classification", "features": "released:dpdgc_embedding"},
              "training": {"epochs": 100}, "privacy": {"unit": _NODE_GDP}},
    "rand_edge_sage": {"method": {"name": "rand_edge_sage"}, **_PER_NODE, "model": {"name": "sage_full"},
                       "task": {"name": "node_classification", "graph": "released:rand_edge"},
                       "training": {"steps": 100}, "privacy": {"unit": "undirected_edge/replacement/predictions"}},
    "dp_mlp": {"method": {"name": "dp_sgd"}, **_PER_NODE, "model": {"name": "mlp"},
               "task": {"name": "node_classification"}, "training": {"epochs": 100}, "privacy": {}},
    "dp_sage": {"method": {"name": "dp_sage"}, "sampler": {"name": "root_subgraphs", "num_hops": 1},
                "clipper": {"name": "per_node_clip"}, "accountant": {"name": "rooted_rdp"},
                "model": {"name": "sage", "layers": 1},
                "task": {"name": "rooted_node_classification", "predictions": "released:dp_sage_outputs"},
                "training": {"epochs": 100}, "privacy": {"unit": _NODE_GDP}},
    "dp_gcn": {"method": {"name": "dp_sgd"}, "sampler": {"name": "graph_splits"},
               "clipper": {"name": "per_split_clip"}, "accountant": {"name": "split_rdp"},
               "model": {"name": "gcn"}, "task": {"name": "split_node_classification"},
               "training": {"epochs": 500}, "privacy": {}},
}


def _integer(text: str) -> int:
    """An integer, also written as ``5e6``."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None
    if not (math.isfinite(value) and value.is_integer()):
        raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}")
    return int(value)


def add_privacy_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Add ``privacy {epsilon,calibrate}`` to a ``graphveil`` sub-parser set."""
    parser = subparsers.add_parser(
        "privacy", help="privacy accounting without data: ε of a planned run, or σ for a target ε",
        description=__doc__.split("\n\n")[0],
    )
    commands = parser.add_subparsers(dest="privacy_command", metavar="{epsilon,calibrate}", required=True)
    for name, helptext in (("epsilon", "ε of the planned run at noise multiplier --sigma"),
                           ("calibrate", "smallest σ whose ε for the planned run is at most --target-epsilon")):
        sub = commands.add_parser(name, help=helptext, description=helptext)
        sub.add_argument("--method", help=(
            "entity: node-level coupled sampling (Thm 3 / C.1); edge: edge-level Poisson (both from the "
            f"flags marked 'entity'/'edge'); or a graph method built from its defaults: {', '.join(METHOD_CONFIGS)}, "
            "or any registered method (its options and components by --set)"))
        sub.add_argument("--config", help="a run config (YAML): account that run, with --nodes in place of its data")
        sub.add_argument("--clipping", choices=sorted(_CLIPPING),
                         help="entity level: freq = FREQ-CLIP (Thm 3), standard = per-tuple (Thm C.1) (default: freq)")
        sub.add_argument("--nodes", type=_integer,
                         help="entity: n, nodes negatives are drawn from (the privacy units of the default δ); graph "
                              "methods: n, training nodes")
        sub.add_argument("--edges", type=_integer, help=(
            "entity/edge: m, records after degree capping (edge: the privacy units of the default δ); graph "
            "methods: undirected edges of the graph, for the default δ of an edge-level unit"))
        sub.add_argument("--degree-cap", type=_integer, help="K, maximum degree after capping (entity)")
        sub.add_argument("--k-neg", type=_integer, help="negatives per positive (entity)")
        sub.add_argument("--sampling-rate", type=float, help="γ, Poisson rate of positives (entity/edge)")
        sub.add_argument("--steps", type=_integer, help="T, number of noisy steps (graph methods: training.steps)")
        sub.add_argument("--epochs", type=float, help="graph methods: training.epochs (instead of --steps)")
        sub.add_argument("--batch-size", type=_integer, help="graph methods: sampler.batch_size")
        sub.add_argument("--unit", help="graph methods: privacy.unit, e.g. 'edge/replacement/predictions'")
        sub.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                         help="graph methods: override a run-config field, e.g. --set method.hops=3 (repeatable)")
        sub.add_argument("--delta", type=float, help="δ (default: the run's rule, 10^-(⌈log10 n⌉+1) of n privacy units: --nodes entities, --edges "
                         "relations, or the graph method's unit)")
        if name == "epsilon":
            sub.add_argument("--sigma", type=float, help=(
                "noise multiplier σ (noise std σ·C); required for entity/edge and --method, with --config "
                "default: the config's privacy section"))
        else:
            sub.add_argument("--target-epsilon", type=float, required=True, help="ε to meet")
        sub.add_argument("--accountant", help=(
            "entity/edge: the accountant (edge: edge_rdp, default, or edge_pld, PLD with the RDP ε beside); "
            "graph methods and --config: --set accountant.name=NAME"))
        sub.add_argument("--json", action="store_true", help="print one JSON object instead of a table")
    return parser


_GRAPH_ONLY = (("--config", "config"), ("--epochs", "epochs"), ("--batch-size", "batch_size"),
               ("--unit", "unit"), ("--set", "set"))
_RELATIONAL_ONLY = (("--clipping", "clipping"), ("--degree-cap", "degree_cap"), ("--k-neg", "k_neg"),
                    ("--sampling-rate", "sampling_rate"), ("--accountant", "accountant"))


def _profiles(args: argparse.Namespace) -> tuple[SamplingProfile, SensitivityProfile]:
    if args.method == "entity":
        for flag, value in (("--nodes", args.nodes), ("--edges", args.edges),
                            ("--degree-cap", args.degree_cap), ("--k-neg", args.k_neg)):
            if value is None:
                raise ConfigError(f"{flag} is required for --method entity")
        sampling = SamplingProfile(SamplingKind.COUPLED_POISSON_WOR, args.sampling_rate, args.edges,
                                   args.nodes, args.degree_cap, args.k_neg)
        return sampling, SensitivityProfile(_CLIPPING[args.clipping], PrivacyUnit.NODE, 1.0)
    for flag, value in (("--nodes", args.nodes), ("--degree-cap", args.degree_cap), ("--k-neg", args.k_neg)):
        if value is not None:
            raise ConfigError(f"{flag} applies to --method entity only")
    if args.edges is not None and args.edges < 1:
        raise ConfigError(f"--edges must be >= 1, got {args.edges}")
    sampling = SamplingProfile(SamplingKind.POISSON_DECOUPLED, args.sampling_rate, args.edges or 0)
    return sampling, SensitivityProfile(SensitivityKind.PER_TUPLE_EDGE, PrivacyUnit.EDGE, 1.0)


def _delta(args: argparse.Namespace) -> tuple[float, str, int | None]:
    """(δ, its rule, n): ``--delta``, else the run's default of the method's privacy units."""
    from graphveil.privacy import DEFAULT_DELTA_RULE, default_delta, delta_warning

    flag, units = ("--nodes", args.nodes) if args.method == "entity" else ("--edges", args.edges)
    if args.delta is not None:
        if not 0 < args.delta < 1:
            raise PrivacyError(f"--delta must be in (0, 1), got {args.delta!r}")
        if units is not None and (warning := delta_warning(args.delta, units, "--delta", flag)):
            log.warning("%s", warning)
        return args.delta, "explicit", units
    if units is None:
        raise ConfigError(f"--delta is required unless {flag} is given (default δ = "
                          f"{DEFAULT_DELTA_RULE} of n = {flag}, the run's rule)")
    return default_delta(units), DEFAULT_DELTA_RULE, units


def run_privacy(args: argparse.Namespace, host: Any) -> int:
    """Run ``graphveil privacy …``; raises :class:`GraphVeilError` on bad values."""
    if args.method is None and args.config is None:
        raise ConfigError("give --method (entity, edge, or a graph method) or --config RUN.yaml")
    if args.config is not None or args.method not in _ACCOUNTANTS:
        return _run_planned(args, host)
    for flag, attr in _GRAPH_ONLY:
        if getattr(args, attr) not in (None, []):
            raise ConfigError(f"{flag} applies to graph methods and --config, not to --method {args.method}")
    for flag, value in (("--sampling-rate", args.sampling_rate), ("--steps", args.steps),
                        ("--sigma", getattr(args, "sigma", 0.0))):
        if value is None:
            raise ConfigError(f"{flag} is required for --method {args.method}")
    args.clipping = args.clipping or "freq"
    if args.steps < 0:
        raise PrivacyError(f"--steps must be >= 0, got {args.steps}")
    if not (0 < args.sampling_rate <= 1):
        raise PrivacyError(f"--sampling-rate must be in (0, 1], got {args.sampling_rate!r}")
    delta, delta_rule, num_units = _delta(args)
    sampling, sensitivity = _profiles(args)
    choices = _ACCOUNTANT_CHOICES[args.method]
    name = args.accountant or choices[0]
    if name not in choices:
        raise ConfigError(f"--accountant {name!r} does not analyse --method {args.method}; choose from "
                          f"{', '.join(choices)}")
    accountant = host.create("accountant", name, {})
    accountant.bind(sampling, sensitivity)
    out: dict[str, Any] = {"method": args.method}
    if args.method == "entity":
        out["clipping"] = args.clipping
    if args.privacy_command == "epsilon":
        sigma = args.sigma
        if not (sigma > 0 and math.isfinite(sigma)):
            raise PrivacyError(f"--sigma must be a finite number > 0, got {sigma!r}")
    else:
        target = args.target_epsilon
        if not (target > 0 and math.isfinite(target)):
            raise PrivacyError(f"--target-epsilon must be a finite number > 0, got {target!r}")
        if args.steps < 1:
            raise PrivacyError(f"--steps must be >= 1 to calibrate, got {args.steps}")
        sigma = accountant.calibrate(target_epsilon=target, delta=delta, num_steps=args.steps)
        out["target_epsilon"] = target
    if args.steps:
        accountant.step(noise_multiplier=sigma, num_steps=args.steps)
    report = accountant.report(delta)
    out.update(report, delta_rule=delta_rule, num_units=num_units)
    if not args.steps and hasattr(accountant, "rdp_curve"):  # no steps: still show the per-step curve at σ
        out["rdp"] = [[float(a), float(v)] for a, v in zip(accountant.orders, accountant.rdp_curve(sigma), strict=True)]
    out["sigma"] = sigma
    if args.json:
        print(json.dumps(out))
    else:
        _print_table(out)
    return 0


def _print_table(out: dict[str, Any]) -> None:
    rows = [("method", out["method"] + (f" ({out['clipping']} clipping)" if "clipping" in out else ""))]
    profile = out.get("profile", {})
    if "theorem" in profile:
        rows.append(("analysis", profile["theorem"]))
    rows += [(k, str(profile[k])) for k in ("gamma", "m", "n", "K", "k_neg") if k in profile]
    if "target_epsilon" in out:
        rows.append(("target ε", f"{out['target_epsilon']:g}"))
    rows += [("σ", f"{out['sigma']:.6g}"), ("steps", str(out["steps"])), ("δ", _delta_cell(out)),
             ("ε", f"{out['epsilon']:.6g}")]
    rows += [(f"ε ({k[8:].upper()})", f"{out[k]:.6g}") for k in ("epsilon_pld", "epsilon_rdp") if k in out]
    rows.append(("optimal α", "-" if out["alpha"] is None else f"{out['alpha']:g}"))
    width = max(len(k) for k, _ in rows)
    for key, value in rows:
        print(f"{key:<{width}}  {value}")


def _delta_cell(out: dict[str, Any]) -> str:
    n = f", n={out['num_units']}" if out.get("num_units") is not None else ""
    return f"{out['delta']:.3g} ({out['delta_rule']}{n})"


def _planned_config(args: argparse.Namespace, host: Any) -> tuple[Any, str]:
    """The run config to account (validated) and where it came from, for messages."""
    from graphveil.run.config import apply_overrides, config_from_dict, load_config, set_dotted

    if args.config is not None:
        if args.method is not None:
            raise ConfigError("give --method or --config, not both (the config names its method)")
        source = str(args.config)
        config = load_config(args.config, args.set)
        raw = config.model_dump(mode="json", exclude={"sweep"})
        if config.training.epochs is not None:
            del raw["training"]["steps"]  # planned from the epochs (as a sweep cell does)
    else:
        source = f"graphveil privacy --method {args.method}"
        registered = {c.name for c in host.components("method")}
        if args.method not in METHOD_CONFIGS and args.method not in registered:
            known = sorted({*_ACCOUNTANTS, *METHOD_CONFIGS, *registered})
            raise ConfigError(f"unknown method {args.method!r} (known: {', '.join(known)})")
        raw = apply_overrides(copy.deepcopy(METHOD_CONFIGS.get(args.method, {"method": {"name": args.method}})),
                              list(args.set))
    training = raw.setdefault("training", {})
    privacy = raw.setdefault("privacy", {})
    if args.steps is not None and args.epochs is not None:
        raise ConfigError("give --steps or --epochs, not both")
    if args.steps is not None:
        training.pop("epochs", None)
        training["steps"] = args.steps
    if args.epochs is not None:
        training.pop("steps", None)
        training["epochs"] = args.epochs
    if args.batch_size is not None:
        set_dotted(raw, ["sampler", "batch_size"], args.batch_size)
    if args.unit is not None:
        privacy["unit"] = args.unit
    sigma = getattr(args, "sigma", None)
    target = getattr(args, "target_epsilon", None)
    for flag, value in (("--sigma", sigma), ("--target-epsilon", target)):
        if value is not None and not (value > 0 and math.isfinite(value)):
            raise PrivacyError(f"{flag} must be a finite number > 0, got {value!r}")
    if sigma is not None or target is not None:
        privacy.update(enabled=True, noise_multiplier=sigma, target_epsilon=target)
    if args.delta is not None:
        if not 0 < args.delta < 1:
            raise PrivacyError(f"--delta must be in (0, 1), got {args.delta!r}")
        privacy["delta"] = args.delta
    if privacy.get("noise_multiplier") is None and privacy.get("target_epsilon") is None:
        raise ConfigError(f"{source}: give --sigma (or calibrate --target-epsilon; for a release that takes "
                          "its own ε, e.g. rand_edge_sage's randomized response, --set privacy.target_epsilon=E)")
    return config_from_dict(raw, source), source


def _run_planned(args: argparse.Namespace, host: Any) -> int:
    """``--config`` / ``--method <graph method>``: account the run with public sizes (graphveil.run.planning)."""
    from graphveil.run.planning import PublicSizes, planned_account

    for flag, attr in _RELATIONAL_ONLY:
        if getattr(args, attr) is not None:
            raise ConfigError(f"{flag} applies to --method entity|edge only")
    if args.nodes is None:
        what = f"--config {args.config}" if args.config is not None else f"--method {args.method}"
        raise ConfigError(f"--nodes (n, the number of training nodes) is required with {what}")
    sizes = PublicSizes(nodes=args.nodes, edges=args.edges)
    config, _source = _planned_config(args, host)
    out = planned_account(config, sizes, host=host)
    out["method"] = args.method or out["method"]
    out["config"] = args.config
    if args.privacy_command == "calibrate":
        out["target_epsilon"] = args.target_epsilon
    out["sigma"] = out["noise_multiplier"]
    if args.json:
        print(json.dumps(out))
    else:
        _print_planned(out)
    return 0


def _print_planned(out: dict[str, Any]) -> None:
    method = out["method"] + (f" ({out['config']})" if out.get("config") else "")
    profile = out["sampling_profile"]
    sampling = ", ".join(f"{k}={v:.6g}" if isinstance(v, float) else f"{k}={v}"
                         for k, v in profile.items() if k != "kind" and v not in (None, 0))
    rows = [("method", method), ("unit", str(out["unit"])), ("n", f"{out['nodes']} training nodes")]
    if out.get("edges") is not None:
        rows.append(("edges", str(out["edges"])))
    rows += [("components", f"{out['sampler']} / {out['clipper']} / {out['accountant']}"),
             ("sampling", f"{profile['kind']}: {sampling}"),
             ("training", f"{out['training']}; {out['steps']} steps ({out['accounted_steps']} accounted)")]
    if "target_epsilon" in out:
        rows.append(("target ε", f"{out['target_epsilon']:g}"))
    rows += [("σ", f"{out['sigma']:.6g}" if out["sigma_used"] else "- (nothing in the plan takes the shared σ)"),
             ("δ", _delta_cell(out)),
             ("ε", f"{out['epsilon']:.6g}"),
             ("optimal α", "-" if out["alpha"] is None else f"{out['alpha']:g}")]
    if out["parts"]:
        rows.append(("parts", "each alone at δ (ε above is their composition, not the sum)"))
    for part in out["parts"]:
        what = (f"{part['steps']} DP-SGD steps" if part["stage"] == "train"
                else f"release {part['mechanism']}" + (", shared σ" if part["calibrated"] else ", own noise"))
        rows.append((f"  {part['name']}", f"ε alone {part['epsilon_alone']:.6g}  ({what})"))
    width = max(len(k) for k, _ in rows)
    for key, value in rows:
        print(f"{key:<{width}}  {value}")


def main(argv: Sequence[str] | None = None, host: Any = None) -> int:
    """Stand-alone entry (for tests): ``main(["privacy", "epsilon", ...])``; exits 2 on bad input."""
    parser = argparse.ArgumentParser(prog="graphveil")
    add_privacy_parser(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(argv)
    try:
        if host is None:
            from graphveil.contract.host import default_host

            host = default_host()
        return run_privacy(args, host)
    except GraphVeilError as exc:
        print(f"graphveil: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    raise SystemExit(main())
