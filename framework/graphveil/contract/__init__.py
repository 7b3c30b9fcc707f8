"""The plugin contract: what a plugin implements and what the core checks before any data is read.

* :mod:`~graphveil.contract.hookspecs` — the hooks (families, lifecycle, commands) and
  :mod:`~graphveil.contract.host` — the plugin host that registers and builds them;
* one module per family base: :mod:`~graphveil.contract.sampler`, :mod:`~graphveil.contract.clipper`,
  :mod:`~graphveil.contract.accountant`, :mod:`~graphveil.contract.model`,
  :mod:`~graphveil.contract.mechanism`, :mod:`~graphveil.contract.method`,
  :mod:`~graphveil.contract.task`, :mod:`~graphveil.contract.data_source`;
* what the invariant compares: :mod:`~graphveil.contract.profiles`, :mod:`~graphveil.contract.units`,
  :mod:`~graphveil.contract.invariant`; component options (:mod:`~graphveil.contract.options`)
  and the errors a user can act on (:mod:`~graphveil.contract.errors`).

It imports nothing of the run, the engine, the data loaders or any plugin.
"""
