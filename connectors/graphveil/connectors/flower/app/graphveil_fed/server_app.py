"""ServerApp of the GraphVeil Flower app (``[tool.flwr.app.components] serverapp``)."""

from graphveil.connectors.flower.server import app as _server_app

app = _server_app
