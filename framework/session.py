"""A training session: one run of DP relational learning on one graph.

The same session runs locally (``graphveil run``) and inside a federated site: the site calls
:meth:`TrainingSession.train` for its local steps between rounds.

Order of work (DESIGN.md, "One DP step"): assemble components and check the invariant
(:meth:`assemble`, no data touched) → load and split the graph, preprocess the training side,
bind the accountant, calibrate σ (:meth:`prepare`) → steps (:meth:`train`) → zero-shot
evaluation on the held-out side (:meth:`evaluate`).
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable
from typing import Any

import torch

from graphveil.components import Accountant, Clipper, Encoder, Sampler, TupleBatch
from graphveil.config import RunConfig
from graphveil.data import RelationalGraph
from graphveil.errors import ConfigError, PrivacyError
from graphveil.evaluation import relation_prediction
from graphveil.host import PluginHost, default_host
from graphveil.profiles import SensitivityKind, check_compatible

log = logging.getLogger(__name__)


class TrainingSession:
    """Assemble, prepare, train and evaluate one run.

    :param config: the validated run configuration.
    :param host: plugin host (default: every installed plugin).
    :param graph: the whole graph to split; ``None`` loads ``config.data``.
    """

    def __init__(self, config: RunConfig, *, host: PluginHost | None = None,
                 graph: RelationalGraph | None = None) -> None:
        self.config = config
        self.host = host or default_host()
        self.graph = graph
        self.generator = torch.Generator().manual_seed(config.seed)
        self.sampler: Sampler | None = None
        self.clipper: Clipper | None = None
        self.accountant: Accountant | None = None
        self.encoder: Encoder | None = None
        self.noise_multiplier: float = 0.0
        self.delta: float = 0.0
        self.steps_done = 0
        self.tuples_used = 0
        self._prepared = False

    # ------------------------------------------------------------------ assemble (no data)
    def assemble(self) -> None:
        """Build every component from the config and refuse mismatched pieces before data is read."""
        cfg = self.config
        self.sampler = self.host.create("sampler", cfg.sampler.name, cfg.sampler.params, where="sampler")
        self.clipper = self.host.create("clipper", cfg.clipper.name, cfg.clipper.params, where="clipper")
        self.accountant = self.host.create(
            "accountant", cfg.accountant.name, cfg.accountant.params, where="accountant"
        )
        check_compatible(
            cfg.accountant.name, self.accountant.supports,
            cfg.sampler.name, self.sampler.sampling_kind,
            cfg.clipper.name, self.clipper.sensitivity_kind,
        )
        units = {self.sampler.unit, self.clipper.unit, self.accountant.unit} - {None}
        if cfg.privacy.enabled and len(units) > 1:
            raise PrivacyError(
                f"privacy units disagree: sampler {cfg.sampler.name!r} is {self.sampler.unit.value}-level, "
                f"clipper {cfg.clipper.name!r} is {self.clipper.unit.value}-level, accountant "
                f"{cfg.accountant.name!r} is {self.accountant.unit.value}-level"
            )
        if cfg.privacy.enabled and self.clipper.sensitivity_kind is SensitivityKind.NONE:
            raise PrivacyError(
                f"clipper {cfg.clipper.name!r} bounds no sensitivity: a private run needs a clipping "
                "clipper (or set privacy.enabled: false for a non-private baseline)"
            )
        self.encoder = self.host.create("encoder", cfg.encoder.name, cfg.encoder.params, where="encoder")

    # ------------------------------------------------------------------ prepare (data)
    def prepare(self) -> None:
        """Load and split the graph, preprocess, bind the accountant, calibrate σ, prepare the encoder."""
        if self._prepared:
            return
        if self.sampler is None:
            self.assemble()
        from graphveil.data import load_graph, transfer_split

        cfg = self.config
        if self.graph is None:
            self.graph = load_graph(cfg.data)
        self.train_graph, self.test_graph = transfer_split(
            self.graph, cfg.data.split.train_fraction, cfg.data.split.seed
        )
        self.train_nodes = self._global_index(self.train_graph)
        self.test_nodes = self._global_index(self.test_graph)
        profile = self.sampler.prepare(self.train_graph, self.generator)
        self.sampling_profile = profile
        self.clipper.bind(profile)
        self.accountant.bind(profile, self.clipper.profile)
        self.delta = cfg.privacy.delta if cfg.privacy.delta is not None else 1.0 / max(profile.num_records, 2)
        if cfg.privacy.enabled:
            if cfg.privacy.noise_multiplier is not None:
                self.noise_multiplier = cfg.privacy.noise_multiplier
            else:
                self.noise_multiplier = self.accountant.calibrate(
                    target_epsilon=cfg.privacy.target_epsilon, delta=self.delta,
                    num_steps=max(cfg.training.steps, 1),
                )
        log.info("sampling profile %s; sigma=%.4f delta=%.3g", profile, self.noise_multiplier, self.delta)
        self.encoder.prepare(self.graph)
        self.optimizer = self._build_optimizer()
        self._prepared = True

    def _global_index(self, sub: RelationalGraph) -> torch.Tensor:
        position = {eid: i for i, eid in enumerate(self.graph.entity_ids)}
        return torch.tensor([position[e] for e in sub.entity_ids], dtype=torch.long)

    def _build_optimizer(self) -> torch.optim.Optimizer:
        from graphveil.engine.dp_step import build_optimizer

        return build_optimizer(self.encoder.trainable_parameters(), self.config.training)

    # ------------------------------------------------------------------ train
    def _to_global(self, batch: TupleBatch) -> TupleBatch:
        def lift(t: torch.Tensor) -> torch.Tensor:
            out = torch.full_like(t, -1)
            ok = t >= 0
            out[ok] = self.train_nodes[t[ok]]
            return out

        return TupleBatch(lift(batch.positives), lift(batch.negatives), lift(batch.anchors))

    def projected_epsilon(self, extra_steps: int) -> float:
        """ε the accountant would report after ``extra_steps`` more steps (nothing recorded)."""
        if not self.config.privacy.enabled:
            return math.inf
        state = self.accountant.state_dict()
        try:
            if extra_steps:
                self.accountant.step(noise_multiplier=self.noise_multiplier, num_steps=extra_steps)
            return self.accountant.get_epsilon(self.delta)
        finally:
            self.accountant.load_state_dict(state)

    def epsilon(self) -> float:
        return self.projected_epsilon(0)

    def train(self, num_steps: int | None = None,
              on_step: Callable[[int, dict[str, Any]], None] | None = None) -> dict[str, Any]:
        """Run ``num_steps`` steps (default: ``training.steps``); every step is accounted."""
        from graphveil.engine.dp_step import GaussianNoise, LossSpec, dp_step, nonprivate_step

        self.prepare()
        cfg = self.config
        steps = cfg.training.steps if num_steps is None else num_steps
        if steps < 0:
            raise ConfigError(f"number of steps must be >= 0, got {steps}")
        private = cfg.privacy.enabled
        expected_b = self.sampling_profile.rate * self.sampling_profile.num_records
        progress = _progress(steps, cfg.output.progress, desc=cfg.name)
        losses = []
        step_fn = dp_step if private else nonprivate_step
        loss_spec = LossSpec.from_config(cfg.training)
        noise = GaussianNoise(self.generator, secure=cfg.privacy.secure_rng) if private else None
        for _ in range(steps):
            batch = self._to_global(self.sampler.sample(self.generator))
            metrics = step_fn(
                self.encoder, batch, clipper=self.clipper, noise_multiplier=self.noise_multiplier,
                expected_batch_size=expected_b, optimizer=self.optimizer, loss=loss_spec, noise=noise,
            ).as_dict()
            if private:
                self.accountant.step(noise_multiplier=self.noise_multiplier)
            self.steps_done += 1
            self.tuples_used += batch.size
            metrics = dict(metrics, step=self.steps_done)
            if private:
                metrics["epsilon"] = self.accountant.get_epsilon(self.delta)
            if metrics.get("loss") is not None:
                losses.append(metrics["loss"])
            self.host.hook.graphveil_step_end(step=self.steps_done, metrics=metrics)
            if on_step is not None:
                on_step(self.steps_done, metrics)
            progress.update(1)
            progress.set_postfix(loss=f"{metrics.get('loss') or float('nan'):.3f}",
                                 eps=f"{metrics.get('epsilon', math.inf):.2f}")
        progress.close()
        return {
            "steps": steps,
            "loss": sum(losses) / len(losses) if losses else float("nan"),
            "tuples_used": self.tuples_used,
            "epsilon": self.epsilon(),
        }

    # ------------------------------------------------------------------ evaluate
    @torch.no_grad()
    def evaluate(self) -> dict[str, float]:
        """Zero-shot PREC@1 / MRR on relations inside the held-out entity set."""
        self.prepare()
        ev = self.config.evaluation
        nodes = self.test_nodes

        def embed_all() -> torch.Tensor:
            self.encoder.eval()
            out = torch.cat([self.encoder.embed(nodes[i : i + 512]) for i in range(0, nodes.numel(), 512)])
            self.encoder.train()
            return out

        return relation_prediction(self.test_graph.edges, embed_all, batch_size=ev.batch_size,
                                   max_edges=ev.max_edges, seed=self.config.data.split.seed)

    # ------------------------------------------------------------------ federated helpers
    def trainable_state(self) -> dict[str, torch.Tensor]:
        return self.encoder.trainable_state()

    def load_trainable_state(self, state: dict[str, torch.Tensor]) -> None:
        self.encoder.load_trainable_state(state)

    def privacy_report(self) -> dict[str, Any]:
        cfg = self.config
        report: dict[str, Any] = {
            "private": cfg.privacy.enabled,
            "sampler": cfg.sampler.name, "clipper": cfg.clipper.name, "accountant": cfg.accountant.name,
            "unit": self.sampler.unit.value if cfg.privacy.enabled else None,
            "noise_multiplier": self.noise_multiplier,
            "clip_norm": getattr(self.clipper, "clip_norm", None),
            # FREQ-CLIP clips at C·κ so that its sum has sensitivity C (entity_dp.clipping).
            "clip_scale": getattr(self.clipper, "kappa", None),
            "steps": self.steps_done,
            "delta": self.delta,
            "sampling_profile": {k: (v.value if hasattr(v, "value") else v)
                                 for k, v in vars(self.sampling_profile).items()},
        }
        if cfg.privacy.enabled:
            detail = self.accountant.report(self.delta)
            report.update(epsilon=detail["epsilon"], alpha=detail.get("alpha"))
        else:
            report["epsilon"] = math.inf
        return report


def _progress(total: int, enabled: bool, desc: str) -> Any:
    from tqdm.auto import tqdm

    return tqdm(total=total, disable=not enabled, desc=desc, unit="step", dynamic_ncols=True)
