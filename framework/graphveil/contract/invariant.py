"""The invariant, in one place: the accountant analyses exactly what the sampler and clipper do.

Every sampler declares the distribution it draws from (:class:`~graphveil.contract.profiles.SamplingKind`),
every clipper the sensitivity of its clipped sum (:class:`~graphveil.contract.profiles.SensitivityKind`),
every accountant the (sampling, sensitivity) pairs it can analyse, and all three the privacy
unit (:class:`~graphveil.contract.units.PrivacyUnit`, compared as a whole value: kind, adjacency, degree
bound, k, predictions). :func:`check_run` is called before any data is read (class-level
declarations) and :func:`check_profiles` again when the accountant is bound to the numeric
profiles; a mismatch is a :class:`~graphveil.contract.errors.ProfileMismatchError` or
:class:`~graphveil.contract.errors.PrivacyError` naming the parts.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from graphveil.contract.errors import PrivacyError, ProfileMismatchError
from graphveil.contract.profiles import SamplingKind, SensitivityKind
from graphveil.contract.units import PrivacyUnit


def _supported_text(supported: Iterable[tuple[SamplingKind, SensitivityKind]]) -> str:
    return ", ".join(sorted(f"({a.value}, {b.value})" for a, b in supported)) or "none"


def check_pair(accountant: str, supported: frozenset[tuple[SamplingKind, SensitivityKind]],
               sampling: SamplingKind, sensitivity: SensitivityKind, *,
               sampler: str = "", clipper: str = "") -> None:
    """Refuse a (sampling, sensitivity) pair the accountant does not analyse.

    :raises ProfileMismatchError: naming the pair and what the accountant analyses.
    """
    if (sampling, sensitivity) in supported:
        return
    who_s = f"sampler {sampler!r} ({sampling.value})" if sampler else f"sampling {sampling.value}"
    who_c = f"clipper {clipper!r} ({sensitivity.value})" if clipper else f"sensitivity {sensitivity.value}"
    raise ProfileMismatchError(
        f"accountant {accountant!r} cannot analyse {who_s} with {who_c}; "
        f"it analyses: {_supported_text(supported)}"
    )


def check_units(parts: Iterable[tuple[str, PrivacyUnit | None]]) -> PrivacyUnit | None:
    """All parts that claim a unit claim the same whole unit; returns it (None if none claims one).

    :param parts: ``(description, unit)``, e.g. ``("sampler 'node_uniform_wor'", unit)``.
    :raises PrivacyError: listing every part with its unit when two differ.
    """
    claimed = [(who, unit) for who, unit in parts if unit is not None]
    if len({unit for _, unit in claimed}) > 1:
        listing = ", ".join(f"{who} is {unit.value}" for who, unit in claimed)
        raise PrivacyError(f"privacy units disagree: {listing}")
    return claimed[0][1] if claimed else None


def check_run(*, private: bool, sampler: tuple[str, Any], clipper: tuple[str, Any],
              accountant: tuple[str, Any], unit: PrivacyUnit | None = None) -> PrivacyUnit | None:
    """The whole check before data is read: pair, units, a private run really clips.

    Each argument is ``(configured name, component)``; the components' class-level
    declarations are read (``sampling_kind``, ``sensitivity_kind``, ``supports``, ``unit``).
    ``unit`` is the run's stated unit (``privacy.unit``), if any: then every component must
    accept it (``accepts_unit``) instead of claiming one unit together.
    The model's structure is checked by :func:`check_structure` once the model is built.

    :returns: the run's privacy unit (None for a non-private run without one).
    """
    (s_name, s), (c_name, c), (a_name, a) = sampler, clipper, accountant
    check_pair(a_name, a.supports, s.sampling_kind, c.sensitivity_kind, sampler=s_name, clipper=c_name)
    if not private:
        return None
    parts = [(f"sampler {s_name!r}", s), (f"clipper {c_name!r}", c), (f"accountant {a_name!r}", a)]
    if unit is not None:
        refusing = [f"{who} (analyses {part.unit.value})" for who, part in parts if not part.accepts_unit(unit)]
        if refusing:
            raise PrivacyError(f"privacy.unit {unit.value!r} is not analysed by {', '.join(refusing)}")
    else:
        unit = check_units([(who, part.unit) for who, part in parts])
    if c.sensitivity_kind is SensitivityKind.NONE:
        raise PrivacyError(
            f"clipper {c_name!r} bounds no sensitivity: a private run needs a clipping "
            "clipper (or set privacy.enabled: false for a non-private baseline)"
        )
    if unit is None:
        raise PrivacyError(f"accountant {a_name!r} claims no privacy unit: it cannot account a private run")
    return unit


def check_structure(name: str, model: Any, accountant: tuple[str, Any] | None = None) -> None:
    """A DP-SGD model must keep examples apart: refuse ``WHOLE_GRAPH``, no declaration, or a
    structure the accountant's analysis does not cover (its ``structures``).

    :raises PrivacyError: naming the model and what to do instead.
    """
    from graphveil.contract.profiles import ExampleStructure

    structure = getattr(model, "structure", None)
    if not isinstance(structure, ExampleStructure):
        raise PrivacyError(f"model {name!r} declares no per-example structure (class attribute "
                           "`structure`, a graphveil.contract.profiles.ExampleStructure)")
    if structure is ExampleStructure.WHOLE_GRAPH:
        raise PrivacyError(
            f"model {name!r} mixes every node of the graph in one forward (structure whole_graph): "
            "no per-example gradient exists to clip. Train it on disjoint subgraphs (structure "
            "components) or release the graph part through a mechanism instead"
        )
    covered = getattr(accountant[1], "structures", None) if accountant is not None else None
    if covered is not None and structure not in covered:
        raise PrivacyError(
            f"accountant {accountant[0]!r} analyses models of structure "
            f"{', '.join(sorted(s.value for s in covered))}; model {name!r} is {structure.value} (its "
            "examples read other units' data, so one unit changes more than one example)")


def check_profiles(accountant: Any, sampling: Any, sensitivity: Any) -> None:
    """At bind time: the numeric profiles form a supported pair for the accountant's unit.

    :raises ProfileMismatchError: naming the pair, the units and what the accountant analyses.
    """
    check_pair(accountant.mechanism, accountant.supports, sampling.kind, sensitivity.kind)
    if sensitivity.unit != accountant.unit:
        raise ProfileMismatchError(
            f"accountant {accountant.mechanism!r} is {getattr(accountant.unit, 'value', None)}-level but "
            f"the sensitivity is stated {getattr(sensitivity.unit, 'value', None)}-level"
        )
