"""The Fleet gateway: the only SuperLink port sites (and the network) can reach.

Flower 1.41's SuperLink serves every API from one FastAPI app on one HTTPS port
(``flwr/superlink/main.py``): the Fleet API for SuperNodes (``/v1/fleet/*``), the Control API
(``/v1/control/*``: ``flwr run``, ``flwr supernode register|unregister``, ``flwr ls`` …) and the
Runtime API the ServerApp uses (``/v1/runtime/*``). With no account plugin, the Control API
authenticates nothing; ``--control-api-address`` is deprecated and ignored. So whoever reaches
that port with the CA certificate can register nodes, unregister sites and start runs.

``graphveil fed server`` therefore binds the SuperLink to an operator-only address
(``--control-host``, default 127.0.0.1) and puts this gateway on the public address: it
terminates TLS with the SuperLink's certificate and forwards only ``POST /v1/fleet/<method>``
(headers, including SuperNode authentication signatures, and body unchanged) to the SuperLink
over TLS. Every other path gets 404 without reaching the SuperLink.
"""

from __future__ import annotations

import argparse
import contextlib
import re
import ssl
import sys

#: Fleet API methods (flwr/superlink/routers/fleet/router.py); nothing else is forwarded.
FLEET_PATH = re.compile(r"^/v1/fleet/[a-z][a-z-]{0,63}$")
#: Hop-by-hop headers a proxy must not forward (RFC 9110 §7.6.1), plus host/length (recomputed).
_DROP = {"connection", "keep-alive", "proxy-authenticate", "proxy-authorization", "te", "trailer",
         "transfer-encoding", "upgrade", "host", "content-length"}


def allowed(method: str, path: str) -> bool:
    return method == "POST" and FLEET_PATH.match(path) is not None


def create_app(upstream: str, ca_file: str):  # noqa: ANN201 - a Starlette app
    import httpx
    from starlette.applications import Starlette
    from starlette.requests import Request
    from starlette.responses import PlainTextResponse, Response
    from starlette.routing import Route

    context = ssl.create_default_context(cafile=ca_file)
    context.check_hostname = False  # upstream is the loopback/pod-local SuperLink, CA-verified
    client = httpx.AsyncClient(base_url=upstream, verify=context, timeout=httpx.Timeout(300.0))

    async def forward(request: Request) -> Response:
        if not allowed(request.method, request.url.path):
            return PlainTextResponse("not found", status_code=404)
        headers = {k: v for k, v in request.headers.items() if k.lower() not in _DROP}
        res = await client.post(request.url.path, content=await request.body(), headers=headers)
        out = {k: v for k, v in res.headers.items() if k.lower() not in _DROP | {"content-encoding"}}
        return Response(res.content, status_code=res.status_code, headers=out)

    async def refuse(request: Request) -> Response:
        return PlainTextResponse("not found", status_code=404)

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette):  # noqa: ANN202
        yield
        await client.aclose()

    return Starlette(routes=[Route("/v1/fleet/{method}", forward, methods=["POST"]),
                             Route("/{rest:path}", refuse, methods=["GET", "POST", "PUT", "DELETE", "PATCH"])],
                     lifespan=lifespan)


def main(argv: list[str] | None = None) -> int:
    import uvicorn

    parser = argparse.ArgumentParser(prog="python -m graphveil.connectors.flower.gateway",
                                     description="Forward only the Fleet API to the SuperLink.")
    parser.add_argument("--host", required=True)
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--upstream", required=True, help="https://HOST:PORT of the SuperLink")
    parser.add_argument("--ca", required=True)
    parser.add_argument("--cert", required=True)
    parser.add_argument("--key", required=True)
    parser.add_argument("--parent-pid", type=int)
    args = parser.parse_args(argv)
    if args.parent_pid is not None:
        from flwr.supercore.app_utils import start_parent_process_monitor

        start_parent_process_monitor(args.parent_pid)
    print(f"GraphVeil Fleet gateway on https://{args.host}:{args.port} -> {args.upstream} (/v1/fleet/* only)",
          flush=True)
    uvicorn.run(create_app(args.upstream, args.ca), host=args.host, port=args.port, ssl_certfile=args.cert,
                ssl_keyfile=args.key, access_log=False, log_level="warning")
    return 0


if __name__ == "__main__":
    sys.exit(main())
