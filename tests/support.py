"""What the tests share beside conftest's fixtures: publishing and draining through pika, the HTTP API, a
hand-driven AMQP socket, and the core in-process.  A helper lives here once, its variations as parameters; a test
file keeps a helper of its own only where no other file needs it."""
from __future__ import annotations

import asyncio
import base64
import json
import socket
import struct
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from contextlib import contextmanager
from typing import Any, Literal, NamedTuple, overload
from urllib.parse import quote

import pika
import pika.channel
import pika.connection
from pamqp import body as pbody
from pamqp import commands
from pamqp import frame as pframe
from pamqp import header as pheader
from pamqp.heartbeat import Heartbeat
from pika.adapters.blocking_connection import BlockingChannel
from pika.exceptions import ChannelClosedByBroker
from pika.spec import Basic

from amqp_server.broker import Broker
from amqp_server.config import Config
from amqp_server.message import Message, make_message
from amqp_server.ports import ClientChannel
from amqp_server.queues.queue import AnyQueue, Consumer, Entry, LocalQueue, Queue
from amqp_server.broker.vhost import VHost
from amqp_server.node.server import Node
from conftest import connect, free_port

# -- AMQP through pika ---------------------------------------------------------------------------------------------

Body = bytes | str


def publish(channel: BlockingChannel, routing_key: str, bodies: Iterable[Body], exchange: str = "",
            mandatory: bool = False, **properties: Any) -> None:
    """Publish each body (a str is sent UTF-8) with the same properties; on a confirming channel each waits."""
    sent = pika.BasicProperties(**properties)
    for body in bodies:
        channel.basic_publish(exchange, routing_key, body.encode() if isinstance(body, str) else body, sent,
                              mandatory=mandatory)


def numbered(count: int, prefix: str = "m", start: int = 0) -> list[str]:
    """Bodies m0, m1, ... to publish, told apart."""
    return [f"{prefix}{i}" for i in range(start, start + count)]


def publish_to(node: Any, routing_key: str, bodies: Iterable[Body], exchange: str = "", confirm: bool = True,
               declare: bool = False, mandatory: bool = False, **properties: Any) -> None:
    """``publish`` on a connection of its own to ``node``, confirmed unless ``confirm`` is false; ``declare``: the
    queue ``routing_key`` is declared durable first."""
    with channel_on(node, confirm) as channel:
        if declare:
            channel.queue_declare(routing_key, durable=True)
        publish(channel, routing_key, bodies, exchange, mandatory, **properties)


def publish_pipelined(node: Any, routing_key: str, bodies: Iterable[Body | tuple[Body, pika.BasicProperties]],
                      exchange: str = "", declare: bool = False, mandatory: bool = False, timeout: float = 120.0,
                      **properties: Any) -> None:
    """As ``publish_to``, every message confirmed (a nack or, ``mandatory``, a return fails the test), but all are
    sent before the first confirm is awaited: no round trip and fsync each, which took minutes for thousands
    on a loaded machine.  For filling a queue; where a test needs each publish to wait, ``publish_to``.  A
    (body, properties) pair has properties of its own."""
    sent = pika.BasicProperties(**properties)
    with connect(node) as connection:
        blocking = connection.channel()
        if declare:
            blocking.queue_declare(routing_key, durable=True)
        channel = beneath(blocking)  # BlockingChannel waits for each confirm
        pending: set[int] = set()
        failed: list[str] = []
        selected: list[bool] = []

        def on_confirm(frame: Any) -> None:
            method = frame.method
            settled = [tag for tag in pending if tag <= method.delivery_tag] if method.multiple \
                else [method.delivery_tag]
            pending.difference_update(settled)
            if isinstance(method, Basic.Nack):
                failed.append(f"nacked: {sorted(settled)[:10]}")

        channel.add_on_return_callback(lambda _ch, method, _props, body: failed.append(
            f"returned {body[:40]!r}: {method.reply_code} {method.reply_text}"))
        channel.confirm_delivery(on_confirm, lambda _frame: selected.append(True))
        deadline = time.monotonic() + timeout
        while not selected:
            assert time.monotonic() < deadline, "no confirm.select-ok"
            connection.process_data_events(time_limit=0.1)
        for tag, item in enumerate(bodies, 1):
            body, own = item if isinstance(item, tuple) else (item, sent)
            pending.add(tag)
            channel.basic_publish(exchange, routing_key, body.encode() if isinstance(body, str) else body, own,
                                  mandatory=mandatory)
        while pending and not failed:
            assert time.monotonic() < deadline, f"{len(pending)} publishes unconfirmed after {timeout} s"
            connection.process_data_events(time_limit=0.1)
        connection.process_data_events(time_limit=0)  # a return comes before its ack: seen by now
        assert not failed, failed[:5]


@contextmanager
def channel_on(node: Any, confirm: bool = False) -> Iterator[BlockingChannel]:
    """A channel on a connection of its own to ``node``, closed after; ``confirm``: in confirm mode."""
    with connect(node) as connection:
        channel = connection.channel()
        if confirm:
            channel.confirm_delivery()
        yield channel


class Got(NamedTuple):
    """A message basic.get returned."""

    body: bytes
    properties: pika.BasicProperties
    redelivered: bool


def body_of(got: Got) -> bytes:
    return got.body


def delivery_tag(method: Basic.Deliver | Basic.GetOk | None) -> int:
    """The tag of a delivery or a basic.get's message, which the test knows it got (pika's types leave it
    Optional)."""
    assert method is not None and method.delivery_tag is not None
    return method.delivery_tag


def get_within(channel: BlockingChannel, queue: str, auto_ack: bool = False,
               seconds: float = 5.0) -> tuple[Basic.GetOk | None, pika.BasicProperties | None, bytes | None]:
    """basic.get until the queue gives a message (one that arrives through another node or a dead-lettering may
    take a while), or ``seconds`` pass: (None, None, None) then."""
    deadline = time.monotonic() + seconds
    while True:
        got = channel.basic_get(queue, auto_ack=auto_ack)
        if got[0] is not None or time.monotonic() > deadline:
            return got
        time.sleep(0.01)


def headers_of(properties: pika.BasicProperties | None) -> dict[str, Any]:
    """A message's headers, which the test knows it has, to read as it knows them (pika types each value as any
    field value a table may hold)."""
    assert properties is not None and properties.headers is not None
    return dict(properties.headers)


def drain(channel: BlockingChannel, queue: str, settle: Literal["auto", "ack", "hold"] = "auto",
          keep: Callable[[Got], Any] = body_of) -> list[Any]:
    """What basic.get returns until the queue is empty, ``auto``-acked, acked one by one (``ack``) or left unacked
    (``hold``); of each message, what ``keep`` takes (its body unless told)."""
    got: list[Any] = []
    while True:
        method, properties, body = channel.basic_get(queue, auto_ack=settle == "auto")
        if method is None:
            return got
        assert properties is not None and body is not None and method.delivery_tag is not None  # (with a method)
        got.append(keep(Got(body, properties, bool(method.redelivered))))
        if settle == "ack":
            channel.basic_ack(method.delivery_tag)


def drain_from(node: Any, queue: str, keep: Callable[[Got], Any] = body_of) -> list[Any]:
    """``drain`` (auto-acked) on a connection of its own to ``node``."""
    with channel_on(node) as channel:
        return drain(channel, queue, keep=keep)


def drain_consumed(node: Any, queue: str, keep: Callable[[Got], Any] = body_of, timeout: float = 120.0) -> list[Any]:
    """``drain_from``, but the messages the first basic.get says are left behind it come through a consumer (a
    basic.get each, one round trip, took minutes for thousands on a loaded machine), then basic.get until the
    queue is empty: what the consumer leaves unacked goes back first.  For emptying deep queues; a test of
    basic.get itself uses ``drain_from``."""
    with channel_on(node) as channel:
        method, properties, body = channel.basic_get(queue, auto_ack=True)
        if method is None:
            return []
        assert properties is not None and body is not None  # (with a method)
        got = [keep(Got(body, properties, bool(method.redelivered)))]
        count = 1 + (method.message_count or 0)
        deadline = time.monotonic() + timeout
        last = 0
        for deliver, properties, body in channel.consume(queue, inactivity_timeout=1.0) if count > 1 else ():
            if deliver is not None:
                assert properties is not None and body is not None and deliver.delivery_tag is not None
                got.append(keep(Got(body, properties, bool(deliver.redelivered))))
                last = deliver.delivery_tag
            if len(got) >= count or time.monotonic() > deadline:
                break
        if last:
            channel.basic_ack(last, multiple=True)
        if count > 1:
            channel.cancel()  # (what came after ``count``: requeued, got below)
        return got + drain(channel, queue, keep=keep)


def channel_closed(excinfo: Any, code: int, text: str | None = None) -> None:
    """The channel (or connection) was closed with ``code`` and, if given, exactly ``text``."""
    assert excinfo.value.reply_code == code, excinfo.value
    if text is not None:
        assert excinfo.value.reply_text == text


@overload
def beneath(blocking: pika.BlockingConnection) -> pika.connection.Connection: ...
@overload
def beneath(blocking: BlockingChannel) -> pika.channel.Channel: ...
def beneath(blocking):
    """pika's asynchronous connection or channel under a blocking one, for what only it offers (the server's
    properties, callbacks on close or cancel); pika's stubs leave the blocking one's ``_impl`` out."""
    return blocking._impl


class AsyncClose:
    """The broker closes a channel after an asynchronous method (publish, ack): catch the reason."""

    def __init__(self, ch: BlockingChannel) -> None:
        self.ch = ch
        self.reason: Exception | None = None
        beneath(ch).add_on_close_callback(self._closed)

    def _closed(self, _channel: Any, reason: Exception) -> None:
        self.reason = reason

    def wait(self, code: int, text: str | None = None, timeout: float = 2.0) -> None:
        deadline = time.monotonic() + timeout
        while self.reason is None and time.monotonic() < deadline:
            self.ch.connection.process_data_events(0.05)
        assert isinstance(self.reason, ChannelClosedByBroker), self.reason
        assert self.reason.reply_code == code, self.reason
        if text is not None:
            assert self.reason.reply_text == text


def wait_for_events(connection: pika.BlockingConnection, check: Callable[..., object], timeout: float = 10.0) -> None:
    """Let pika's connection take what arrives until ``check()`` holds (an AssertionError after ``timeout``)."""
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, "timed out"
        connection.process_data_events(time_limit=0.1)


def consume_n(conn: pika.BlockingConnection, ch: BlockingChannel, queue: str, n: int, auto_ack: bool = True,
              timeout: float = 3.0) -> list:
    """Collect n deliveries (method, props, body) with a consumer, then cancel it."""
    got: list = []
    tag = ch.basic_consume(queue, lambda c, m, p, b: got.append((m, p, b)), auto_ack=auto_ack)
    deadline = time.monotonic() + timeout
    while len(got) < n and time.monotonic() < deadline:
        conn.process_data_events(0.05)
    ch.basic_cancel(tag)
    return got


def bodies(gets: list) -> list[bytes]:
    """The bodies of what ``consume_n`` collected."""
    return [b for _, _, b in gets]


# -- the HTTP API ---------------------------------------------------------------------------------------------------

GUEST = ("guest", "guest")


class Response:
    def __init__(self, status: int, headers: Any, raw: bytes) -> None:
        self.status = status
        self.headers = headers
        self.raw = raw

    @property
    def json(self) -> Any:
        return json.loads(self.raw) if self.raw else None


def call(broker: Any, method: str, path: str, body: Any = None, auth: tuple[str, str] | None = GUEST,
         raw: bytes | None = None) -> Response:
    """One request to the node's HTTP API (JSON ``body`` or ``raw`` bytes), answered whatever its status."""
    data = raw if raw is not None else (json.dumps(body).encode() if body is not None else None)
    request = urllib.request.Request(f"http://127.0.0.1:{broker.mgmt_port}{path}", data=data, method=method)
    if data is not None:
        request.add_header("Content-Type", "application/json")
    if auth is not None:
        token = base64.b64encode(f"{auth[0]}:{auth[1]}".encode()).decode()
        request.add_header("Authorization", f"Basic {token}")
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return Response(response.status, response.headers, response.read())
    except urllib.error.HTTPError as exc:
        return Response(exc.code, exc.headers, exc.read())


def q(name: str) -> str:
    """A name as one segment of a path."""
    return quote(name, safe="")


def assert_error(response: Response, status: int) -> dict:
    """The status, and RabbitMQ's error body: exactly ``error`` and a ``reason``."""
    assert response.status == status, (response.status, response.raw)
    body = response.json
    assert set(body) == {"error", "reason"} and body["reason"], body
    return body


# -- AMQP by hand, for what no client sends ------------------------------------------------------------------------

PROTOCOL_HEADER = b"AMQP\x00\x00\x09\x01"
FRAME_END = b"\xce"


class Closed(Exception):
    """The peer closed the socket."""


class Raw:
    """A hand-driven AMQP client on a plain socket."""

    def __init__(self, broker: Any, timeout: float = 5.0) -> None:
        self.sock = socket.create_connection((broker.host, broker.port), timeout=timeout)
        self.buf = b""

    def close(self) -> None:
        self.sock.close()

    def send(self, data: bytes) -> None:
        self.sock.sendall(data)

    def send_method(self, channel: int, method: Any) -> None:
        self.send(pframe.marshal(method, channel))

    def recv(self, size: int = 65536) -> bytes:
        """b"" at end of stream: RabbitMQ often ends a connection with a reset where Warren sends a FIN."""
        try:
            return self.sock.recv(size)
        except ConnectionResetError:
            return b""

    def _fill(self) -> None:
        data = self.recv()
        if not data:
            raise Closed()
        self.buf += data

    def read_frame(self) -> tuple[int, Any]:
        """Next (channel, frame) off the wire, heartbeats skipped."""
        while True:
            while True:
                try:
                    consumed, channel, value = pframe.unmarshal(self.buf)
                except Exception:  # pamqp raises UnmarshalingException on partial input
                    self._fill()
                    continue
                self.buf = self.buf[consumed:]
                break
            if not isinstance(value, Heartbeat):
                return channel, value

    def expect(self, kind: Any) -> Any:
        channel, value = self.read_frame()
        assert isinstance(value, kind), f"expected {kind.__name__}, got {value!r}"
        return value

    def handshake(self, frame_max: int = 0, heartbeat: int = 0, capabilities: dict | str | None = None,
                  password: str = "guest", open_vhost: bool = True, channel_max: int = 0) -> commands.Connection.Tune:
        """Open the connection; ``capabilities`` is the client's property as sent (a str: one that is no table)."""
        self.send(PROTOCOL_HEADER)
        self.expect(commands.Connection.Start)
        caps = {"authentication_failure_close": True} if capabilities is None else capabilities
        self.send_method(0, commands.Connection.StartOk(
            client_properties={"product": "raw-test", "capabilities": caps},
            mechanism="PLAIN", response=f"\x00guest\x00{password}", locale="en_US"))
        tune = self.expect(commands.Connection.Tune)
        self.send_method(0, commands.Connection.TuneOk(channel_max=channel_max or tune.channel_max,
                                                        frame_max=frame_max or tune.frame_max,
                                                        heartbeat=heartbeat))
        if open_vhost:
            self.send_method(0, commands.Connection.Open(virtual_host="/"))
            self.expect(commands.Connection.OpenOk)
        return tune

    def open_channel(self, channel: int = 1) -> None:
        self.send_method(channel, commands.Channel.Open())
        self.expect(commands.Channel.OpenOk)

    def expect_connection_close(self) -> commands.Connection.Close:
        """Read until Connection.Close (skipping other frames), answer close-ok, expect EOF."""
        while True:
            channel, value = self.read_frame()
            if isinstance(value, commands.Connection.Close):
                assert channel == 0
                try:
                    self.send_method(0, commands.Connection.CloseOk())
                except OSError:
                    pass
                return value

    def assert_eof(self, timeout: float = 5.0) -> None:
        self.sock.settimeout(timeout)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if not self.recv():
                return
        raise AssertionError("server did not close the socket")


def stalled_consumer(broker: Any, queue: str, prefetch: int = 0, arguments: dict | None = None) -> Raw:
    """A raw client consuming ``queue`` for manual ack (``prefetch``: its basic.qos first, which a stream asks
    for; ``arguments``: the consume's), reading nothing yet."""
    raw = Raw(broker, timeout=60)
    raw.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 65536)
    raw.handshake()
    raw.open_channel(1)
    if prefetch:
        raw.send_method(1, commands.Basic.Qos(prefetch_count=prefetch))
        raw.expect(commands.Basic.QosOk)
    raw.send_method(1, commands.Basic.Consume(queue=queue, arguments=arguments or {}))
    raw.expect(commands.Basic.ConsumeOk)
    return raw


def raw_frame(ftype: int, channel: int, payload: bytes, end: bytes = FRAME_END) -> bytes:
    return struct.pack(">BHI", ftype, channel, len(payload)) + payload + end


def method_payload(class_id: int, method_id: int, args: bytes = b"") -> bytes:
    return struct.pack(">HH", class_id, method_id) + args


def publish_frames(channel: int, exchange: str, routing_key: str, body: bytes, declared: int | None = None) -> bytes:
    """basic.publish, its content header (``declared``: the body size it claims) and the body, as frames."""
    size = len(body) if declared is None else declared
    return (pframe.marshal(commands.Basic.Publish(exchange=exchange, routing_key=routing_key), channel)
            + pframe.marshal(pheader.ContentHeader(0, size, commands.Basic.Properties()), channel)
            + (pframe.marshal(pbody.ContentBody(body), channel) if body else b""))


# -- a node in this process -------------------------------------------------------------------------------------

class Running:
    """A node serving in this process, in a thread of its own with its own event loop: a test can reach into it
    (``call``) while real clients drive it."""

    def __init__(self, config: Config) -> None:
        self.config = config
        self.host = config.bind
        self.port = config.amqp_port
        self.mgmt_port = config.mgmt_port
        self.stream_port = config.stream_port
        self.loop = asyncio.new_event_loop()
        self.node: Node | None = None
        started = threading.Event()

        def run() -> None:
            asyncio.set_event_loop(self.loop)

            async def serve() -> None:
                self.node = Node(config)
                await self.node.start()
                started.set()
                await self.node.run_until_stopped()

            self.loop.run_until_complete(serve())

        self.thread = threading.Thread(target=run, daemon=True)
        self.thread.start()
        assert started.wait(15), "the node did not start"

    def call(self, fn: Any) -> Any:
        """``fn()`` on the node's loop, its answer back."""
        return asyncio.run_coroutine_threadsafe(_call(fn), self.loop).result(10)

    def stop(self) -> None:
        assert self.node is not None
        self.loop.call_soon_threadsafe(self.node.stop)
        self.thread.join(15)


async def _call(fn: Any) -> Any:
    return fn()


def start(tmp_path: Path, **options: Any) -> Running:
    """A node on free ports, without the HTTP API unless ``options`` say otherwise."""
    defaults = {"amqp_port": free_port(), "mgmt_enabled": False, "bind": "127.0.0.1", "data_dir": str(tmp_path)}
    return Running(Config(**{**defaults, **options}))



# -- the core in-process: no sockets, no frames --------------------------------------------------------------------

def message(body: bytes = b"m", routing_key: str = "q", exchange: str = "", **properties: Any) -> Message:
    """A message as a front end hands it to the core."""
    return make_message(exchange, routing_key, commands.Basic.Properties(**properties), body)


def publish_local(broker: Broker, vhost: VHost, queue: str, *bodies: bytes, **properties: Any) -> None:
    """Publish each body to ``queue`` through the default exchange; each must be routed and taken."""
    for body in bodies:
        routed, rejected = broker.publish(vhost, vhost.exchange(""), message(body, queue, **properties))
        assert routed and not rejected


def drain_local(broker: Broker, vhost: VHost, queue: str) -> list[bytes]:
    """The bodies a get without ack takes until ``queue`` is empty."""
    got = []
    while (entry := broker.get_local(vhost, queue, no_ack=True)[1]) is not None:
        got.append(entry.message.body)
    return got


class Target:
    """A DeliveryTarget that records what the core hands it; ``room`` stands for the socket's write buffer."""

    def __init__(self) -> None:
        self.room = True
        self.delivered: list[tuple[str, bytes, bool]] = []  # (consumer tag, body, redelivered)
        self.held: list[tuple[Entry, AnyQueue, Consumer | None]] = []  # what a client would have unacked
        self.cancelled: list[str] = []
        self.failures: list[tuple[str, str]] = []  # (consumer tag, reason)

    def client(self) -> ClientChannel:
        return ClientChannel("in-process", 1, ("127.0.0.1", 1), "guest", "")

    def failed(self, consumer: Consumer, reason: str) -> None:
        self.failures.append((consumer.tag, reason))

    def handed_over(self, consumer: Consumer, old: Any, new: Any) -> None:
        """(a quorum queue's leader moved: nothing to change here)"""

    def can_deliver(self, shared: bool) -> bool:
        return self.room

    def deliver(self, consumer: Consumer, entry: Entry) -> None:
        self.delivered.append((consumer.tag, entry.message.body, entry.redelivered))
        if not consumer.no_ack:
            self.held.append((entry, consumer.queue, consumer))

    def cancelled_by_broker(self, consumer: Consumer) -> None:
        self.cancelled.append(consumer.tag)

    def bodies(self, tag: str | None = None) -> list[bytes]:
        return [body for t, body, _ in self.delivered if tag is None or t == tag]


def consume(broker: Broker, vhost: VHost, queue: str, target: Target, tag: str, prefetch: int = 0,
            no_ack: bool = False, exclusive: bool = False, priority: int | None = None) -> Consumer:
    """A consumer on ``queue`` delivering to ``target``, handed what is ready at once."""
    arguments = {} if priority is None else {"x-priority": priority}
    consumer = broker.consume(broker.consumable(vhost, queue), target, tag, no_ack, exclusive, arguments, prefetch)
    consumer.queue.deliver_ready()
    return consumer


def local(queue: AnyQueue) -> LocalQueue:
    """The queue of this node that ``queue`` is (tests of one node's own queues)."""
    found = queue.local()
    assert found is not None, f"{queue.name} is another node's"
    return found


def classic(queue: AnyQueue) -> Queue:
    """The queue of this node that ``queue`` is, holding a ready list (a classic queue, or a type built on it)."""
    found = local(queue)
    assert isinstance(found, Queue), f"{queue.name} holds no ready list"
    return found
