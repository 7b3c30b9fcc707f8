"""The Fleet gateway under abuse, with real TLS sockets on loopback: a body over the limit is
refused before it is read (declared or chunked), half-open connections are closed after the
header / body timeouts, the connection cap closes one connection too many at accept, and the
default body limit fits the largest request Flower sends.

The gateway runs in a thread of its own; its upstream is a plain HTTP recorder (what would
reach the SuperLink). Timeouts are configured short (0.5 s) and only ever checked with a
generous margin ("closed before 30 s"), never timed.
"""

from __future__ import annotations

import asyncio
import http.server
import shutil
import socket
import ssl
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from _paths import REPO

from graphveil.connectors.flower.gateway import (
    LINGER_BYTES,
    MIB,
    READ_SIZE,
    FleetGateway,
    Limits,
    main,
)

DEPLOY = REPO / "deploy"
#: Generous: the configured timeouts are 0.5 s; a closed connection must show within this.
PATIENCE = 30.0


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    if not shutil.which("openssl"):
        pytest.skip("needs openssl (deploy/scripts/make-certs.sh)")
    out = tmp_path_factory.mktemp("gateway") / "certs"
    subprocess.run([DEPLOY / "scripts" / "make-certs.sh", out, "DNS:localhost", "IP:127.0.0.1"],
                   check=True, capture_output=True)
    return out


class Upstream(http.server.ThreadingHTTPServer):
    """What reaches the SuperLink: every request's path, headers and body."""

    def __init__(self) -> None:
        self.seen: list[tuple[str, dict[str, str], bytes]] = []
        outer = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_POST(self) -> None:  # noqa: N802 - http.server's name
                if self.headers.get("transfer-encoding", "").lower() == "chunked":
                    body = b""
                    while size := int(self.rfile.readline().strip(), 16):
                        body += self.rfile.read(size)
                        self.rfile.readline()
                    self.rfile.readline()
                else:
                    body = self.rfile.read(int(self.headers.get("content-length", 0)))
                outer.seen.append((self.path, dict(self.headers), body))
                reply = f"got {len(body)}".encode()
                self.send_response(200)
                self.send_header("content-length", str(len(reply)))
                self.end_headers()
                self.wfile.write(reply)

            def log_message(self, *args) -> None:
                pass

        super().__init__(("127.0.0.1", 0), Handler)


class Running:
    """A :class:`FleetGateway` serving on 127.0.0.1 from a thread of its own."""

    def __init__(self, certs: Path, upstream: Upstream, limits: Limits) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        self.gateway = FleetGateway(f"http://127.0.0.1:{upstream.server_address[1]}", str(certs / "ca.crt"),
                                    str(certs / "server.pem"), str(certs / "server.key"), limits)
        self.port = self._run(self.gateway.start("127.0.0.1", 0))
        self.tls = ssl.create_default_context(cafile=str(certs / "ca.crt"))

    def _run(self, coro):  # noqa: ANN001, ANN202
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(PATIENCE)

    @property
    def stats(self):  # noqa: ANN201
        return self.gateway.stats

    def close(self) -> None:
        self._run(self.gateway.aclose())
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(PATIENCE)
        self.loop.close()

    def tcp(self) -> socket.socket:
        sock = socket.create_connection(("127.0.0.1", self.port), timeout=PATIENCE)
        return sock

    def tls_socket(self) -> ssl.SSLSocket:
        return self.tls.wrap_socket(self.tcp(), server_hostname="localhost")

    def wait_until(self, condition: Callable[[], bool], what: str) -> None:
        deadline = time.monotonic() + PATIENCE
        while not condition():
            if time.monotonic() > deadline:
                raise AssertionError(f"not within {PATIENCE} s: {what} (stats {self.stats})")
            time.sleep(0.02)


@pytest.fixture
def upstream() -> Iterator[Upstream]:
    server = Upstream()
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server
    server.shutdown()
    server.server_close()


@pytest.fixture
def gateway(certs: Path, upstream: Upstream, request: pytest.FixtureRequest) -> Iterator[Running]:
    """The gateway with the default limits, or those of ``@limits(...)``."""
    running = Running(certs, upstream, Limits(**getattr(request, "param", {})))
    yield running
    running.close()


def limits(**values: float) -> pytest.MarkDecorator:
    """Run a test against a gateway with these :class:`Limits`."""
    return pytest.mark.parametrize("gateway", [values], indirect=True, ids=[""])


def head(path: str = "/v1/fleet/push-object", **headers: str) -> bytes:
    lines = [f"POST {path} HTTP/1.1", "Host: localhost", *(f"{k.replace('_', '-')}: {v}" for k, v in headers.items())]
    return ("\r\n".join(lines) + "\r\n\r\n").encode()


def response(sock: socket.socket) -> tuple[int, bytes]:
    """Status and body of one response (the connection may close after it)."""
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(65536)
        if not chunk:
            raise AssertionError(f"closed before a response: {data!r}")
        data += chunk
    head_, _, body = data.partition(b"\r\n\r\n")
    length = int(next(line.split(b":")[1] for line in head_.split(b"\r\n") if line.lower().startswith(b"content-length")))
    while len(body) < length:
        body += sock.recv(65536)
    return int(head_.split()[1]), body


def closed_by_the_gateway(sock: socket.socket) -> bool:
    """The gateway closed ``sock`` (EOF or reset) before :data:`PATIENCE` ran out; False if the
    wait ran out (the socket's own timeout) — never a timed assertion on the gateway's timeout."""
    sock.settimeout(PATIENCE)
    try:
        while sock.recv(65536):
            pass
        return True
    except (ConnectionResetError, BrokenPipeError, ssl.SSLEOFError, ssl.SSLZeroReturnError):
        return True
    except TimeoutError:
        return False


# ------------------------------------------------------------------------------ forwarding


def test_only_fleet_posts_are_forwarded_with_keep_alive(gateway: Running, upstream: Upstream) -> None:
    import httpx

    with httpx.Client(base_url=f"https://127.0.0.1:{gateway.port}", verify=gateway.tls) as client:
        signed = {"flwr-signature-bin": "c2ln", "flwr-timestamp": "1", "content-type": "application/protobuf"}
        first = client.post("/v1/fleet/pull-messages", content=b"\x01" * 1000, headers=signed)
        second = client.post("/v1/fleet/push-object", content=iter([b"a" * 70_000, b"b" * 5]))  # chunked
        assert (first.status_code, first.text, second.status_code, second.text) == (200, "got 1000", 200, "got 70005")
        for method, path in (("POST", "/v1/control/start-run"), ("GET", "/v1/fleet/pull-messages"),
                             ("POST", "/v1/runtime/pull-messages"), ("POST", "/v1/fleet/../control/x")):
            assert client.request(method, path, content=b"x").status_code == 404, path
    assert [(p, len(b)) for p, _, b in upstream.seen] == [("/v1/fleet/pull-messages", 1000),
                                                          ("/v1/fleet/push-object", 70_005)]
    sent = {k.lower(): v for k, v in upstream.seen[0][1].items()}
    assert sent["flwr-signature-bin"] == "c2ln" and sent["content-type"] == "application/protobuf"
    assert gateway.stats.forwarded == 2 and gateway.stats.refused == {"not the Fleet API": 4}


# ------------------------------------------------------------------------------ the body limit


def test_a_declared_oversized_body_is_refused_before_it_is_read(gateway: Running, upstream: Upstream) -> None:
    """The attack of issue 25: a 400 MB unauthenticated POST. The head alone gets 413; what the
    client goes on sending is dropped (at most LINGER_BYTES) and the connection closed."""
    with gateway.tls_socket() as sock:
        sock.sendall(head(Content_Length=str(400 * 10**6)))
        assert response(sock) == (413, f"request body over {8 * MIB} bytes".encode())
        assert gateway.stats.bytes_read < 1024 and gateway.stats.peak_held == 0  # the head only
        sent, chunk = 0, b"\x00" * READ_SIZE
        with pytest.raises(OSError):  # reset or broken pipe once the gateway has closed
            while sent < 64 * MIB:
                sock.sendall(chunk)
                sent += len(chunk)
    gateway.wait_until(lambda: gateway.stats.active == 0, "the connection closed")
    assert gateway.stats.bytes_read <= 1024 + LINGER_BYTES + READ_SIZE
    assert gateway.stats.peak_held == 0 and upstream.seen == []
    assert gateway.stats.refused == {"body over the limit": 1}


@limits(max_body=256 * 1024)
def test_a_chunked_body_is_counted_and_refused_at_the_limit(gateway: Running, upstream: Upstream) -> None:
    """No declared length: the body is counted as it arrives and refused at max_body; at most
    max_body bytes are ever held, nothing is forwarded."""
    with gateway.tls_socket() as sock:
        sock.sendall(head(Transfer_Encoding="chunked"))
        # three times the limit, within what the gateway drops after its 413 (one thread: an
        # SSL socket is not safe to send on and receive from at once)
        chunk = f"{READ_SIZE:x}\r\n".encode() + b"\x00" * READ_SIZE + b"\r\n"
        for _ in range(3 * 256 * 1024 // READ_SIZE):
            sock.sendall(chunk)
        assert response(sock) == (413, f"request body over {256 * 1024} bytes".encode())
    gateway.wait_until(lambda: gateway.stats.active == 0, "the connection closed")
    assert gateway.stats.peak_held <= 256 * 1024 and upstream.seen == []
    assert gateway.stats.bytes_read <= 256 * 1024 + 2 * READ_SIZE + LINGER_BYTES
    assert gateway.stats.refused == {"body over the limit": 1}


@limits(max_body=MIB, max_buffered=3 * MIB)
def test_bodies_held_at_once_are_bounded_over_all_connections(gateway: Running, upstream: Upstream) -> None:
    """Three slow uploads of 1 MiB reserve the whole budget: a fourth gets 503 (Flower retries)."""
    slow = [gateway.tls_socket() for _ in range(3)]
    try:
        for sock in slow:
            sock.sendall(head(Content_Length=str(MIB)) + b"x" * 10)
        gateway.wait_until(lambda: gateway.stats.reserved == 3 * MIB, "three bodies reserved")
        with gateway.tls_socket() as fourth:
            fourth.sendall(head(Content_Length="10") + b"0123456789")
            assert response(fourth) == (503, b"busy; retry")
        for sock in slow:
            sock.sendall(b"x" * (MIB - 10))
        assert [response(sock) for sock in slow] == [(200, f"got {MIB}".encode())] * 3
    finally:
        for sock in slow:
            sock.close()
    assert gateway.stats.refused == {"buffer budget": 1} and len(upstream.seen) == 3


# ------------------------------------------------------------------------------ timeouts and the cap


@limits(header_timeout=0.5, body_timeout=0.5)
def test_half_open_connections_are_closed_after_the_timeouts(gateway: Running, upstream: Upstream) -> None:
    silent = gateway.tcp()  # no TLS handshake at all
    handshaken = gateway.tls_socket()  # TLS, then half a request head
    handshaken.sendall(b"POST /v1/fleet/push-object HTTP/1.1\r\nHost: localhost\r\n")
    slow_body = gateway.tls_socket()  # a whole head, then 10 of 100 body bytes
    slow_body.sendall(head(Content_Length="100") + b"0123456789")
    try:
        assert closed_by_the_gateway(silent) and closed_by_the_gateway(handshaken)
        assert response(slow_body) == (408, b"request body not received within 0.5 s")
        assert closed_by_the_gateway(slow_body)
    finally:
        for sock in (silent, handshaken, slow_body):
            sock.close()
    gateway.wait_until(lambda: gateway.stats.active == 0, "every connection closed")
    assert gateway.stats.refused == {"header timeout": 2, "body timeout": 1} and upstream.seen == []


@limits(header_timeout=0.5)
def test_an_idle_kept_alive_connection_is_closed_after_the_header_timeout(gateway: Running) -> None:
    with gateway.tls_socket() as sock:
        sock.sendall(head(Content_Length="3") + b"abc")
        assert response(sock) == (200, b"got 3")
        assert closed_by_the_gateway(sock)  # no next request within the header timeout


@limits(max_connections=3, header_timeout=60.0)
def test_one_connection_over_the_cap_is_closed_at_accept(gateway: Running, upstream: Upstream) -> None:
    held = [gateway.tcp() for _ in range(3)]
    try:
        gateway.wait_until(lambda: gateway.stats.active == 3, "three connections open")
        with gateway.tcp() as extra:
            assert closed_by_the_gateway(extra)  # before any TLS: no handshake, no response
        assert gateway.stats.refused == {"connection cap": 1} and gateway.stats.active == 3
        held.pop().close()
        gateway.wait_until(lambda: gateway.stats.active == 2, "a held connection closed")
        with gateway.tls_socket() as sock:  # a slot is free again: served
            sock.sendall(head(Content_Length="2") + b"ok")
            assert response(sock) == (200, b"got 2")
    finally:
        for sock in held:
            sock.close()
    assert len(upstream.seen) == 1


# ------------------------------------------------------------------------------ defaults and options


@pytest.mark.usefixtures("flower_task")
def test_the_default_body_limit_fits_the_largest_request_flower_sends() -> None:
    """Flower pushes a reply's arrays as objects, one per push-object request, each array cut into
    chunks of at most FLWR_PRIVATE_MAX_ARRAY_CHUNK_SIZE (5 MiB): a 12 MiB tensor's largest
    request is one chunk plus a few hundred bytes, and the default limit is 3 MiB above it."""
    import torch
    from flwr.app import Message
    from flwr.common.constant import FLWR_PRIVATE_MAX_ARRAY_CHUNK_SIZE
    from flwr.proto.message_pb2 import PushObjectRequest
    from flwr.proto.node_pb2 import Node
    from flwr.supercore.inflatable.inflatable_object import get_all_nested_objects

    from graphveil.connectors.flower import records

    state = {"big": torch.arange(3 * MIB, dtype=torch.float32), "lora_A": torch.ones(8, 384)}
    message = Message(content=records.trained_content("site-a", state, {"num-steps": 1.0}),
                      dst_node_id=0, message_type="train")
    largest = max(PushObjectRequest(node=Node(node_id=2**63 - 1), run_id=2**63 - 1, object_id=oid,
                                    object_content=obj.deflate(), session_id="s" * 64).ByteSize()
                  for oid, obj in get_all_nested_objects(message).items())
    assert FLWR_PRIVATE_MAX_ARRAY_CHUNK_SIZE == 5 * MIB
    assert 5 * MIB < largest < 5 * MIB + 4096
    assert Limits().max_body == largest // MIB * MIB + 3 * MIB


def test_limits_are_options_of_the_server_and_checked(tmp_path: Path, capsys) -> None:
    from graphveil.apps.cli import main as cli

    for name in ("ca.crt", "server.pem", "server.key"):
        (tmp_path / name).write_text("x")
    base = ["fed", "server", "--ca", str(tmp_path / "ca.crt"), "--cert", str(tmp_path / "server.pem"),
            "--key", str(tmp_path / "server.key"), "--dry-run"]
    assert cli(base) == 0
    gateway_line = capsys.readouterr().out.splitlines()[0]
    assert (f"--max-body {8 * MIB} --header-timeout 10.0 --body-timeout 60.0 --max-connections 128 "
            f"--max-buffered {64 * MIB}") in gateway_line
    assert cli([*base, "--gateway-max-body", "16MiB", "--gateway-max-connections", "32",
                "--gateway-header-timeout", "5"]) == 0
    gateway_line = capsys.readouterr().out.splitlines()[0]
    assert f"--max-body {16 * MIB} --header-timeout 5.0" in gateway_line and "--max-connections 32" in gateway_line
    assert cli([*base, "--gateway-max-body", "96MiB"]) == 2  # over max-buffered
    assert "max_buffered" in capsys.readouterr().err
    with pytest.raises(SystemExit) as info:
        main(["--host", "h", "--port", "1", "--upstream", "u", "--ca", "c", "--cert", "c", "--key", "k",
              "--max-connections", "0"])
    assert info.value.code == 2 and "max_connections must be > 0" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["--host", "h", "--port", "1", "--upstream", "u", "--ca", "c", "--cert", "c", "--key", "k",
              "--max-body", "lots"])
    assert "not a size in bytes: 'lots'" in capsys.readouterr().err
