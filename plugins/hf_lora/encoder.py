"""A Hugging Face text encoder with LoRA adapters on its top layers (paper 2, Sec. 3.3).

Entities are embedded by mean pooling (over the attention mask) the last hidden states of a
BERT-style encoder, optionally L2-normalised. Only the LoRA factors (``lora_A``, ``lora_B``) of
the top ``lora_layers`` transformer layers are trainable; everything else is frozen.

CPU speed trick (shared with ``hf_causal_lora``, :mod:`graphveil.plugins.hf_common`): the frozen
layers below the adapted ones do not depend on the trainable weights, so
:meth:`HfLoraEncoder.prepare` runs them ONCE per entity (no grad) and caches their outputs;
:meth:`HfLoraEncoder.embed` runs only the top layers on the cached states, trimmed to the
longest sequence in the batch (padding columns change nothing: they are masked keys and are
excluded from the pool). Memory of the cache: ``n · max_length · hidden · 4`` bytes.

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

from collections.abc import Sequence
from typing import ClassVar

import torch
import torch.nn.functional as F
from pydantic import BaseModel, Field
from torch import nn

from graphveil.plugins.hf_common import (
    CachedLoraEncoder,
    LoraParams,
    add_lora,
    check_lora_layers,
    check_model_type,
    loading,
    minilm_path,
    model_directory,
    no_dropout,
)

#: Model types whose layers can be run one by one as ``layer(hidden, mask)`` after
#: ``model.embeddings``, with LoRA defaults on the attention query and value projections.
DEFAULT_TARGETS: dict[str, list[str]] = {
    "bert": ["query", "value"],
    "roberta": ["query", "value"],
    "xlm-roberta": ["query", "value"],
    "camembert": ["query", "value"],
}

#: Shape of the ``tiny-bert`` test model (random weights, MiniLM's tokenizer).
TINY_BERT = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64)


class HfLoraParams(LoraParams):
    """Options of :class:`HfLoraEncoder`."""

    model: str = Field(
        "minilm",
        description="'minilm': the packaged all-MiniLM-L6-v2 (offline); 'tiny-bert': a tiny "
        "random BERT for tests; or a local Hugging Face model directory.",
    )
    target_modules: list[str] | None = Field(
        None, min_length=1, description="Module names that get LoRA; default per model type (BERT-like: query, value)."
    )
    normalize: bool = Field(True, description="L2-normalise the mean-pooled embeddings.")
    seed: int = Field(0, description="Seed of the LoRA initialisation (and of tiny-bert's random weights).")


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


class HfLoraEncoder(CachedLoraEncoder):
    """Hugging Face text encoder (default: packaged MiniLM) with LoRA on its top layers, mean pooled."""

    Params: ClassVar[type[BaseModel]] = HfLoraParams
    component = "hf_lora"
    random_models = frozenset({"tiny-bert"})

    def __init__(self, params: HfLoraParams | None = None) -> None:
        super().__init__()
        self.params = params = params or HfLoraParams()
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(params.seed)
            base, self.tokenizer = _load(params.model)
            model_type = base.config.model_type
            check_model_type(model_type, list(DEFAULT_TARGETS), "hf_lora",
                             "BERT-style encoders whose layers can be cached")
            num_layers = len(base.encoder.layer)
            self.first_lora_layer = check_lora_layers(params.lora_layers, num_layers, params.model)
            no_dropout(base)
            targets = params.target_modules or DEFAULT_TARGETS[model_type]
            self.peft = add_lora(base, params, targets, range(self.first_lora_layer, num_layers), "layer")
        layers = list(base.encoder.layer)
        # Not registered as submodules (they already are, under self.peft).
        object.__setattr__(self, "_lower", layers[: self.first_lora_layer])
        object.__setattr__(self, "top", _TopStack(layers[self.first_lora_layer :], base.config, params.normalize))
        self.dim = int(base.config.hidden_size)
        self._reset()

    def _tokenize(self, texts: Sequence[str]) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
        tokens = self.tokenizer(
            list(texts), padding="max_length", truncation=True, max_length=self.params.max_length, return_tensors="pt"
        )
        inputs = {k: v for k, v in tokens.items() if k in ("input_ids", "token_type_ids")}
        return inputs, tokens["attention_mask"].bool()

    def _frozen_states(self, inputs: dict[str, torch.Tensor], mask: torch.Tensor) -> torch.Tensor:
        return _run_layers(self._lower, self.base.embeddings(**inputs), mask, self.base.config)


def _load(model: str):
    """(base model, tokenizer) for ``minilm``, ``tiny-bert`` or a local directory, offline."""
    from transformers import AutoModel, AutoTokenizer, BertConfig

    minilm = minilm_path()
    if model == "tiny-bert":
        tokenizer = AutoTokenizer.from_pretrained(minilm, local_files_only=True)
        config = BertConfig(vocab_size=tokenizer.vocab_size, **TINY_BERT)
        return AutoModel.from_config(config), tokenizer
    path = minilm if model == "minilm" else model_directory(model, "'minilm', 'tiny-bert'")
    with loading(path):
        tokenizer = AutoTokenizer.from_pretrained(path, local_files_only=True)
        return AutoModel.from_pretrained(path, local_files_only=True), tokenizer
