"""``graphveil privacy``: ε of a planned run, or the σ that meets a budget — no data touched.

    graphveil privacy epsilon   --method entity --clipping freq --nodes N --edges M --degree-cap K
                                --k-neg KNEG --sampling-rate GAMMA --sigma SIGMA --steps T [--delta D] [--json]
    graphveil privacy calibrate --method entity ... --target-epsilon E (no --sigma) [--json]
    graphveil privacy epsilon   --method edge --sampling-rate GAMMA --sigma SIGMA --steps T --delta D

The accountant is built through the plugin host (``coupled_rdp`` for entity level, with Thm 3 for
``--clipping freq`` and Thm C.1 for ``--clipping standard``; ``edge_rdp`` for edge level) and bound
to profiles made from the flags with C = 1. δ defaults to 1/|E| when ``--edges`` is given.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from collections.abc import Sequence
from typing import Any

from graphveil.errors import ConfigError, GraphVeilError, PrivacyError
from graphveil.profiles import (
    PrivacyUnit,
    SamplingKind,
    SamplingProfile,
    SensitivityKind,
    SensitivityProfile,
)

_ACCOUNTANTS = {"entity": "coupled_rdp", "edge": "edge_rdp"}
_CLIPPING = {"freq": SensitivityKind.FREQ_CLIP_NODE, "standard": SensitivityKind.STANDARD_TUPLE_NODE}


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
    for name, helptext in (("epsilon", "ε after --steps steps at noise multiplier --sigma"),
                           ("calibrate", "smallest σ whose ε after --steps steps is at most --target-epsilon")):
        sub = commands.add_parser(name, help=helptext, description=helptext)
        sub.add_argument("--method", choices=sorted(_ACCOUNTANTS), required=True,
                         help="entity: node-level coupled sampling (Thm 3 / C.1); edge: edge-level Poisson")
        sub.add_argument("--clipping", choices=sorted(_CLIPPING), default="freq",
                         help="entity level: freq = FREQ-CLIP (Thm 3), standard = per-tuple (Thm C.1) (default: freq)")
        sub.add_argument("--nodes", type=_integer, help="n, nodes negatives are drawn from (entity)")
        sub.add_argument("--edges", type=_integer, help="m, records after degree capping; default δ = 1/m")
        sub.add_argument("--degree-cap", type=_integer, help="K, maximum degree after capping (entity)")
        sub.add_argument("--k-neg", type=_integer, help="negatives per positive (entity)")
        sub.add_argument("--sampling-rate", type=float, required=True, help="γ, Poisson rate of positives")
        sub.add_argument("--steps", type=_integer, required=True, help="T, number of noisy steps")
        sub.add_argument("--delta", type=float, help="δ (default 1/edges)")
        if name == "epsilon":
            sub.add_argument("--sigma", type=float, required=True, help="noise multiplier σ (noise std σ·C)")
        else:
            sub.add_argument("--target-epsilon", type=float, required=True, help="ε to meet after --steps steps")
        sub.add_argument("--json", action="store_true", help="print one JSON object instead of a table")
    return parser


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


def _delta(args: argparse.Namespace) -> float:
    if args.delta is not None:
        delta = args.delta
    elif args.edges is not None and args.edges >= 2:
        delta = 1.0 / args.edges
    else:
        raise ConfigError("--delta is required unless --edges (>= 2) is given (default δ = 1/edges)")
    if not 0 < delta < 1:
        raise PrivacyError(f"--delta must be in (0, 1), got {delta!r}")
    return delta


def run_privacy(args: argparse.Namespace, host: Any) -> int:
    """Run ``graphveil privacy …``; raises :class:`GraphVeilError` on bad values."""
    if args.steps < 0:
        raise PrivacyError(f"--steps must be >= 0, got {args.steps}")
    if not (0 < args.sampling_rate <= 1):
        raise PrivacyError(f"--sampling-rate must be in (0, 1], got {args.sampling_rate!r}")
    delta = _delta(args)
    sampling, sensitivity = _profiles(args)
    accountant = host.create("accountant", _ACCOUNTANTS[args.method], {})
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
    out.update(report)
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
    rows += [("σ", f"{out['sigma']:.6g}"), ("steps", str(out["steps"])), ("δ", f"{out['delta']:.3g}"),
             ("ε", f"{out['epsilon']:.6g}"),
             ("optimal α", "-" if out["alpha"] is None else f"{out['alpha']:g}")]
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
            from graphveil.host import default_host

            host = default_host()
        return run_privacy(args, host)
    except GraphVeilError as exc:
        print(f"graphveil: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    raise SystemExit(main())
