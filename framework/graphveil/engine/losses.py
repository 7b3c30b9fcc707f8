"""Per-tuple relational losses from entity embeddings (paper 2, Sec. 3.1).

A tuple ``Tᵢ = (eᵢ⁺, eᵢ,₁⁻, …, eᵢ,ₖ⁻)`` is one clipping unit: the positive relation
``eᵢ⁺ = (uᵢ, vᵢ)`` and its negatives ``eᵢ,ⱼ⁻ = (wᵢⱼ, nᵢⱼ)``, where ``wᵢⱼ ∈ {uᵢ, vᵢ}`` is the end the
negative entity ``nᵢⱼ`` is paired with. Scores are cosine similarities ``s(x, y)``.

* InfoNCE: ``ℓᵢ = −ln( exp(s⁺/τ) / (exp(s⁺/τ) + Σⱼ exp(sⱼ⁻/τ)) )``
* Hinge:   ``ℓᵢ = Σⱼ max(0, γ − s⁺ + sⱼ⁻)``

with ``s⁺ = s(uᵢ, vᵢ)`` and ``sⱼ⁻ = s(wᵢⱼ, nᵢⱼ)``; masked negatives are left out of both.
"""

from __future__ import annotations

from typing import Literal

import torch
import torch.nn.functional as F

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
