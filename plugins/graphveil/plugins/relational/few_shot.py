"""Few-shot relation prediction (paper 2, Sec. 4.2 and Table 3): the released encoder fine-tuned
without noise on a few relations of the held-out side (the test domain), then ranked on the rest.

The few-shot relations are evaluation data from the test domain, not the training data the
guarantee covers, so ε is unchanged (paper 2, App. C: "the examples used for further
fine-tuning are non-private from the test domain"). The encoder's trainable weights are put back
afterwards: what a run saves and a site shares is the released model, never the few-shot one.
"""

from __future__ import annotations

from typing import Any

import torch

from graphveil.contract.errors import ConfigError
from graphveil.contract.model import Encoder
from graphveil.engine.dp_step import nonprivate_step
from graphveil.evaluation import relation_prediction
from graphveil.plugins.relational.losses import LossSpec
from graphveil.sampling import pair_with_random_ends


def split_few_shot(edges: torch.Tensor, train: int, validation: int, seed: int
                   ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(train, validation, test)`` relations: a seeded random ``train`` + ``validation`` of
    ``edges`` and every other one for testing.

    :raises ConfigError: if fewer than ``train + validation + 2`` relations are held out.
    """
    m = edges.shape[0]
    if m < train + validation + 2:
        raise ConfigError(f"evaluation.few_shot: {train} + {validation} relations asked for, but the "
                          f"held-out side has {m}; at least two more must remain to test on")
    order = torch.randperm(m, generator=torch.Generator().manual_seed(seed))
    return edges[order[:train]], edges[order[train : train + validation]], edges[order[train + validation :]]


def few_shot_relation_prediction(
    model: Encoder, edges: torch.Tensor, nodes: torch.Tensor, released_z: torch.Tensor, config: Any,
    loss: LossSpec, *, lr: float, optimizer: str, batch_size: int, max_edges: int | None, seed: int,
) -> dict[str, Any]:
    """Fine-tune ``model`` without noise on ``config.relations`` held-out relations, choose the
    step with the best MRR on ``config.validation`` others (step 0, the released model, included),
    and rank the remaining relations with that model; the model's weights are restored after.

    :param edges: ``(m, 2)`` held-out relations, indices into ``nodes``.
    :param nodes: held-out side entity indices into the encoder's dataset.
    :param released_z: ``(len(nodes), d)`` the released model's embeddings of ``nodes``: the
        same test relations ranked without few-shot fine-tuning (``fewshot_released_*``), the
        paired comparison (zero-shot metrics rank every held-out relation, a larger set).
    :param config: :class:`graphveil.run.config.FewShotConfig`.
    :param optimizer: ``"adam"`` or ``"sgd"`` (the run's ``training.optimizer``).
    :returns: ``fewshot_prec1``, ``fewshot_mrr`` and ``fewshot_released_prec1``,
        ``fewshot_released_mrr`` on the test relations, ``fewshot_relations`` (how many were
        tested) and ``fewshot_step`` (the step chosen, 0: fine-tuning did not help validation).
    """
    train, val, test = split_few_shot(edges, config.relations, config.validation, seed)
    gen = torch.Generator().manual_seed(seed + 1)
    released = model.trainable_state()
    params = list(model.trainable_parameters())
    opt = torch.optim.Adam(params, lr=lr) if optimizer == "adam" else torch.optim.SGD(params, lr=lr)

    def score(rel: torch.Tensor, size: int, limit: int | None = None) -> dict[str, float]:
        used = rel.unique()  # embed only the entities these relations touch
        local = torch.searchsorted(used, rel)

        def embed_all() -> torch.Tensor:
            return torch.cat([model.embed(nodes[used[i : i + 512]]) for i in range(0, used.numel(), 512)])

        model.eval()
        try:
            return relation_prediction(local, embed_all, batch_size=size, max_edges=limit, seed=seed)
        finally:
            model.train()

    best_mrr, best_step, best_state = score(val, config.validation)["mrr"], 0, released
    try:
        for step in range(1, config.steps + 1):
            negatives = torch.randint(nodes.numel(), (train.shape[0], config.negatives), generator=gen)
            flip = torch.rand(train.shape[0], generator=gen) < 0.5
            positives = torch.where(flip.unsqueeze(1), train.flip(1), train)
            local = pair_with_random_ends(positives, negatives, gen)
            batch = type(local)(nodes[local.positives], nodes[local.negatives], nodes[local.anchors])
            nonprivate_step(model, batch, optimizer=opt, loss=loss)
            if step % config.eval_every == 0 or step == config.steps:
                mrr = score(val, config.validation)["mrr"]
                if mrr > best_mrr:
                    best_mrr, best_step, best_state = mrr, step, model.trainable_state()
        before = relation_prediction(test, lambda: released_z, batch_size=batch_size, max_edges=max_edges, seed=seed)
        if best_step == 0:
            after = before
        else:
            model.load_trainable_state(best_state)
            after = score(test, batch_size, max_edges)
    finally:
        model.load_trainable_state(released)
    return {"fewshot_prec1": after["prec1"], "fewshot_mrr": after["mrr"],
            "fewshot_released_prec1": before["prec1"], "fewshot_released_mrr": before["mrr"],
            "fewshot_relations": after["num_relations"], "fewshot_step": best_step}
