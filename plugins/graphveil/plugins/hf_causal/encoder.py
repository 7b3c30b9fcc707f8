"""A decoder LLM (Llama, Mistral, Qwen2/Qwen3) as entity encoder, LoRA on its top layers.

Each entity text is run through a causal language model's decoder stack (no LM head) and
pooled into one vector, optionally L2-normalised. Only the LoRA factors (``lora_A``,
``lora_B``; default targets ``q_proj``, ``v_proj``) of the top ``lora_layers`` decoder layers
are trainable; everything else is frozen. The frozen layers below them are run once per
entity and cached (:mod:`graphveil.plugins.hf_common`); each step runs only the top layers.

Pooling (``pooling``):

* ``last`` (default): the final-norm hidden state of the LAST real token. Under a causal mask
  it is the only position that has attended to the whole text, so it is the summary the
  model computes (the recipe of decoder embedders such as e5-mistral and gte-Qwen, which also
  append an EOS token: ``append_eos``).
* ``mean``: the masked mean over real tokens. Offered for comparison; with causal attention
  early tokens saw little of the text but get the same weight as the last one.

Sequences are padded on the RIGHT (built here, whatever the tokenizer's ``padding_side``), so
position ids ``0 … len-1`` of real tokens, their rotary embeddings and, through the causal +
padding mask, their hidden states do not depend on how long other texts in the batch are. The
last real token is at ``mask.sum(1) - 1``; padding columns after it are trimmed per batch.
A text that tokenises to nothing (an empty text under a tokenizer without BOS) is one EOS
token (the pad token if there is no EOS). A tokenizer without a pad token gets pad = EOS.

Per-tuple gradients (:mod:`graphveil.engine.per_tuple`) see only ``nn.Linear`` LoRA factors; no
activation mixes sequences along dim 0 (the rotary tables are shared constants, the attention
mask is per sequence), so the tuple decomposition is exact.

``dtype: bfloat16`` halves the memory of the base model and of the cache
(``n · max_length · hidden · bytes``); the LoRA factors stay float32 (peft upcasts adapters of a
half-precision base) and the pooled embeddings are returned as float32, so gradients, clipping
and noise are float32. ``device: auto`` puts the model on CUDA when available; the cache stays
in CPU memory and each batch's rows are moved to the device.

Reproducibility: the LoRA initialisation (and ``tiny-llama``'s random weights) are drawn under
``torch.manual_seed(params.seed)`` in a forked CPU RNG state. Dropout of the base model
(including attention dropout) is switched off; LoRA dropout acts in ``train()`` mode only.
Nothing is downloaded: ``model`` is ``tiny-llama`` or a local directory (``local_files_only``).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from contextlib import contextmanager
from typing import ClassVar, Literal

import torch
import torch.nn.functional as F
from pydantic import BaseModel, Field, field_validator
from torch import nn

from graphveil.contract.errors import ConfigError
from graphveil.plugins.hf_common import (
    CachedLoraEncoder,
    LoraParams,
    add_lora,
    check_device,
    check_lora_layers,
    check_model_type,
    loading,
    minilm_path,
    model_directory,
    no_dropout,
    quiet_loading,
)

#: Decoder model types whose layers run as ``layer(hidden, mask, rotary tables)`` after
#: ``model.embed_tokens``, with LoRA defaults on the attention query and value projections.
DEFAULT_TARGETS: dict[str, list[str]] = {
    "llama": ["q_proj", "v_proj"],
    "mistral": ["q_proj", "v_proj"],
    "qwen2": ["q_proj", "v_proj"],
    "qwen3": ["q_proj", "v_proj"],
}

#: Shape of the ``tiny-llama`` test model (random weights, MiniLM's tokenizer; one KV head: GQA).
TINY_LLAMA = dict(
    hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1,
    max_position_embeddings=512,
)

_MASKS = ("full_attention", "sliding_attention")


class HfCausalParams(LoraParams):
    """Options of :class:`HfCausalEncoder`."""

    model: str = Field(
        "tiny-llama",
        description="'tiny-llama': a tiny random Llama for tests and wiring (MiniLM's tokenizer); or "
        "a local Hugging Face directory (config, weights, tokenizer) of a llama, mistral, qwen2 or "
        "qwen3 model.",
    )
    target_modules: list[str] | None = Field(
        None, min_length=1, description="Module names that get LoRA; default q_proj, v_proj."
    )
    seed: int = Field(0, description="Seed of the LoRA initialisation (and of tiny-llama's random weights).")
    pooling: Literal["last", "mean"] = Field(
        "last",
        description="'last': the last real token (under a causal mask the only one that saw the "
        "whole text); 'mean': masked mean over real tokens.",
    )
    append_eos: bool = Field(
        False, description="Append the tokenizer's EOS token to every text (then pooled by 'last')."
    )
    dtype: Literal["float32", "bfloat16"] = Field(
        "float32", description="dtype of the frozen base model and the cache; LoRA factors stay float32."
    )
    device: str = Field("auto", description="'auto' (CUDA when available, else CPU), 'cpu', 'cuda' or 'cuda:N'.")

    _known_device = field_validator("device")(check_device)


class _CausalTop(nn.Module):
    """The adapted top decoder layers + final norm + pooling: ``(N, T, H), (N, T) → (N, H)``."""

    def __init__(self, layers, kinds, norm, rotary, config, pooling: str, normalize: bool) -> None:
        super().__init__()
        self.layers, self.norm, self.rotary = nn.ModuleList(layers), norm, rotary
        self.kinds, self.config, self.pooling, self.normalize = kinds, config, pooling, normalize

    def forward(self, hidden: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        hidden = run_decoder_layers(self.layers, self.kinds, self.rotary, self.config, hidden, mask)
        if self.pooling == "last":  # right padding: the last real token is at len - 1
            rows = torch.arange(hidden.shape[0], device=hidden.device)
            pooled = self.norm(hidden[rows, mask.sum(1) - 1]).float()
        else:
            weights = mask.float().unsqueeze(-1)
            pooled = (self.norm(hidden).float() * weights).sum(1) / weights.sum(1).clamp(min=1.0)
        return F.normalize(pooled, dim=-1) if self.normalize else pooled


def run_decoder_layers(layers, kinds, rotary, config, hidden: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Run decoder layers as ``LlamaModel.forward`` does: positions ``0 … T-1`` (right padding),
    rotary tables from ``model.rotary_emb``, causal (or sliding-window) + padding masks."""
    from transformers.masking_utils import create_causal_mask, create_sliding_window_causal_mask

    positions = torch.arange(hidden.shape[1], device=hidden.device).unsqueeze(0)
    kwargs = dict(config=config, inputs_embeds=hidden, attention_mask=mask, past_key_values=None,
                  position_ids=positions)
    build = {"full_attention": create_causal_mask, "sliding_attention": create_sliding_window_causal_mask}
    masks = {kind: build[kind](**kwargs) for kind in set(kinds)}
    rope = rotary(hidden, positions)
    for layer, kind in zip(layers, kinds, strict=True):
        out = layer(hidden, attention_mask=masks[kind], position_embeddings=rope, position_ids=positions)
        hidden = out[0] if isinstance(out, tuple) else out
    return hidden


def layer_kinds(config, num_layers: int) -> list[str]:
    """Per layer: ``full_attention`` or ``sliding_attention`` (Qwen's ``layer_types``, Mistral's
    ``sliding_window``)."""
    kinds = getattr(config, "layer_types", None)
    if not kinds:
        sliding = getattr(config, "sliding_window", None) is not None
        kinds = ["sliding_attention" if sliding else "full_attention"] * num_layers
    unknown = sorted(set(kinds) - set(_MASKS))
    if unknown:
        raise ConfigError(f"encoder.model: layer types {unknown} are not supported by hf_causal_lora")
    return list(kinds)[:num_layers]


class HfCausalEncoder(CachedLoraEncoder):
    """Decoder LLM (Llama / Mistral / Qwen) with LoRA on its top layers, last-token pooled."""

    Params: ClassVar[type[BaseModel]] = HfCausalParams
    component = "hf_causal_lora"
    random_models = frozenset({"tiny-llama"})

    def __init__(self, params: HfCausalParams | None = None) -> None:
        super().__init__()
        self.params = params = params or HfCausalParams()
        self.device = _device(params.device)
        self.cache_dtype = getattr(torch, params.dtype)
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(params.seed)
            base, self.tokenizer = _load(params.model, self.cache_dtype)
            num_layers = len(base.layers)
            self.first_lora_layer = check_lora_layers(params.lora_layers, num_layers, params.model)
            kinds = layer_kinds(base.config, num_layers)
            no_dropout(base)
            targets = params.target_modules or DEFAULT_TARGETS[base.config.model_type]
            self.peft = add_lora(base, params, targets, range(self.first_lora_layer, num_layers), "layers")
        self.peft.to(self.device)
        self._pad_and_eos(params)
        first, layers = self.first_lora_layer, list(base.layers)
        # Not registered as submodules (they already are, under self.peft).
        object.__setattr__(self, "_lower", (layers[:first], kinds[:first]))
        top = _CausalTop(layers[first:], kinds[first:], base.norm, base.rotary_emb, base.config,
                         params.pooling, params.normalize)
        object.__setattr__(self, "top", top)
        self.dim = int(base.config.hidden_size)
        self._reset()

    def _pad_and_eos(self, params: HfCausalParams) -> None:
        tok = self.tokenizer
        if tok.pad_token is None:
            if tok.eos_token is None:
                raise ConfigError(f"encoder.model: the tokenizer of {params.model!r} has neither a pad nor an eos token")
            tok.pad_token = tok.eos_token  # decoder tokenizers often have no pad token
        if params.append_eos and tok.eos_token_id is None:
            raise ConfigError(f"encoder.append_eos: the tokenizer of {params.model!r} has no eos token")
        self._empty_id = tok.eos_token_id if tok.eos_token_id is not None else tok.pad_token_id

    def _cache_extra(self) -> tuple:
        return (self.params.dtype, self.params.append_eos)

    def _tokenize(self, texts: Sequence[str]) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
        """Right-padded ``input_ids`` and mask, built here (whatever the tokenizer's padding side)."""
        cap, eos = self.params.max_length, self.tokenizer.eos_token_id
        append = self.params.append_eos
        rows = self.tokenizer(list(texts), truncation=True, max_length=cap - int(append))["input_ids"]
        ids = torch.full((len(rows), cap), self.tokenizer.pad_token_id, dtype=torch.long)
        mask = torch.zeros(len(rows), cap, dtype=torch.bool)
        for i, row in enumerate(rows):
            row = list(row)
            if append and (not row or row[-1] != eos):
                row.append(eos)
            row = row or [self._empty_id]
            ids[i, : len(row)] = torch.tensor(row)
            mask[i, : len(row)] = True
        vocab = self.base.config.vocab_size
        if ids.numel() and int(ids.max()) >= vocab:
            raise ConfigError(
                f"encoder.model: the tokenizer of {self.params.model!r} gives token id {int(ids.max())}, "
                f"outside the model's vocabulary of {vocab}: tokenizer and weights do not match"
            )
        return {"input_ids": ids}, mask

    def _frozen_states(self, inputs: dict[str, torch.Tensor], mask: torch.Tensor) -> torch.Tensor:
        layers, kinds = self._lower
        base = self.base
        return run_decoder_layers(layers, kinds, base.rotary_emb, base.config, base.embed_tokens(inputs["input_ids"]), mask)


def _device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    device = torch.device(name)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ConfigError(f"encoder.device: {name!r} asked for, but CUDA is not available")
    return device


def _load(model: str, dtype: torch.dtype):
    """(decoder base model without LM head, tokenizer) for ``tiny-llama`` or a local directory."""
    from transformers import AutoConfig, AutoModel, AutoTokenizer, LlamaConfig

    if model == "tiny-llama":
        tokenizer = AutoTokenizer.from_pretrained(minilm_path(), local_files_only=True)
        config = LlamaConfig(vocab_size=tokenizer.vocab_size, pad_token_id=tokenizer.pad_token_id, **TINY_LLAMA)
        return AutoModel.from_config(config).to(dtype), tokenizer
    path = model_directory(model, "'tiny-llama'")
    quiet_loading()
    with loading(path):
        config = AutoConfig.from_pretrained(path, local_files_only=True)
    check_model_type(config.model_type, list(DEFAULT_TARGETS), "hf_causal_lora", "decoder models")
    with loading(path), _quiet(logging.getLogger("transformers.modeling_utils")):
        tokenizer = AutoTokenizer.from_pretrained(path, local_files_only=True)  # after the type check
        base, info = AutoModel.from_pretrained(path, local_files_only=True, dtype=dtype, output_loading_info=True)
    # A published causal LM also holds lm_head (unexpected here, not needed); a MISSING weight
    # would be left randomly initialised in the frozen model, so it is refused.
    missing = sorted(info.get("missing_keys", ()))
    if missing:
        raise ConfigError(f"encoder.model: {path} has no weights for {missing[:3]} ({len(missing)} missing)")
    return base, tokenizer


@contextmanager
def _quiet(logger: logging.Logger):
    """Hide transformers' load report (it lists lm_head as unexpected); missing keys are checked."""
    level = logger.level
    logger.setLevel(logging.ERROR)
    try:
        yield
    finally:
        logger.setLevel(level)
