"""Hook specifications for GraphVeil plugins (pluggy project ``graphveil``).

A plugin is a module or object with functions marked ``@hookimpl``. It is found through the
entry-point group ``graphveil`` (the built-ins use it too) or registered directly with
:meth:`graphveil.host.PluginHost.register`.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pluggy

PROJECT = "graphveil"
hookspec = pluggy.HookspecMarker(PROJECT)
hookimpl = pluggy.HookimplMarker(PROJECT)


# --------------------------------------------------------------------------------------------
# Component families
# --------------------------------------------------------------------------------------------


@hookspec
def graphveil_samplers() -> Mapping[str, Any]:
    """Name the sampler factories this plugin provides.

    Each factory is a subclass of :class:`graphveil.components.Sampler` (or a callable
    returning one) with a ``Params`` model and a class-level ``sampling_kind``: the
    distribution its batches are drawn from, as the accountant will assume it.

    :returns: mapping of component name → factory. Names are lowercase and unique across all
        plugins; a clash is an error naming both plugins.
    """


@hookspec
def graphveil_clippers() -> Mapping[str, Any]:
    """Name the clipper factories this plugin provides.

    Each factory is a subclass of :class:`graphveil.components.Clipper` declaring its
    ``sensitivity_kind`` with respect to its privacy ``unit``.

    :returns: mapping of component name → factory.
    """


@hookspec
def graphveil_accountants() -> Mapping[str, Any]:
    """Name the accountant factories this plugin provides.

    Each factory is a subclass of :class:`graphveil.components.Accountant` declaring in
    ``supports`` exactly the (sampling kind, sensitivity kind) pairs it can analyse.

    :returns: mapping of component name → factory.
    """


@hookspec
def graphveil_encoders() -> Mapping[str, Any]:
    """Name the encoder factories this plugin provides.

    Each factory is a subclass of :class:`graphveil.components.Encoder`.

    :returns: mapping of component name → factory.
    """


# --------------------------------------------------------------------------------------------
# Lifecycle: logging, auditing and monitoring plugins observe; they cannot change results.
# --------------------------------------------------------------------------------------------


@hookspec
def graphveil_step_end(step: int, metrics: Mapping[str, float]) -> None:
    """Called after every optimizer step.

    :param step: 1-based step index within the session.
    :param metrics: loss, batch size, clipped fraction, ε spent so far.
    """


@hookspec
def graphveil_round_end(server_round: int, metrics: Mapping[str, Any]) -> None:
    """Called by the federated server after each round has been aggregated.

    :param server_round: 1-based round number.
    :param metrics: aggregated metrics and each site's reported ε.
    """


@hookspec
def graphveil_run_end(run_dir: Path | None, report: Mapping[str, Any]) -> None:
    """Called once when a training session ends.

    :param run_dir: the output directory, or ``None`` for a session without one.
    :param report: the privacy report and final evaluation metrics.
    """
