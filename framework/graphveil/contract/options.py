"""Options of components: the model of a component with none, its one-line description, and the
one way every options model's errors are reported (the run config, a plugin's ``Params``, a data
source's, a site's node config all name the key, the value and, where useful, the known keys)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from pydantic import BaseModel, ConfigDict, ValidationError


class NoParams(BaseModel):
    """Options model for a component that takes none."""

    model_config = ConfigDict(extra="forbid")


def describe(factory: Any) -> str:
    """First line of a factory's docstring: the one-line description users see."""
    doc = (getattr(factory, "__doc__", None) or "").strip()
    return doc.splitlines()[0].strip() if doc else "(no description)"


def format_validation_error(source: str, exc: ValidationError, *, model: type[BaseModel] | None = None,
                            known: Iterable[str] | None = None, noun: str = "field", sep: str = ": ") -> str:
    """The first error of ``exc`` as one line naming the source, the field and the bad value.

    The one formatter of pydantic errors (run configs, component options, node and run configs
    of the Flower connector).

    :param model: the validated model; a field is then named by its alias (``epsilon-budget``).
    :param known: names to list when the error is an unknown key (``extra="forbid"``).
    :param noun: "field" or "key", in "required … is missing".
    :param sep: between ``source`` and the field (": " or "." for component options).
    """
    first = exc.errors()[0]
    loc = [str(p) for p in first["loc"]]
    if model is not None and loc and first["type"] != "extra_forbidden":  # an unknown key is named as given
        info = model.model_fields.get(loc[0])
        if info is not None and info.alias:
            loc[0] = info.alias
    field = ".".join(loc) or "(top level)"
    msg = first["msg"].removeprefix("Value error, ")
    if first["type"] == "extra_forbidden" and known is not None:
        return f"{source}: unknown {noun} {field!r} (known: {', '.join(known)})"
    if first["type"] == "missing":
        return f"{source}{sep}{field}: required {noun} is missing"
    if isinstance(first.get("input"), Mapping):  # a whole section: the message names the field
        return f"{source}{sep}{field}: {msg}"
    return f"{source}{sep}{field}: {msg} (got {first.get('input')!r})"
