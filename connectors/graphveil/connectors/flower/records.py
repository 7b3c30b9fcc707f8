"""What travels between server and sites: record names, metric keys, and their builders.

Server → site (train message): ``arrays`` (the global trainable parameters) and ``config``
(``server-round``, ``local-steps``).

Site → server (reply), and nothing else:

* ``arrays`` — the site's updated trainable parameters (LoRA adapter weights; a node task's model
  and, keyed ``<release>/<weight>``, the weights a release trained by DP-SGD, e.g. GAP's encoder):
  post-processing of its DP release; after a failure past the reservation, the server's own arrays unchanged.
  Absent when the site refused the round.
* ``metrics`` — scalars: :data:`PUBLIC_METRICS` always (the task's own parameters and the site's
  policy, none computed from data); :data:`SPEND_METRICS` only if the site set ``share-epsilon``
  (ε depends on the sampling rate b/|Ē|); :data:`UTILITY_METRICS` only if the site set
  ``share-utility-metrics`` (held-out scores). Both opt-ins are non-private releases
  (deploy/RUNBOOK.md §5).
* ``site`` — ``site-name``, ``status`` (:data:`STATUSES`) and, when refused or failed, a
  ``reason`` written by GraphVeil (never an exception text that could quote data); and, in every
  reply sent after the site opened its ledger, the ledger's witness head (:data:`LEDGER_KEYS`,
  :meth:`graphveil.ledger.PrivacyLedger.witness_head`): ``ledger-seq``, the number of rounds the
  ledger has closed, ``ledger-head`` the keyed hash of the last of them and ``ledger-previous``
  the one before — for the server's witness (:mod:`graphveil.ledger.witness`). The hashes are
  HMACs under the site's key: they say nothing about the rows' values. ``failed`` happens only
  before the spend is reserved; after it, every reply is ``trained``.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

import numpy as np
import torch
from flwr.app import Array, ArrayRecord, ConfigRecord, Message, MetricRecord, RecordDict

from graphveil.ledger import WitnessHead

ARRAYS = "arrays"
CONFIG = "config"
METRICS = "metrics"
SITE = "site"

SERVER_ROUND = "server-round"
LOCAL_STEPS = "local-steps"

#: Key the server's strategy weights adapters by: the public number of local steps.
WEIGHT = "num-steps"
#: Data-independent scalars every trained reply carries: the server's own step count and σ
#: (the task gives σ directly), and the site's own δ and budget (its policy).
PUBLIC_METRICS = ("num-steps", "delta", "epsilon-budget", "noise-multiplier")
#: ε spent so far (and, in a budget refusal, the ε the round would have reached), sent only when
#: the site sets ``share-epsilon``: public at edge level (accounted from the site's public size
#: floor), a non-private release at node level (it depends on |Ē| and n).
SPEND_METRICS = ("epsilon", "projected-epsilon")
#: A trained reply of a site that shares its spend.
PRIVACY_METRICS = ("num-steps", "epsilon", "delta", "epsilon-budget", "noise-multiplier")
#: Held-out scores, sent only when the site sets ``share-utility-metrics`` (not privatized).
UTILITY_METRICS = ("mrr", "prec1")
#: A budget refusal of a site that shares its spend (without ``share-epsilon``: no ε values).
REFUSAL_METRICS = ("num-steps", "epsilon", "delta", "epsilon-budget", "projected-epsilon")
#: Every metric key a reply may carry; the server ignores (and logs) any other.
KNOWN_METRICS = tuple(dict.fromkeys(PRIVACY_METRICS + UTILITY_METRICS + REFUSAL_METRICS))
#: The ledger's witness head in a reply's ``site`` record (every reply after the ledger opened).
LEDGER_SEQ, LEDGER_HEAD, LEDGER_PREVIOUS = "ledger-seq", "ledger-head", "ledger-previous"
LEDGER_KEYS = (LEDGER_SEQ, LEDGER_HEAD, LEDGER_PREVIOUS)
SITE_KEYS = ("site-name", "status", "reason", *LEDGER_KEYS)
_HEX64 = re.compile(r"^[0-9a-f]{64}$")

TRAINED, REFUSED, FAILED = "trained", "refused", "failed"
STATUSES = (TRAINED, REFUSED, FAILED)


def arrays_from_state(state: Mapping[str, torch.Tensor]) -> ArrayRecord:
    return ArrayRecord({k: Array(np.ascontiguousarray(v.detach().cpu().numpy())) for k, v in state.items()})


def state_from_arrays(record: ArrayRecord) -> dict[str, torch.Tensor]:
    return {k: torch.from_numpy(np.array(v.numpy(), copy=True)) for k, v in record.items()}


def train_content(arrays: ArrayRecord, server_round: int, local_steps: int) -> RecordDict:
    return RecordDict({ARRAYS: arrays, CONFIG: ConfigRecord({SERVER_ROUND: server_round, LOCAL_STEPS: local_steps})})


def _site_record(values: dict[str, Any], ledger_head: WitnessHead | None) -> ConfigRecord:
    if ledger_head is not None:
        values[LEDGER_SEQ], values[LEDGER_HEAD] = int(ledger_head.seq), ledger_head.head
        if ledger_head.previous is not None:
            values[LEDGER_PREVIOUS] = ledger_head.previous
    return ConfigRecord(values)


def trained_content(site: str, state: Mapping[str, torch.Tensor], metrics: Mapping[str, float], *,
                    ledger_head: WitnessHead | None = None) -> RecordDict:
    """A trained reply; ``ledger_head``: the ledger's witness head after the round's release (the
    server refuses a trained reply without one)."""
    return RecordDict({
        ARRAYS: arrays_from_state(state),
        METRICS: MetricRecord(dict(metrics)),
        SITE: _site_record({"site-name": site, "status": TRAINED}, ledger_head),
    })


def refused_content(site: str, status: str, reason: str, metrics: Mapping[str, float], *,
                    ledger_head: WitnessHead | None = None) -> RecordDict:
    """A refused or failed reply; ``ledger_head`` if the site had opened its ledger."""
    if status not in (REFUSED, FAILED):
        raise ValueError(f"status must be {REFUSED!r} or {FAILED!r}, got {status!r}")
    return RecordDict({
        METRICS: MetricRecord(dict(metrics)),
        SITE: _site_record({"site-name": site, "status": status, "reason": reason}, ledger_head),
    })


def ledger_head_of(site_values: Mapping[str, Any]) -> WitnessHead | None:
    """The witness head a reply's ``site`` record carries; ``None`` if it carries none.

    :raises ValueError: naming the key, if it carries a malformed one."""
    if not any(k in site_values for k in LEDGER_KEYS):
        return None
    seq, head, previous = (site_values.get(k) for k in LEDGER_KEYS)
    if isinstance(seq, bool) or not isinstance(seq, int) or seq < 0:
        raise ValueError(f"{LEDGER_SEQ} {seq!r} is not an integer >= 0")
    for key, value in ((LEDGER_HEAD, head), (LEDGER_PREVIOUS, previous)):
        if (value is not None or key == LEDGER_HEAD) and not (isinstance(value, str) and _HEX64.match(value)):
            raise ValueError(f"{key} {value!r} is not 64 lower-case hex digits")
    if (previous is None) != (seq == 0):
        raise ValueError(f"{LEDGER_PREVIOUS} must come with {LEDGER_SEQ} >= 1 (and only then)")
    return WitnessHead(seq, head, previous)


def describe_content(content: RecordDict) -> dict[str, Any]:
    """Everything a reply carries, as JSON: array names/shapes/dtypes and every scalar value.

    The server writes this for each reply to its audit log, so what left each site can be read.
    """
    out: dict[str, Any] = {}
    for name, record in content.items():
        if isinstance(record, ArrayRecord):
            out[name] = {"type": "ArrayRecord", "arrays": {
                k: {"shape": list(v.shape), "dtype": str(v.dtype)} for k, v in record.items()}}
        elif isinstance(record, MetricRecord):
            out[name] = {"type": "MetricRecord", "values": dict(record)}
        elif isinstance(record, ConfigRecord):
            out[name] = {"type": "ConfigRecord", "values": {k: _jsonable(v) for k, v in record.items()}}
        else:  # pragma: no cover - RecordDict holds only the three kinds
            out[name] = {"type": type(record).__name__}
    return out


def _jsonable(value: Any) -> Any:
    if isinstance(value, bytes):
        return value.hex()
    if isinstance(value, list):
        return [_jsonable(v) for v in value]
    return value


def describe_reply(message: Message) -> dict[str, Any]:
    entry: dict[str, Any] = {"node-id": int(message.metadata.src_node_id)}
    if message.has_error():
        entry["error"] = {"code": int(message.error.code), "reason": str(message.error.reason)}
    else:
        entry["content"] = describe_content(message.content)
    return entry
