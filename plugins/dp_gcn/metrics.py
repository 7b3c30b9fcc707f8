"""Accuracy and F1 for single-label multi-class node classification (pure torch).

Paper 3 reports "F1" computed with scikit-learn's ``precision_recall_fscore_support(...,
average='micro')`` (its ``GCN.calculate_accuracy``). For single-label multi-class data micro-F1
equals accuracy, so the paper's F1 column is accuracy; its majority baseline (Cora 0.32) is the
majority class's share of the test nodes. GraphVeil reports accuracy (= that micro-F1) and the
macro-F1 as well.
"""

from __future__ import annotations

import torch


def accuracy(pred: torch.Tensor, target: torch.Tensor) -> float:
    """Share of equal entries (= micro-F1 for single-label classes); nan for no entries."""
    return float((pred == target).double().mean()) if target.numel() else float("nan")


def macro_f1(pred: torch.Tensor, target: torch.Tensor) -> float:
    """Unweighted mean over classes of F1 = 2TP / (2TP + FP + FN), over the classes that occur in
    ``target`` or ``pred`` (scikit-learn's ``f1_score(average='macro')`` with default labels);
    nan for no entries."""
    if not target.numel():
        return float("nan")
    pred, target = pred.reshape(-1).long(), target.reshape(-1).long()
    classes = torch.unique(torch.cat([pred, target]))
    tp = torch.stack([((pred == c) & (target == c)).sum() for c in classes]).double()
    fp = torch.stack([((pred == c) & (target != c)).sum() for c in classes]).double()
    fn = torch.stack([((pred != c) & (target == c)).sum() for c in classes]).double()
    return float((2 * tp / (2 * tp + fp + fn)).mean())
