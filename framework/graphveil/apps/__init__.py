"""Applications built on the core: the ``graphveil`` command line and the demo.

The core (hook specs, host, components, session, engine, privacy, data) knows nothing of these
modules; they use its public API only. Connectors add their own commands through the
``graphveil_add_commands`` hook, so nothing here imports a connector.

* :mod:`.cli` — ``graphveil``: parses, dispatches, turns user errors into exit code 2;
* :mod:`.cli_privacy` — ``graphveil privacy``: ε or σ of a planned run, no data touched;
* :mod:`.cli_budget` — ``graphveil budget``: a site's privacy ledger;
* :mod:`.demo` — ``graphveil demo``: the paper comparison on the bundled CiteSeer graph.
"""
