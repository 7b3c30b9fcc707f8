"""Per-tuple relational losses from entity embeddings (paper 2, Sec. 3.1).

A tuple ``Tᵢ = (eᵢ⁺, eᵢ,₁⁻, …, eᵢ,ₖ⁻)`` is one clipping unit: the positive relation
``eᵢ⁺ = (uᵢ, vᵢ)`` and its negatives ``eᵢ,ⱼ⁻ = (wᵢⱼ, nᵢⱼ)``, where ``wᵢⱼ ∈ {uᵢ, vᵢ}`` is the end the
negative entity ``nᵢⱼ`` is paired with. Scores are cosine similarities ``s(x, y)``.

* InfoNCE: ``ℓᵢ = −ln( exp(s⁺/τ) / (exp(s⁺/τ) + Σⱼ exp(sⱼ⁻/τ)) )``
* Hinge:   ``ℓᵢ = Σⱼ max(0, γ − s⁺ + sⱼ⁻)``

with ``s⁺ = s(uᵢ, vᵢ)`` and ``sⱼ⁻ = s(wᵢⱼ, nᵢⱼ)``; masked negatives are left out of both.

The relational task's losses live here, with the task (:mod:`.task`): :class:`LossSpec` is the
``losses(model, batch)`` callable the engine's DP step takes, and the audit's canaries are scored
with the task's own ``losses``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

import torch
import torch.nn.functional as F

from graphveil.contract.errors import PluginError
from graphveil.contract.model import Encoder
from graphveil.contract.sampler import TupleBatch

__all__ = ["LossKind", "LossSpec", "batch_losses", "tuple_losses", "tuple_scores"]

LossKind = Literal["infonce", "hinge"]


def tuple_scores(emb: torch.Tensor, anchors_pos: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Cosine scores ``(s⁺ (b,), s⁻ (b, k))``.

    :param emb: ``(b, 2 + k, d)`` embeddings of ``u, v, n₁, …, nₖ`` per tuple.
    :param anchors_pos: ``(b, k)`` in ``{0, 1}``: which end of the positive (0: u, 1: v) each
        negative is paired with.
    """
    if emb.dim() != 3 or emb.shape[1] < 2:
        raise ValueError(f"emb must be (b, 2 + k, d), got {tuple(emb.shape)}")
    b, width, d = emb.shape
    k = width - 2
    if anchors_pos.shape != (b, k):
        raise ValueError(f"anchors_pos must be ({b}, {k}), got {tuple(anchors_pos.shape)}")
    unit = F.normalize(emb, dim=-1)
    pos = (unit[:, 0] * unit[:, 1]).sum(-1)
    anchors = torch.gather(unit[:, :2], 1, anchors_pos.long().unsqueeze(-1).expand(b, k, d))
    neg = (anchors * unit[:, 2:]).sum(-1)
    return pos, neg


def tuple_losses(
    emb: torch.Tensor,
    anchors_pos: torch.Tensor,
    mask: torch.Tensor,
    *,
    kind: LossKind,
    temperature: float = 0.05,
    margin: float = 0.2,
) -> torch.Tensor:
    """Loss of each tuple, shape ``(b,)``; tuple ``i`` depends only on ``emb[i]``.

    :param mask: ``(b, k)`` bool, False for padded (absent) negatives, which are ignored.
    :param kind: ``"infonce"`` (scores divided by ``temperature``) or ``"hinge"`` (``margin``).
    """
    pos, neg = tuple_scores(emb, anchors_pos)
    if mask.shape != neg.shape:
        raise ValueError(f"mask must be {tuple(neg.shape)}, got {tuple(mask.shape)}")
    mask = mask.bool()
    if kind == "infonce":
        logits = torch.cat([pos.unsqueeze(1), neg], 1) / temperature
        keep = torch.cat([torch.ones(mask.shape[0], 1, dtype=torch.bool), mask], 1)
        logits = logits.masked_fill(~keep, float("-inf"))
        return -torch.log_softmax(logits, dim=1)[:, 0]
    if kind == "hinge":
        return (F.relu(margin - pos.unsqueeze(1) + neg) * mask.to(neg.dtype)).sum(1)
    raise ValueError(f"unknown loss {kind!r}; expected 'infonce' or 'hinge'")


@dataclass(frozen=True)
class LossSpec:
    """Which per-tuple loss, and its temperature (InfoNCE) or margin (hinge)."""

    kind: LossKind = "infonce"
    temperature: float = 0.05
    margin: float = 0.2

    @classmethod
    def from_config(cls, training: Any) -> LossSpec:
        return cls(training.loss, training.temperature, training.margin)

    def __call__(self, encoder: Encoder, batch: TupleBatch) -> torch.Tensor:
        """The ``(b,)`` losses of ``batch``: a task's ``losses(model, batch)`` for the engine."""
        return batch_losses(encoder, batch, self)


def _anchor_positions(batch: TupleBatch) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(entities (b, 2+k) with masked negatives filled, anchors_pos (b, k), mask (b, k))``.

    ``batch.anchors`` holds the entity ``wᵢⱼ`` (an end of ``eᵢ⁺``); negatives ``< 0`` are absent.
    """
    u, v = batch.positives[:, :1], batch.positives[:, 1:]
    mask = batch.negatives >= 0
    anchors = batch.anchors
    bad = mask & (anchors != u) & (anchors != v)
    if bool(bad.any()):
        i, j = (int(x) for x in bad.nonzero()[0])
        raise PluginError(
            f"sampler produced anchor {int(anchors[i, j])} for negative {j} of tuple {i}, which is "
            f"not an end of its positive relation {batch.positives[i].tolist()}"
        )
    anchors_pos = (anchors == v).long() & mask.long()
    negatives = torch.where(mask, batch.negatives, u.expand_as(batch.negatives))
    return torch.cat([batch.positives, negatives], 1), anchors_pos, mask


def batch_losses(encoder: Encoder, batch: TupleBatch, loss: LossSpec) -> torch.Tensor:
    """Per-tuple losses ``(b,)``; entities are embedded tuple-major, one sequence per occurrence."""
    entities, anchors_pos, mask = _anchor_positions(batch)
    b, width = entities.shape
    emb = encoder.embed(entities.reshape(-1)).reshape(b, width, -1)
    return tuple_losses(
        emb, anchors_pos, mask, kind=loss.kind, temperature=loss.temperature, margin=loss.margin
    )
