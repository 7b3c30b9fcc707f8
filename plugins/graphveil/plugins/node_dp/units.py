"""The privacy units of node-level DP-SGD on row-wise models (paper 4's GDP levels)."""

from graphveil.contract.units import Adjacency, PrivacyUnit, UnitKind

#: Paper 4's node-level GDP: neighbouring datasets replace one node; predictions are released.
NODE_GDP = PrivacyUnit(UnitKind.NODE, Adjacency.REPLACEMENT, protects_predictions=True)

#: GDP unit kinds (replacement adjacency, predictions covered) under which per-node DP-SGD on a
#: model whose example i reads row i alone (node i's features, label and released row) changes at
#: most one example: node and k-neighbor replace node r's own row (edges reach no example of
#: such a model), an edge or undirected edge changes no example at all (the per-node bound is
#: then conservative).
_ROW_WISE_GDP = frozenset({UnitKind.NODE, UnitKind.K_NEIGHBOR, UnitKind.EDGE, UnitKind.UNDIRECTED_EDGE})


def row_wise_gdp(unit: PrivacyUnit) -> bool:
    """Whether per-node (replace-one, 2C) DP-SGD analysis holds for ``unit`` (see :data:`_ROW_WISE_GDP`)."""
    return (unit.kind in _ROW_WISE_GDP and unit.adjacency is Adjacency.REPLACEMENT
            and unit.protects_predictions)


class RowWiseGdpUnits:
    """Mixin for node_dp's sampler, clipper and accountant: they accept every GDP level of
    :func:`row_wise_gdp`. The accountant also declares ``structures = {ROWS}``, so a model whose
    examples read neighbours (GraphSAGE, GCN) is refused with these components."""

    @classmethod
    def accepts_unit(cls, unit: PrivacyUnit) -> bool:
        return row_wise_gdp(unit)
