"""ClientApp of the GraphVeil Flower app (``[tool.flwr.app.components] clientapp``)."""

from graphveil.connectors.flower.site import app as _client_app

app = _client_app
