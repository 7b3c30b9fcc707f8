"""DP-SGD basics every run may need: the non-private baseline pieces (no clipping, no accounting)."""

from graphveil.contract.hookspecs import hookimpl


@hookimpl
def graphveil_clippers():
    from graphveil.plugins.standard.no_clip import NoClip

    return {"no_clip": NoClip}


@hookimpl
def graphveil_accountants():
    from graphveil.plugins.standard.no_accounting import NoAccountant

    return {"no_accounting": NoAccountant}


@hookimpl
def graphveil_methods():
    from graphveil.plugins.standard.methods import DpSgd

    return {"dp_sgd": DpSgd}


@hookimpl
def graphveil_tasks():
    from graphveil.plugins.relational.task import RelationalTask

    return {"relational": RelationalTask}


from graphveil.plugins.standard.sources import graphveil_data_sources  # noqa: E402, F401 - the built-in data sources
