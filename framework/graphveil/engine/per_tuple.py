"""Per-tuple (per-example) gradient norms and the clipped sum from ONE backward pass.

Paper 2 (privately-learning-from-graphs-llm-finetuning), Sec. 3.3: the gradient of an example
is a sum over its tokens of per-layer terms that forward hooks (inputs) and the output
gradients of the ordinary backward determine, so per-example norms and ``Σᵢ cᵢ g(Eᵢ)`` need no
per-token (or, for ghost layers, per-example) gradient tensors. Per layer type a **grad
sampler** does the work (:mod:`graphveil.engine.grad_samplers`: ``nn.Linear`` incl. LoRA
factors with ghost norm / book-keeping, ``nn.Embedding``, ``nn.LayerNorm``, PyG's ``Linear``, a
module-owned output bias as in PyG's ``GCNConv``; plugins register more). A module owning
trainable parameters without a sampler is refused naming it — unless the caller or the model
opts in to the ``torch.func`` fallback (``fallback="functorch"``; small models only).

The backward is ``torch.autograd.grad`` of ``loss_sum`` with respect to the OUTPUTS of the
recorded modules (their :class:`~torch.autograd.graph.GradientEdge` at the time of the call),
not the parameters: autograd then runs only the input-gradient half of every layer's backward
and never forms the summed weight gradients, which the engine would discard (Bu et al. 2023,
"Differentially private optimization on large model at small cost", book-keeping: one
backward for output gradients; the clipped sum is then one matrix product per layer from the
records, in place of autograd's weight-gradient product). Because autograd then no longer
reads a layer's saved input, the engine checks itself that no recorded input was changed in
place between the forward and the backward (autograd's own check, which it would skip).
On the first step (``verify``) the parameters are differentiated too and their summed gradient
is checked against ``Σᵢ g(Eᵢ)``: a parameter that reaches the loss other than through its
module's forward (functional use, weight tying) is refused instead of silently mis-clipped.

Grouping: every recorded activation has rows on dim 0, and either

* ``record(num_groups=b)``: in each module call example ``i`` owns the consecutive rows
  ``[i·s, (i+1)·s)`` with ``s = N / b`` (one call over all ``b·(2+k)`` occurrences, tuple-major,
  or one call for positives and one for negatives, each tuple-major, both work); or
* ``record(groups=index)``: ``index[r]`` is the example of row ``r`` of every call (examples own
  different numbers of rows: subgraph batches, PyG's ``batch`` vector); per-example sums are
  segment sums.

The decomposition is exact only if rows of different examples never mix (no batch norm — refused
when the engine is built —, no cross-example attention or message passing) and each example's
loss depends only on its own rows.

Usage::

    engine = PerTupleGrad(encoder)
    with engine.record(num_groups=b):
        emb = encoder.embed(ids)            # ids: b·(2+k) occurrences, tuple-major
    losses = tuple_losses(emb.view(b, 2 + k, -1), ...)
    norms = engine.compute(losses.sum())    # (b,)
    engine.accumulate(factors)              # p.grad = Σᵢ factorsᵢ·g(Eᵢ)

Micro-batches (:func:`graphveil.engine.dp_step.dp_step`): after each micro-batch's ``compute``,
``pop_records()`` takes its records out of the engine; once factors are known for the whole
batch, ``accumulate(f_m, records=rec_m, add=True)`` adds each micro-batch's weighted sum.

Devices and dtypes: records stay on the parameters' device; norms are float32 (float64 if a
parameter is float64), accumulated in float64 on that device.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Literal

import torch
from torch import nn
from torch.autograd.graph import GradientEdge, get_gradient_edge

from graphveil.contract.errors import PluginError
from graphveil.engine.grad_samplers import (
    FunctorchSampler,
    GradSampler,
    LayerRecord,
    Mode,
    make_groups,
    registered_types,
    sampler_for,
    threads_for,
)
from graphveil.engine.grad_samplers.groups import Groups

Fallback = Literal["refuse", "functorch"]

__all__ = ["Fallback", "Mode", "PerTupleGrad", "Records"]


@dataclass
class Records:
    """What one record → compute cycle kept: its grouping and each layer's records."""

    groups: Groups
    layers: list[LayerRecord]

    @property
    def num_examples(self) -> int:
        return self.groups.num


@dataclass
class _Layer:
    """A module owning trainable parameters and the sampler that decomposes them."""

    name: str
    module: nn.Module
    params: dict[str, nn.Parameter]
    sampler: GradSampler


class PerTupleGrad:
    """Per-tuple gradient norms and clipped sums for every trainable parameter of ``model``.

    :param model: the module whose trainable parameters (``requires_grad``) are differentiated.
    :param mode: ``"auto"`` picks per layer the cheaper of ghost norm and materialised
        per-tuple gradients; ``"ghost"`` / ``"materialize"`` force one (tests, benchmarks).
    :param verify: check ``Σᵢ g(Eᵢ)`` against autograd's summed gradient (the backward then
        also forms the summed weight gradients, plus one matrix product per ghost linear
        layer; :func:`~graphveil.engine.dp_step.dp_step` verifies the first step only).
    :param fallback: for modules with no registered grad sampler: ``"refuse"`` (an error naming
        the module) or ``"functorch"`` (per-example ``torch.func.vmap(grad(...))`` of the module,
        for small models). ``None`` (default): the model's ``per_example_fallback`` attribute if
        it sets one, else ``"refuse"``.
    :raises PluginError: batch norm anywhere in ``model``; a module owning trainable parameters
        that no sampler handles (and no fallback); an uninitialised lazy parameter; a sampler's
        own refusal (e.g. an embedding with ``scale_grad_by_freq``).
    """

    def __init__(
        self, model: nn.Module, *, mode: Mode = "auto", verify: bool = True, fallback: Fallback | None = None
    ) -> None:
        if mode not in ("auto", "ghost", "materialize"):
            raise ValueError(f"mode must be auto, ghost or materialize, got {mode!r}")
        if fallback is None:
            fallback = getattr(model, "per_example_fallback", "refuse")
        if fallback not in ("refuse", "functorch"):
            raise ValueError(f"fallback must be 'refuse' or 'functorch', got {fallback!r}")
        self.mode, self.verify, self.fallback = mode, verify, fallback
        _refuse_batch_norm(model)
        self._layers: list[_Layer] = []
        for name, module in model.named_modules():
            own = {n: p for n, p in module.named_parameters(recurse=False) if p.requires_grad}
            if own:
                label = name or type(model).__name__
                self._layers.append(_Layer(label, module, own, _sampler(label, module, own, fallback)))
        params = self.parameters
        self._device = params[0].device if params else torch.device("cpu")
        self._norm_dtype = torch.float64 if any(p.dtype == torch.float64 for p in params) else torch.float32
        self._step: Records | None = None
        #: the recorded outputs' gradient edges: what the backward differentiates (module note)
        self._edges: list[GradientEdge] = []
        self._state = "idle"  # idle → recording → recorded → computing → computed → idle

    @property
    def parameters(self) -> list[nn.Parameter]:
        """The trainable parameters handled, in module order."""
        return [p for layer in self._layers for p in layer.params.values()]

    # ---------------------------------------------------------------------------------------
    # forward: record inputs, hook outputs
    # ---------------------------------------------------------------------------------------

    @contextmanager
    def record(
        self, num_groups: int | None = None, *, groups: torch.Tensor | None = None
    ) -> Iterator[PerTupleGrad]:
        """Record the forward pass inside, grouping rows (dim 0) into examples.

        :param num_groups: the number of examples ``b``; alone, every call's rows split into
            ``b`` equal consecutive blocks.
        :param groups: a ``(rows,)`` integer tensor, ``groups[r]`` the example of row ``r`` of
            every call (values in ``[0, num_groups)``; ``num_groups`` defaults to its max + 1).
        """
        grouping = make_groups(num_groups, groups)
        step = Records(grouping, [LayerRecord() for _ in self._layers])
        self._step, self._edges = step, []
        handles = [
            layer.module.register_forward_hook(self._forward_hook(layer, rec, step), with_kwargs=True)
            for layer, rec in zip(self._layers, step.layers, strict=True)
        ]
        self._state = "recording"
        try:
            yield self
        finally:
            self._state = "recorded"
            for handle in handles:
                handle.remove()

    def _forward_hook(self, layer: _Layer, rec: LayerRecord, step: Records):
        def hook(module: nn.Module, args: tuple, kwargs: dict[str, Any], output: Any) -> None:
            if not torch.is_grad_enabled():
                return
            saved = layer.sampler.capture(args, kwargs, output)
            out = layer.sampler.output_tensor(output)
            rec.calls += 1
            if out.requires_grad:
                versions = _versions(saved)
                out.register_hook(lambda g: self._backward_hook(layer, rec, step, saved, versions, g))
                self._edges.append(get_gradient_edge(out))

        return hook

    def _backward_hook(self, layer: _Layer, rec: LayerRecord, step: Records, saved: Any, versions: list[int],
                       grad: torch.Tensor) -> None:
        if self._state != "computing" or step is not self._step:
            return  # a backward that is not ours (e.g. a test's reference gradient)
        if _versions(saved) != versions:
            raise PluginError(
                f"per-tuple gradients: an input of {layer.name} ({type(layer.module).__name__}) was "
                "modified in place after the module's forward, so its recorded value is not the "
                "one the output was computed from; clone it before the in-place operation"
            )
        layer.sampler.backward(rec, saved, grad.detach(), step.groups, self.mode)

    # ---------------------------------------------------------------------------------------
    # backward: per-tuple norms
    # ---------------------------------------------------------------------------------------

    def compute(self, loss_sum: torch.Tensor) -> torch.Tensor:
        """Per-tuple gradient norms ``‖g(Eᵢ)‖₂`` (shape ``(num_groups,)``) of ``loss_sum = Σᵢ ℓᵢ``."""
        if self._state != "recorded" or self._step is None:
            raise RuntimeError("call compute() once, after leaving the record() block")
        step = self._step
        b = step.groups.num
        sq = torch.zeros(b, dtype=torch.float64, device=self._device)
        params = self.parameters
        summed: list[torch.Tensor | None] = [None] * len(params)
        self._state = "computing"
        try:
            # Output gradients only (module note); the parameters too when verifying.
            wanted = [*params, *self._edges] if self.verify else self._edges
            if b and loss_sum.requires_grad and wanted:
                grads = torch.autograd.grad(loss_sum, wanted, allow_unused=True)
                if self.verify:
                    summed = list(grads[: len(params)])
                del grads  # the captured output gradients: the hooks kept what they need
            flat: list[torch.Tensor] = []
            for layer, rec in zip(self._layers, step.layers, strict=True):
                ghost = layer.sampler.finish(rec, step.groups)
                if ghost is not None:
                    sq += ghost.to(sq.device)
                flat.extend(t.flatten(1).to(sq.device) for t in rec.per_example.values())
            step.groups.release()
            with threads_for(b * sum(p.numel() for p in params)):
                if flat:  # few large ops rather than many small ones
                    sq += torch.cat(flat, 1).double().pow(2).sum(1)
                if self.verify and b:
                    self._verify(step, dict(zip(map(id, params), summed, strict=True)))
        except BaseException:
            self._step, self._state = None, "idle"  # nothing half-done survives a failure
            raise
        finally:
            self._edges = []  # they hold the autograd graph
        self._state = "computed"
        return sq.clamp(min=0).sqrt().to(self._norm_dtype)  # ghost sums may round below 0

    def _verify(self, step: Records, summed: dict[int, torch.Tensor | None]) -> None:
        """Σᵢ g(Eᵢ) must equal autograd's gradient of the summed loss, parameter by parameter."""
        ones = torch.ones(step.groups.num, device=self._device)
        names, got, want = [], [], []
        for layer, rec in zip(self._layers, step.layers, strict=True):
            for name, p in layer.params.items():
                names.append(f"{layer.name}.{name}")
                got.append(self._weighted(layer, rec, step.groups, name, p, ones).flatten())
                w = summed[id(p)]
                want.append(torch.zeros(p.numel(), dtype=p.dtype, device=p.device) if w is None else w.flatten())
        got_all, want_all = torch.cat(got), torch.cat(want).to(got[0].device)
        lengths = torch.tensor([t.numel() for t in got], device=got_all.device)

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

    def pop_records(self) -> Records:
        """Take the computed step's records out of the engine (it is then ready to record again).

        For micro-batching: keep each micro-batch's records until the factors of the whole batch
        are known, then pass them to :meth:`accumulate`.
        """
        if self._state != "computed" or self._step is None:
            raise RuntimeError("call compute() before pop_records()")
        step, self._step, self._state = self._step, None, "idle"
        return step

    # ---------------------------------------------------------------------------------------
    # weighted (clipped) sum
    # ---------------------------------------------------------------------------------------

    def accumulate(self, factors: torch.Tensor, records: Records | None = None, *, add: bool = False) -> None:
        """Set ``p.grad = Σᵢ factorsᵢ·g(Eᵢ)`` for every trainable parameter (consumes the records).

        Parameters that received no gradient this step get zeros, so noise can be added to
        every released coordinate.

        :param records: records taken by :meth:`pop_records` (default: the step just computed).
        :param add: add to ``p.grad`` instead of overwriting it (micro-batches after the first).
        """
        if records is None:
            if self._state != "computed" or self._step is None:
                raise RuntimeError("call compute() before accumulate()")
            step = self._step
        else:
            step = records
        factors = torch.as_tensor(factors).reshape(-1)
        if factors.numel() != step.groups.num:
            raise ValueError(f"expected {step.groups.num} factors, got {factors.numel()}")
        with threads_for(factors.numel() * sum(p.numel() for p in self.parameters)):
            for layer, rec in zip(self._layers, step.layers, strict=True):
                for name, p in layer.params.items():
                    value = self._weighted(layer, rec, step.groups, name, p, factors)
                    p.grad = p.grad + value if add and p.grad is not None else value
                rec.reset()
        if records is None:
            self._step, self._state = None, "idle"

    def _weighted(
        self, layer: _Layer, rec: LayerRecord, groups: Groups, name: str, p: nn.Parameter, factors: torch.Tensor
    ) -> torch.Tensor:
        f = factors.to(device=p.device, dtype=p.dtype)
        if name in rec.per_example:
            return torch.tensordot(f, rec.per_example[name], dims=1)
        value = layer.sampler.weighted(rec, name, p, f, groups)
        return torch.zeros_like(p) if value is None else value


def _versions(saved: Any) -> list[int]:
    """In-place version counters of the tensors a sampler captured (a tensor or a tuple/list)."""
    items = saved if isinstance(saved, tuple | list) else (saved,)
    return [t._version for t in items if isinstance(t, torch.Tensor)]


def _refuse_batch_norm(model: nn.Module) -> None:
    """Batch norm mixes examples along dim 0 (batch statistics in train mode, running statistics
    updated from the whole batch), whether or not it is trainable: refuse it up front."""
    for name, module in model.named_modules():
        if isinstance(module, nn.modules.batchnorm._BatchNorm):
            raise PluginError(
                f"per-tuple gradients: module {name or type(model).__name__!r} "
                f"({type(module).__name__}) is batch norm, which mixes examples along dim 0 "
                "through batch statistics, so no per-example gradient exists; use LayerNorm or "
                "GroupNorm instead"
            )


def _sampler(name: str, module: nn.Module, own: dict[str, nn.Parameter], fallback: Fallback) -> GradSampler:
    lazy = [n for n, p in own.items() if nn.parameter.is_lazy(p)]
    kind = type(module).__name__
    if lazy:
        raise PluginError(
            f"per-tuple gradients: module {name!r} ({kind}) has uninitialised lazy parameters "
            f"{lazy} (e.g. torch_geometric's Linear(-1, ...) or nn.LazyLinear): run one forward "
            "pass first (it fixes their shapes), then build the optimizer and the engine"
        )
    cls = sampler_for(module)
    if cls is None:
        if fallback != "functorch":
            raise PluginError(
                f"per-tuple gradients: module {name!r} ({kind}) owns trainable parameters "
                f"{list(own)}, but no grad sampler is registered for {kind} (supported: "
                f"{', '.join(registered_types())}); freeze it (requires_grad=False), restrict "
                "LoRA/target modules to supported layers, register a sampler "
                "(graphveil.engine.grad_samplers.register), or, for a small model, opt in to the "
                "torch.func fallback (PerTupleGrad(model, fallback='functorch') or "
                "per_example_fallback = 'functorch' on the model class)"
            )
        cls = FunctorchSampler
    return cls(name, module, own)
