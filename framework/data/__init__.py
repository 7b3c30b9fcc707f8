"""Relational graphs: the data model, loaders, validation and the transfer split."""

from graphveil.data.graph import RelationalGraph

__all__ = ["RelationalGraph"]
