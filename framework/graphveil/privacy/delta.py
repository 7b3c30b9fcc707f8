"""The default δ of a run, from the number of privacy units in its training data."""

from __future__ import annotations

import math

#: Name of the rule, recorded in ``privacy.json`` as ``delta_rule`` when δ was not given.
DEFAULT_DELTA_RULE = "10^-(ceil(log10 n)+1)"


def default_delta(num_units: int) -> float:
    """δ = 10^-(⌈log₁₀ n⌉ + 1): at most 1/(10n), rounded DOWN to a power of ten.

    ``n`` is the number of privacy units in the training data: training entities for
    node-level (entity) DP, training relations |E_train| (before any degree capping) for
    edge-level DP.

    Why:

    * δ ≥ 1/n admits mechanisms that are (ε, δ)-DP yet publish one unit's data in the clear
      (release each of the n units' records with probability δ: in expectation one is
      published). δ must be *well below* 1/n.
    * 1/(10n) is the usual "well below 1/n" margin.
    * Rounding down to a power of ten makes δ reveal only n's order of magnitude, not n.

    >>> default_delta(2230)          # training entities of a 3 186-entity graph split 70/30
    1e-05
    >>> default_delta(1000)          # exactly a power of ten: 1/(10n) itself
    0.0001
    >>> default_delta(1001)
    1e-05
    >>> default_delta(9)
    0.01
    >>> default_delta(1)
    0.1
    >>> all(default_delta(n) <= 1 / (10 * n) for n in range(1, 5000))
    True

    :raises ValueError: if ``num_units`` is not a positive integer.
    """
    if isinstance(num_units, bool) or int(num_units) != num_units or num_units < 1:
        raise ValueError(f"number of privacy units must be a positive integer, got {num_units!r}")
    n = int(num_units)
    digits = len(str(n - 1)) if n > 1 else 0  # ⌈log₁₀ n⌉ in exact integer arithmetic
    return float(f"1e-{digits + 1}")


def delta_too_large(delta: float, num_units: int) -> bool:
    """Whether ``delta`` is at least 1/n (the level at which δ no longer protects one unit).

    >>> delta_too_large(1e-3, 1000), delta_too_large(9.9e-4, 1000)
    (True, False)
    """
    return delta * num_units >= 1.0 or math.isclose(delta * num_units, 1.0)


def delta_warning(delta: float, num_units: int, name: str, units: str) -> str | None:
    """The warning an explicit δ ≥ 1/n gets (None below 1/n); ``name`` is where δ was set
    (``privacy.delta``, ``--delta``), ``units`` what the n privacy units are.

    >>> delta_warning(1e-3, 1000, "--delta", "--edges")[:52]
    '--delta=0.001 is not below 1/n for n=1000 privacy un'
    >>> delta_warning(1e-5, 1000, "--delta", "--edges") is None
    True
    """
    if not delta_too_large(delta, num_units):
        return None
    return (f"{name}={delta:.3g} is not below 1/n for n={num_units} privacy units ({units}): a mechanism may "
            f"then publish one unit's data in the clear and still satisfy the claim; the default rule would "
            f"give {default_delta(num_units):.0e}")
