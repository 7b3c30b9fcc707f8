"""What the node-classification methods share (node_dp's DP-MLP, dp_gcn, gdp's GAP, DPDGC,
RandEdge+SAGE and DP-SAGE): the node task, the without-replacement sampler base and the models on
one layer-stack base.

A library package, not a plugin: it registers nothing. The methods' plugins register its
components under their own names (``node_dp``: task ``node_classification``, models ``mlp`` and
``sage``), so configs name them as before.

* :mod:`.task` — :class:`~.task.NodeClassification`, the base of ``split_node_classification``
  (dp_gcn) and ``rooted_node_classification`` (gdp);
* :mod:`.sampler` — :class:`~.sampler.WithoutReplacementSampler`, b of n examples uniformly
  without replacement, fresh at every step (``node_uniform_wor``, ``graph_splits``,
  ``root_subgraphs``);
* :mod:`.layers` — :class:`~.layers.LayerStack`, the base of ``mlp``, ``sage``, ``gcn`` and
  ``sage_full``; :mod:`.mlp` and :mod:`.sage` — the two models every GNN method may train.
"""
