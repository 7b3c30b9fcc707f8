"""The data-source family: loaders as plugins (``data.source`` names one).

A data source reads one dataset (a relational graph with entity texts, or a node-feature graph)
from its options and returns it validated; the task then splits it. Options sit next to
``source`` in the run config's ``data`` section and are validated against the source's
``Params`` model before anything is read (:func:`check_source_options`).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping
from typing import Any, ClassVar

from pydantic import BaseModel, ValidationError

from graphveil.contract.errors import ConfigError
from graphveil.contract.options import NoParams, format_validation_error

#: Keys of the ``data`` section that are not a source's options.
COMMON_KEYS = ("source", "split", "max_entities")


class DataSource(ABC):
    """Loads one dataset. Subclasses implement :meth:`load` and declare ``Params``
    (a pydantic model; it must not define the common keys ``source``, ``split``, ``max_entities``)."""

    Params: ClassVar[type[BaseModel]] = NoParams

    def __init__(self, params: BaseModel | None = None) -> None:
        self.params = params if params is not None else self.Params()

    @abstractmethod
    def load(self) -> Any:
        """Read and validate the dataset (a :class:`~graphveil.data.RelationalGraph` or
        :class:`~graphveil.data.node_graph.NodeGraph`); raise :class:`~graphveil.contract.errors.DataError`
        naming the file and the problem."""


def check_source_options(host: Any, name: str, options: Mapping[str, Any], *,
                         section: str = "data") -> BaseModel:
    """Validate ``options`` against data source ``name``'s ``Params``.

    Messages name the run-config key: ``data.source: unknown data source 'x'; available: ...``,
    ``data.path is required for source 'edge_list'``, ``data.id_col applies only to source
    'edge_list' (source is 'citeseer')``, ``data.id_col: <problem> (got <value>)``; a
    ``Params`` model validator's own message is kept as it is (it names the keys itself).

    :param host: the run's plugin host (anything whose ``components("data_source")`` lists the
        registered sources).
    :param section: the config section the keys sit in (``data.split.eval_data`` for graph B
        of a two-graph split).
    :raises ConfigError: on an unknown source or a bad option.
    """
    infos = host.components("data_source")
    info = next((c for c in infos if c.name == name), None)
    if info is None:
        known = ", ".join(c.name for c in infos) or "none"
        raise ConfigError(f"{section}.source: unknown data source {name!r}; available: {known}")
    model = info.params_model
    try:
        return model.model_validate(dict(options))
    except ValidationError as exc:
        raise ConfigError(_option_error(exc, name, model, infos, section)) from exc


def _option_error(exc: ValidationError, name: str, model: type[BaseModel], infos: list[Any],
                  section: str = "data") -> str:
    first = exc.errors()[0]
    loc = first["loc"]
    if not loc:  # a model validator: its message names the keys
        return first["msg"].removeprefix("Value error, ")
    key = f"{section}.{'.'.join(str(p) for p in loc)}"
    if first["type"] == "missing":
        return f"{key} is required for source {name!r}"
    if first["type"] == "extra_forbidden" and len(loc) == 1:
        owners = [c.name for c in infos if c.name != name and loc[0] in c.params_model.model_fields]
        if owners:
            which = f"source {owners[0]!r}" if len(owners) == 1 else f"sources {', '.join(map(repr, owners))}"
            return f"{key} applies only to {which} (source is {name!r})"
        known = ", ".join(model.model_fields) or "none"
        return f"{key}: not an option of source {name!r} (its options: {known})"
    return format_validation_error(section, exc, model=model, sep=".")
