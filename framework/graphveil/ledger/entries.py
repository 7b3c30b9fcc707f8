"""The ledger's vocabulary: schema version, row kinds and statuses, its errors and the records it
hands out (entries, reservations, verification reports, witness heads)."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from graphveil.contract.errors import GraphVeilError, PrivacyError

SCHEMA_VERSION = 3
#: Entry statuses whose spend counts (``refused`` entries record a request, not a release).
COUNTING = ("reserved", "released", "withheld", "migrated")
#: Row kinds of the chain.
KINDS = ("bind", "reserve", "refuse", "release", "withhold", "raise", "migrate", "records", "rekey")
#: Row kinds that close a request (one per round that reached the ledger, whatever the data):
#: the witness's sequence number counts these, never the data-dependent ``raise``/``records`` rows.
CHECKPOINTS = ("release", "withhold", "refuse")
_REL_TOL = 1e-9
_EPS_TOL = 1e-9


class LedgerError(GraphVeilError):
    """The ledger file is unreadable, from another program or a newer GraphVeil, fails
    verification, or was rolled back behind its anchor."""

class LedgerBindingError(PrivacyError):
    """The run's site, privacy unit, δ or RDP order grid differs from the one the ledger is
    bound to. ``key`` names it (``site``, ``unit``, ``delta`` or ``orders``)."""

    def __init__(self, message: str, *, key: str) -> None:
        super().__init__(message)
        self.key = key

class BudgetExhaustedError(PrivacyError):
    """The requested steps would take the site past its privacy budget; nothing was released."""

    def __init__(self, message: str, *, projected_epsilon: float, budget: float, spent: float) -> None:
        super().__init__(message)
        self.projected_epsilon = projected_epsilon
        self.budget = budget
        self.spent = spent

@dataclass(frozen=True)
class LedgerEntry:
    """One reservation (later released or withheld), refusal, or migrated v1 total.

    ``epsilon`` is the *cumulative* ε at ``delta`` after this entry (for a refusal: the ε the
    request would have reached). ``id`` is the id of the entry's first chain row.
    """

    id: int
    created: str
    status: str
    site: str
    run: str
    round: int
    steps: int
    noise_multiplier: float
    delta: float
    epsilon: float
    budget: float
    mechanism: str
    note: str

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)

@dataclass(frozen=True)
class Reservation:
    """Spend recorded ahead of training: the RDP increment of ``steps`` steps at σ."""

    entry_id: int
    increment: tuple[float, ...]
    orders: tuple[float, ...]
    epsilon: float
    delta: float
    budget: float
    steps: int
    noise_multiplier: float

@dataclass(frozen=True)
class VerifyReport:
    """Result of :meth:`PrivacyLedger.verify`. ``first_bad`` is the id of the first row that
    fails (``None`` if the failure is not one row's, e.g. the anchor or the meta table)."""

    ok: bool
    count: int
    head: str
    epsilon: float
    delta: float | None
    error: str | None = None
    first_bad: int | None = None

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)

@dataclass(frozen=True)
class WitnessHead:
    """What each reply of a site tells the server's witness: ``seq`` checkpoints (rounds the
    ledger closed), the keyed hash ``head`` of the last one and ``previous``, the hash of the
    one before (the genesis hash when ``seq`` is 1; ``None`` when it is 0)."""

    seq: int
    head: str
    previous: str | None
