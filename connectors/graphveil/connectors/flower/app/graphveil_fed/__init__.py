"""Flower app entry points of GraphVeil (thin re-exports of graphveil.connectors.flower)."""
