"""GraphVeil on Flower: the site ClientApp, the server ServerApp and its strategy.

* :mod:`.site` — ``app``: the ClientApp a data owner's SuperNode runs (its own graph, its own
  budget and ledger);
* :mod:`.server` — ``app``: the ServerApp (FedAvg or FedAdam over the LoRA adapters);
* :mod:`.strategy` — :class:`~.strategy.SiteRounds`, refusal- and dropout-aware rounds;
* :mod:`.settings` — the app's run config (``[tool.flwr.app.config]``, ``task.*``), a site's node
  config (:class:`~.settings.SiteSettings`) and the site's privacy policy;
* :mod:`.records` — what travels between server and sites;
* :mod:`.guard`, :mod:`.gateway` — the site's app pinning, the server's Fleet-only gateway;
* :mod:`.commands` — ``graphveil fed``, added to the command line by :mod:`.plugin` (entry point
  ``flower``); :mod:`.control` wraps Flower's tools, :mod:`.bundle` locates and hashes the app;
* :mod:`.partition` — split a graph into per-site files (demos, tests, benchmarks).

The Flower app project (``pyproject.toml`` with ``[tool.flwr.app]``) is the ``app/`` folder
next to this file (``graphveil fed app-dir`` prints it).
"""
