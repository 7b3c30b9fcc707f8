"""Per-tuple gradient norms and the clipped sum from ONE backward pass.

Paper 2 (privately-learning-from-graphs-llm-finetuning), Sec. 3.3: for a linear layer
``s = W a`` the gradient of a tuple ``E`` (``K = 2 + k`` entities × ``M`` tokens) is
``g(E) = Σ_{i,j} r_{i,j} a_{i,j}ᵀ`` with ``r = ∂ℓ/∂s``. We record ``a`` and ``r`` for every
token, never the per-token outer products, and per layer pick the cheaper of

* **ghost norm** (Li et al., 2021): ``‖g(E)‖² = Σ_{t,t'} (a_t·a_t')(r_t·r_t')``, i.e. the sum of
  ``(A Aᵀ) ∘ (R Rᵀ)`` — cost ``L²(d+p)`` per tuple with ``L = K·M`` tokens;
* **book-keeping** (materialised per-tuple gradient, the paper's ``r aᵀ``): ``Rᵀ A`` — cost
  ``L·d·p`` per tuple and memory ``d·p`` (always cheaper for LoRA factors, where ``p`` or ``d``
  is the rank ``r``).

The weighted sum ``Σᵢ cᵢ g(Eᵢ)`` is then formed directly from the same records (no second
backward): ``(c ∘ R)ᵀ A`` for ghost layers, ``Σᵢ cᵢ Gᵢ`` for materialised ones. Embedding layers
use the ghost identity with ``a_t·a_t' = [idx_t = idx_t']``.

The output gradients ``r`` come from ``torch.autograd.grad(loss_sum, outputs)``, which does not
compute the (summed) parameter gradients at all.

Only ``nn.Linear`` (weight, bias; including peft's ``lora_A``/``lora_B``) and ``nn.Embedding``
(weight) may own trainable parameters; anything else is refused naming the module.

Grouping: every recorded activation has the sequence (entity occurrence) index on dim 0, and
tuple ``i`` owns the consecutive sequences ``[i·s, (i+1)·s)`` with ``s = N / num_groups``.
The per-tuple decomposition is exact only if sequences never mix along dim 0 (no batch norm,
no cross-sequence attention) and each tuple's loss depends only on its own sequences.

Usage::

    engine = PerTupleGrad(encoder)
    with engine.record():
        emb = encoder.embed(ids)            # ids: b·(2+k) occurrences, tuple-major
    losses = tuple_losses(emb.view(b, 2 + k, -1), ...)
    norms = engine.compute(losses.sum(), num_groups=b)     # (b,)
    engine.accumulate(factors)                              # p.grad = Σᵢ factorsᵢ·g(Eᵢ)
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Literal

import torch
from torch import nn

from graphveil.errors import PluginError

Mode = Literal["auto", "ghost", "materialize"]


@dataclass
class _Call:
    """One forward call of a hooked module: its input and its output (still in the graph)."""

    inp: torch.Tensor
    out: torch.Tensor
    versions: tuple[int, int]


@dataclass
class _Layer:
    """A module owning trainable parameters, its recorded calls and per-step results."""

    name: str
    module: nn.Module
    calls: list[_Call] = field(default_factory=list)
    # Filled by compute(): per parameter either a materialised (B, *shape) tensor or the
    # (activations, output-grads) pair for the ghost path.
    per_tuple: dict[str, torch.Tensor] = field(default_factory=dict)
    ghost: tuple[torch.Tensor, torch.Tensor] | None = None


class PerTupleGrad:
    """Per-tuple gradient norms and clipped sums for every trainable parameter of ``model``.

    :param model: the module whose trainable parameters (``requires_grad``) are differentiated.
    :param mode: ``"auto"`` picks per layer the cheaper of ghost norm and materialised
        per-tuple gradients; ``"ghost"`` / ``"materialize"`` force one (tests, benchmarks).
    :raises PluginError: a module other than ``nn.Linear``/``nn.Embedding`` owns trainable
        parameters, or an embedding uses ``scale_grad_by_freq`` (not decomposable per tuple).
    """

    def __init__(self, model: nn.Module, *, mode: Mode = "auto") -> None:
        if mode not in ("auto", "ghost", "materialize"):
            raise ValueError(f"mode must be auto, ghost or materialize, got {mode!r}")
        self.mode = mode
        self._layers: list[_Layer] = []
        for name, module in model.named_modules():
            own = [n for n, p in module.named_parameters(recurse=False) if p.requires_grad]
            if not own:
                continue
            _check_supported(name, module, own)
            self._layers.append(_Layer(name or type(model).__name__, module))
        self._recording = False
        self._num_groups: int | None = None

    @property
    def parameters(self) -> list[nn.Parameter]:
        """The trainable parameters handled, in module order."""
        return [p for layer in self._layers for p in _trainable(layer.module).values()]

    # ---------------------------------------------------------------------------------------
    # forward: record inputs and outputs
    # ---------------------------------------------------------------------------------------

    @contextmanager
    def record(self) -> Iterator[PerTupleGrad]:
        """Record every hooked module's input and output during the forward pass inside."""
        for layer in self._layers:
            layer.calls.clear()
            layer.per_tuple.clear()
            layer.ghost = None
        self._num_groups = None
        handles = [layer.module.register_forward_hook(self._hook(layer)) for layer in self._layers]
        self._recording = True
        try:
            yield self
        finally:
            self._recording = False
            for handle in handles:
                handle.remove()

    def _hook(self, layer: _Layer):
        def hook(module: nn.Module, args: tuple, output: torch.Tensor) -> None:
            if not torch.is_grad_enabled():
                return
            if not isinstance(output, torch.Tensor) or not args or not isinstance(args[0], torch.Tensor):
                raise PluginError(f"per-tuple gradients: {layer.name} must take and return one tensor")
            inp = args[0]
            if not isinstance(module, nn.Embedding) and inp.dim() < 2:
                raise PluginError(f"per-tuple gradients: {layer.name} got an input without a batch dim")
            layer.calls.append(_Call(inp.detach(), output, (inp._version, output._version)))

        return hook

    # ---------------------------------------------------------------------------------------
    # backward: output gradients, per-tuple norms
    # ---------------------------------------------------------------------------------------

    def compute(self, loss_sum: torch.Tensor, num_groups: int) -> torch.Tensor:
        """Per-tuple gradient norms ``‖g(Eᵢ)‖₂`` (shape ``(num_groups,)``) of ``loss_sum = Σᵢ ℓᵢ``.

        Runs one ``autograd.grad`` to the recorded module outputs (no parameter gradients).
        """
        if self._recording:
            raise RuntimeError("call compute() after leaving the record() block")
        if num_groups < 0:
            raise ValueError(f"num_groups must be >= 0, got {num_groups}")
        self._num_groups = num_groups
        sq = torch.zeros(num_groups, dtype=torch.float64)
        calls = [(layer, call) for layer in self._layers for call in layer.calls]
        if num_groups == 0:
            return sq
        self._check_unrecorded(loss_sum)
        if not calls:
            return sq
        for layer, call in calls:
            if (call.inp._version, call.out._version) != call.versions:
                raise PluginError(
                    f"per-tuple gradients: the input or output of {layer.name} was modified in "
                    "place after its forward; the recorded tensors would be wrong"
                )
        grads = torch.autograd.grad(
            loss_sum, [c.out for _, c in calls], allow_unused=True, retain_graph=False
        )
        by_layer: dict[int, list[tuple[torch.Tensor, torch.Tensor]]] = {}
        for (layer, call), g in zip(calls, grads, strict=True):
            g = torch.zeros_like(call.out) if g is None else g
            by_layer.setdefault(id(layer), []).append((call.inp, g.detach()))
        for layer in self._layers:
            pairs = by_layer.get(id(layer))
            if pairs:
                sq += self._layer_sq_norms(layer, pairs, num_groups).double()
            layer.calls.clear()
        return sq.clamp(min=0).sqrt().to(torch.float32)  # ghost sums may round below 0

    def _check_unrecorded(self, loss_sum: torch.Tensor) -> None:
        """Refuse trainable parameters that reach the loss without their module's forward."""
        silent = [
            (layer.name, p)
            for layer in self._layers
            if not layer.calls
            for p in _trainable(layer.module).values()
        ]
        if not silent:
            return
        grads = torch.autograd.grad(
            loss_sum, [p for _, p in silent], allow_unused=True, retain_graph=True
        )
        for (name, _), g in zip(silent, grads, strict=True):
            if g is not None and bool(g.ne(0).any()):
                raise PluginError(
                    f"per-tuple gradients: parameters of {name} reach the loss without a call to "
                    "its forward (functional use or weight tying), so they cannot be tracked"
                )

    def _layer_sq_norms(
        self, layer: _Layer, pairs: list[tuple[torch.Tensor, torch.Tensor]], b: int
    ) -> torch.Tensor:
        params = _trainable(layer.module)
        module = layer.module
        if isinstance(module, nn.Embedding):
            idx = torch.cat([_group(x.unsqueeze(-1), b, layer.name) for x, _ in pairs], 1)[..., 0]
            g = torch.cat([_group(g, b, layer.name) for _, g in pairs], 1)
            if module.padding_idx is not None:
                g = g * (idx != module.padding_idx).unsqueeze(-1).to(g.dtype)
            layer.ghost = (idx, g)
            same = (idx.unsqueeze(2) == idx.unsqueeze(1)).to(g.dtype)
            return (same * torch.bmm(g, g.transpose(1, 2))).sum((1, 2))
        a = torch.cat([_group(x, b, layer.name) for x, _ in pairs], 1)
        g = torch.cat([_group(g, b, layer.name) for _, g in pairs], 1)
        sq = torch.zeros(b, dtype=g.dtype)
        if "bias" in params:
            gb = g.sum(1)
            layer.per_tuple["bias"] = gb
            sq = sq + gb.pow(2).sum(1)
        if "weight" in params:
            length, d, p = a.shape[1], a.shape[2], g.shape[2]
            use_ghost = self.mode == "ghost" or (self.mode == "auto" and length * (d + p) < d * p)
            if use_ghost:
                layer.ghost = (a, g)
                sq = sq + (torch.bmm(a, a.transpose(1, 2)) * torch.bmm(g, g.transpose(1, 2))).sum((1, 2))
            else:
                gw = torch.bmm(g.transpose(1, 2), a)
                layer.per_tuple["weight"] = gw
                sq = sq + gw.pow(2).sum((1, 2))
        return sq

    # ---------------------------------------------------------------------------------------
    # weighted (clipped) sum
    # ---------------------------------------------------------------------------------------

    def accumulate(self, factors: torch.Tensor) -> None:
        """Set ``p.grad = Σᵢ factorsᵢ·g(Eᵢ)`` for every trainable parameter (overwrites).

        Parameters that received no gradient this step get zeros, so noise can be added to
        every released coordinate.
        """
        b = self._num_groups
        if b is None:
            raise RuntimeError("call compute() before accumulate()")
        factors = torch.as_tensor(factors).reshape(-1)
        if factors.numel() != b:
            raise ValueError(f"expected {b} factors, got {factors.numel()}")
        for layer in self._layers:
            params = _trainable(layer.module)
            for name, p in params.items():
                grad = torch.zeros_like(p)
                f = factors.to(p.dtype)
                if name in layer.per_tuple:
                    grad += torch.tensordot(f, layer.per_tuple[name], dims=1)
                elif layer.ghost is not None and name == "weight":
                    a, g = layer.ghost
                    gf = (g * f.view(-1, 1, 1)).reshape(-1, g.shape[-1])
                    if isinstance(layer.module, nn.Embedding):
                        grad.index_add_(0, a.reshape(-1), gf)
                    else:
                        grad += gf.t() @ a.reshape(-1, a.shape[-1])
                p.grad = grad
            layer.per_tuple.clear()
            layer.ghost = None
        self._num_groups = None


def _trainable(module: nn.Module) -> dict[str, nn.Parameter]:
    return {n: p for n, p in module.named_parameters(recurse=False) if p.requires_grad}


def _check_supported(name: str, module: nn.Module, own: list[str]) -> None:
    kind = type(module).__name__
    if isinstance(module, nn.Linear) and set(own) <= {"weight", "bias"}:
        return
    if isinstance(module, nn.Embedding) and own == ["weight"]:
        if module.scale_grad_by_freq:
            raise PluginError(
                f"per-tuple gradients: embedding {name!r} uses scale_grad_by_freq, which couples "
                "tuples through batch token counts; disable it or freeze the embedding"
            )
        return
    raise PluginError(
        f"per-tuple gradients: module {name!r} ({kind}) owns trainable parameters {own}, but only "
        "nn.Linear (weight, bias) and nn.Embedding (weight) are supported; freeze it "
        "(requires_grad=False) or restrict LoRA/target modules to linear layers"
    )


def _group(t: torch.Tensor, b: int, name: str) -> torch.Tensor:
    """``(N, ..., f)`` → ``(b, L, f)``: tuple i owns rows ``[i·s, (i+1)·s)``, ``s = N / b``."""
    n = t.shape[0]
    if n % b:
        raise ValueError(f"{name}: {n} sequences on dim 0 cannot be split into {b} equal tuples")
    return t.reshape(b, -1, t.shape[-1])
