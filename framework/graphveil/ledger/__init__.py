"""The per-site privacy ledger: a durable, hash-chained privacy odometer in one SQLite file.

A data owner keeps **one ledger per site dataset**. It records the RDP curve of *everything the
site has released*, across rounds, runs, mechanisms, sampling rates γ and noise multipliers σ,
so the ε it shows is the total spent on the site's data, not the spend of one run.

Composition
-----------
Rényi DP composes additively: if mechanism i is (α, ρᵢ(α))-RDP for every order α, the
adaptive composition of all of them is (α, Σᵢ ρᵢ(α))-RDP (Mironov 2017, "Rényi Differential
Privacy", Prop. 1). This holds across *different* mechanisms, γ and σ as long as every ρᵢ is
stated for the same privacy unit and adjacency relation. The ledger is therefore bound (in its
``meta`` table, through chained ``bind`` rows) to the site, the privacy unit, δ and the RDP
order grid — and to nothing else. Each reservation stores the RDP *increment* of its steps,
``steps · accountant.rdp_curve(σ)`` on the ledger's orders; the spent ε is
``rdp_to_epsilon(orders, Σ increments, δ)`` (Thm D.1). A change of batch size, data size,
mechanism or σ is simply another increment. Accountants without an RDP curve (no
``orders``/``rdp_curve``/``total_rdp``) are refused: their spend cannot be added up here.

Write-ahead rule (DESIGN.md, "Federated"): spend is written *before* any output leaves the site.

1. :meth:`PrivacyLedger.reserve` — in one exclusive transaction: verify the chain, add the
   planned increment to the recorded total, and either append a ``reserve`` row or, if ε would
   exceed the budget, a ``refuse`` row and raise :class:`BudgetExhaustedError`.
2. :meth:`PrivacyLedger.release` — after training, compare the RDP curve of the steps the run's
   accountant actually took with the reserved increment (pointwise). If it is larger, the larger
   increment is appended first (``raise`` row), or the output is withheld when later
   reservations were already built on the smaller one; then a ``release`` row.

A site killed between 1 and 2 leaves an unconfirmed reservation, which counts in full.

Creation
--------
A ledger is created once, explicitly: :func:`init_ledger` (``graphveil budget init``) makes the
site key ``<ledger>.key`` (:mod:`graphveil.ledger.site_key`, 0600, never replaced), the ledger and, if
asked, its anchor. Opening a ledger never creates any of them: a missing ledger, key or anchor
is an error naming the file. (An implicit create-on-first-use would turn "restore a backup,
delete the anchor" into a silent re-anchoring.)

Tamper evidence
---------------
The ``entries`` table is append-only and hash-chained: each row's ``hash`` is the HMAC-SHA256,
under the site key, of the canonical JSON of all its fields (id, kind, reference, site, run,
round, steps, σ, δ, ε, budget, mechanism, profile, increment, note) together with ``prev_hash``;
the first row's ``prev_hash`` is the genesis hash, the keyed hash of the ledger's creation meta
(a random ledger id and the creation time). Status changes (release, withhold, a larger
increment) and the storage of a degree-capped record set are new chained rows that reference
the reservation or key, never updates. So a raw SQL ``UPDATE`` or ``DELETE`` of any row breaks
:meth:`PrivacyLedger.verify` (a deleted last row is caught by SQLite's AUTOINCREMENT counter,
and for certain by an anchor), and so does a *consistent* rewrite of the whole chain (every
increment scaled, every hash recomputed) by anyone without the key. A ledger that fails
verification refuses to reserve.

The key does not stop the party that holds it: the site's operator can rewrite the chain and
re-sign it. What stops the operator is a witness outside the site (below). The key also keeps
the heads the server witnesses opaque: entry values depend on private sizes (ε depends on
b/|Ē|), and an unkeyed head would let the server test guesses of them.

Anchoring against rollback
--------------------------
A chain cannot tell a restored backup from the real file: both verify. Pass
``anchor=Path(...)``: after every committed write the ledger atomically writes
``{"count": n, "hash": h}`` (its head) to that file, and on open and before every reservation
it checks that its own chain has the anchored head as a prefix; a missing anchor is refused
(``init`` writes the first one; ``init --reanchor`` a lost one, explicitly). **Keep the anchor
outside the ledger's volume** — another disk or mount, a WORM/object-lock bucket synced from
it, or simply the head printed by ``graphveil budget head`` into the operator's log — otherwise
a restored volume snapshot rolls back the anchor together with the ledger. ``graphveil budget
verify --anchor FILE`` or ``--expect-head HASH`` checks a ledger against an anchor kept
elsewhere.

The witness
-----------
An anchor is the site operator's own file. Every reply a site sends after opening its ledger
carries :meth:`PrivacyLedger.witness_head`: the number of *checkpoint* rows (one per round that
reached the ledger: ``release``, ``withhold`` or ``refuse``) and the keyed hash of the last one.
The server keeps them per site (:mod:`graphveil.ledger.witness`) and refuses a site whose
sequence number goes backwards (a restored backup, a replaced ledger) or whose head differs at
a sequence number it saw before (a fork). Without the key the server cannot check that a larger
sequence number extends what it saw; the site can: ``graphveil budget verify --witness FILE``
checks that the ledger's chain holds every witnessed (seq, head), which catches a rewrite of
history the server saw, even one re-signed with the key. See deploy/RUNBOOK.md §8 for what the
witness does and does not protect against.

Schema migration (versions 1 and 2 → 3)
---------------------------------------
Schema 3 is schema 2 with the chain keyed (and a ``rekey`` row kind). ``graphveil budget init``
upgrades an older ledger: a schema-2 ledger's unkeyed chain is verified, then every row is
re-chained under the new key in one transaction; the unkeyed table stays as ``entries_v2`` and a
chained ``rekey`` row records its row count and head. Opening a schema-2 ledger without that
step is an error saying so.

A version-1 ledger held, per entry, the *cumulative* accountant state (mechanism, profile, order
grid, history of (σ, steps)). ``init`` creates its key, and opening it then migrates it in one
transaction: the v1 table is kept as ``entries_v1`` (audit), and the latest counting v1 state is
replayed by the installed accountant plugin of the same mechanism, rebound to the recorded
profile (the accountant's own ``load_state_dict`` refuses a different profile or order grid) —
its ``total_rdp()`` becomes a single chained ``migrate`` row that counts like a reservation. The
rebuilt ε must equal the ε the v1 ledger recorded, otherwise nothing changes. This is sound (it
is the exact RDP curve the v1 ledger was accounting) and is the only option that is: a bare
(ε, δ) total has no RDP curve to compose with. When the curve cannot be rebuilt (plugin missing,
accountant without RDP), the v1 file is left untouched (and ``init`` removes the key it made)
and a :class:`LedgerError` explains why; ``graphveil budget migrate`` performs the same
migration explicitly on a ledger that has its key.

Degree-capped record sets
-------------------------
:meth:`PrivacyLedger.save_records` stores the site's degree-capped record set Ē (an (m, 2)
int64 tensor) once; its SHA-256 is a chained row, so replacing Ē silently breaks
verification, saving different content under an existing key is refused, and so is a second
record set under another key (other data or other capping options): one ledger, one Ē.
"""

from graphveil.ledger.chain import schema_version_of
from graphveil.ledger.create import init_ledger
from graphveil.ledger.entries import (
    CHECKPOINTS,
    COUNTING,
    KINDS,
    SCHEMA_VERSION,
    BudgetExhaustedError,
    LedgerBindingError,
    LedgerEntry,
    LedgerError,
    Reservation,
    VerifyReport,
    WitnessHead,
)
from graphveil.ledger.ledger import PrivacyLedger
from graphveil.ledger.summary import format_summary

__all__ = [
    "CHECKPOINTS", "COUNTING", "KINDS", "SCHEMA_VERSION", "BudgetExhaustedError", "LedgerBindingError",
    "LedgerEntry", "LedgerError", "PrivacyLedger", "Reservation", "VerifyReport", "WitnessHead",
    "format_summary", "init_ledger", "schema_version_of",
]
