"""The relational task's per-tuple losses (paper 2, Sec. 3.1): the one place the task, its
protocols and plugins take them from.

* :class:`LossSpec` — which loss (InfoNCE or hinge) and its temperature or margin
  (``training.loss``, ``training.temperature``, ``training.margin``);
* :func:`batch_losses` — the ``(b,)`` losses of a :class:`~graphveil.contract.sampler.TupleBatch`
  under an encoder (entities embedded tuple-major, masked negatives left out);
* :func:`tuple_losses`, :func:`tuple_scores` — the same from embeddings.

Their code is still in the engine (:mod:`graphveil.engine.dp_step`, :mod:`graphveil.engine.losses`):
``dp_step`` accepts a :class:`LossSpec` in place of a task's ``losses`` and the audit's canary
scores call :func:`batch_losses`, and the framework cannot import a plugin. Once ``dp_step``
takes only a task's ``losses`` callable, the code moves here and these names stay.
"""

from graphveil.engine.dp_step import LossSpec, batch_losses
from graphveil.engine.losses import LossKind, tuple_losses, tuple_scores

__all__ = ["LossKind", "LossSpec", "batch_losses", "tuple_losses", "tuple_scores"]
