"""The privacy unit of DP-MLP: a node (features, label, edges) replaced, predictions covered."""

from graphveil.units import Adjacency, PrivacyUnit, UnitKind

#: Paper 4's node-level GDP: neighbouring datasets replace one node; predictions are released.
NODE_GDP = PrivacyUnit(UnitKind.NODE, Adjacency.REPLACEMENT, protects_predictions=True)
