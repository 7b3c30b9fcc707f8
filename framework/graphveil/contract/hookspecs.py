"""Hook specifications for GraphVeil plugins (pluggy project ``graphveil``).

A plugin is a module or object with functions marked ``@hookimpl``; only marked functions are
hooks (an unmarked ``graphveil_clippers`` is an ordinary function and provides nothing). A
plugin is found through the entry-point group ``graphveil`` (the built-ins use it too) or
registered directly with :meth:`graphveil.contract.host.PluginHost.register`, which refuses an
implementation whose name matches no spec below.

The specs are grouped by phase, like pytest's ``hookspec.py``: the component families are
called once per plugin at registration; the lifecycle hooks are called while a run goes and
receive read-only views (:func:`graphveil.contract.host.read_only`); the application hook adds
subcommands to the ``graphveil`` command line (the Flower connector adds ``fed``). None of them is ``firstresult``;
a ``firstresult`` spec added later must say "Stops at first non-None result" in its docstring.
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
# Component families: called once per plugin when it is registered. Each returns named factories;
# a factory is usually the component class, called with its validated ``Params`` instance.
# Names are lowercase letters, digits and underscores, unique within a family across all
# plugins (a clash is an error naming both plugins). The profiles a factory declares are read
# by the invariant check before any data is touched.
# --------------------------------------------------------------------------------------------


@hookspec
def graphveil_samplers() -> Mapping[str, Any]:
    """Name the sampler factories this plugin provides.

    Each factory is a subclass of :class:`graphveil.contract.sampler.Sampler` (or a callable
    returning one) with a ``Params`` model. It must declare its *sampling profile* at class
    level: ``sampling_kind`` (a :class:`graphveil.contract.profiles.SamplingKind`, the distribution its
    batches are drawn from exactly as the accountant will assume it: name the sampler after
    it) and ``unit`` (the :class:`graphveil.contract.profiles.PrivacyUnit` it samples for). Its
    ``prepare`` returns the numeric :class:`graphveil.contract.profiles.SamplingProfile`.

    :returns: mapping of component name → factory, e.g. ``{"entity_poisson_wor": PoissonWORSampler}``.
    """


@hookspec
def graphveil_clippers() -> Mapping[str, Any]:
    """Name the clipper factories this plugin provides.

    Each factory is a subclass of :class:`graphveil.contract.clipper.Clipper` with a ``Params``
    model. It must declare its *sensitivity profile* at class level: ``sensitivity_kind`` (a
    :class:`graphveil.contract.profiles.SensitivityKind`: how much the clipped sum can move when one
    privacy unit changes, in units of ``clip_norm``) and ``unit`` (the privacy unit that
    sensitivity is with respect to).

    :returns: mapping of component name → factory, e.g. ``{"freq_clip": FreqClipper}``.
    """


@hookspec
def graphveil_accountants() -> Mapping[str, Any]:
    """Name the accountant factories this plugin provides.

    Each factory is a subclass of :class:`graphveil.contract.accountant.Accountant` with a ``Params``
    model. It must declare ``mechanism`` (its name in a saved state), ``unit`` and
    ``supports``: exactly the (:class:`~graphveil.contract.profiles.SamplingKind`,
    :class:`~graphveil.contract.profiles.SensitivityKind`) pairs it can analyse. A run whose sampler and
    clipper form any other pair is refused before data is read.

    :returns: mapping of component name → factory, e.g. ``{"coupled_rdp_freq": CoupledRdpFreqAccountant}``.
    """


@hookspec
def graphveil_encoders() -> Mapping[str, Any]:
    """Name the encoder factories this plugin provides.

    Each factory is a subclass of :class:`graphveil.contract.model.Encoder` with a ``Params``
    model. An encoder declares no privacy profile, but its ``embed`` must keep entities apart
    along dimension 0 (no batch norm) so per-tuple gradients are what the clipper sees.

    :returns: mapping of component name → factory, e.g. ``{"hf_lora": HfLoraEncoder}``.
    """


@hookspec
def graphveil_models() -> Mapping[str, Any]:
    """Name the model factories this plugin provides (models called on a task's batches).

    Each factory is a subclass of :class:`graphveil.contract.model.Model` with a ``Params`` model
    and a class-level ``structure`` (:class:`graphveil.contract.profiles.ExampleStructure`): how its
    forward keeps examples apart. A ``whole_graph`` model is refused for DP-SGD before data is read.

    :returns: mapping of component name → factory, e.g. ``{"mlp": MLP}``.
    """


@hookspec
def graphveil_tasks() -> Mapping[str, Any]:
    """Name the task factories this plugin provides.

    Each factory is a subclass of :class:`graphveil.contract.task.Task`: it splits the data, gives
    per-example losses for a batch and evaluates the released model.

    :returns: mapping of component name → factory, e.g. ``{"node_classification": NodeClassification}``.
    """


@hookspec
def graphveil_mechanisms() -> Mapping[str, Any]:
    """Name the one-shot mechanism factories this plugin provides.

    Each factory is a subclass of :class:`graphveil.contract.mechanism.Mechanism` declaring ``unit``;
    it releases once and reports a ``dp_accounting`` event the run's accountant composes.

    :returns: mapping of component name → factory, e.g. ``{"gaussian_output": GaussianOutput}``.
    """


@hookspec
def graphveil_methods() -> Mapping[str, Any]:
    """Name the method factories this plugin provides (``method`` in a run config).

    Each factory is a subclass of :class:`graphveil.contract.method.Method`: it returns the run's staged
    plan (releases, DP-SGD training, post-processing), run against one accountant and budget.

    :returns: mapping of component name → factory, e.g. ``{"dp_sgd": DpSgd}``.
    """


@hookspec
def graphveil_data_sources() -> Mapping[str, Any]:
    """Name the data-source factories this plugin provides (``data.source`` in a run config).

    Each factory is a subclass of :class:`graphveil.contract.data_source.DataSource` with a ``Params``
    model (its options sit next to ``source`` in the ``data`` section) and a ``load`` method.

    :returns: mapping of component name → factory, e.g. ``{"planetoid": PlanetoidSource}``.
    """


# --------------------------------------------------------------------------------------------
# Lifecycle: logging, auditing and monitoring plugins observe; they cannot change results.
# Every mapping argument is a deep read-only copy (``types.MappingProxyType``; sequences become
# tuples): writing to it raises ``TypeError``, and what the caller records is unaffected.
# ``json.dumps(metrics, default=dict)`` serialises one; ``dict(metrics)`` is a shallow mutable copy.
# --------------------------------------------------------------------------------------------


@hookspec
def graphveil_step_end(step: int, metrics: Mapping[str, Any]) -> None:
    """Observe one optimizer step of a training session, before it is logged.

    :param step: 1-based step index within the session.
    :param metrics: read-only view of the step's record as written to ``metrics.jsonl``:
        loss, batch size, clipped fraction, ``step`` and (private runs) ε spent so far.
    :returns: nothing; a return value is ignored.
    """


@hookspec
def graphveil_round_end(server_round: int, metrics: Mapping[str, Any]) -> None:
    """Observe one federated round, after it has been aggregated and written to ``rounds.jsonl``.

    :param server_round: 1-based round number.
    :param metrics: read-only view of the round's record: aggregated metrics and each site's
        status and reported ε (``metrics["sites"]`` is a tuple of read-only mappings).
    :returns: nothing; a return value is ignored.
    """


@hookspec
def graphveil_run_end(run_dir: Path | None, report: Mapping[str, Any]) -> None:
    """Observe the end of a training session, after its privacy report has been written.

    :param run_dir: the final output directory (it appears under this name once the run
        commits; its files are complete, under
        :meth:`graphveil.run.outputs.RunDirectory.staging_path`), or ``None`` for a session
        without one (a federated site's round: ``report`` then names ``site`` and ``server_round``).
    :param report: read-only view of the privacy report (as in ``privacy.json``) merged with
        the final evaluation metrics.
    :returns: nothing; a return value is ignored.
    """


# --------------------------------------------------------------------------------------------
# Applications: how plugins and connectors extend the ``graphveil`` command line, the way
# pytest plugins add options. The core's own commands (run, demo, plugins, privacy, budget)
# are added first; connectors add theirs here (the Flower connector adds ``fed``), so the core
# never imports them.
# --------------------------------------------------------------------------------------------


@hookspec
def graphveil_add_commands(subparsers: Any) -> None:
    """Add subcommands to the ``graphveil`` command line.

    Called once, after the built-in commands are added and before the arguments are parsed.
    Each added parser sets ``func`` via ``set_defaults(func=...)``: a callable taking the parsed
    :class:`argparse.Namespace` and returning the exit code (``None`` means 0). A
    :class:`graphveil.contract.errors.GraphVeilError` it raises is printed on one line and exits with
    code 2, like the built-in commands. A name another plugin (or a built-in) already uses is
    an error naming the plugins that add commands. Import heavy modules inside ``func`` or
    inside this hook, not at plugin import: every host loads the plugin.

    :param subparsers: the top-level ``add_subparsers()`` action of the ``graphveil`` parser;
        call its ``add_parser(name, help=...)``.
    :returns: nothing; a return value is ignored.
    """
