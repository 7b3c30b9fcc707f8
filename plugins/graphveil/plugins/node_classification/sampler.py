"""b of n examples uniformly without replacement, fresh and independent at every step.

The fixed-size sampling that the replace-one analysis of the sampled-without-replacement
Gaussian (Wang, Balle & Kasiviswanathan 2019, Thm 27; dp-accounting's
``SampledWithoutReplacementDpEvent``) assumes. The node-classification samplers draw their
examples so: ``node_uniform_wor`` (training nodes, node_dp), ``graph_splits`` (graph splits,
dp_gcn) and ``root_subgraphs`` (roots of subgraphs, gdp); each states its own unit and profile.
"""

from __future__ import annotations

from typing import Any, ClassVar

import torch

from graphveil.contract.errors import PrivacyError
from graphveil.contract.profiles import SamplingKind, SamplingProfile
from graphveil.contract.sampler import Sampler


class WithoutReplacementSampler(Sampler):
    """Base: :meth:`prepare` sets the profile (``num_records`` n, ``batch_size`` b);
    :meth:`draw` gives b distinct positions in ``0..n-1``, a uniform b-subset.

    Subclasses set ``name`` (the registered name, for messages), ``unit`` and ``Params``.
    """

    name: ClassVar[str]
    sampling_kind: ClassVar[SamplingKind] = SamplingKind.UNIFORM_WOR

    def __init__(self, params: Any = None) -> None:
        self.params = params if params is not None else self.Params()
        self._profile: SamplingProfile | None = None

    def draw(self, generator: torch.Generator) -> torch.Tensor:
        """``(b,)`` positions: randperm's first b entries, independent of every other step."""
        return torch.randperm(self.profile.num_records, generator=generator)[: self.profile.batch_size]

    @property
    def profile(self) -> SamplingProfile:
        if self._profile is None:
            raise PrivacyError(f"sampler {self.name!r} is not prepared")
        return self._profile
