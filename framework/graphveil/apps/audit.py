"""A one-run privacy audit of a relational run (Steinke, Nasr & Jagielski, NeurIPS 2023).

``graphveil audit CONFIG`` trains the config's run ONCE on its data plus ``m`` canaries, each
put in or left out independently with probability 1/2, guesses each canary's membership from
the released weights, and turns the number of correct guesses into an empirical ε lower bound
(:mod:`graphveil.privacy.one_run_audit`) printed beside the claimed ε.

Canaries are the run's privacy unit, so the bound speaks about the claim the run makes:

* entity-level runs (unit ``node``): a canary is a fresh entity with ``degree`` relations to
  fresh partner entities of its own (default: the sampler's degree cap K, so a canary reaches
  the most a unit may contribute). Left out, the entity and its relations are absent; its
  partners stay in the data either way (isolated), so toggling a canary is exactly adding or
  removing one entity with its relations.
* edge-level runs (unit ``edge``): a canary is one relation between two fresh entities of its
  own; both entities stay in the data either way, only the relation comes and goes.

Why fresh entities with random text: the audit has power only if an included canary leaves a
trace a left-out one cannot, so canaries should be easy to tell apart. Every fresh entity's
text is a string of random pseudo-words (no word of the data, no two entities alike) and its
feature vector, on a feature graph, an independent Gaussian draw with the data's per-column
mean and spread; a canary's relations touch nothing else, so an included canary's relations
are the only training signal its entities ever get, and nothing else the model learns predicts
them. Canary ids are
drawn until they fall on the training side of the keyed transfer split (``two_graphs``: they
join graph A), so an included canary is training data.

Guess: the score of a canary is how much the released model lowered the loss of its relations,
``ℓ_before − ℓ_after`` — the run's own tuple loss (InfoNCE or hinge, at its temperature / margin)
of each canary relation in both directions against ``negatives`` fresh entities of OTHER
canaries (drawn before training, independent of membership), averaged over the canary's
relations. Negatives of the same kind as the canary's partners cancel what training does to
fresh entities in general: on a tiny LoRA model (64 canaries, 100 non-private steps) data
entities as negatives gave mean scores 2.35 in / 1.43 out and 27 of 32 guesses right, these
negatives 0.81 in / −1.29 out and 31 of 32. Before is the model as initialised, after is the trained (released) trainable state; both are public or
released, so the guess reads nothing private. The top ``r/2`` scores are guessed "in", the
bottom ``r/2`` "out", the rest abstained on. Each ``r`` of a small grid fixed in advance is
tested at level ``(1 − confidence)/len(grid)`` (Bonferroni), so the largest of their bounds
still holds at ``confidence``; ``guesses`` fixes one ``r`` instead.

Randomness: membership comes from the OS CSPRNG (fresh, written nowhere before training)
unless ``seed`` is given (tests; the canaries' contents then come from ``seed + 1``, a separate
stream); the run's own sampling seed and noise source are the config's.

Limits: the bound is a lower bound that holds with probability ``confidence``; a run that is
far less private than claimed may still show a small bound (a weak guesser, few canaries, few
steps), and even a run that memorises every canary cannot show more than the all-correct bound
of ``r`` guesses (about 1.8 at r = 20, 2.6 at r = 40, 3.5 at r = 100 at 95 %). One run at small
``m`` is weak evidence either way; it can refute a claim, never confirm one.
"""

from __future__ import annotations

import math
import secrets
import string
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from graphveil.contract.errors import ConfigError, DataError
from graphveil.contract.host import PluginHost, default_host
from graphveil.contract.model import Encoder
from graphveil.contract.sampler import TupleBatch
from graphveil.contract.units import Adjacency, PrivacyUnit, UnitKind
from graphveil.data.graph import RelationalGraph
from graphveil.data.split import split_key, split_position
from graphveil.privacy.one_run_audit import all_correct_bound, epsilon_lower_bound
from graphveil.run.config import RunConfig
from graphveil.run.outputs import RunDirectory
from graphveil.run.session import TrainingSession

#: Default number of canaries.
DEFAULT_CANARIES = 100
#: Shares of the canaries guessed on (each ``r`` tested at level ``(1 − confidence) / 4``).
GUESS_FRACTIONS = (0.1, 0.2, 0.5, 1.0)
#: Negatives each canary relation is scored against.
DEFAULT_NEGATIVES = 16
#: Random pseudo-words per fresh entity text, and their length range.
TEXT_WORDS, WORD_LENGTH = 6, (4, 8)
#: Canary relations scored per forward pass.
SCORE_CHUNK = 64


@dataclass
class CanarySet:
    """The data of one audited run with its canaries, and what the guesser scores.

    :param unit: the run's privacy unit (``node`` or ``edge``).
    :param included: ``(m,)`` bool, canary i is in the training data (the audit's secret S).
    :param graph: the training input: the data, every canary's fixed partner entities, the
        included canaries (their entity, for entity-level, and their relations).
    :param probe: every fresh entity (canary entities and partners, included or not): the
        entities the guesser embeds; no relations.
    :param relations: per canary, ``(d, 2)`` its relations as probe indices.
    :param negatives: ``(m, k)`` probe indices: canary i's relations are scored against these
        fresh entities of other canaries (drawn before training, independent of membership).
    """

    unit: PrivacyUnit
    included: torch.Tensor
    graph: RelationalGraph
    probe: RelationalGraph
    relations: list[torch.Tensor]
    negatives: torch.Tensor
    degree: int = 1
    notes: dict[str, Any] = field(default_factory=dict)

    @property
    def m(self) -> int:
        return int(self.included.numel())


def draw_membership(m: int, seed: int | None = None) -> torch.Tensor:
    """``(m,)`` bool, each True independently with probability 1/2: from the OS CSPRNG, or from
    ``seed`` (reproducible tests only: whoever knows the seed knows the answer)."""
    if seed is None:
        bits = secrets.randbits(m) if m else 0
        return torch.tensor([(bits >> i) & 1 == 1 for i in range(m)], dtype=torch.bool)
    gen = torch.Generator().manual_seed(seed)
    return torch.rand(m, generator=gen) < 0.5


def _pseudo_text(gen: torch.Generator) -> str:
    letters = string.ascii_lowercase
    words = []
    for _ in range(TEXT_WORDS):
        size = int(torch.randint(WORD_LENGTH[0], WORD_LENGTH[1] + 1, (1,), generator=gen))
        words.append("".join(letters[int(i)] for i in torch.randint(0, 26, (size,), generator=gen)))
    return " ".join(words)


def _fresh_ids(count: int, taken: set[str], gen: torch.Generator, on_train_side: Any) -> list[str]:
    """``count`` new entity ids, none in ``taken``, each accepted by ``on_train_side``."""
    ids: list[str] = []
    while len(ids) < count:
        candidate = f"audit-canary-{int(torch.randint(0, 2**62, (1,), generator=gen)):016x}"
        if candidate not in taken and on_train_side(candidate):
            taken.add(candidate)
            ids.append(candidate)
    return ids


def plant_canaries(graph: RelationalGraph, split: Any, unit: PrivacyUnit, included: torch.Tensor, *,
                   degree: int = 1, negatives: int = DEFAULT_NEGATIVES, seed: int | None = None) -> CanarySet:
    """The training input with the included canaries, and the probe the guesser scores.

    :param graph: the data as loaded (``data.split.kind`` transfer: one graph; ``two_graphs``: the
        joined :class:`~graphveil.data.two_graphs.TwoGraphs`, canaries join graph A).
    :param split: the run's ``data.split``.
    :param unit: ``PrivacyUnit.NODE`` (a canary is an entity with ``degree`` relations) or
        ``PrivacyUnit.EDGE`` (a canary is one relation).
    :param included: ``(m,)`` bool membership (:func:`draw_membership`).
    :param seed: seed of the canaries' ids, texts and the negatives (default: OS entropy).
    :raises DataError: if the graph has no entity texts or no training-side entity.
    :raises ConfigError: on a split kind or unit the audit does not handle.
    """
    if graph.texts is None and graph.features is None:
        raise DataError(f"{graph.name}: the audit's canaries need entity texts or features; this graph has neither")
    if unit not in (PrivacyUnit.NODE, PrivacyUnit.EDGE):
        raise ConfigError(f"graphveil audit: privacy unit {unit.value!r} is not audited (node or edge only)")
    if degree < 1:
        raise ConfigError(f"canary degree must be >= 1, got {degree}")
    gen = torch.Generator().manual_seed(secrets.randbits(63) if seed is None else seed)
    m = int(included.numel())
    base, rebuild = _training_base(graph, split)
    key = split_key(split.seed)

    def on_train(eid: str) -> bool:
        return split.kind != "transfer" or split_position(key, eid) < split.train_fraction
    node_level = unit == PrivacyUnit.NODE
    # Fresh entities per canary: entity-level [canary, partner_1..partner_d], edge-level [a, b].
    per = 1 + degree if node_level else 2
    ids = _fresh_ids(m * per, set(base.entity_ids), gen, on_train)
    texts = None if base.texts is None else [_pseudo_text(gen) for _ in ids]
    features = _fresh_features(base.features, len(ids), gen)
    # Fresh entity j of canary i is ids[i * per + j]; present unless it is a left-out canary entity.
    present = [not (node_level and j == 0 and not bool(included[i])) for i in range(m) for j in range(per)]
    index, n = {}, base.num_nodes
    for pos, keep in enumerate(present):
        if keep:
            index[pos] = n
            n += 1
    relations_local: list[list[tuple[int, int]]] = []
    edges = []
    for i in range(m):
        pairs = [(0, j) for j in range(1, per)] if node_level else [(0, 1)]
        relations_local.append([(i * per + a, i * per + b) for a, b in pairs])
        if bool(included[i]):
            edges += [sorted((index[i * per + a], index[i * per + b])) for a, b in pairs]
    kept = [p for p in range(len(ids)) if present[p]]
    train_input = RelationalGraph(
        name=f"{base.name}+{int(included.sum())}/{m} canaries",
        entity_ids=base.entity_ids + [ids[p] for p in kept],
        edges=torch.cat([base.edges, torch.tensor(edges, dtype=torch.long).reshape(-1, 2)]),
        texts=None if texts is None else list(base.texts) + [texts[p] for p in kept],
        features=None if features is None else torch.cat([base.features, features[kept]]),
        labels=None if base.labels is None else torch.cat([base.labels, torch.full((len(kept),), -1)]),
        label_names=base.label_names, notes=dict(base.notes),
    )
    # Each canary's negatives: fresh entities of other canaries, drawn now (independent of S).
    k = min(negatives, per * (m - 1))
    owner = torch.arange(m * per) // per
    negs = torch.stack([torch.nonzero(owner != i).flatten()[torch.randperm(per * (m - 1), generator=gen)[:k]]
                        for i in range(m)])
    probe = RelationalGraph(name="audit probe", entity_ids=ids, edges=torch.zeros(0, 2, dtype=torch.long),
                            texts=texts, features=features)
    return CanarySet(
        unit=unit, included=included.clone(), graph=rebuild(train_input), probe=probe,
        relations=[torch.tensor(r, dtype=torch.long) for r in relations_local],
        negatives=negs, degree=per - 1 if node_level else 1,
        notes={"fresh_entities": len(ids), "relations_per_canary": per - 1 if node_level else 1,
               "negatives_per_relation": k},
    )


def _training_base(graph: RelationalGraph, split: Any) -> tuple[RelationalGraph, Any]:
    """The graph canaries join and how to put it back into the dataset the task splits."""
    if split.kind == "transfer":
        return graph, lambda g: g
    if split.kind == "two_graphs":
        from graphveil.data.two_graphs import TwoGraphs, join_graphs

        if not isinstance(graph, TwoGraphs):
            raise ConfigError("graphveil audit: data.split.kind two_graphs needs the joined dataset "
                              "(graphveil.data.load_data)")
        return graph.train, lambda g: join_graphs(g, graph.held_out)
    raise ConfigError(f"graphveil audit: data.split.kind {split.kind!r} is not audited "
                      "(transfer or two_graphs)")


def _fresh_features(features: torch.Tensor | None, count: int, gen: torch.Generator) -> torch.Tensor | None:
    """``count`` feature rows for fresh entities: independent Gaussians with the data's per-column
    mean and spread (a constant column gets spread 1), so no two are alike and none is a data row."""
    if features is None:
        return None
    x = features.detach().to(torch.float32)
    std = x.std(0).nan_to_num(1.0)
    std = torch.where(std > 0, std, torch.ones_like(std))
    return (x.mean(0) + std * torch.randn(count, x.shape[1], generator=gen)).to(features.dtype)


@torch.no_grad()
def canary_scores(encoder: Encoder, canaries: CanarySet, before: dict[str, torch.Tensor],
                  after: dict[str, torch.Tensor],
                  loss_fn: Callable[[Encoder, TupleBatch], torch.Tensor]) -> torch.Tensor:
    """``(m,)`` loss drop ``ℓ_before − ℓ_after`` of each canary's relations (module docstring),
    under the run task's own per-tuple ``loss_fn(model, batch)`` (its ``losses``).

    Prepares ``encoder`` on the probe and leaves it holding ``after``.
    """
    encoder.prepare(canaries.probe)
    pairs = torch.cat(canaries.relations)
    pairs = torch.cat([pairs, pairs.flip(1)])  # both directions: each end anchors the negatives once
    owner = torch.cat([torch.full((len(r),), i) for i, r in enumerate(canaries.relations)]).repeat(2)
    negs = canaries.negatives[owner]
    losses = []
    for state in (before, after):
        encoder.load_trainable_state(state)
        encoder.eval()
        parts = []
        for start in range(0, pairs.shape[0], SCORE_CHUNK):
            chunk, neg = pairs[start : start + SCORE_CHUNK], negs[start : start + SCORE_CHUNK]
            batch = TupleBatch(chunk, neg, chunk[:, :1].expand(-1, neg.shape[1]).clone())
            parts.append(loss_fn(encoder, batch).double())
        losses.append(torch.cat(parts))
    encoder.train()
    drop = losses[0] - losses[1]
    sums = torch.zeros(canaries.m, dtype=torch.float64).index_add_(0, owner, drop)
    return sums / torch.bincount(owner, minlength=canaries.m).double()


def guess(scores: torch.Tensor, r: int) -> torch.Tensor:
    """``(m,)`` guesses in {+1 in, −1 out, 0 abstain}: the top ``⌈r/2⌉`` scores in, the bottom
    ``⌊r/2⌋`` out (ties by canary index, which is independent of membership)."""
    m = scores.numel()
    if not 0 <= r <= m:
        raise ConfigError(f"guesses must be between 0 and the number of canaries {m}, got {r}")
    order = torch.argsort(scores, descending=True, stable=True)
    out = torch.zeros(m, dtype=torch.int8)
    k_in = (r + 1) // 2
    out[order[:k_in]] = 1
    if r - k_in:
        out[order[m - (r - k_in):]] = -1
    return out


def guess_grid(m: int, guesses: int | None = None) -> list[int]:
    """The guess counts tested: ``guesses`` alone, or :data:`GUESS_FRACTIONS` of ``m`` (≥ 2, distinct)."""
    if guesses is not None:
        return [int(guesses)]
    return sorted({min(m, max(2, round(f * m))) for f in GUESS_FRACTIONS})


def judge(scores: torch.Tensor, included: torch.Tensor, *, delta: float, confidence: float = 0.95,
          guesses: int | None = None) -> dict[str, Any]:
    """The ε lower bound from the scores: each ``r`` of :func:`guess_grid` at level
    ``(1 − confidence)/len(grid)``, the largest bound kept (Bonferroni: it holds at ``confidence``)."""
    m = int(included.numel())
    grid = guess_grid(m, guesses)
    level = (1.0 - confidence) / len(grid)
    truth = torch.where(included, 1, -1).to(torch.int8)
    tried = []
    for r in grid:
        g = guess(scores, r)
        v = int(((g == truth) & (g != 0)).sum())
        tried.append({"guesses": r, "correct": v,
                      "epsilon_lower_bound": epsilon_lower_bound(m, r, v, delta, 1.0 - level),
                      "most_possible": all_correct_bound(r, 1.0 - level) if r else 0.0})
    best = max(tried, key=lambda t: (t["epsilon_lower_bound"], -t["guesses"]))
    return {"canaries": m, "included": int(included.sum()), "confidence": confidence,
            "level_per_guess_count": level, "tried": tried, **best}


def _unit_of(session: TrainingSession) -> PrivacyUnit:
    unit = getattr(session.sampler, "unit", None)
    if (session.task.model_family != "encoder" or not isinstance(unit, PrivacyUnit)
            or unit.kind not in (UnitKind.NODE, UnitKind.EDGE) or unit.adjacency != Adjacency.ADD_REMOVE):
        raise ConfigError(
            f"graphveil audit: audits relational runs at entity level (node) or edge level; this run's task "
            f"{session.config.task.name!r} with sampler {session.config.sampler.name!r} "
            f"(unit {getattr(unit, 'value', unit)!r}) is not one")
    return PrivacyUnit(unit.kind)


def default_degree(config: RunConfig, unit: PrivacyUnit) -> int:
    """Relations per entity canary: the sampler's degree cap K if it has one (the most a unit may
    contribute), else 1; 1 for edge canaries."""
    if unit != PrivacyUnit.NODE:
        return 1
    cap = config.sampler.params.get("degree_cap")
    return int(cap) if cap else 1


def run_audit(config: RunConfig, *, canaries: int = DEFAULT_CANARIES, degree: int | None = None,
              guesses: int | None = None, confidence: float = 0.95, negatives: int = DEFAULT_NEGATIVES,
              seed: int | None = None, host: PluginHost | None = None, graph: RelationalGraph | None = None,
              output: Path | None = None) -> dict[str, Any]:
    """Plant canaries, train the config's run once, guess, bound; write ``audit.json``.

    :param seed: membership and canary seed (tests only; default: fresh OS entropy).
    :param graph: the loaded dataset (default: ``config.data``).
    :param output: the audit's folder (default ``runs/audit-<name>-<time>``), written under
        ``.partial`` and renamed when complete.
    :returns: the ``audit.json`` content plus ``run_dir``.
    :raises ConfigError: for a run the audit does not handle or bad audit options, before training.
    """
    if canaries < 2:
        raise ConfigError(f"--canaries must be >= 2, got {canaries}")
    if guesses is not None and not 2 <= guesses <= canaries:
        raise ConfigError(f"--guesses must be between 2 and --canaries ({canaries}), got {guesses}")
    if not 0 < confidence < 1:
        raise ConfigError(f"--confidence must be in (0, 1), got {confidence}")
    host = host or default_host()
    session = TrainingSession(config, host=host)
    session.assemble()  # refuses a mismatched run before any data is read
    unit = _unit_of(session)
    degree = default_degree(config, unit) if degree is None else degree
    if graph is None:
        graph = session.load_data()  # with the data options the assembly validated
    if hasattr(graph, "to_relational"):  # a feature graph (planetoid, twitch): its relations, as the task reads them
        graph = graph.to_relational()
    if not isinstance(graph, RelationalGraph):
        raise ConfigError(f"graphveil audit: the data is {type(graph).__name__}, not a relational graph")
    out = RunDirectory(Path(output) if output else RunDirectory.default_for(f"audit-{config.name}"))
    try:
        # membership and canary contents from separate streams, so the contents say nothing of S
        planted = plant_canaries(graph, config.data.split, unit, draw_membership(canaries, seed),
                                 degree=degree, negatives=negatives, seed=None if seed is None else seed + 1)
        session.graph = planted.graph
        session.prepare()
        before = session.encoder.trainable_state()
        train = session.train(on_step=lambda _s, metrics: out.log_metrics(metrics))
        privacy = session.privacy_report()
        after = session.encoder.trainable_state()
        scores = canary_scores(session.encoder, planted, before, after, session.task.losses)
        verdict = judge(scores, planted.included, delta=session.delta, confidence=confidence, guesses=guesses)
        result = {
            "name": config.name, "method": describe_method(config, unit), "unit": unit.value,
            "private": config.privacy.enabled, "claimed_epsilon": privacy["epsilon"],
            "delta": session.delta, "noise_multiplier": session.noise_multiplier, "steps": train["steps"],
            **planted.notes, **verdict,
            "scores": [float(s) for s in scores], "membership": [bool(x) for x in planted.included],
        }
        out.write_yaml("config.resolved.yaml", session.resolved_config())
        out.write_json("privacy.json", privacy)
        out.write_json("audit.json", result)
        run_dir = out.commit()
    except BaseException:
        out.discard()
        raise
    return {**result, "run_dir": run_dir}


def describe_method(config: RunConfig, unit: PrivacyUnit) -> str:
    """e.g. ``entity-level DP (entity_poisson_wor, standard_clip, coupled_rdp_standard)``."""
    level = "entity-level" if unit == PrivacyUnit.NODE else "edge-level"
    kind = f"{level} DP" if config.privacy.enabled else f"non-private ({level} sampler)"
    return f"{kind} ({config.sampler.name}, {config.clipper.name}, {config.accountant.name})"


def format_audit(result: dict[str, Any]) -> str:
    """The lines ``graphveil audit`` prints."""
    claimed = result["claimed_epsilon"]
    claim = "∞ (non-private)" if not math.isfinite(claimed) else f"{claimed:.3f}"
    pct = f"{100 * result['confidence']:g} %"
    rows = [
        ("method", result["method"]),
        ("unit", f"{result['unit']} (a canary is {'an entity with its relations' if result['unit'] == 'node' else 'a relation'}"
                 f"{', ' + str(result['relations_per_canary']) + ' relations' if result['unit'] == 'node' else ''})"),
        ("claimed ε (δ)", f"{claim} (δ = {result['delta']:.3g})"),
        ("canaries m", f"{result['canaries']} ({result['included']} in)"),
        ("guesses r", str(result["guesses"])),
        ("correct v", str(result["correct"])),
        (f"empirical ε lower bound ({pct})", f"{result['epsilon_lower_bound']:.3f}"
                                             f"  (at most {result['most_possible']:.3f} with {result['guesses']} guesses)"),
    ]
    width = max(len(k) for k, _ in rows)
    lines = [f"{k.ljust(width)}  {v}" for k, v in rows]
    tried = ", ".join(f"r={t['guesses']}: v={t['correct']} → {t['epsilon_lower_bound']:.3f}" for t in result["tried"])
    lines.append(f"(each guess count tested at level {result['level_per_guess_count']:.4g}: {tried})")
    return "\n".join(lines)
