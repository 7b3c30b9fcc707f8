"""Per-tuple gradient norms and the clipped sum from ONE backward pass.

Paper 2 (privately-learning-from-graphs-llm-finetuning), Sec. 3.3: for a linear layer
``s = W a`` the gradient of a tuple ``E`` (``K = 2 + k`` entities × ``M`` tokens) is
``g(E) = Σ_{i,j} r_{i,j} a_{i,j}ᵀ`` with ``r = ∂ℓ/∂s``. We record ``a`` (forward hook) and ``r``
(tensor hook on the output, during the ordinary backward), never the per-token outer products,
and per layer pick the cheaper of

* **book-keeping** (the paper's ``r aᵀ`` summed per tuple, materialised): ``G_E = R_Eᵀ A_E`` —
  cost ``L·d·p`` and memory ``d·p`` per tuple, with ``L = K·M`` tokens; computed inside the
  backward hook, so activations are released as early as in a plain backward. Always chosen
  for LoRA factors, where ``p`` or ``d`` is the rank;
* **ghost norm** (Li et al., 2021): ``‖G_E‖² = Σ_{t,t'} (a_t·a_t')(r_t·r_t')`` — cost
  ``L²(d+p)``, no ``d·p`` tensor per tuple; ``A``, ``R`` are kept for the weighted sum.

The weighted sum ``Σᵢ cᵢ g(Eᵢ)`` is then formed from the same records (no second backward):
``Σᵢ cᵢ Gᵢ`` (book-keeping) or ``(c ∘ R)ᵀ A`` (ghost). Embedding layers use the ghost identity
with ``a_t·a_t' = [idx_t = idx_t']`` and skip the padding index.

The backward is ``torch.autograd.grad(loss_sum, trainable parameters)`` — the same work as the
non-private step — and its summed gradient is checked against ``Σᵢ g(Eᵢ)`` (``verify``): a
parameter that reaches the loss other than through its module's forward (functional use,
weight tying) is refused instead of silently mis-clipped.

Only ``nn.Linear`` (weight, bias; including peft's ``lora_A``/``lora_B``) and ``nn.Embedding``
(weight) may own trainable parameters; anything else is refused naming the module.

Grouping: every recorded activation has the sequence (entity occurrence) index on dim 0, and
in each module call tuple ``i`` owns the consecutive rows ``[i·s, (i+1)·s)`` with
``s = N / num_groups`` (so one call over all ``b·(2+k)`` occurrences, tuple-major, or e.g. one
call for the positives and one for the negatives, each tuple-major, both work).
The decomposition is exact only if sequences never mix along dim 0 (no batch norm, no
cross-sequence attention) and each tuple's loss depends only on its own sequences.

Usage::

    engine = PerTupleGrad(encoder)
    with engine.record(num_groups=b):
        emb = encoder.embed(ids)            # ids: b·(2+k) occurrences, tuple-major
    losses = tuple_losses(emb.view(b, 2 + k, -1), ...)
    norms = engine.compute(losses.sum())    # (b,)
    engine.accumulate(factors)              # p.grad = Σᵢ factorsᵢ·g(Eᵢ)
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
class _Layer:
    """A module owning trainable parameters and what one step recorded for it."""

    name: str
    module: nn.Module
    params: dict[str, nn.Parameter]
    calls: int = 0
    ghost: bool | None = None  # decided at the first output gradient of a step
    # book-keeping: per-tuple gradients (b, *shape); ghost: (activations, output grads) per call
    per_tuple: dict[str, torch.Tensor] = field(default_factory=dict)
    pairs: list[tuple[torch.Tensor, torch.Tensor]] = field(default_factory=list)

    def reset(self) -> None:
        self.calls, self.ghost = 0, None
        self.per_tuple.clear()
        self.pairs.clear()


class PerTupleGrad:
    """Per-tuple gradient norms and clipped sums for every trainable parameter of ``model``.

    :param model: the module whose trainable parameters (``requires_grad``) are differentiated.
    :param mode: ``"auto"`` picks per layer the cheaper of ghost norm and materialised
        per-tuple gradients; ``"ghost"`` / ``"materialize"`` force one (tests, benchmarks).
    :param verify: check ``Σᵢ g(Eᵢ)`` against autograd's summed gradient (costs one extra
        matrix product per ghost linear layer; nothing noticeable for LoRA).
    :raises PluginError: a module other than ``nn.Linear``/``nn.Embedding`` owns trainable
        parameters, or an embedding uses ``scale_grad_by_freq`` (not decomposable per tuple).
    """

    def __init__(self, model: nn.Module, *, mode: Mode = "auto", verify: bool = True) -> None:
        if mode not in ("auto", "ghost", "materialize"):
            raise ValueError(f"mode must be auto, ghost or materialize, got {mode!r}")
        self.mode, self.verify = mode, verify
        self._layers: list[_Layer] = []
        for name, module in model.named_modules():
            own = {n: p for n, p in module.named_parameters(recurse=False) if p.requires_grad}
            if own:
                _check_supported(name, module, list(own))
                self._layers.append(_Layer(name or type(model).__name__, module, own))
        self._num_groups: int | None = None
        self._state = "idle"  # idle → recording → recorded → computed → idle

    @property
    def parameters(self) -> list[nn.Parameter]:
        """The trainable parameters handled, in module order."""
        return [p for layer in self._layers for p in layer.params.values()]

    # ---------------------------------------------------------------------------------------
    # forward: record inputs, hook outputs
    # ---------------------------------------------------------------------------------------

    @contextmanager
    def record(self, num_groups: int) -> Iterator[PerTupleGrad]:
        """Record the forward pass inside; dim 0 of every activation splits into ``num_groups``."""
        if num_groups < 0:
            raise ValueError(f"num_groups must be >= 0, got {num_groups}")
        for layer in self._layers:
            layer.reset()
        self._num_groups = num_groups
        handles = [layer.module.register_forward_hook(self._forward_hook(layer)) for layer in self._layers]
        self._state = "recording"
        try:
            yield self
        finally:
            self._state = "recorded"
            for handle in handles:
                handle.remove()

    def _forward_hook(self, layer: _Layer):
        def hook(module: nn.Module, args: tuple, output: torch.Tensor) -> None:
            if not torch.is_grad_enabled():
                return
            if not isinstance(output, torch.Tensor) or not args or not isinstance(args[0], torch.Tensor):
                raise PluginError(f"per-tuple gradients: {layer.name} must take and return one tensor")
            inp = args[0].detach()
            if not isinstance(module, nn.Embedding) and inp.dim() < 2:
                raise PluginError(f"per-tuple gradients: {layer.name} got an input without a batch dim")
            layer.calls += 1
            if output.requires_grad:
                output.register_hook(lambda g: self._backward_hook(layer, inp, g))

        return hook

    def _backward_hook(self, layer: _Layer, inp: torch.Tensor, grad: torch.Tensor) -> None:
        if self._state != "computing":
            return  # a backward that is not ours (e.g. a test's reference gradient)
        b = self._num_groups
        assert b is not None
        g = _group(grad.detach(), b, layer.name)
        if isinstance(layer.module, nn.Embedding):
            layer.ghost = True
            layer.pairs.append((_group(inp.unsqueeze(-1), b, layer.name)[..., 0], g))
            return
        a = _group(inp, b, layer.name)
        with _threads_for(g.numel() * a.shape[-1]):
            if "bias" in layer.params:
                _add(layer.per_tuple, "bias", g.sum(1))
            if "weight" in layer.params:
                if layer.ghost is None:
                    length, d, p = a.shape[1], a.shape[2], g.shape[2]
                    layer.ghost = self.mode == "ghost" or (self.mode == "auto" and length * (d + p) < d * p)
                if layer.ghost:
                    layer.pairs.append((a, g))
                else:
                    _add(layer.per_tuple, "weight", torch.bmm(g.transpose(1, 2), a))

    # ---------------------------------------------------------------------------------------
    # backward: per-tuple norms
    # ---------------------------------------------------------------------------------------

    def compute(self, loss_sum: torch.Tensor) -> torch.Tensor:
        """Per-tuple gradient norms ``‖g(Eᵢ)‖₂`` (shape ``(num_groups,)``) of ``loss_sum = Σᵢ ℓᵢ``."""
        if self._state != "recorded":
            raise RuntimeError("call compute() once, after leaving the record() block")
        b = self._num_groups
        assert b is not None
        sq = torch.zeros(b, dtype=torch.float64)
        params = self.parameters
        summed: list[torch.Tensor | None] = [None] * len(params)
        self._state = "computing"
        try:
            if b and loss_sum.requires_grad:
                summed = list(torch.autograd.grad(loss_sum, params, allow_unused=True))
        except BaseException:
            for layer in self._layers:
                layer.reset()
            self._state = "idle"
            raise
        self._state = "computed"
        flat: list[torch.Tensor] = []
        for layer in self._layers:
            if layer.ghost and layer.pairs:
                a, g = _cat([x for x, _ in layer.pairs]), _cat([y for _, y in layer.pairs])
                with _threads_for(g.shape[1] * (g.numel() + a.numel())):  # the two L×L Gram matrices
                    if isinstance(layer.module, nn.Embedding):
                        if layer.module.padding_idx is not None:
                            g = g * (a != layer.module.padding_idx).unsqueeze(-1).to(g.dtype)
                        gram_a = (a.unsqueeze(2) == a.unsqueeze(1)).to(g.dtype)
                    else:
                        gram_a = torch.bmm(a, a.transpose(1, 2))
                    layer.pairs = [(a, g)]
                    sq += (gram_a * torch.bmm(g, g.transpose(1, 2))).sum((1, 2)).double()
            flat.extend(t.flatten(1) for t in layer.per_tuple.values())
        with _threads_for(b * sum(p.numel() for p in params)):
            if flat:  # few large ops rather than many small ones
                sq += torch.cat(flat, 1).double().pow(2).sum(1)
            if self.verify and b:
                self._verify(dict(zip(map(id, params), summed, strict=True)))
        return sq.clamp(min=0).sqrt().to(torch.float32)  # ghost sums may round below 0

    def _verify(self, summed: dict[int, torch.Tensor | None]) -> None:
        """Σᵢ g(Eᵢ) must equal autograd's gradient of the summed loss, parameter by parameter."""
        ones = torch.ones(self._num_groups or 0)
        names, got, want = [], [], []
        for layer in self._layers:
            for name, p in layer.params.items():
                names.append(f"{layer.name}.{name}")
                got.append(self._weighted(layer, name, p, ones).flatten())
                w = summed[id(p)]
                want.append(torch.zeros(p.numel(), dtype=p.dtype) if w is None else w.flatten())
        lengths = torch.tensor([t.numel() for t in got])
        got_all, want_all = torch.cat(got), torch.cat(want)

        def seg_max(x: torch.Tensor) -> torch.Tensor:
            return torch.segment_reduce(x, "max", lengths=lengths, initial=0.0)

        err = seg_max((got_all - want_all).abs())
        scale = seg_max(got_all.abs()) + seg_max(want_all.abs())
        bad = (err > 1e-3 * scale + 1e-12).nonzero().flatten().tolist()
        if bad:
            raise PluginError(
                f"per-tuple gradients: {names[bad[0]]} reaches the loss other than through its "
                "module's forward (functional use or weight tying), so its per-tuple gradients "
                "cannot be tracked"
            )

    # ---------------------------------------------------------------------------------------
    # weighted (clipped) sum
    # ---------------------------------------------------------------------------------------

    def accumulate(self, factors: torch.Tensor) -> None:
        """Set ``p.grad = Σᵢ factorsᵢ·g(Eᵢ)`` for every trainable parameter (overwrites).

        Parameters that received no gradient this step get zeros, so noise can be added to
        every released coordinate.
        """
        if self._state != "computed":
            raise RuntimeError("call compute() before accumulate()")
        factors = torch.as_tensor(factors).reshape(-1)
        if factors.numel() != self._num_groups:
            raise ValueError(f"expected {self._num_groups} factors, got {factors.numel()}")
        with _threads_for(factors.numel() * sum(p.numel() for p in self.parameters)):
            for layer in self._layers:
                for name, p in layer.params.items():
                    p.grad = self._weighted(layer, name, p, factors)
                layer.reset()
        self._num_groups, self._state = None, "idle"

    def _weighted(self, layer: _Layer, name: str, p: nn.Parameter, factors: torch.Tensor) -> torch.Tensor:
        f = factors.to(p.dtype)
        if name in layer.per_tuple:
            return torch.tensordot(f, layer.per_tuple[name], dims=1)
        if name == "weight" and layer.ghost and layer.pairs:
            ((a, g),) = layer.pairs
            gf = (g * f.view(-1, 1, 1)).reshape(-1, g.shape[-1])
            if isinstance(layer.module, nn.Embedding):
                return torch.zeros_like(p).index_add_(0, a.reshape(-1), gf)
            return gf.t() @ a.reshape(-1, a.shape[-1])
        return torch.zeros_like(p)


#: Multiply-adds below which one thread beats a parallel region: LoRA-sized per-tuple products
#: (e.g. 32 tuples × 192 tokens × 384 × 8) run ~10x slower on 2 contended threads than on one.
_SMALL_WORK = 1 << 26


@contextmanager
def _threads_for(work: int) -> Iterator[None]:
    """Run small per-tuple linear algebra on one intra-op thread (restored afterwards)."""
    threads = torch.get_num_threads()
    if work >= _SMALL_WORK or threads == 1:
        yield
        return
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


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
    if b == 0 or n % b:
        raise ValueError(f"{name}: {n} sequences on dim 0 cannot be split into {b} equal tuples")
    return t.reshape(b, -1, t.shape[-1])


def _cat(parts: list[torch.Tensor]) -> torch.Tensor:
    """Tokens of several calls of one module, side by side per tuple (no copy for one call)."""
    return parts[0] if len(parts) == 1 else torch.cat(parts, 1)


def _add(store: dict[str, torch.Tensor], key: str, value: torch.Tensor) -> None:
    store[key] = store[key] + value if key in store else value
