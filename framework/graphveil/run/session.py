"""A training session: one DP-SGD run of one task on one dataset.

The same session runs locally (``graphveil run``) and inside a federated site: the site calls
:meth:`TrainingSession.train` for its local steps between rounds.

Order of work (DESIGN.md, "One DP step"): assemble components, ask the method for its staged
plan and check the invariant (:meth:`assemble`, no data touched) → load the data, let the task
split it, preprocess the training side, bind the accountant, calibrate one σ for the whole plan,
run the stages before training (:meth:`prepare`) → steps (:meth:`train`) → the stages after
training and the task's evaluation on the held-out side (:meth:`evaluate`). What is specific to
relational tuples or node classification lives in the task (:mod:`graphveil.contract.task`), the order
of releases and training in the method (:mod:`graphveil.contract.method`).
"""

from __future__ import annotations

import logging
import math
import secrets
from collections.abc import Callable
from types import MappingProxyType
from typing import TYPE_CHECKING, Any

import torch

from graphveil.contract.accountant import Accountant
from graphveil.contract.clipper import Clipper
from graphveil.contract.errors import ConfigError, PluginError
from graphveil.contract.host import PluginHost, default_host, read_only
from graphveil.contract.invariant import check_run, check_structure, check_units
from graphveil.contract.method import MODEL_KEY, Plan, PostProcess, Release, Stage
from graphveil.contract.model import Model
from graphveil.contract.sampler import Sampler
from graphveil.contract.task import Task
from graphveil.contract.units import PrivacyUnit
from graphveil.data import RelationalGraph
from graphveil.data.loaders import DataOptions, check_data_options
from graphveil.privacy.delta import DEFAULT_DELTA_RULE, default_delta, delta_warning
from graphveil.run.config import DataConfig, RunConfig
from graphveil.run.records_store import RecordsStore, records_key

if TYPE_CHECKING:
    from graphveil.engine.data_parallel import DataParallel
    from graphveil.engine.noise import GaussianNoise
    from graphveil.run.prepared_cache import PreparedCache

log = logging.getLogger(__name__)

#: separates a release's name from its weight's name in :meth:`TrainingSession.trainable_state`
#: (model weights are named with dots: ``net.0.weight``)
RELEASE_KEY = "/"


class TrainingSession:
    """Assemble, prepare, train and evaluate one run.

    :param config: the validated run configuration.
    :param host: plugin host (default: every installed plugin).
    :param graph: the whole graph to split; ``None`` loads ``config.data``.
    :param records_store: where the sampler's randomized preprocessing (the degree-capped Ē)
        is kept per (training graph, sampler, options), so it is drawn once and reused by every
        later run or round (:mod:`graphveil.run.records_store`); ``None``: computed per session.
    :param prepared_cache: a folder where the encoder keeps deterministic, data-derived set-up
        (a LoRA encoder's frozen-layer states) across processes, e.g. a federated site's rounds
        (:mod:`graphveil.run.prepared_cache`); handed to an encoder with a ``prepared_cache``
        attribute, ignored by others. ``None``: computed per process.
    :param data_parallel: this process's rank in a data-parallel group
        (:class:`~graphveil.engine.data_parallel.DataParallel`, ``graphveil run --nproc``): every
        rank samples the same logical batches (rank 0 draws a fresh sampling seed and sends it to
        the others), starts from rank 0's weights and differentiates its shard of each batch;
        rank 0 alone holds a noise source and calls the lifecycle hooks. Only runs whose plan is
        one DP-SGD stage of a task with ``data_parallel = True`` are accepted (:meth:`assemble`).

    Randomness: :attr:`generator` is the SAMPLING generator only (batches, negatives, degree
    capping), seeded with ``config.seed`` or, if that is ``None``, with fresh OS entropy that is
    kept nowhere. DP noise never comes from it: :attr:`noise` draws from the OS CSPRNG (or,
    with ``privacy.research_noise_seed``, from its own generator).
    """

    def __init__(self, config: RunConfig, *, host: PluginHost | None = None,
                 graph: RelationalGraph | None = None, records_store: RecordsStore | None = None,
                 prepared_cache: PreparedCache | None = None,
                 data_parallel: DataParallel | None = None) -> None:
        self.config = config
        self.data_parallel = data_parallel
        self.host = host or default_host()
        self.graph = graph
        self.records_store = records_store
        self.prepared_cache = prepared_cache
        self.sampling_seed_fixed = config.seed is not None
        if config.seed is not None:
            sampling_seed = config.seed
        else:  # every rank of a data-parallel group must draw the same batches
            sampling_seed = secrets.randbits(63) if data_parallel is None else data_parallel.broadcast_seed()
        self.generator = torch.Generator().manual_seed(sampling_seed)
        del sampling_seed
        self.noise: GaussianNoise | None = None
        self.sampler: Sampler | None = None
        self.clipper: Clipper | None = None
        self.accountant: Accountant | None = None
        self.encoder: Model | None = None  # the trained model (an Encoder for the relational task)
        self.task: Task | None = None
        #: the data section's source options as :meth:`assemble` validated them (None before, or
        #: for a given graph whose source the host does not register): what reads an option reads it here
        self.data_options: DataOptions | None = None
        self.unit: PrivacyUnit | None = None
        self.noise_multiplier: float = 0.0
        self.delta: float = 0.0
        self.delta_rule: str = DEFAULT_DELTA_RULE
        self.num_units: int = 0
        self.planned_steps = 0
        self.mechanisms: list[tuple[str, Any]] = []
        self.plan: Plan = Plan()
        self.released: Any = MappingProxyType({})
        self._finished = False
        self.steps_done = 0
        self.tuples_used = 0
        self.schedule_position = 0  # the learning-rate schedule's next step (0-based)
        self.lr_schedule: Any = None  # graphveil.engine.schedules.LrSchedule, built by prepare()
        self._prepared = False
        self._accounting_bound = False
        self.records_key: str | None = None

    # ------------------------------------------------------------------ assemble (no data)
    def assemble(self) -> None:
        """Build every component from the config and refuse mismatched pieces before data is read.

        Every option is validated here, once, by the run's host: the components' and the data
        source's, kept as :attr:`data_options`; an error names the config's file and key
        (``run.yaml: data: data.id_col: ...``). A session given its graph reads no data section:
        its options are still checked (``config.resolved.yaml`` records them) if the host
        registers its source, and left as written otherwise (a test host without the built-ins)."""
        cfg = self.config
        self.data_options = assembled_data_options(cfg, self.host, reads_data=self.graph is None)
        self.sampler = self.host.create("sampler", cfg.sampler.name, cfg.sampler.params, where="sampler")
        self.clipper = self.host.create("clipper", cfg.clipper.name, cfg.clipper.params, where="clipper")
        self.accountant = self.host.create(
            "accountant", cfg.accountant.name, cfg.accountant.params, where="accountant"
        )
        self.unit = check_run(
            private=cfg.privacy.enabled, sampler=(cfg.sampler.name, self.sampler),
            clipper=(cfg.clipper.name, self.clipper), accountant=(cfg.accountant.name, self.accountant),
            unit=cfg.privacy.privacy_unit,
        )
        if cfg.privacy.enabled and cfg.privacy.unit is not None:
            for part in (self.sampler, self.clipper, self.accountant):
                part.unit = self.unit  # accepted above: the components now state the run's unit
        self.task = self.host.create("task", cfg.task.name, cfg.task.params, where="task")
        for protocol in cfg.evaluation.protocols():
            if protocol not in self.task.protocols:
                raise ConfigError(f"evaluation.{protocol}: task {cfg.task.name!r} does not run this protocol "
                                  f"(it runs: {sorted(self.task.protocols) or 'none'})")
        family = self.task.model_family
        section = "encoder" if cfg.encoder is not None else "model"
        if family != section:
            raise ConfigError(f"task {cfg.task.name!r} trains a {family}: give a {family!r} section, not {section!r}")
        self.encoder = self.host.create(family, cfg.network.name, cfg.network.params, where=family)
        self.mechanisms = [
            (m.name, self.host.create("mechanism", m.name, m.params, where=f"mechanisms[{i}]"))
            for i, m in enumerate(cfg.mechanisms)
        ]
        method = self.host.create("method", cfg.method.name, cfg.method.params, where="method")
        plan = method.plan(cfg, list(self.mechanisms))
        if not isinstance(plan, Plan):
            raise PluginError(f"method {cfg.method.name!r} returned {type(plan).__name__}, not a graphveil.contract.method.Plan")
        self.plan = plan
        if self.trains_privately:
            check_structure(cfg.network.name, self.encoder, (cfg.accountant.name, self.accountant))
        self.task.planned_releases = plan.artifacts_before_training()
        self.task.configure(cfg)
        if cfg.privacy.enabled:
            check_units([("the run", self.unit)] + [(f"mechanism {r.name!r}", r.mechanism.unit)
                                                    for r in plan.releases])
        if self.data_parallel is not None:
            self.check_data_parallel(self.data_parallel.world_size)

    def check_data_parallel(self, processes: int) -> None:
        """Refuse (:class:`ConfigError`) to split this assembled run across ``processes`` ranks
        unless its plan is one DP-SGD stage of a task whose examples may be sharded.

        Releases (GAP's aggregation perturbation, noisy embeddings, …) would each need their
        own rank-0 draw and broadcast, and a non-private step divides by the realised batch;
        neither is split across ranks.
        """
        cfg = self.config
        where = f"--nproc {processes}"
        if processes < 1:
            raise ConfigError(f"{where}: the number of processes must be >= 1")
        if not self.task.data_parallel:
            raise ConfigError(f"{where}: task {cfg.task.name!r} does not split its batches across processes "
                              "(data-parallel DP-SGD runs the relational task only)")
        if not self.trains_privately or len(self.plan.stages) != 1:
            what = ("trains without privacy" if not self.trains_privately
                    else f"has {len(self.plan.stages)} stages (releases besides DP-SGD)")
            raise ConfigError(f"{where}: method {cfg.method.name!r} {what}; several processes split only "
                              "a plan of one DP-SGD training stage")
        if cfg.sweep is not None:
            raise ConfigError(f"{where}: a sweep runs its cells one by one; run each cell with --nproc instead")

    @property
    def writes(self) -> bool:
        """Whether this process draws noise, writes and calls hooks (not a data-parallel rank > 0)."""
        return self.data_parallel is None or self.data_parallel.writes

    def load_data(self) -> Any:
        """The dataset of the config's data section, read with the options :meth:`assemble`
        validated (assembling first if needed); see :func:`graphveil.data.load_data`."""
        from graphveil.data import load_data

        if self.sampler is None:
            self.assemble()
        if self.data_options is None:  # given a graph of a source the host lacks: refused by name here
            self.data_options = check_data_options(self.config.data, self.host, where=self.config.origin)
        return load_data(self.config.data, self.host, options=self.data_options)

    def resolved_config(self) -> dict[str, Any]:
        """``config.resolved.yaml``: see :func:`resolved_config`."""
        return resolved_config(self.config, self.data_options)

    @property
    def trains_privately(self) -> bool:
        """The plan trains with DP-SGD: a private run whose Train stage is not ``private=False``."""
        stage = self.plan.train_stage
        return self.config.privacy.enabled and stage is not None and stage.private

    # ------------------------------------------------------------------ prepare (data)
    def prepare(self) -> None:
        """Load and split the graph, preprocess, bind the accountant, calibrate σ, prepare the encoder."""
        if self._prepared:
            return
        self.prepare_accounting()
        profile = self.sampling_profile
        log.info("sampling profile %s; sigma=%.4f delta=%.3g", profile, self.noise_multiplier, self.delta)
        self._run_stages(self.plan.before_training())
        if self.task.reads_release:
            self._bind_sampler_to_release()
        if self.prepared_cache is not None and hasattr(self.encoder, "prepared_cache"):
            self.encoder.prepared_cache = self.prepared_cache
        self.task.prepare_model(self.encoder)
        if self.data_parallel is not None:  # every rank starts from rank 0's initial weights
            self.data_parallel.broadcast_(list(self.encoder.trainable_parameters()))
        self.optimizer = self._build_optimizer()
        self.lr_schedule = self._build_schedule()
        self._prepared = True
        if (noise := self.noise_per_step()) is not None:
            log.info("noise per step: std %.3g per weight (σC/b̄), norm %.3g over %d trainable weights; each "
                     "clipped tuple's gradient has norm <= %.3g", noise["std_per_weight"], noise["norm"],
                     noise["trainable_weights"], noise["tuple_norm_bound"])

    def prepare_accounting(self) -> None:
        """The first part of :meth:`prepare`: load and split the graph, bind the accountant, fix δ
        and σ — nothing released or trained yet. A federated site reserves a round's whole spend
        (:meth:`planned_rdp`) between this and the releases :meth:`prepare` runs next."""
        if self._accounting_bound:
            return
        if self.sampler is None:
            self.assemble()
        cfg = self.config
        if self.graph is None:
            self.graph = self.load_data()
        self.task.setup(self.graph, cfg.data.split)
        self.bind_accounting()
        if cfg.privacy.enabled and self.writes:  # data parallel: rank 0 alone draws the noise
            from graphveil.engine.noise import GaussianNoise

            self.noise = GaussianNoise(research_seed=cfg.privacy.research_noise_seed)
        self._accounting_bound = True

    def planned_rdp(self, num_steps: int) -> Any:
        """RDP curve (on the accountant's orders) of what :meth:`prepare` and ``num_steps`` steps
        of :meth:`train` will compose: the plan's releases before training at the run's σ, then
        the steps; nothing is recorded. Needs :meth:`prepare_accounting` (or :meth:`prepare`
        before any release ran). Releases after training (:meth:`evaluate`) are not included."""
        import numpy as np

        acc, sigma = self.accountant, self.noise_multiplier
        curve = np.zeros_like(np.asarray(acc.orders, dtype=float))
        if self.config.privacy.enabled:
            for stage in self.plan.before_training():
                if isinstance(stage, Release):
                    curve = curve + acc.event_rdp(stage.mechanism.event_at(sigma), stage.name)
            if num_steps and self.trains_privately:
                curve = curve + num_steps * np.asarray(acc.rdp_curve(sigma), dtype=float)
        return curve

    def noise_per_step(self) -> dict[str, Any] | None:
        """The Gaussian noise in each step's averaged gradient, from the run's public numbers.

        ``std_per_weight`` σC/b̄ and its expected norm ``norm`` σC√d/b̄ over the d trainable weights,
        the yardstick for the (private) signal: the mean of b̄ clipped tuple gradients, each of
        norm ≤ ``tuple_norm_bound`` (C, or C·κ for FREQ-CLIP), must stand out of it over the steps
        (README: why entity level loses the Cora gain). None without DP training.
        """
        if not (self.trains_privately and self._prepared):
            return None
        d = sum(p.numel() for p in self.encoder.trainable_parameters())
        clip = float(self.clipper.clip_norm)
        std = self.noise_multiplier * clip / self.sampling_profile.expected_batch_size
        # FREQ-CLIP clips each tuple at C·κ (its sum over a unit has sensitivity C)
        bound = clip * float(self.clipper.kappa or 1.0)
        return {"std_per_weight": std, "norm": std * math.sqrt(d), "trainable_weights": d,
                "tuple_norm_bound": bound}

    def bind_accounting(self, task: Any = None) -> None:
        """Everything between splitting the data and the first release: bind the plan's releases,
        prepare the sampler on the training side, bind the clipper and the accountant, fix δ and
        one σ for the whole plan, and hand that σ to the calibrated releases.

        ``task``: the run's task once :meth:`Task.setup` has split the data (default), or a
        stand-in that holds only public sizes (:class:`graphveil.run.planning.PublicTask`):
        ``graphveil privacy --config/--method`` computes a planned run's σ and ε by this same code.
        """
        cfg = self.config
        task = self.task if task is None else task
        for release in self.plan.releases:
            release.mechanism.bind(task)
        profile = self._prepare_sampler(task)
        self.planned_steps = self._planned_steps(profile)
        self.sampling_profile = profile
        self.clipper.bind(profile)
        self.accountant.bind(profile, self.clipper.profile)
        self._choose_delta(task)
        if cfg.privacy.enabled:
            if cfg.privacy.noise_multiplier is not None:
                self.noise_multiplier = cfg.privacy.noise_multiplier
            elif not self.trains_privately and not any(r.mechanism.calibrated() for r in self.plan.releases):
                # nothing takes the shared σ (e.g. randomized response sized by the method): the
                # releases' own events are the whole account
                self.noise_multiplier = 0.0
            else:
                # One σ for the whole plan: every step and every release counts against the target.
                self.noise_multiplier = self.accountant.calibrate(
                    target_epsilon=cfg.privacy.target_epsilon, delta=self.delta,
                    num_steps=max(self.planned_steps, 1) if self.trains_privately else 0,
                    releases=self._planned_events if self.plan.releases else None,
                )
        for release in self.plan.releases:
            if release.mechanism.calibrated():
                release.mechanism.noise_multiplier = self.noise_multiplier

    def bind_public_accounting(self) -> bool:
        """Bind the clipper and accountant from public numbers alone, before any data is read.

        Possible when the sampler states its accounted profile without data
        (:meth:`Sampler.public_profile`, e.g. a public size floor), σ and δ are given and the
        plan is one DP-SGD stage; then :attr:`accountant` holds exactly what :meth:`prepare`
        will bind it to, and a federated site reserves its spend before reading its graph.
        :returns: whether it was bound (``False``: the accounted numbers need the data).
        """
        if self.sampler is None:
            self.assemble()
        cfg = self.config
        profile = self.sampler.public_profile()
        if (profile is None or not self.trains_privately or self.plan.releases
                or cfg.privacy.noise_multiplier is None or cfg.privacy.delta is None):
            return False
        self.sampling_profile = profile
        self.clipper.bind(profile)
        self.accountant.bind(profile, self.clipper.profile)
        self.noise_multiplier = float(cfg.privacy.noise_multiplier)
        self.delta, self.delta_rule = float(cfg.privacy.delta), "explicit"
        return True

    def _bind_sampler_to_release(self) -> None:
        """Prepare the sampler again on the task's training view once the release it reads has
        run (paper 2's RR baseline trains on randomized relations). Before, the raw training side
        sized the run (δ, a first profile); σ and ε do not depend on the sampler here, because
        only a training stage without noise may read a release this way."""
        if self.trains_privately:
            raise ConfigError(f"task {self.config.task.name!r} trains on a release, but the plan trains with "
                              "DP-SGD: its sampling profile would change after σ was calibrated; a training "
                              "stage that reads a release must train without noise (post-processing)")
        self.sampling_profile = self._prepare_sampler()
        self.planned_steps = self._planned_steps(self.sampling_profile)
        log.info("sampler bound to the released training view: %s", self.sampling_profile)

    def _prepare_sampler(self, task: Any = None) -> Any:
        """``sampler.prepare`` on the training side, reusing a stored record set when there is one.

        Only samplers with a randomized preprocessing (whose
        :meth:`~graphveil.contract.sampler.Sampler.preprocessing_params` is not ``None``, e.g.
        degree capping) use the store: the key
        is :func:`records_key` (training graph, sampler name, those options); a stored Ē is
        validated by the sampler (PrivacyError if it does not fit this graph), a new one saved.
        ``task``: whose ``train_view`` (default: the run's task).
        """
        view = (self.task if task is None else task).train_view
        sampler, store = self.sampler, self.records_store
        params = sampler.preprocessing_params()
        self.records_key = None
        if store is None or params is None:
            return sampler.prepare(view, self.generator)
        key = records_key(view, self.config.sampler.name, params)
        self.records_key = key
        stored = store.load_records(key)
        if stored is not None:
            profile = sampler.prepare(view, self.generator, records=stored)
            log.info("reusing the stored record set (%d records) for %s", profile.num_records, key)
            return profile
        profile = sampler.prepare(view, self.generator)
        store.save_records(key, sampler.records)
        return profile

    def _planned_events(self, sigma: float) -> list[tuple[str, Any]]:
        """The plan's releases as accounting events if the shared noise multiplier were σ."""
        return [(r.name, r.mechanism.event_at(sigma)) for r in self.plan.releases]

    def _run_stages(self, stages: Any) -> None:
        """Run release and post-processing stages in order; each release is accounted at once.

        Every artifact goes to :attr:`released` (read-only, by stage name), the one store the
        task and later stages read. Each release is composed as the event the calibration
        analysed, ``event_at(σ)`` (a fixed-noise mechanism's own ``event()``).
        """
        from graphveil.engine.noise import GaussianNoise

        noise = self.noise or GaussianNoise()
        released = dict(self.released)
        stage: Stage
        for stage in stages:
            if isinstance(stage, Release):
                mechanism = stage.mechanism
                released[stage.name] = mechanism.release(self.task, noise)
                if self.config.privacy.enabled:
                    self.accountant.compose_event(mechanism.event_at(self.noise_multiplier), stage.name)
                log.info("released %s (sensitivity %.4g)", stage.name, mechanism.sensitivity())
            elif isinstance(stage, PostProcess):
                released[stage.name] = stage.run(MappingProxyType(dict(released)))
                log.info("post-processed %s from the released artifacts", stage.name)
            self.released = MappingProxyType(dict(released))
            self.task.released = self.released

    def _planned_steps(self, profile: Any) -> int:
        """``training.steps``, or ``ceil(epochs · n / b̄)`` with n records and b̄ the expected batch."""
        training = self.config.training
        if training.epochs is None:
            return training.steps
        return max(1, math.ceil(training.epochs * profile.num_records / profile.expected_batch_size))

    # The relational task's split, for callers that inspect a relational session.
    @property
    def train_graph(self) -> RelationalGraph:
        return self.task.train_graph

    @property
    def test_graph(self) -> RelationalGraph:
        return self.task.test_graph

    @property
    def train_nodes(self) -> torch.Tensor:
        return self.task.train_nodes

    def _choose_delta(self, task: Any = None) -> None:
        """δ: explicit, or :func:`~graphveil.privacy.default_delta` of the number of privacy units.

        Units: ``task.num_units`` (default task: the run's), e.g. training entities (node-level),
        training relations before capping (edge-level). An explicit δ ≥ 1/n is honoured with a
        warning naming n.
        """
        cfg = self.config
        unit = getattr(self.sampler, "unit", None)
        self.num_units = (self.task if task is None else task).num_units(unit)
        if cfg.privacy.delta is None:
            self.delta, self.delta_rule = default_delta(self.num_units), DEFAULT_DELTA_RULE
            return
        self.delta, self.delta_rule = float(cfg.privacy.delta), "explicit"
        what = "training relations" if unit == PrivacyUnit.EDGE else "training units"
        if cfg.privacy.enabled and (warning := delta_warning(self.delta, self.num_units, "privacy.delta",
                                                             f"{getattr(unit, 'value', unit)}-level: {what}")):
            log.warning("%s", warning)

    def _build_optimizer(self) -> torch.optim.Optimizer:
        from graphveil.engine.dp_step import build_optimizer

        return build_optimizer(self.encoder.trainable_parameters(), self.config.training)

    def _build_schedule(self) -> Any:
        """``training.schedule`` / ``warmup`` over the planned steps (:mod:`graphveil.engine.schedules`)."""
        from graphveil.engine.schedules import LrSchedule

        training = self.config.training
        return LrSchedule(self.optimizer, training.schedule, self.planned_steps, training.warmup)

    # ------------------------------------------------------------------ train
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
              on_step: Callable[[int, dict[str, Any]], None] | None = None, *,
              schedule_start: int | None = None) -> dict[str, Any]:
        """Run ``num_steps`` steps (default: the planned steps); every step is accounted.

        Each step is one logical batch from the sampler (run in chunks of
        ``training.micro_batch_size``), one noise draw, one optimizer step at the scheduled
        rate. ``schedule_start``: the schedule position of the first step (a federated site
        passes its round's offset, since it builds a fresh session each round); default: continue
        where this session's schedule is (0 for a new session).
        """
        from graphveil.engine.dp_step import dp_step, nonprivate_step

        self.prepare()
        cfg = self.config
        steps = (self.planned_steps if self.plan.trains else 0) if num_steps is None else num_steps
        if steps < 0:
            raise ConfigError(f"number of steps must be >= 0, got {steps}")
        if schedule_start is not None:
            if schedule_start < 0:
                raise ConfigError(f"schedule_start must be >= 0, got {schedule_start}")
            self.schedule_position = schedule_start
        self._warn_beyond_plan(steps)
        if steps and not self.plan.trains:
            raise ConfigError(f"method {cfg.method.name!r} has no training stage; {steps} steps were asked for")
        private = self.trains_privately
        expected_b = self.sampling_profile.expected_batch_size
        progress = _progress(steps, cfg.output.progress and self.writes, desc=cfg.name)
        losses = []
        step_fn = dp_step if private else nonprivate_step
        noise = self.noise if private else None
        for _ in range(steps):
            batch = self.task.lift(self.sampler.sample(self.generator))
            lr = self.lr_schedule.set_step(self.schedule_position)
            metrics = step_fn(
                self.encoder, batch, clipper=self.clipper, noise_multiplier=self.noise_multiplier,
                expected_batch_size=expected_b, optimizer=self.optimizer, loss=self.task.losses, noise=noise,
                micro_batch_size=cfg.training.micro_batch_size,
                **({"group": self.data_parallel} if self.data_parallel is not None else {}),
            ).as_dict()
            if private:
                self.accountant.step(noise_multiplier=self.noise_multiplier)
            self.steps_done += 1
            self.schedule_position += 1
            self.tuples_used += batch.size
            metrics = dict(metrics, step=self.steps_done, lr=lr)
            if private:
                metrics["epsilon"] = self.accountant.get_epsilon(self.delta)
            if metrics.get("loss") is not None:
                losses.append(metrics["loss"])
            if self.writes:
                self.host.hook.graphveil_step_end(step=self.steps_done, metrics=read_only(metrics))
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

    def _warn_beyond_plan(self, steps: int) -> None:
        training = self.config.training
        end = self.schedule_position + steps
        if training.schedule != "constant" and steps and end > self.planned_steps:
            log.warning("training.schedule=%s decays to 0 at the planned step %d; steps %d-%d run beyond "
                        "it at rate 0 (their privacy cost is still accounted)", training.schedule,
                        self.planned_steps, max(self.schedule_position, self.planned_steps) + 1, end)

    # ------------------------------------------------------------------ evaluate
    def evaluate(self) -> dict[str, float]:
        """The stages after training (once), then the task's evaluation on the held-out side
        (relational: zero-shot PREC@1 / MRR)."""
        self.prepare()
        if not self._finished and self.plan.after_training():
            self.released = MappingProxyType({**self.released, MODEL_KEY: self.encoder})
            self.task.released = self.released  # a release after training reads the model from the task
            self._run_stages(self.plan.after_training())
        self._finished = True
        return self.task.evaluate(self.encoder)

    # ------------------------------------------------------------------ federated helpers
    def trainable_state(self) -> dict[str, torch.Tensor]:
        """What a federated site sends: the model's trainable weights and, keyed
        ``<release>/<weight>`` (:data:`RELEASE_KEY`), the weights a release before training
        trained and shares (:meth:`~graphveil.contract.mechanism.Mechanism.shared_state`, e.g.
        GAP's encoder), each covered by its stage's accounted event. A release's part is there
        once it has run."""
        state = dict(self.encoder.trainable_state())
        for release in self.plan.releases:
            state.update({f"{release.name}{RELEASE_KEY}{k}": v for k, v in release.mechanism.shared_state().items()})
        return state

    def start_releases_from(self, state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """Hand each release before training its keys of ``state`` (``<release>/…``) to start
        from (:meth:`~graphveil.contract.mechanism.Mechanism.start_from`); returns the rest, the
        model's, for :meth:`load_trainable_state` once :meth:`prepare` has sized the model.

        :raises ConfigError: once the releases have run (before: after :meth:`prepare_accounting`
            only), or for a key of no release before training.
        """
        parts: dict[str, dict[str, torch.Tensor]] = {}
        rest: dict[str, torch.Tensor] = {}
        for key, value in state.items():
            name, sep, inner = key.partition(RELEASE_KEY)
            if sep:
                parts.setdefault(name, {})[inner] = value
            else:
                rest[key] = value
        if not parts:
            return rest
        if self._prepared or self.released:
            raise ConfigError("release weights load before the releases run (before prepare())")
        releases = {s.name: s.mechanism for s in self.plan.before_training() if isinstance(s, Release)}
        if unknown := sorted(set(parts) - set(releases)):
            raise ConfigError(f"trainable state: {unknown[0]!r} is no release before training of this plan "
                              f"(releases: {sorted(releases) or 'none'})")
        for name, part in parts.items():
            releases[name].start_from(part)
        return rest

    def load_trainable_state(self, state: dict[str, torch.Tensor]) -> None:
        """The model's weights (no release key: those go to :meth:`start_releases_from`)."""
        if keys := sorted(k for k in state if RELEASE_KEY in k):
            raise ConfigError(f"trainable state: {keys[0]!r} is a release's weight; releases start from "
                              "theirs before they run (start_releases_from)")
        self.encoder.load_trainable_state(state)

    def privacy_report(self) -> dict[str, Any]:
        from graphveil.engine import noise_kernel

        cfg = self.config
        report: dict[str, Any] = {
            "private": cfg.privacy.enabled,
            "sampler": cfg.sampler.name, "clipper": cfg.clipper.name, "accountant": cfg.accountant.name,
            "unit": self.sampler.unit.value if cfg.privacy.enabled else None,
            "noise_multiplier": self.noise_multiplier,
            "clip_norm": getattr(self.clipper, "clip_norm", None),
            # FREQ-CLIP clips at C·κ so that its sum has sensitivity C (entity_dp.clipping).
            "clip_scale": self.clipper.kappa,
            "steps": self.steps_done,
            "training": self._training_mode(),
            "delta": self.delta,
            # δ given in the config ("explicit") or the default rule of graphveil.privacy.default_delta
            "delta_rule": self.delta_rule,
            # n: training entities (node-level) or training relations before capping (edge-level)
            "num_units": self.num_units,
            # "csprng-4sum": OS CSPRNG, (z1+z2+z3+z4)/2 per coordinate; "research-seed": the
            # noise is reproducible from privacy.research_noise_seed (and subtractable)
            "noise": self.noise.mode if self.noise is not None else None,
            "research_noise_seed_set": cfg.privacy.research_noise_seed is not None,
            # the CPU noise's float64 transform: the C kernel or torch's (the same noise to a few
            # ulp; a CUDA model's noise is drawn on the device)
            "noise_transform": noise_kernel.transform_name() if self.noise is not None else None,
            # "fixed": config seed (batches reproducible by whoever knows it; amplification by
            # subsampling assumes they are secret); "fresh": OS entropy, written nowhere
            "sampling_seed": "fixed" if self.sampling_seed_fixed else "fresh",
            "dataset": self._dataset_scope(),
            "sampling_profile": {k: (v.value if hasattr(v, "value") else v)
                                 for k, v in vars(self.sampling_profile).items()},
        }
        if cfg.privacy.enabled:
            detail = self.accountant.report(self.delta)
            report.update(epsilon=detail["epsilon"], alpha=detail.get("alpha"),
                          releases=list(detail.get("releases", [])))
            # an accountant with more than one analysis (edge_pld: PLD and RDP) states each
            report.update({k: detail[k] for k in ("epsilon_pld", "epsilon_rdp", "accounting") if k in detail})
            if (noise := self.noise_per_step()) is not None:
                report["noise_per_step"] = noise
        else:
            report["epsilon"] = math.inf
        return report

    def _training_mode(self) -> str:
        stage = self.plan.train_stage
        if stage is None:
            return "none (the method has no training stage)"
        if self.trains_privately:
            return "dp_sgd"
        return f"non-private: {stage.reason}" if self.config.privacy.enabled else "non-private run"

    def _dataset_scope(self) -> dict[str, Any]:
        """What the guarantee is with respect to, with the exact sizes (run directory only)."""
        cfg, profile = self.config, self.sampling_profile
        unit = getattr(self.sampler, "unit", None)
        side = ("graph A (data; data.split.eval_data is evaluation data, not covered)"
                if cfg.data.split.kind == "two_graphs" else "the training side of the keyed entity split")
        if not cfg.privacy.enabled:
            claim = "none (non-private run)"
        elif unit == PrivacyUnit.NODE:
            claim = f"node-level DP w.r.t. the degree-capped relation set Ē (K={profile.degree_cap}) of {side}"
        elif unit == PrivacyUnit.EDGE:
            claim = f"edge-level DP w.r.t. the relations of {side}"
        elif unit.protects_predictions:
            claim = (f"{unit.value} graph DP (paper 4, Def. 4.2) w.r.t. the whole graph (all node features, "
                     "edges and training labels): the weights and the prediction of every node other "
                     "than the replaced one")
        else:
            claim = f"{unit.value} DP w.r.t. the training side of the keyed split"
        return {"claim": claim, **self.task.scope(), "records": profile.num_records,
                "records_persisted": self.records_key is not None}


def assembled_data_options(config: RunConfig, host: PluginHost, *, reads_data: bool) -> DataOptions | None:
    """The data options the assembly of a run of ``config`` validates with ``host``: all of them
    when the run reads its data section; for a run given its graph, those of a source ``host``
    registers, and None for another (a test host without the built-ins).

    :raises ConfigError: naming the config's file and the ``data.*`` key.
    """
    if reads_data or config.data.source in {c.name for c in host.components("data_source")}:
        return check_data_options(config.data, host, where=config.origin)
    return None


def resolved_config(config: RunConfig, data_options: DataOptions | None) -> dict[str, Any]:
    """``config`` in JSON types, as a run directory's ``config.resolved.yaml`` holds it: the data
    section (and graph B's) with the source's full option set as the assembly validated it
    (``data_options``: typed, defaults filled in) in place of the options as written."""
    raw = config.model_dump(mode="json")
    if data_options is not None:
        raw["data"] = _resolved_section(raw["data"], data_options)
        if data_options.eval_data is not None:
            split = raw["data"]["split"]
            split["eval_data"] = _resolved_section(split["eval_data"], data_options.eval_data)
    return raw


def _resolved_section(section: dict[str, Any], options: DataOptions) -> dict[str, Any]:
    return {**{k: v for k, v in section.items() if k in DataConfig.model_fields}, **options.resolved()}


def _progress(total: int, enabled: bool, desc: str) -> Any:
    from tqdm.auto import tqdm

    return tqdm(total=total, disable=not enabled, desc=desc, unit="step", dynamic_ncols=True)
