"""Per-example gradient samplers: one per layer type, found through a registry.

A grad sampler computes, for the trainable parameters ONE module owns directly, the per-example
gradients (or their norms and the weighted sum ``Σᵢ fᵢ gᵢ``) from what the module's forward
recorded and the gradient of its output — the shape of Opacus' ``grad_sample/`` package, with
the ghost-norm / book-keeping choice of paper 2, Sec. 3.3 for linear layers. Built-ins:

=====================================  ============================  ===========================
module type                            parameters                    file
=====================================  ============================  ===========================
``torch.nn.Linear`` (peft LoRA A/B)    weight, bias                  :mod:`.linear`
``torch.nn.Embedding``                 weight                        :mod:`.embedding`
``torch.nn.LayerNorm``                 weight, bias                  :mod:`.layer_norm`
``torch_geometric...Linear``           weight, bias                  :mod:`.pyg_linear`
``GCNConv``, ``ResGatedGraphConv``     ``bias`` added to the output  :mod:`.module_bias`
=====================================  ============================  ===========================

and :mod:`.functorch`, the ``torch.func`` fallback for any other module (opt-in only).

A plugin adds a layer type with the decorator::

    from graphveil.engine.grad_samplers import GradSampler, register

    @register(MyLayer)              # or a dotted name: register("pkg.module.MyLayer")
    class MyLayerSampler(GradSampler):
        handles = frozenset({"weight"})
        def capture(self, args, kwargs, output): ...       # what the backward needs (detached)
        def backward(self, rec, saved, grad, groups, mode): ...  # rec.add("weight", (b, *shape))

A module is matched by the most specific registered class in its MRO. Registration never
overwrites: a second sampler for the same type is an error naming both.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, ClassVar, Literal, TypeVar

import torch
from torch import nn

from graphveil.contract.errors import PluginError
from graphveil.engine.grad_samplers.groups import Blocks, Gram, Groups, Segments, make_groups

__all__ = [
    "Blocks",
    "GradSampler",
    "Groups",
    "LayerRecord",
    "Mode",
    "Segments",
    "make_groups",
    "register",
    "registered_types",
    "sampler_for",
]

Mode = Literal["auto", "ghost", "materialize"]


@dataclass
class LayerRecord:
    """What one record → compute cycle kept for one module.

    ``per_example``: materialised per-example gradients ``(b, *param.shape)``, summed over the
    module's calls. ``pairs``: per call, what the sampler defers to :meth:`GradSampler.finish`
    (ghost norm: canonical inputs and output gradients). ``ghost``: the ghost/materialise
    choice, made at the first output gradient of a step and kept for its other calls.
    """

    calls: int = 0
    ghost: bool | None = None
    per_example: dict[str, torch.Tensor] = field(default_factory=dict)
    pairs: list[tuple[torch.Tensor, torch.Tensor]] = field(default_factory=list)

    def add(self, name: str, value: torch.Tensor) -> None:
        """Add one call's per-example gradients of parameter ``name``."""
        store = self.per_example
        store[name] = store[name] + value if name in store else value

    def reset(self) -> None:
        self.calls, self.ghost = 0, None
        self.per_example.clear()
        self.pairs.clear()


class GradSampler:
    """Per-example gradients of the trainable parameters one module owns directly.

    One instance per module, built with the engine (:meth:`check` refuses what cannot be
    decomposed, before any data is read). One step:

    1. forward hook → :meth:`capture` returns what the backward needs (detached), and
       :meth:`output_tensor` the tensor whose gradient is recorded;
    2. that gradient → :meth:`backward` adds per-example gradients (``rec.add``) or defers
       (``rec.pairs``);
    3. after autograd's backward → :meth:`finish` returns per-example squared norms of what was
       deferred (ghost norm), or materialises it;
    4. :meth:`weighted` gives ``Σᵢ fᵢ gᵢ`` for parameters kept as ghost pairs (materialised ones
       are summed by the engine).

    :param name: the module's qualified name (for messages).
    :param params: the module's own trainable parameters by name.
    """

    #: Names of the module's own parameters this sampler decomposes (others are refused).
    handles: ClassVar[frozenset[str]] = frozenset()
    #: :meth:`gram` depends on its input alone, so modules of this sampler class reading the
    #: same input in one step share its Gram matrix (equal blocks; :meth:`.groups.Blocks.ghost_sq`).
    shared_gram: ClassVar[bool] = False

    def __init__(self, name: str, module: nn.Module, params: dict[str, nn.Parameter]) -> None:
        self.name, self.module, self.params = name, module, params
        self.check()

    @property
    def kind(self) -> str:
        return type(self.module).__name__

    def check(self) -> None:
        """Refuse (:class:`PluginError`) a configuration this sampler cannot decompose."""
        extra = sorted(set(self.params) - self.handles)
        if extra:
            raise PluginError(
                f"per-tuple gradients: module {self.name!r} ({self.kind}) owns trainable "
                f"parameters {extra}, but {type(self).__name__} handles only "
                f"{sorted(self.handles)}; freeze them (requires_grad=False)"
            )

    def input_tensor(self, args: tuple, kwargs: dict[str, Any]) -> torch.Tensor:
        """The module's one tensor input (positional, or the only keyword argument)."""
        if args and isinstance(args[0], torch.Tensor):
            return args[0]
        if not args and len(kwargs) == 1 and isinstance(next(iter(kwargs.values())), torch.Tensor):
            return next(iter(kwargs.values()))
        raise PluginError(f"per-tuple gradients: {self.name} must take and return one tensor")

    def capture(self, args: tuple, kwargs: dict[str, Any], output: Any) -> Any:
        """What :meth:`backward` needs from this call, detached (default: nothing)."""
        return None

    def output_tensor(self, output: Any) -> torch.Tensor:
        """The tensor whose gradient is recorded (default: the module's output, one tensor)."""
        if not isinstance(output, torch.Tensor):
            raise PluginError(f"per-tuple gradients: {self.name} must take and return one tensor")
        return output

    def backward(self, rec: LayerRecord, saved: Any, grad: torch.Tensor, groups: Groups, mode: Mode) -> None:
        """Record one call's contribution, given the gradient of its output."""
        raise NotImplementedError

    def finish(self, rec: LayerRecord, groups: Groups) -> torch.Tensor | None:
        """After the backward: per-example squared norms (float64 ``(b,)``) of ghost parameters.

        Default: the ghost norm over ``rec.pairs`` of all calls side by side (so cross-call
        terms count), with :meth:`gram`; ``None`` if nothing was kept as ghost pairs.
        """
        if not (rec.ghost and rec.pairs):
            return None
        a, g = _cat([x for x, _ in rec.pairs]), _cat([y for _, y in rec.pairs])
        with threads_for(g.shape[1] * (g.numel() + a.numel())):  # the two L×L Gram matrices
            a, g = self.ghost_inputs(a, g)
            rec.pairs = [(a, g)]
            return groups.ghost_sq(a, g, self.gram, type(self) if self.shared_gram else None)

    def ghost_inputs(self, a: torch.Tensor, g: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Adjust the ghost pairs before use (e.g. drop an embedding's padding tokens)."""
        return a, g

    def gram(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        """Token similarities ``(R, La, Lb)`` between canonical inputs (see :data:`.groups.Gram`)."""
        raise NotImplementedError

    def weighted(
        self, rec: LayerRecord, name: str, p: nn.Parameter, factors: torch.Tensor, groups: Groups
    ) -> torch.Tensor | None:
        """``Σᵢ fᵢ gᵢ`` for a parameter kept as ghost pairs; ``None`` if nothing was kept."""
        return None


S = TypeVar("S", bound=type[GradSampler])

_REGISTRY: dict[str, type[GradSampler]] = {}


def type_name(cls: type) -> str:
    """``module.QualName`` of a class: the registry's key."""
    return f"{cls.__module__}.{cls.__qualname__}"


def register(*module_types: type[nn.Module] | str) -> Callable[[S], S]:
    """Class decorator: the sampler handles modules of these types (and their subclasses).

    A type may be given as its dotted name (``"torch_geometric.nn.dense.linear.Linear"``), so a
    heavy library is not imported just to register it; it then matches by name.

    :raises PluginError: a type already has a sampler (the message names both); nothing is
        registered then.
    """
    names = [t if isinstance(t, str) else type_name(t) for t in module_types]
    if not names:
        raise TypeError("register() needs at least one module type")

    def decorate(sampler: S) -> S:
        if not (isinstance(sampler, type) and issubclass(sampler, GradSampler)):
            raise TypeError(f"register() decorates GradSampler subclasses, got {sampler!r}")
        clashes = [f"{n} ({_REGISTRY[n].__qualname__})" for n in names if n in _REGISTRY]
        if clashes:  # validate first: all or nothing
            raise PluginError(
                f"grad sampler {sampler.__qualname__} cannot be registered: already registered "
                f"for {', '.join(clashes)}"
            )
        for n in names:
            _REGISTRY[n] = sampler
        return sampler

    return decorate


def sampler_for(module: nn.Module) -> type[GradSampler] | None:
    """The sampler of the most specific registered class in ``type(module).__mro__``, if any."""
    for cls in type(module).__mro__:
        found = _REGISTRY.get(type_name(cls))
        if found is not None:
            return found
    return None


def registered_types() -> list[str]:
    """Dotted names of the module types with a sampler (for messages)."""
    return sorted(_REGISTRY)


#: Multiply-adds below which one thread beats a parallel region: LoRA-sized per-tuple products
#: (e.g. 32 tuples × 192 tokens × 384 × 8) run ~10x slower on 2 contended threads than on one.
_SMALL_WORK = 1 << 26


@contextmanager
def threads_for(work: int) -> Iterator[None]:
    """Run small per-example linear algebra on one intra-op thread (restored afterwards)."""
    threads = torch.get_num_threads()
    if work >= _SMALL_WORK or threads == 1:
        yield
        return
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


def _cat(parts: list[torch.Tensor]) -> torch.Tensor:
    """Tokens of several calls of one module, side by side per row block (no copy for one call)."""
    return parts[0] if len(parts) == 1 else torch.cat(parts, 1)


# The built-in samplers register themselves on import; they need the names above.
from graphveil.engine.grad_samplers import (  # noqa: E402, F401
    embedding,
    layer_norm,
    linear,
    module_bias,
    pyg_linear,
)
from graphveil.engine.grad_samplers.functorch import FunctorchSampler  # noqa: E402

__all__ += ["FunctorchSampler", "Gram", "threads_for", "type_name"]
