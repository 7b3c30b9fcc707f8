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

Full fine-tuning (``finetune: full``): no LoRA; every weight of the transformer trains —
word, position and token-type embeddings, every LayerNorm, every attention and FFN linear (only
the unused BERT pooler and the attention key biases, whose gradient is exactly zero, stay frozen:
:func:`_full_trainable`). Nothing is frozen, so nothing is cached: :meth:`prepare` keeps
the tokens and :meth:`embed` runs the whole model from them. Position and token-type ids are fed
batch-shaped ``(N, T)``: transformers' ``BertEmbeddings`` would otherwise look positions up from
a ``(1, T)`` buffer broadcast over the batch, and the per-example hooks of ``nn.Embedding`` need
one row per sequence. The per-tuple engine then sees ``nn.Embedding``, ``nn.LayerNorm`` and
``nn.Linear`` modules only; the decomposition stays exact (no activation mixes sequences). LoRA
and cache options (``lora_*``, ``target_modules``, ``cache_batch_size``) are refused with it.

Reproducibility: the LoRA initialisation (and ``tiny-bert``'s random weights) are drawn under
``torch.manual_seed(params.seed)`` in a forked RNG state, independent of the caller's global
RNG. Dropout of the base model is switched off (the cache must be deterministic); LoRA dropout
(``lora_dropout``, default 0) acts in ``train()`` mode only and draws from torch's global RNG.
It keeps the per-tuple decomposition exact: it is elementwise per token, and the engine
records ``lora_A``'s post-dropout input.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import ClassVar, Literal

import torch
import torch.nn.functional as F
from pydantic import BaseModel, Field
from torch import nn

from graphveil.plugins.hf_common import (
    CachedLoraEncoder,
    LoraParams,
    add_lora,
    check_full_finetune,
    check_lora_layers,
    check_model_type,
    loading,
    minilm_path,
    model_directory,
    no_dropout,
    tokenize_padded,
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
    finetune: Literal["lora", "full"] = Field(
        "lora",
        description="'lora': LoRA adapters on the top lora_layers layers, the frozen layers below "
        "cached; 'full': every weight of the transformer trains (embeddings, LayerNorms, linears), "
        "no LoRA, no cache.",
    )


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


class _FullStack(nn.Module):
    """Embeddings + every layer + pooling, from tokens: ``(N, T, 2) [input ids, token types], (N, T) → (N, H)``."""

    def __init__(self, embeddings: nn.Module, top: _TopStack) -> None:
        super().__init__()
        self.embeddings, self.top = embeddings, top

    def forward(self, tokens: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        # contiguous ids: per-example samplers may view them flat (Opacus' embedding norm sampler does)
        input_ids, token_type_ids = (t.contiguous() for t in tokens.unbind(-1))
        position_ids = _position_ids(self.embeddings, input_ids).contiguous()
        hidden = self.embeddings(input_ids=input_ids, token_type_ids=token_type_ids, position_ids=position_ids)
        return self.top(hidden, mask)


def _position_ids(embeddings: nn.Module, input_ids: torch.Tensor) -> torch.Tensor:
    """The position ids the model would use, one row per sequence ``(N, T)``: RoBERTa-style
    models derive them from the padding (already per row); BERT reads a ``(1, max_len)`` buffer."""
    from_ids = getattr(embeddings, "create_position_ids_from_input_ids", None)
    if from_ids is not None:
        return from_ids(input_ids, embeddings.padding_idx)
    n, t = input_ids.shape
    return embeddings.position_ids[:, :t].expand(n, t)


def _run_layers(layers, hidden: torch.Tensor, mask: torch.Tensor, config) -> torch.Tensor:
    from transformers.masking_utils import create_bidirectional_mask

    attn = create_bidirectional_mask(config=config, inputs_embeds=hidden, attention_mask=mask.long())
    for layer in layers:
        out = layer(hidden, attn)
        hidden = out[0] if isinstance(out, tuple) else out
    return hidden


class HfLoraEncoder(CachedLoraEncoder):
    """Hugging Face text encoder (default: packaged MiniLM) with LoRA on its top layers (or, with
    ``finetune: full``, every weight trainable), mean pooled."""

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
            no_dropout(base)
            if params.finetune == "full":
                check_full_finetune(params)
                self.full_finetune, self.first_lora_layer = True, 0
                self.transformer = _full_trainable(base)
            else:
                self.first_lora_layer = check_lora_layers(params.lora_layers, num_layers, params.model)
                targets = params.target_modules or DEFAULT_TARGETS[model_type]
                self.peft = add_lora(base, params, targets, range(self.first_lora_layer, num_layers), "layer")
        layers = list(base.encoder.layer)
        # Not registered as submodules (they already are, under self.peft / self.transformer).
        object.__setattr__(self, "_lower", layers[: self.first_lora_layer])
        top = _TopStack(layers[self.first_lora_layer :], base.config, params.normalize)
        object.__setattr__(self, "top", _FullStack(base.embeddings, top) if self.full_finetune else top)
        self.dim = int(base.config.hidden_size)
        self._reset()

    def _tokenize(self, texts: Sequence[str]) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
        inputs, mask = tokenize_padded(self.tokenizer, texts, self.params.max_length)
        if self.full_finetune:  # _FullStack reads [input ids, token types]; zeros as BertEmbeddings' buffer
            inputs = {"input_ids": inputs["input_ids"],
                      "token_type_ids": inputs.get("token_type_ids", torch.zeros_like(inputs["input_ids"]))}
        return inputs, mask

    def _frozen_states(self, inputs: dict[str, torch.Tensor], mask: torch.Tensor) -> torch.Tensor:
        return _run_layers(self._lower, self.base.embeddings(**inputs), mask, self.base.config)


def _full_trainable(base: nn.Module) -> nn.Module:
    """Every weight trainable except those that cannot change the embeddings: the pooler (mean
    pooling never reaches it) and the attention KEY biases (a query's scores all shift by
    ``q·b_k``, which softmax ignores: their gradient is exactly zero, autograd returns rounding
    noise that the per-tuple engine's summed-gradient check cannot tell from a tracking error,
    and DP noise on them would be pure noise)."""
    base.requires_grad_(True)
    if getattr(base, "pooler", None) is not None:
        base.pooler.requires_grad_(False)
    for layer in base.encoder.layer:
        key = layer.attention.self.key
        if key.bias is not None:
            key.bias.requires_grad_(False)
    return base


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
