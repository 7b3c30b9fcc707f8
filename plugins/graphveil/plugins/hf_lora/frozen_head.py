"""``frozen_head``: a small trainable head on frozen entity embeddings computed once (CPU-scale runs).

Each entity's base embedding is computed ONCE, with no gradient, and kept in memory:

- ``model: minilm`` / ``tiny-bert`` / a local BERT-style directory: the mean-pooled (over the
  attention mask) last hidden states of the frozen text encoder — exactly ``hf_lora``'s
  embedding before any training (same loading, same layers, same pooling);
- ``model: features``: the graph's own entity feature vectors (e.g. Cora's bag of words).

Only the head trains; ``embed`` looks the rows up and runs the head on them. Heads, both equal
to the identity at step 0, so the base row of a comparison IS the frozen model:

- ``head: linear``: ``z = W x (+ b)``, ``W`` initialised to the identity (``d × d`` weights);
- ``head: diagonal``: ``z = w ⊙ x``, ``w`` initialised to ones (``d`` weights: a learned weight per
  input dimension, e.g. per word of a bag of words). The fewest parameters, hence the least DP
  noise; per-example gradients come from the engine's ``torch.func`` fallback (exact, and
  cheap for ``d`` parameters; the encoder opts in for this head only);
- ``head: residual``: ``z = x + B(A x)``, rank ``rank``, ``B`` initialised to zero (LoRA's rule).
  Cheaper in parameters, but ``A`` is a random projection: on sparse features (bag of words)
  ``(A x)·(A x')`` is a noisy estimate of ``x·x'`` and the first steps of ``B`` add that noise to
  held-out entities' embeddings (measured on Cora: MRR fell below the base; see README).

With ``normalize`` (default) the head's input rows are L2-normalised (cosine scores do not
change) and so are its outputs.

Privacy: the head's layers are the only trainable parameters, so the DP engine's per-example
gradients come from the registered ``nn.Linear`` grad sampler (ghost norm / book-keeping) or,
for the diagonal head, from ``torch.func``; rows along dim 0 never mix, and per-tuple clipping
works as for LoRA. An entity's
cached embedding is a deterministic function of that entity's own text (or feature vector) and
of the public frozen model: adding or removing one entity (or one relation) changes no other
entity's cached row, so the privacy-unit analysis of the samplers, clippers and accountants is
unchanged — the cache is a fixed, data-independent map applied row by row before training.
At a federated site the text models' embeddings are also kept between rounds in the site's
prepared cache (:mod:`graphveil.run.prepared_cache`: the site's own files, nothing of it is sent).

Devices and dtypes: ``dtype`` is that of the frozen text model while the cache is built; the
cache and the head are float32; ``device: auto`` runs the text model and the head on CUDA when
available (the cache stays in CPU memory; each batch's rows are moved to the device).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, ClassVar, Literal

import torch
import torch.nn.functional as F
from pydantic import BaseModel, ConfigDict, Field, field_validator
from torch import nn

from graphveil.contract.errors import ConfigError, DataError
from graphveil.contract.model import Encoder
from graphveil.plugins.hf_common import (
    cached_for_last_graph,
    check_device,
    frozen_key,
    frozen_tensors,
    texts_digest,
    tokenize_padded,
)

if TYPE_CHECKING:
    from graphveil.data.graph import RelationalGraph
    from graphveil.run.prepared_cache import PreparedCache

#: Base embeddings of the last prepared graph, keyed by what they depend on (a demo's rows and
#: a site's rounds prepare the same graph again).
_EMBEDDING_CACHE: dict[tuple, torch.Tensor] = {}

FEATURES = "features"


class FrozenHeadParams(BaseModel):
    """Options of :class:`FrozenHeadEncoder`."""

    model_config = ConfigDict(extra="forbid")

    model: str = Field("minilm", description=(
        "'minilm': the packaged all-MiniLM-L6-v2 (offline); 'tiny-bert': a tiny random BERT for "
        "tests; a local BERT-style Hugging Face directory; or 'features': the graph's entity "
        "feature vectors (e.g. Cora's bag of words)."))
    head: Literal["linear", "diagonal", "residual"] = Field("linear", description=(
        "'linear': z = W x, W starts as the identity; 'diagonal': z = w * x, w starts at ones "
        "(d weights); 'residual': z = x + B(A x) of rank `rank`, B starts at zero. Each equals "
        "the frozen embedding at step 0."))
    rank: int = Field(16, ge=1, description="Rank of the residual head (head: residual only).")
    bias: bool = Field(False, description="Give the linear head a bias (starts at zero).")
    normalize: bool = Field(True, description="L2-normalise the head's input rows and its outputs.")
    max_length: int = Field(128, ge=2, le=512, description="Tokens per entity text (text models only).")
    cache_batch_size: int = Field(64, ge=1, description="Entities per forward pass while embedding once.")
    seed: int = Field(0, description="Seed of the residual head's A (and of tiny-bert's random weights).")
    dtype: Literal["float32", "bfloat16"] = Field(
        "float32", description="dtype of the frozen text model while embedding; cache and head are float32.")
    device: str = Field("auto", description="'auto' (CUDA when available, else CPU), 'cpu', 'cuda' or 'cuda:N'.")

    _known_device = field_validator("device")(check_device)


class FrozenHeadEncoder(Encoder):
    """A trainable identity-initialised head (linear or low-rank residual) on frozen entity
    embeddings computed once per entity (a frozen text encoder's mean pool, or node features)."""

    Params: ClassVar[type[BaseModel]] = FrozenHeadParams
    #: Where :meth:`prepare` keeps a text model's embeddings across processes (a federated
    #: site's folder, set by the session from the site's node config; never from a task option).
    prepared_cache: PreparedCache | None = None

    def __init__(self, params: FrozenHeadParams | None = None) -> None:
        super().__init__()
        from graphveil.plugins.hf_causal.encoder import _device

        self.params = params = params or FrozenHeadParams()
        if params.head != "residual" and "rank" in params.model_fields_set:
            raise ConfigError("encoder.rank: only applies to head: residual")
        if params.head != "linear" and params.bias:
            raise ConfigError("encoder.bias: only applies to head: linear")
        self.device = _device(params.device)
        self._text_model: tuple | None = None
        self.dim: int | None = None
        if params.model != FEATURES:
            with torch.random.fork_rng(devices=[]):
                torch.manual_seed(params.seed)
                base, tokenizer = _load_text_model(params.model)
            self._text_model = (base.to(self.device, getattr(torch, params.dtype)), tokenizer)
            self.dim = int(base.config.hidden_size)
            self._build_head(self.dim)
        self._x: torch.Tensor | None = None
        self.eval()

    def _build_head(self, dim: int) -> None:
        p = self.params
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(p.seed)
            if p.head == "diagonal":
                self.scale = _Scale(dim)
                self.per_example_fallback = "functorch"  # _Scale has no grad sampler; d weights
            elif p.head == "linear":
                self.linear = nn.Linear(dim, dim, bias=p.bias)
                with torch.no_grad():
                    self.linear.weight.copy_(torch.eye(dim))
                    if self.linear.bias is not None:
                        self.linear.bias.zero_()
            else:
                self.down = nn.Linear(dim, p.rank, bias=False)  # kaiming-uniform, as LoRA's A
                self.up = nn.Linear(p.rank, dim, bias=False)
                nn.init.zeros_(self.up.weight)
        self.to(self.device)

    # ------------------------------------------------------------------------- the cache

    def prepare(self, graph: RelationalGraph) -> None:
        """Compute (or reuse) every entity's frozen embedding; size the head for feature graphs."""
        p = self.params
        if p.model == FEATURES:
            if graph.features is None:
                raise DataError(f"graph {graph.name!r} has no entity features; encoder.model: features "
                                "reads them (use a text model for a text graph)")
            x = graph.features.detach().to("cpu", torch.float32)
            if not torch.isfinite(x).all():
                raise DataError(f"graph {graph.name!r}: entity features hold NaN or infinite values")
            empty = (x == 0).all(1).nonzero().flatten()
            if empty.numel():  # a zero row has no direction: cosine scores and their gradients are NaN
                raise DataError(f"graph {graph.name!r}: {empty.numel()} entities have an all-zero feature "
                                f"vector (first: {graph.entity_ids[int(empty[0])]!r}); cosine scores need "
                                "a non-zero vector per entity")
            if self.dim is None:
                self.dim = int(x.shape[1])
                self._build_head(self.dim)
            elif self.dim != x.shape[1]:
                raise DataError(f"graph {graph.name!r} has {x.shape[1]} features per entity; this head "
                                f"was built for {self.dim}")
        else:
            if graph.texts is None:
                raise DataError(f"graph {graph.name!r} has no entity texts; encoder.model {p.model!r} "
                                "encodes text (encoder.model: features reads feature vectors)")
            x = cached_for_last_graph(_EMBEDDING_CACHE, self._cache_key(graph.texts),
                                      lambda: self._stored_or_embedded(list(graph.texts)))
        self._x = F.normalize(x, dim=-1) if p.normalize else x

    def _cache_key(self, texts: Sequence[str]) -> tuple:
        p = self.params
        seed = p.seed if p.model == "tiny-bert" else None  # its frozen weights are random
        return (p.model, seed, p.max_length, p.dtype, texts_digest(texts))

    def _stored_or_embedded(self, texts: list[str]) -> torch.Tensor:
        """Every entity's frozen embedding, from :attr:`prepared_cache` if it holds them for
        exactly these texts, tokenizer, weights and options (:meth:`prepared_key`), else
        computed (and stored)."""
        store = self.prepared_cache
        if store is None:
            return self._embed_texts(texts)
        shape = (len(texts), self.dim)

        def fits(saved) -> None:  # refuse a file that is not these embeddings
            x = saved.get("embeddings")
            if x is None or tuple(x.shape) != shape or x.dtype != torch.float32:
                raise ValueError(f"expected float32 embeddings of shape {list(shape)}")
            if not bool(torch.isfinite(x).all()):
                raise ValueError("non-finite embeddings")

        return store.load_or_compute(self.prepared_key(texts), lambda: {"embeddings": self._embed_texts(texts)},
                                     fits)["embeddings"]

    def prepared_key(self, texts: Sequence[str]) -> str:
        """Key of the embeddings in a :class:`~graphveil.run.prepared_cache.PreparedCache`
        (:func:`~graphveil.plugins.hf_common.frozen_key`): the texts and the tokenizer, every
        weight and buffer of the frozen text model, the token cap, its dtype and device type."""
        assert self._text_model is not None
        base, tokenizer = self._text_model
        p = self.params
        # The key holds texts, not tokens: bump the version when _tokens or _embed_texts changes.
        meta = ("graphveil-frozen-embeddings-v1", type(self).__qualname__, p.model, p.max_length, p.dtype,
                self.device.type)
        return frozen_key("frozen-embeddings", meta, texts, tokenizer, frozen_tensors(base),  # all frozen
                          lambda: self._tokens(texts))

    def _tokens(self, texts: Sequence[str]) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
        """``(model inputs, (n, max_length) bool mask)`` of the texts."""
        assert self._text_model is not None
        return tokenize_padded(self._text_model[1], texts, self.params.max_length)

    @torch.no_grad()
    def _embed_texts(self, texts: Sequence[str]) -> torch.Tensor:
        """Mean-pooled last hidden states of the frozen text model, ``(n, H)`` float32 on the CPU."""
        from tqdm.auto import tqdm

        from graphveil.plugins.hf_lora.encoder import _run_layers

        assert self._text_model is not None
        base = self._text_model[0]
        inputs, mask = self._tokens(texts)
        out = torch.empty(len(texts), self.dim, dtype=torch.float32)
        step = self.params.cache_batch_size
        for start in tqdm(range(0, len(texts), step), desc=f"embedding {len(texts)} entities once",
                          unit="batch", disable=None):
            m = mask[start : start + step]
            used = m.any(0)  # padding columns are masked keys and left out of the pool
            m = m[:, used].to(self.device)
            part = {k: v[start : start + step][:, used].to(self.device) for k, v in inputs.items()}
            hidden = _run_layers(list(base.encoder.layer), base.embeddings(**part), m, base.config)
            w = m.to(hidden.dtype).unsqueeze(-1)
            out[start : start + step] = ((hidden * w).sum(1) / w.sum(1).clamp(min=1.0)).to("cpu", torch.float32)
        return out

    # ------------------------------------------------------------------------- the model

    def head(self, x: torch.Tensor) -> torch.Tensor:
        """The trainable map, ``(N, d) → (N, d)``; the identity until it has trained."""
        head = self.params.head
        z = self.linear(x) if head == "linear" else self.scale(x) if head == "diagonal" else x + self.up(self.down(x))
        return F.normalize(z, dim=-1) if self.params.normalize else z

    def embed(self, entity_ids: torch.Tensor) -> torch.Tensor:
        """``(N,)`` entity indices (repeats allowed, one row each) → ``(N, d)`` embeddings."""
        if self._x is None:
            raise RuntimeError("FrozenHeadEncoder.embed called before prepare(graph)")
        ids = torch.as_tensor(entity_ids, dtype=torch.long).reshape(-1).cpu()
        n = self._x.shape[0]
        if ids.numel() and (int(ids.min()) < 0 or int(ids.max()) >= n):
            bad = ids[(ids < 0) | (ids >= n)][0]
            raise DataError(f"entity index {int(bad)} is out of range for the prepared graph ({n} entities)")
        return self.head(self._x[ids].to(self.device))

    def save(self, directory: Path) -> None:
        """Write the head's weights (``head.pt``) and the options that rebuild it (``head.json``)."""
        directory.mkdir(parents=True, exist_ok=True)
        torch.save(self.trainable_state(), directory / "head.pt")
        (directory / "head.json").write_text(self.params.model_dump_json(indent=2) + "\n", encoding="utf-8")

    def base_embeddings(self) -> torch.Tensor:
        """The cached input rows of every prepared entity (normalised as the head sees them)."""
        if self._x is None:
            raise RuntimeError("FrozenHeadEncoder.base_embeddings called before prepare(graph)")
        return self._x


class _Scale(nn.Module):
    """``x ↦ w ⊙ x`` with ``w`` (d,) starting at ones: a weight per input dimension."""

    def __init__(self, dim: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * self.weight


def _load_text_model(model: str):
    """(frozen BERT-style model, tokenizer), loaded offline as ``hf_lora`` loads it, no dropout."""
    from graphveil.plugins.hf_common import check_model_type, no_dropout
    from graphveil.plugins.hf_lora.encoder import DEFAULT_TARGETS, _load

    base, tokenizer = _load(model)
    check_model_type(base.config.model_type, list(DEFAULT_TARGETS), "frozen_head",
                     "BERT-style encoders run layer by layer as hf_lora runs them")
    no_dropout(base)
    base.requires_grad_(False)
    return base.eval(), tokenizer
