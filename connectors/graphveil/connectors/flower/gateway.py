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

Anyone on the network reaches this port before any authentication (the SuperLink checks the
SuperNode signatures), so the gateway bounds what an unauthenticated peer can hold
(:class:`Limits`; each a flag of this module and of ``graphveil fed server``):

* a request body is at most ``max_body`` bytes: a declared ``Content-Length`` above it gets 413
  before any of the body is read, a chunked body is counted as it arrives and refused (413) at
  the limit; nothing of a refused request is forwarded. The default, 8 MiB, is 3 MiB above the
  largest request a site sends: Flower splits every array into chunks of at most 5 MiB
  (``FLWR_PRIVATE_MAX_ARRAY_CHUNK_SIZE``) pushed one per ``push-object`` request, whatever the
  model (the shipped app's default task, MiniLM + LoRA rank 8, sends at most 12.6 kB);
* the TLS handshake and the request head must arrive within ``header_timeout`` seconds of the
  connection (or of the previous response, on a kept-alive connection), the body within
  ``body_timeout`` seconds of the head (408); half-open connections are closed then;
* at most ``max_connections`` connections are open at once; one more is closed as soon as it is
  accepted, before its TLS handshake (Flower's client retries);
* bodies held at once (all connections) are at most ``max_buffered`` bytes; a request that would
  exceed it gets 503 (retried by Flower's client), so memory stays bounded under a flood.

The server is asyncio with h11 (HTTP/1.1, keep-alive; the SuperNode's client is httpx over
HTTP/1.1); the upstream call is httpx.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import re
import ssl
import sys
from collections.abc import Iterable
from dataclasses import dataclass, field
from http import HTTPStatus
from typing import Any

log = logging.getLogger(__name__)

#: Fleet API methods (flwr/superlink/routers/fleet/router.py); nothing else is forwarded.
FLEET_PATH = re.compile(r"^/v1/fleet/[a-z][a-z-]{0,63}$")
#: Hop-by-hop headers a proxy must not forward (RFC 9110 §7.6.1), plus host/length (recomputed).
_DROP = {"connection", "keep-alive", "proxy-authenticate", "proxy-authorization", "te", "trailer",
         "transfer-encoding", "upgrade", "host", "content-length"}
MIB = 1 << 20
#: Bytes read from a connection at a time, and the largest request head (line and headers).
READ_SIZE = 64 * 1024
MAX_HEAD_BYTES = 64 * 1024
#: After an error response to a request whose body was not read, the rest of the body is read
#: and dropped (at most this many bytes) and the connection held open for at most this long
#: before it is closed, so that the client sees the response rather than a reset (a
#: "lingering close").
LINGER_SECONDS = 2.0
LINGER_BYTES = MIB


def allowed(method: str, path: str) -> bool:
    return method == "POST" and FLEET_PATH.match(path) is not None


@dataclass(frozen=True)
class Limits:
    """What one peer, and all of them together, may hold of the gateway (module docstring)."""

    max_body: int = 8 * MIB
    header_timeout: float = 10.0
    body_timeout: float = 60.0
    max_connections: int = 128
    max_buffered: int = 64 * MIB

    def __post_init__(self) -> None:
        for name in ("max_body", "header_timeout", "body_timeout", "max_connections", "max_buffered"):
            if not getattr(self, name) > 0:
                raise ValueError(f"gateway limit {name} must be > 0, got {getattr(self, name)!r}")
        if self.max_buffered < self.max_body:
            raise ValueError(f"gateway limit max_buffered ({self.max_buffered}) must be >= max_body "
                             f"({self.max_body}): one request of the largest size must fit")


@dataclass
class Stats:
    """Counters of one gateway (read by the tests; refusals are logged as they accumulate)."""

    active: int = 0  # connections open now
    bytes_read: int = 0  # bytes read from clients (after TLS), including bodies dropped while lingering
    reserved: int = 0  # body bytes reserved against max_buffered now (declared lengths, max_body if chunked)
    held: int = 0  # body bytes held now, and the most held at once
    peak_held: int = 0
    forwarded: int = 0
    refused: dict[str, int] = field(default_factory=dict)  # why -> how many


def parse_bytes(text: str) -> int:
    """A size in bytes: ``8388608``, ``8MiB``, ``8M``, ``512KiB`` (K, M, G are powers of 1024).

    >>> [parse_bytes(t) for t in ("1024", "8MiB", "8M", "1.5 KiB", "1G")]
    [1024, 8388608, 8388608, 1536, 1073741824]
    """
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*(?:([KMG])(?:iB|B)?)?\s*", text, re.IGNORECASE)
    if m is None:
        raise argparse.ArgumentTypeError(f"not a size in bytes: {text!r} (e.g. 8388608, 8MiB, 512KiB)")
    return int(float(m[1]) * 1024 ** (" KMG".index(m[2].upper()) if m[2] else 0))


class _Refused(Exception):
    """Answer ``status`` (``why`` counts and names it) and close the connection."""

    def __init__(self, status: int, why: str, text: str) -> None:
        super().__init__(text)
        self.status, self.why, self.text = status, why, text


class FleetGateway:
    """The gateway's server: :meth:`start` it in a running loop, :meth:`aclose` it there."""

    def __init__(self, upstream: str, ca_file: str, cert: str, key: str, limits: Limits | None = None,
                 *, upstream_timeout: float = 300.0) -> None:
        self.upstream = upstream
        self.limits = limits or Limits()
        self.stats = Stats()
        self._tls = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        self._tls.load_cert_chain(cert, key)
        self._upstream_tls = ssl.create_default_context(cafile=ca_file)
        self._upstream_tls.check_hostname = False  # upstream is the loopback/pod-local SuperLink, CA-verified
        self._upstream_timeout = upstream_timeout
        self._client: Any = None
        self._server: asyncio.Server | None = None
        self._tasks: set[asyncio.Task] = set()

    async def start(self, host: str, port: int) -> int:
        """Listen on ``host:port`` (0: any free port); the port listened on."""
        import httpx

        self._client = httpx.AsyncClient(base_url=self.upstream, verify=self._upstream_tls,
                                         timeout=httpx.Timeout(self._upstream_timeout))
        loop = asyncio.get_running_loop()
        self._server = await loop.create_server(lambda: _Accept(self), host, port, backlog=1024)
        return int(self._server.sockets[0].getsockname()[1])

    async def aclose(self) -> None:
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        if self._client is not None:
            await self._client.aclose()

    # ------------------------------------------------------------------------------ connections
    def _accepted(self, transport: asyncio.Transport) -> None:
        """Called at accept time, in accept order, before any byte is read: the connection cap."""
        if self.stats.active >= self.limits.max_connections:
            self._count("connection cap")
            transport.abort()
            return
        self.stats.active += 1
        transport.pause_reading()  # nothing is read until TLS takes the socket over
        task = asyncio.get_running_loop().create_task(self._connection(transport))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _connection(self, raw: asyncio.Transport) -> None:
        loop = asyncio.get_running_loop()
        transport: asyncio.BaseTransport | None = None
        try:
            reader = asyncio.StreamReader(limit=READ_SIZE)
            protocol = asyncio.StreamReaderProtocol(reader)
            try:
                async with asyncio.timeout(self.limits.header_timeout):
                    transport = await loop.start_tls(raw, protocol, self._tls, server_side=True,
                                                     ssl_handshake_timeout=self.limits.header_timeout)
            except TimeoutError:
                self._count("header timeout")
                return
            protocol.connection_made(transport)
            writer = asyncio.StreamWriter(transport, protocol, reader, loop)  # type: ignore[arg-type]
            await self._serve(reader, writer)
        except (OSError, ssl.SSLError, EOFError):
            pass  # the peer went away or spoke no TLS: nothing to answer
        except Exception:  # e.g. a response h11 cannot send: this connection only
            log.exception("Fleet gateway: connection failed")
        finally:
            self.stats.active -= 1
            if transport is None:
                raw.abort()  # no TLS: nothing to say to the peer
            else:
                _close(transport)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        """Requests of one connection, kept alive while both sides finish each cleanly."""
        import h11

        conn = h11.Connection(h11.SERVER, max_incomplete_event_size=MAX_HEAD_BYTES)
        while True:
            try:
                try:
                    async with asyncio.timeout(self.limits.header_timeout):
                        request = await self._event(conn, reader)
                except TimeoutError:
                    self._count("header timeout")
                    return
                if not isinstance(request, h11.Request):
                    return  # the client closed the connection between requests
                await self._respond(conn, writer, *await self._handle(conn, reader, request))
            except h11.RemoteProtocolError as exc:
                self._count("malformed request")
                with contextlib.suppress(h11.LocalProtocolError):
                    await self._respond(conn, writer, exc.error_status_hint, [], b"bad request")
                return
            except _Refused as refusal:
                self._count(refusal.why)
                with contextlib.suppress(h11.LocalProtocolError):
                    await self._respond(conn, writer, refusal.status, [], refusal.text.encode())
                await self._linger(conn, reader)
                return
            if conn.our_state is not h11.DONE or conn.their_state is not h11.DONE:
                return
            conn.start_next_cycle()

    async def _event(self, conn: Any, reader: asyncio.StreamReader) -> Any:
        import h11

        while (event := conn.next_event()) is h11.NEED_DATA:
            data = await reader.read(READ_SIZE)
            self.stats.bytes_read += len(data)
            conn.receive_data(data)  # b"": the peer closed its side
        return event

    async def _handle(self, conn: Any, reader: asyncio.StreamReader, request: Any
                      ) -> tuple[int, list[tuple[str, str]], bytes]:
        """Check, read and forward one request; its response (status, headers, body)."""
        import httpx

        path = request.target.decode("ascii", "replace").partition("?")[0]
        if not allowed(request.method.decode("ascii", "replace"), path):
            raise _Refused(404, "not the Fleet API", "not found")
        headers = [(k.decode("latin-1"), v.decode("latin-1")) for k, v in request.headers]
        declared = next((int(v) for k, v in headers if k == "content-length"), None)  # h11 checked it
        if declared is not None and declared > self.limits.max_body:
            raise _Refused(413, "body over the limit", f"request body over {self.limits.max_body} bytes")
        chunked = any(k == "transfer-encoding" for k, _ in headers)  # h11 accepts only chunked
        reserve = declared if declared is not None else self.limits.max_body if chunked else 0
        if self.stats.reserved + reserve > self.limits.max_buffered:
            raise _Refused(503, "buffer budget", "busy; retry")
        self.stats.reserved += reserve
        body = bytearray()
        try:
            await self._body(conn, reader, body)
            forward = [(k, v) for k, v in headers if k not in _DROP]
            try:
                res = await self._client.post(path, content=bytes(body), headers=forward)
            except httpx.HTTPError:
                raise _Refused(502, "upstream unreachable", "the SuperLink did not answer") from None
        finally:
            self.stats.reserved -= reserve
            self.stats.held -= len(body)
        self.stats.forwarded += 1
        out = [(k, v) for k, v in res.headers.items() if k.lower() not in _DROP | {"content-encoding"}]
        return res.status_code, out, res.content

    async def _body(self, conn: Any, reader: asyncio.StreamReader, body: bytearray) -> None:
        """Read the request body into ``body``: at most ``max_body`` bytes, within ``body_timeout`` s."""
        import h11

        try:
            async with asyncio.timeout(self.limits.body_timeout):
                while not isinstance(event := await self._event(conn, reader), h11.EndOfMessage):
                    if isinstance(event, h11.ConnectionClosed):
                        raise EOFError
                    if len(body) + len(event.data) > self.limits.max_body:  # a chunked body
                        raise _Refused(413, "body over the limit", f"request body over {self.limits.max_body} bytes")
                    body += event.data
                    self.stats.held += len(event.data)
                    self.stats.peak_held = max(self.stats.peak_held, self.stats.held)
        except TimeoutError:
            raise _Refused(408, "body timeout", f"request body not received within {self.limits.body_timeout:g} s"
                           ) from None

    async def _respond(self, conn: Any, writer: asyncio.StreamWriter, status: int,
                       headers: Iterable[tuple[str, str]], body: bytes) -> None:
        import h11

        headers = [*headers, ("content-length", str(len(body)))]
        reason = b""
        if status >= 400 and conn.their_state is not h11.DONE:
            headers.append(("connection", "close"))
        with contextlib.suppress(ValueError):
            reason = HTTPStatus(status).phrase.encode()
        writer.write(conn.send(h11.Response(status_code=status, headers=headers, reason=reason)))
        writer.write(conn.send(h11.Data(data=body)) if body else b"")
        writer.write(conn.send(h11.EndOfMessage()))
        await writer.drain()

    async def _linger(self, conn: Any, reader: asyncio.StreamReader) -> None:
        """Read and drop what the client still sends of a refused request, briefly and boundedly."""
        import h11

        if conn.their_state in (h11.DONE, h11.CLOSED, h11.ERROR):
            return
        dropped = 0
        with contextlib.suppress(TimeoutError, OSError, ssl.SSLError):
            async with asyncio.timeout(LINGER_SECONDS):
                while dropped < LINGER_BYTES and (data := await reader.read(READ_SIZE)):
                    dropped += len(data)
                # Past the byte budget, read nothing more but keep the connection open for the
                # rest of the linger time: a sender then blocks on a full window instead of
                # getting a reset that can discard the response before its reader sees it.
                if dropped >= LINGER_BYTES:
                    await asyncio.sleep(LINGER_SECONDS)
        self.stats.bytes_read += dropped

    def _count(self, why: str) -> None:
        n = self.stats.refused[why] = self.stats.refused.get(why, 0) + 1
        if n & (n - 1) == 0:  # the 1st, 2nd, 4th, 8th …: an attack shows in the log without flooding it
            log.warning("Fleet gateway: %d refusal(s) so far: %s", n, why)


def _close(transport: asyncio.BaseTransport) -> None:
    """Close after what was written is sent (the response), but abort a peer that does not read."""
    transport.close()
    asyncio.get_running_loop().call_later(LINGER_SECONDS, transport.abort)


class _Accept(asyncio.Protocol):
    """The accepted TCP connection until TLS takes it over (:meth:`FleetGateway._accepted`)."""

    def __init__(self, gateway: FleetGateway) -> None:
        self.gateway = gateway

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.gateway._accepted(transport)  # type: ignore[arg-type]


def add_limit_arguments(parser: Any, prefix: str = "") -> None:  # a parser or an argument group
    """The :class:`Limits` as options (``--max-body`` …, or ``--gateway-max-body`` … with
    ``prefix="gateway-"`` for ``graphveil fed server``)."""
    d = Limits()
    parser.add_argument(f"--{prefix}max-body", type=parse_bytes, default=d.max_body, metavar="BYTES",
                        help=f"largest request body (413 above it; default {d.max_body // MIB}MiB: Flower's "
                             f"5 MiB array chunks + 3 MiB)")
    parser.add_argument(f"--{prefix}header-timeout", type=float, default=d.header_timeout, metavar="S",
                        help=f"seconds for the TLS handshake and request head (default {d.header_timeout:g})")
    parser.add_argument(f"--{prefix}body-timeout", type=float, default=d.body_timeout, metavar="S",
                        help=f"seconds for a request body after its head (408; default {d.body_timeout:g})")
    parser.add_argument(f"--{prefix}max-connections", type=int, default=d.max_connections, metavar="N",
                        help=f"connections open at once; more are closed at accept (default {d.max_connections})")
    parser.add_argument(f"--{prefix}max-buffered", type=parse_bytes, default=d.max_buffered, metavar="BYTES",
                        help=f"request bodies held at once over all connections (503 above it; default "
                             f"{d.max_buffered // MIB}MiB)")


def limits_from(args: argparse.Namespace, prefix: str = "") -> Limits:
    """The :class:`Limits` parsed by :func:`add_limit_arguments`; ``ValueError`` naming a bad one."""
    p = prefix.replace("-", "_")
    return Limits(max_body=getattr(args, f"{p}max_body"), header_timeout=getattr(args, f"{p}header_timeout"),
                  body_timeout=getattr(args, f"{p}body_timeout"),
                  max_connections=getattr(args, f"{p}max_connections"),
                  max_buffered=getattr(args, f"{p}max_buffered"))


async def _serve_forever(gateway: FleetGateway, host: str, port: int) -> None:
    await gateway.start(host, port)
    try:
        await asyncio.Event().wait()
    finally:
        await gateway.aclose()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m graphveil.connectors.flower.gateway",
                                     description="Forward only the Fleet API to the SuperLink.")
    parser.add_argument("--host", required=True)
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--upstream", required=True, help="https://HOST:PORT of the SuperLink")
    parser.add_argument("--ca", required=True)
    parser.add_argument("--cert", required=True)
    parser.add_argument("--key", required=True)
    parser.add_argument("--parent-pid", type=int)
    add_limit_arguments(parser)
    args = parser.parse_args(argv)
    try:
        limits = limits_from(args)
    except ValueError as exc:
        parser.error(str(exc))
    if args.parent_pid is not None:
        from flwr.supercore.app_utils import start_parent_process_monitor

        start_parent_process_monitor(args.parent_pid)
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(levelname)s %(message)s")
    print(f"GraphVeil Fleet gateway on https://{args.host}:{args.port} -> {args.upstream} (/v1/fleet/* only; "
          f"body <= {limits.max_body} B, head {limits.header_timeout:g} s, body {limits.body_timeout:g} s, "
          f"<= {limits.max_connections} connections, <= {limits.max_buffered} B buffered)", flush=True)
    gateway = FleetGateway(args.upstream, args.ca, args.cert, args.key, limits)
    asyncio.run(_serve_forever(gateway, args.host, args.port))
    return 0


if __name__ == "__main__":
    sys.exit(main())
