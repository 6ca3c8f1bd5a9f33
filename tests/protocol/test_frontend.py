"""The protections every front end shares (``amqp_server.frontend.front_end``), tried on the stream protocol and the
cluster link as on AMQP: reading stops while the peer does not read what it is sent, before and after login; a read
handles a bounded number of frames; the client ports (AMQP, AMQPS, stream) count their connections not logged in
together, TLS handshakes among them; an internal error's log line never raises.

In-process where a fake transport suffices (what the node writes and whether it reads are exact there); live for
the ports' shared cap and what an idle TLS handshake costs.
"""
from __future__ import annotations

import asyncio
import logging
import os
import socket
import struct
import time
import tracemalloc
from pathlib import Path
from typing import Any, AsyncIterator, Iterator

import pika
import pytest

from amqp_server.frontend import front_end as frontend
from amqp_server.broker import Broker
from amqp_server.frontend.clients import Clients
from amqp_server.config import Config
from amqp_server.framing.file_out import WRITE_ALONE
from amqp_server.message import Message
from amqp_server.payload import encode
from amqp_server.publisher_flow import PublisherFlow
from amqp_server.stream.manager import StreamManager
from amqp_server.stream.reader import StreamConnection
from conftest import INTEGRATION, BrokerProcess, connect, free_port, starts
from forwarder.peers import node_link as link
from test_preauth import SECRET, FakeTransport, Recorder, frame, proof, server_link

pytestmark = pytest.mark.timeout(120)


class Transport(FakeTransport):
    """A socket whose peer reads nothing: what is written stays, and past the high-water mark the protocol is told
    to pause writing, as asyncio's transports do."""

    def __init__(self, protocol: asyncio.BaseProtocol) -> None:
        super().__init__(protocol)
        self.high = 64 * 1024
        self.full = False

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return ("127.0.0.1", 4242) if name == "peername" else default

    def set_write_buffer_limits(self, high: int | None = None, low: int | None = None) -> None:
        self.high = high if high is not None else self.high

    def get_write_buffer_size(self) -> int:
        return len(self.written)

    def write(self, data: bytes | bytearray | memoryview) -> None:
        super().write(data)
        if not self.full and len(self.written) > self.high:
            self.full = True
            self.protocol.pause_writing()

    def drained(self) -> None:
        """The peer read everything."""
        self.written.clear()
        if self.full:
            self.full = False
            self.protocol.resume_writing()


async def turns(n: int = 5) -> None:
    for _ in range(n):
        await asyncio.sleep(0)


# -- the stream protocol, in-process -------------------------------------------------------------------------


def sframe(key: int, body: bytes) -> bytes:
    return struct.pack(">IHH", len(body) + 4, key, 1) + body


def sstring(value: str) -> bytes:
    return struct.pack(">h", len(value.encode())) + value.encode()


WRITE_HIGH = 256 * 1024  # a logged-in connection's (--write-buffer-high; 4 MiB by default)
PEER_PROPERTIES = sframe(0x11, struct.pack(">I", 1) + struct.pack(">i", 0))
METADATA = sframe(0x0F, struct.pack(">I", 9) + struct.pack(">i", 1) + sstring("no-such-stream"))


def responses(written: bytes | bytearray, key: int) -> int:
    count, pos = 0, 0
    while pos + 6 <= len(written):
        size, got = struct.unpack_from(">IH", written, pos)
        count += got == key
        pos += 4 + size
    return count


@pytest.fixture
async def stream_connection(tmp_path: Path) -> AsyncIterator[Any]:
    """(connection, transport, broker) factory: a stream connection on a fake socket, in a broker of its own."""
    broker = Broker(str(tmp_path / "data"))
    made: list[StreamConnection] = []

    def make() -> tuple[StreamConnection, Transport]:
        config = Config(write_buffer_high=WRITE_HIGH)
        connection = StreamConnection(broker, StreamManager(broker), config, PublisherFlow(), Clients(config))
        transport = Transport(connection)
        connection.connection_made(transport)
        made.append(connection)
        return connection, transport

    yield make
    broker.close()


def login(connection: StreamConnection, transport: Transport) -> None:
    connection.data_received(PEER_PROPERTIES + sframe(0x12, struct.pack(">I", 2)) + sframe(
        0x13, struct.pack(">I", 3) + sstring("PLAIN") + struct.pack(">i", 12) + b"\0guest\0guest"))
    connection.data_received(sframe(0x14, struct.pack(">II", 1048576, 0))
                             + sframe(0x15, struct.pack(">I", 4) + sstring("/")))
    assert responses(transport.written, 0x8015) == 1 and connection.state == 3  # OPEN
    transport.drained()


@pytest.mark.parametrize("request_, response, logged_in", [(PEER_PROPERTIES, 0x8011, False),
                                                           (METADATA, 0x800F, True)],
                         ids=["before-login", "after-login"])
async def test_a_stream_client_that_does_not_read_is_read_no_more(stream_connection, request_, response, logged_in):
    """Finding: the stream reader read on forever while its client read nothing (89 -> 218 MiB in 9.5 s before
    login, 109 -> 535 MiB in 60 s after).  Now what it answered waits in at most the transport's high-water mark
    (64 KiB before login) and one read's frames; the frames read meanwhile wait too, and go on once it reads."""
    connection, transport = stream_connection()
    if logged_in:
        login(connection, transport)
    fed = 0
    for _ in range(10):
        if not transport.paused:  # (a paused socket delivers nothing more)
            connection.data_received(request_ * 2000)
            fed += 2000
        await turns()
    answered = responses(transport.written, response)
    assert transport.paused and connection.write_paused
    assert transport.high == (frontend.PRELOGIN_WRITE_HIGH if not logged_in else WRITE_HIGH)
    assert len(transport.written) < transport.high + frontend.FRAMES_PER_TURN * 300, len(transport.written)
    assert fed <= 10_000 and answered < fed
    for _ in range(100):  # the client reads: what was read goes on
        transport.drained()
        await turns()
        answered += responses(transport.written, response)
    assert answered == fed and not transport.paused


async def test_one_stream_read_handles_a_bounded_number_of_frames(stream_connection):
    connection, transport = stream_connection()
    login(connection, transport)
    transport.high = 1 << 30
    connection.data_received(METADATA * 3000)
    assert responses(transport.written, 0x800F) == frontend.FRAMES_PER_TURN
    assert transport.paused  # the rest at the next turn, nothing more read meanwhile
    await turns(10)
    assert responses(transport.written, 0x800F) == 3000 and not transport.paused


async def test_a_stream_internal_error_is_logged_and_never_raises(stream_connection, monkeypatch):
    connection, transport = stream_connection()
    login(connection, transport)

    def broken(*_args: Any) -> None:
        raise RuntimeError("a bug")

    def unloggable(*_args: Any, **_kwargs: Any) -> None:
        raise OSError(24, "Too many open files")

    monkeypatch.setitem(StreamConnection._HANDLERS, 0x0F, broken)
    for level in ("error", "warning"):
        monkeypatch.setattr(logging.getLogger("warren.stream"), level, unloggable)
    connection.data_received(METADATA)  # logging itself fails (no file descriptor left): nothing escapes
    assert responses(transport.written, 0x16) == 1  # closed with INTERNAL_ERROR


# -- the cluster link, in-process --------------------------------------------------------------------------


async def authenticated_link() -> tuple[link.ServerLink, Transport, Recorder]:
    recorder = Recorder()
    server, fake = server_link(recorder)
    await turns()  # the challenge written
    transport = Transport(server)  # the same connection on a socket that fills
    server.transport = transport
    nonce = fake.written[link.FRAME.size:link.FRAME.size + link.NONCE_SIZE]
    server.data_received(frame(link.AUTH, b"n" * link.NONCE_SIZE + proof(nonce, "warren2@host", b"dialer")
                               + b"warren2@host"))
    assert server.authenticated and transport.high == link.WRITE_BUFFER_HIGH
    return server, transport, recorder


async def test_a_link_listener_whose_dialer_does_not_read_is_read_no_more():
    """The listening end stops reading while its writes are full (the dialer always reads: both stopping would
    deadlock), the frames already read waiting with the socket."""
    server, transport, recorder = await authenticated_link()
    server.pause_writing()  # the dialer reads nothing
    assert transport.paused
    server.data_received(frame(link.STATS, b"{}") * 10)
    assert recorder.frames == []
    server.resume_writing()
    await turns()
    assert len(recorder.frames) == 10 and not transport.paused


async def test_a_link_dialer_reads_on_while_its_writes_are_full():
    recorder = Recorder()
    client = link.ClientLink(SECRET, "warren2@host", "warren1@host", recorder)
    transport = Transport(client)
    client.connection_made(transport)
    client.pause_writing()
    assert client.write_paused and not transport.paused


async def test_one_link_read_handles_a_bounded_number_of_frames():
    server, transport, recorder = await authenticated_link()
    server.data_received(frame(link.STATS, b"{}") * 2500)
    assert len(recorder.frames) == frontend.FRAMES_PER_TURN and transport.paused
    await turns(10)
    assert len(recorder.frames) == 2500 and not transport.paused


async def test_one_link_read_handles_a_bounded_number_of_bytes():
    """Frames of 400 KB, as a snapshot's: three a turn (the one that crosses ``BYTES_PER_TURN`` too), the rest
    at the next turns."""
    server, transport, recorder = await authenticated_link()
    server.data_received(frame(link.STATS, b" " * 400_000) * 8)
    assert len(recorder.frames) == 3 and transport.paused
    await turns(10)
    assert len(recorder.frames) == 8 and not transport.paused


def large_deliver(size: int) -> tuple[bytes, bytes]:
    """A DELIVER frame of a message whose body is ``size`` octets, and the body."""
    body = bytes(range(256)) * (size // 256)
    payload = b"".join((link.DELIVER_HEAD.pack(1, 2, 3, 0), *encode(b"\x00\x01q", b"\x00\x3c" + b"h" * 12, body)))
    return frame(link.DELIVER, payload), body


async def test_a_large_link_frame_is_read_into_a_buffer_of_its_own_that_becomes_its_body():
    """Past its first read, a large frame is read straight into one buffer of its declared size, which its handler
    gets and whose message's body it becomes, the head before it cut off in place: the body is copied by no one."""
    server, _, recorder = await authenticated_link()
    data, body = large_deliver(4 << 20)
    server.data_received(data[:100_000])  # (its first read, with the frames before it)
    at = 100_000
    while at < len(data):
        into = server.get_buffer(-1)
        assert len(into) == len(data) - at  # the rest of the frame, and no more
        took = min(len(into), 256 * 1024)
        into[:took] = data[at:at + took]
        del into  # (as the transport's read lets go of it)
        server.buffer_updated(took)
        at += took
    await turns()
    [(ftype, payload)] = recorder.frames
    assert ftype == link.DELIVER and type(payload) is bytearray and len(payload) == len(data) - link.FRAME.size
    message = link.read_message(payload, link.DELIVER_HEAD.size)
    assert message.body is payload and message.body == body
    assert (message.exchange, message.routing_key, type(message.route), type(message.header)) == ("", "q", bytes, bytes)


async def test_a_large_link_frame_read_in_pieces_is_held_once(monkeypatch):
    """16 MiB read in pieces (the reads of a plain transport): the node holds it once, where the read buffer, the
    frame cut from it and the body cut from that held it three times or more."""
    server, _, recorder = await authenticated_link()
    data, body = large_deliver(16 << 20)
    messages = []
    monkeypatch.setattr(recorder, "frame",
                        lambda ftype, payload: messages.append(link.read_message(payload, link.DELIVER_HEAD.size)))
    tracemalloc.start()
    try:
        with memoryview(data) as view:
            for at in range(0, len(data), 256 * 1024):
                server.data_received(view[at:at + 256 * 1024])
        await turns()
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert [m.body == body for m in messages] == [True]
    assert peak < len(body) + (2 << 20), f"{peak >> 20} MiB held for a body of 16 MiB"


async def test_a_large_link_frame_cut_short_by_the_link_s_end_leaves_nothing_and_an_oversized_one_is_refused():
    """A large frame half sent when the link closes leaves nothing behind; a frame larger than ``MAX_FRAME`` closes
    the link before any byte of it is kept."""
    server, transport, recorder = await authenticated_link()
    data, _ = large_deliver(8 << 20)
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        server.data_received(data[:len(data) // 2])
        assert tracemalloc.get_traced_memory()[0] - before > len(data) // 2  # (its buffer, of its declared size)
        transport.abort()
        await turns()
        left = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    assert recorder.frames == [] and left < 1 << 20, f"{left} octets left"

    server, transport, recorder = await authenticated_link()
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        server.data_received(link.FRAME.pack(link.MAX_FRAME + 1, link.DELIVER) + data[link.FRAME.size:1 << 20])
        await turns()
        peak = tracemalloc.get_traced_memory()[1] - before
    finally:
        tracemalloc.stop()
    assert transport.aborted and recorder.frames == [] and peak < 4 << 20


async def test_a_large_body_a_link_sends_goes_to_its_transport_as_the_peer_reads_never_joined():
    """A 16 MiB body in memory leaves as the peer reads: the transport is given pieces of it up to its high-water
    mark (each copied once), not the frame joined into one copy and all of it copied again into its buffer."""
    server, transport, _ = await authenticated_link()
    body = bytearray(os.urandom(16 << 20))
    server.send_message(link.DELIVER, link.DELIVER_HEAD.pack(1, 2, 3, 0),
                        Message("", "q", b"\x00\x01q", b"\x00\x3c" + b"h" * 12, body))  # type: ignore[arg-type]
    await turns()
    assert len(transport.written) <= link.WRITE_BUFFER_HIGH + WRITE_ALONE and server.write_paused
    got = bytearray()
    while transport.written:
        got += transport.written
        transport.drained()
        await turns()
    [payload] = [payload for ftype, payload in frames(bytes(got)) if ftype == link.DELIVER]
    assert link.read_message(payload, link.DELIVER_HEAD.size).body == body


def frames(data: bytes) -> list[tuple[int, bytes]]:
    """The link frames of ``data``."""
    found = []
    at = 0
    while at < len(data):
        size, ftype = link.FRAME.unpack_from(data, at)
        found.append((ftype, data[at + link.FRAME.size:at + link.FRAME.size + size]))
        at += link.FRAME.size + size
    return found


# -- the client ports' shared pre-login cap, live -------------------------------------------------------------


def closed_by_node(sock: socket.socket) -> bool:
    sock.setblocking(False)
    try:
        return sock.recv(1) == b""
    except BlockingIOError:
        return False
    except OSError:
        return True


@pytest.fixture(scope="module")
@starts(INTEGRATION)
def capped_node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """A node with the stream protocol and an AMQPS port, whose client ports let 12 connections wait for login."""
    from test_tls import PKI

    pki = PKI.create(tmp_path_factory.mktemp("pki"))
    tls_port = free_port()
    node = BrokerProcess(tmp_path_factory.mktemp("frontend") / "data", streams=True, extra=[
        "--handshakes-max", "12", "--tls-port", str(tls_port), "--tls-certfile", pki.server_cert,
        "--tls-keyfile", pki.server_key, "--tls-cacertfile", pki.cafile]).start()
    node.tls_port = tls_port  # type: ignore[attr-defined]
    node.pki = pki  # type: ignore[attr-defined]
    yield node
    node.stop()


def idle(port: int, n: int) -> list[socket.socket]:
    return [socket.create_connection(("127.0.0.1", port), timeout=5) for _ in range(n)]


def count_closed(socks: list[socket.socket], within: float) -> int:
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        closed = sum(closed_by_node(sock) for sock in socks)
        if closed >= len(socks) - 12:
            return closed
        time.sleep(0.1)
    return sum(closed_by_node(sock) for sock in socks)


@pytest.mark.warren_only("the pre-login cap is Warren's")
@pytest.mark.parametrize("port", ["stream_port", "tls_port"])
def test_connections_not_logged_in_to_stream_and_amqps_ports_count_in_the_shared_cap(capped_node, port):
    """Finding: 1,100 idle stream connections (ulimit -n 1024) stopped new AMQP connections; a TLS handshake
    was outside every cap.  Now both count among the 12 the client ports let wait: beyond them the oldest close,
    while a logged-in AMQP client carries on and a new one logs in."""
    with connect(capped_node) as amqp:
        channel = amqp.channel()
        channel.queue_declare("frontend-cap")
        socks = idle(getattr(capped_node, port), 40)
        try:
            assert count_closed(socks, 3.0) >= 40 - 12  # (TLS's own handshake timeout is 5 s; the deadline 10 s)
            channel.basic_publish("", "frontend-cap", b"still here")
            with connect(capped_node) as newcomer:
                assert newcomer.channel().queue_declare("frontend-cap", passive=True).method.message_count == 1
        finally:
            for sock in socks:
                sock.close()
        channel.queue_delete("frontend-cap")


@pytest.mark.warren_only("AMQPS with Warren's test certificates")
def test_amqps_still_logs_in_after_idle_handshakes(capped_node):
    socks = idle(capped_node.tls_port, 20)
    try:
        context = capped_node.pki.client_context()
        params = pika.ConnectionParameters("localhost", capped_node.tls_port, connection_attempts=1,
                                           ssl_options=pika.SSLOptions(context, "localhost"))
        with pika.BlockingConnection(params) as connection:
            assert connection.channel().queue_declare("", exclusive=True).method.queue
    finally:
        for sock in socks:
            sock.close()
