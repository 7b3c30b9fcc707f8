"""Test doubles shared by the ledger and federation unit tests, and a site's node config.

``PoissonGaussianRdp`` is a small accountant for the Poisson-subsampled Gaussian built on
dp-accounting; the ledger tests cross-check it (and so the ledger's composition) against
opacus' independent RDP analysis.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from pathlib import Path
from typing import Any, ClassVar

import dp_accounting
import torch
from flwr.app import RecordDict
from opacus.accountants import RDPAccountant

from graphveil.connectors.flower import records
from graphveil.contract.accountant import Accountant
from graphveil.contract.method import Plan
from graphveil.contract.profiles import (
    PrivacyUnit,
    SamplingKind,
    SamplingProfile,
    SensitivityKind,
    SensitivityProfile,
)

#: A short RDP order grid keeps the tests fast; both libraries use the same one.
ORDERS = [1.25, 1.5, 1.75, 2.0, 2.5, 3.0, 4.0, 5.0, 6.0, 8.0, 10.0, 12.0, 16.0, 20.0, 32.0, 64.0]


def dp_accounting_epsilon(history: list[tuple[float, float, int]], delta: float) -> float:
    """ε of a composition of Poisson-subsampled Gaussians, straight from dp-accounting."""
    return _dp_accounting_epsilon(tuple(tuple(h) for h in history), delta)


@functools.lru_cache(maxsize=4096)
def _dp_accounting_epsilon(history: tuple[tuple[float, float, int], ...], delta: float) -> float:
    acc = dp_accounting.rdp.RdpAccountant(orders=ORDERS)
    for sigma, rate, steps in history:
        event = dp_accounting.PoissonSampledDpEvent(rate, dp_accounting.GaussianDpEvent(sigma))
        acc.compose(event, steps)
    return float(acc.get_epsilon(delta))


def opacus_epsilon(history: list[tuple[float, float, int]], delta: float) -> float:
    acc = RDPAccountant()
    acc.history = [(s, q, n) for s, q, n in history]
    return float(acc.get_epsilon(delta, alphas=ORDERS))


class PoissonGaussianRdp(Accountant):
    """Poisson-subsampled Gaussian, RDP composition by dp-accounting (test double)."""

    mechanism: ClassVar[str] = "test_poisson_gaussian_rdp"
    unit: ClassVar[PrivacyUnit] = PrivacyUnit.EDGE
    supports: ClassVar[frozenset[tuple[SamplingKind, SensitivityKind]]] = frozenset(
        {(SamplingKind.POISSON, SensitivityKind.PER_TUPLE_EDGE)}
    )

    def __init__(self, rate: float = 0.02) -> None:
        self.rate = rate
        self.history: list[tuple[float, float, int]] = []

    def bind(self, sampling: SamplingProfile, sensitivity: SensitivityProfile) -> None:
        self.rate = sampling.rate

    def step(self, *, noise_multiplier: float, num_steps: int = 1) -> None:
        if self.history and self.history[-1][:2] == (noise_multiplier, self.rate):
            s, q, n = self.history[-1]
            self.history[-1] = (s, q, n + num_steps)
        else:
            self.history.append((noise_multiplier, self.rate, num_steps))

    def get_epsilon(self, delta: float) -> float:
        return dp_accounting_epsilon(self.history, delta) if self.history else 0.0

    def report(self, delta: float) -> dict[str, Any]:
        return {"epsilon": self.get_epsilon(delta), "delta": delta}

    def calibrate(self, *, target_epsilon: float, delta: float, num_steps: int) -> float:
        lo, hi = 0.3, 50.0
        for _ in range(40):
            mid = (lo + hi) / 2
            if dp_accounting_epsilon([(mid, self.rate, num_steps)], delta) > target_epsilon:
                lo = mid
            else:
                hi = mid
        return hi

    def state_dict(self) -> dict[str, Any]:
        return {"mechanism": self.mechanism, "history": [list(h) for h in self.history]}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        if state.get("mechanism") != self.mechanism:
            raise ValueError(f"state of mechanism {state.get('mechanism')!r}, expected {self.mechanism!r}")
        self.history = [(float(s), float(q), int(n)) for s, q, n in state["history"]]


class OtherMechanism(PoissonGaussianRdp):
    mechanism: ClassVar[str] = "test_other_mechanism"


def edge_accountant(rate: float = 0.02) -> Accountant:
    """The real edge-level RDP accountant (dp-accounting's Poisson-subsampled Gaussian) on the
    short order grid, bound to γ = ``rate``: what the ledger composes."""
    from graphveil.plugins.edge_dp.accountant import EdgeRdpAccountant
    from graphveil.privacy import RdpParams

    acc = EdgeRdpAccountant(RdpParams(orders=ORDERS))
    acc.bind(SamplingProfile(SamplingKind.POISSON, rate, num_records=1000),
             SensitivityProfile(SensitivityKind.PER_TUPLE_EDGE, PrivacyUnit.EDGE, 1.0))
    return acc


class FakeEncoder(torch.nn.Module):
    """Two 'LoRA' matrices; ``embed`` is irrelevant for the connector tests."""

    def __init__(self, seed: int = 0) -> None:
        super().__init__()
        g = torch.Generator().manual_seed(seed)
        self.lora_A = torch.nn.Parameter(torch.randn(4, 8, generator=g))
        self.lora_B = torch.nn.Parameter(torch.zeros(8, 4))
        self.frozen = torch.nn.Parameter(torch.ones(3), requires_grad=False)

    def trainable_state(self) -> dict[str, torch.Tensor]:
        return {n: p.detach().clone() for n, p in self.named_parameters() if p.requires_grad}

    def load_trainable_state(self, state: Mapping[str, torch.Tensor]) -> None:
        own = {n: p for n, p in self.named_parameters() if p.requires_grad}
        if set(own) != set(state):
            raise ValueError(f"trainable state mismatch: {sorted(own)} vs {sorted(state)}")
        with torch.no_grad():
            for n, t in state.items():
                own[n].copy_(torch.as_tensor(t))

    def save(self, directory: Any) -> None:
        from pathlib import Path

        Path(directory).mkdir(parents=True, exist_ok=True)
        torch.save(self.trainable_state(), Path(directory) / "adapter.pt")


class FakeSession:
    """The TrainingSession contract with a fake encoder and the edge RDP accountant at γ = 0.02.

    ``train`` moves every trainable tensor by ``step_size`` per step (so tests can tell exactly
    which state a site trained from) and steps the accountant once per step, like the real one.
    """

    instances: ClassVar[list[FakeSession]] = []

    def __init__(self, config: Any, *, graph: Any = None, host: Any = None, records_store: Any = None) -> None:
        self.config = config
        self.graph = graph
        self.records_store = records_store
        self.encoder = FakeEncoder(seed=config.seed)
        self.accountant = edge_accountant()
        self.noise_multiplier = 0.0
        self.delta = 0.0
        self.tuples_used = 0
        self.prepared = False
        self.plan = Plan()  # one DP-SGD stage, nothing released before training
        FakeSession.instances.append(self)

    def bind_public_accounting(self) -> bool:
        """As a real edge-level session with the site's size floor: σ, δ and the accountant are
        known before the graph is read (prepare() then reads it)."""
        self.noise_multiplier = float(self.config.privacy.noise_multiplier or 1.0)
        self.delta = float(self.config.privacy.delta or 1e-5)
        return True

    def prepare(self) -> None:
        self.prepared = True
        self.bind_public_accounting()

    def prepare_accounting(self) -> None:  # reads the graph, as the real one does
        self.prepare()

    def trainable_state(self) -> dict[str, torch.Tensor]:
        return self.encoder.trainable_state()

    def start_releases_from(self, state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        return dict(state)  # nothing is released before training: every key is the model's

    def load_trainable_state(self, state: Mapping[str, torch.Tensor]) -> None:
        self.encoder.load_trainable_state(state)

    def train(self, num_steps: int | None = None, *, schedule_start: int | None = None) -> dict[str, Any]:
        steps = self.config.training.steps if num_steps is None else num_steps
        with torch.no_grad():
            for p in self.encoder.parameters():
                if p.requires_grad:
                    p.add_(0.5 * steps)
        for _ in range(steps):
            self.accountant.step(noise_multiplier=self.noise_multiplier)
        self.tuples_used += 7 * steps
        return {"steps": steps, "loss": 0.1, "tuples_used": self.tuples_used,
                "epsilon": self.accountant.get_epsilon(self.delta)}

    def evaluate(self) -> dict[str, float]:
        return {"prec1": 0.25, "mrr": 0.5}


class LocalGrid:
    """An in-process Grid: each node is a site Context; messages go straight to ``handle_train``.

    ``offline`` nodes are not listed; ``drop`` nodes are listed but answer with Flower's
    NODE_UNAVAILABLE error (a site that died mid-round). ``sent`` keeps every message sent.
    """

    def __init__(self, sites: dict[int, Any], *, session_factory: Any = FakeSession) -> None:
        from flwr.serverapp import Grid

        Grid.register(LocalGrid)
        self.sites = sites
        self.session_factory = session_factory
        self.offline: set[int] = set()
        self.drop: set[int] = set()
        self.sent: list[Any] = []
        self._replies: dict[str, Any] = {}

    def set_run(self, run: Any) -> None:  # pragma: no cover - unused
        self._run = run

    @property
    def run(self) -> Any:  # pragma: no cover - unused
        return self._run

    def create_message(self, content, message_type, dst_node_id, group_id, ttl=None):  # pragma: no cover
        from flwr.app import Message

        return Message(content, dst_node_id, message_type, group_id=group_id, ttl=ttl)

    def get_node_ids(self) -> list[int]:
        return [n for n in self.sites if n not in self.offline]

    def push_messages(self, messages):
        """Each message is handled at once; its reply waits for :meth:`pull_messages`."""
        from uuid import uuid4

        from flwr.app import Error, Message

        from graphveil.connectors.flower.site import handle_train

        ids = []
        for msg in messages:
            msg.metadata.__dict__["_message_id"] = str(uuid4())  # as Flower's grids do
            self.sent.append(msg)
            node = msg.metadata.dst_node_id
            if node in self.drop:
                reply = Message(Error(code=5, reason="node unavailable"), reply_to=msg)
            else:
                content = handle_train(msg.content, self.sites[node], session_factory=self.session_factory)
                reply = Message(content, reply_to=msg)
            self._replies[msg.metadata.message_id] = reply
            ids.append(msg.metadata.message_id)
        return ids

    def pull_messages(self, message_ids):
        return [self._replies.pop(i) for i in list(message_ids) if i in self._replies]

    def send_and_receive(self, messages, *, timeout=None):  # pragma: no cover - PromptGrid's is used
        return self.pull_messages(self.push_messages(messages))


def init_site_ledger(node_config: dict[str, Any]) -> dict[str, Any]:
    """What a site's operator does once before its SuperNode starts (``graphveil budget init``):
    the ledger, its key and its anchor, for the node config's ``ledger`` and ``ledger-anchor``."""
    from graphveil.ledger import init_ledger

    init_ledger(node_config["ledger"], site=node_config["site-name"],
                anchor=node_config.get("ledger-anchor")).close()
    return node_config


def public_view(content: Any) -> dict[str, Any]:
    """What a reply shows a server that cannot tell two keyed hashes apart: every field, shape and
    scalar, with the ledger heads (HMACs under each site's own key) reduced to their length."""
    from graphveil.connectors.flower import records

    view = records.describe_content(content)
    values = view.get(records.SITE, {}).get("values", {})
    for key in ("ledger-head", "ledger-previous"):
        if isinstance(values.get(key), str):
            values[key] = f"<{len(values[key])} hex>"
    return view


def site_context(node_id: int, node_config: dict[str, Any], run_config: dict[str, Any], run_id: int = 1) -> Any:
    from flwr.app import Context, RecordDict

    return Context(run_id=run_id, node_id=node_id, node_config=node_config, state=RecordDict(),
                   run_config=run_config)


#: A run config whose task validates and passes an edge-level site's policy (the fake session
#: ignores the components). δ is the site's: the task does not set it.
RUN_CONFIG: dict[str, Any] = {
    "num-server-rounds": 2, "local-steps": 3, "min-sites": 1,
    "task.sampler.name": "edge_poisson_decoupled", "task.clipper.name": "per_tuple_clip",
    "task.accountant.name": "edge_rdp", "task.encoder.name": "hf_lora", "task.encoder.model": "tiny-bert",
    "task.privacy.noise_multiplier": 1.0,
}
#: The policy keys every test site sets (δ as the unit tests' accountant expects).
SITE_POLICY: dict[str, Any] = {"delta": 1e-5, "privacy-unit": "edge", "min-records": 100}


def node_config(tmp_path: Path, name: str = "bank-a", budget: float = 5.0, **extra) -> dict:
    """A site that opted into both non-private releases (ε and held-out scores), so the tests can
    check the numbers; ``test_fed_messages.py::test_by_default_a_reply_carries_only_public_scalars``
    checks the default."""
    folder = tmp_path / name
    folder.mkdir(exist_ok=True)
    (folder / "edges.tsv").write_text("source\ttarget\n")
    (folder / "entities.jsonl").write_text("")
    cfg = {"site-name": name, "data-path": str(folder / "edges.tsv"),
           "data-entities": str(folder / "entities.jsonl"), "epsilon-budget": budget,
           "ledger": str(folder / "ledger.sqlite"), "seed": 7, **SITE_POLICY,
           "share-epsilon": True, "share-utility-metrics": True, **extra}
    if not Path(cfg["ledger"]).exists():  # the site's operator ran `graphveil budget init` once
        init_site_ledger(cfg)
    return cfg


def global_state() -> dict[str, torch.Tensor]:
    return FakeEncoder(seed=123).trainable_state()


def train_content(server_round: int = 1, steps: int = 3, state=None) -> RecordDict:
    return records.train_content(records.arrays_from_state(state or global_state()), server_round, steps)


#: A node-classification federation (DP-MLP, paper 4's baseline) small enough for the tests.
NODE_TASK_RUN_CONFIG: dict[str, Any] = {
    "num-server-rounds": 2, "local-steps": 3, "min-sites": 1,
    "task.task.name": "node_classification",
    "task.model.name": "mlp", "task.model.hidden": 16, "task.model.layers": 2, "task.model.seed": 0,
    "task.sampler.name": "node_uniform_wor", "task.sampler.batch_size": 32,
    "task.clipper.name": "per_node_clip", "task.clipper.clip_norm": 1.0,
    "task.accountant.name": "node_rdp", "task.training.lr": 0.01,
    "task.privacy.noise_multiplier": 1.0,
}
#: GAP on top of it: encoder and classifier shared (the encoder trained at each site every round
#: from the server's weights; round 1 from ``encoder_seed``), aggregates recomputed at the site.
GAP_RUN_CONFIG: dict[str, Any] = {
    **NODE_TASK_RUN_CONFIG,
    "task.method.name": "gap", "task.method.hops": 2, "task.method.hidden": 16, "task.method.encoder_layers": 1,
    "task.method.encoder_seed": 0,
    "task.method.encoder_training.epochs": 2, "task.method.encoder_training.batch_size": 32,
    "task.method.encoder_training.lr": 0.01, "task.method.encoder_training.clip_norm": 1.0,
    "task.task.features": "released:gap_aggregates",
}
#: DP-SAGE (paper 4's baseline, Daigavane et al.): GraphSAGE on rooted subgraphs, rooted_rdp
#: charging the hypergeometric count of the G = 1 + 2D examples one node reaches (D = 168 here:
#: a large σ keeps one round within a test budget). Shared: the GraphSAGE weights.
DP_SAGE_RUN_CONFIG: dict[str, Any] = {
    **{k: v for k, v in NODE_TASK_RUN_CONFIG.items() if not k.startswith("task.model.")},
    "task.task.name": "rooted_node_classification", "task.task.predictions": "released:dp_sage_outputs",
    "task.method.name": "dp_sage", "task.model.name": "sage", "task.model.hidden": 16, "task.model.layers": 1,
    "task.model.seed": 0,
    "task.sampler.name": "root_subgraphs", "task.sampler.num_hops": 1, "task.accountant.name": "rooted_rdp",
    "task.privacy.noise_multiplier": 40.0,
}
#: DPDGC: DP-Emb (per-node adjacency embedding, group 2D + 1 at node level: a very large σ here)
#: released at the site every round against the task's projection R, the LINKX classifier shared.
DPDGC_RUN_CONFIG: dict[str, Any] = {
    **{k: v for k, v in NODE_TASK_RUN_CONFIG.items() if not k.startswith("task.model.")},
    "task.method.name": "dpdgc", "task.method.hidden": 16, "task.method.embedding_training.epochs": 2,
    "task.method.embedding_training.batch_size": 64, "task.method.embedding_training.lr": 0.01,
    "task.method.embedding_training.clip_norm": 1.0, "task.method.projection_seed": 0,
    "task.task.features": "released:dpdgc_embedding",
    "task.model.name": "linkx", "task.model.hidden": 16, "task.model.layers": 2, "task.model.embedding_width": 16,
    "task.model.seed": 0, "task.privacy.noise_multiplier": 400.0,
}
#: DP-GCN (paper 3): a GCN on s = 10 keyed graph splits, b = 2 per step, split_rdp. Only a site
#: whose release-scope is 'weights' runs it (its predictions read raw neighbours). Shared: the GCN.
DP_GCN_RUN_CONFIG: dict[str, Any] = {
    **{k: v for k, v in NODE_TASK_RUN_CONFIG.items() if not k.startswith("task.model.")},
    "task.task.name": "split_node_classification",
    "task.model.name": "gcn", "task.model.hidden": 16, "task.model.layers": 2, "task.model.seed": 0,
    "task.sampler.name": "graph_splits", "task.sampler.num_splits": 10, "task.sampler.batch_size": 2,
    "task.clipper.name": "per_split_clip", "task.accountant.name": "split_rdp",
}
#: A node-classification site at paper 4's node level, D = 168 (Cora's largest degree).
NODE_SITE_POLICY: dict[str, Any] = {"delta": 1e-4, "privacy-unit": "node", "task-kind": "node_classification",
                                    "degree-bound": 168}


def write_cora_sites(folder: Path, num_sites: int = 3, *, kind: str = "random", seed: int = 0) -> list[Path]:
    """Bundled Cora split among ``num_sites`` sites, each part as ``site-<i>/graph.pt``."""
    from graphveil.connectors.flower.partition import load_source, write_node_partition

    return write_node_partition(load_source(source="planetoid", name="cora"), num_sites, folder, seed,
                                kind=kind)[0]
