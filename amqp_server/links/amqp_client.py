"""A small asyncio AMQP 0-9-1 client for the node's links (shovels, federation): what moving messages needs, and
no more.

Frames are parsed here rather than by a client library, for two reasons: a delivery's content header is passed
on as the bytes it came in (a message keeps every property exactly, and nothing is decoded or encoded per
message unless the link changes a property), and a client library would add its own properties (aiormq sets a
``message_id`` on any publish without one).  Methods other than the per-message ones (deliver, ack, nack) go
through pamqp, which the broker uses too.

Any failure — the socket, missed heartbeats, the server closing the connection or a working channel — ends the
connection: :attr:`Client.closed` then holds the reason, and the link reconnects.
"""
from __future__ import annotations

import asyncio
import logging
import struct
import time
from typing import Any, Callable

from pamqp import commands, frame as pframe, heartbeat as pheartbeat
from pamqp.base import Frame

from .. import __version__
from ..framing.header_table import Field, encode as encode_table
from .uri import AMQPURI

log = logging.getLogger("warren.link")

FRAME_HEADER = struct.Struct(">BHI")
FRAME_END = b"\xce"
DELIVER = struct.Struct(">HH")
BASIC_ACK = struct.Struct(">HHQB")  # class, method, delivery tag, flags (also basic.nack's layout)
FRAME_MAX = 131072
DISPOSABLE_CHANNEL = 100  # one-off calls (see disposable_call)
PUBLISH_FRAMES_KEPT = 1024  # basic.publish frames kept by destination (see publish)
HEARTBEAT_FRAME = pframe.marshal(pheartbeat.Heartbeat(), 0)

# tag, redelivered, exchange, routing key, header payload, body
Delivered = Callable[[int, bool, str, str, bytes, bytes], None]
Confirmed = Callable[[int, bool, bool], None]  # publish seq, multiple, nack


class ClientError(Exception):
    """Why a connection ended: the server's close (code and text), the socket's error, a timeout."""

    def __init__(self, text: str, code: int = 0) -> None:
        super().__init__(text)
        self.code = code  # the server's reply code, when it closed the connection


class ChannelClosed(ClientError):
    def __init__(self, code: int, text: str) -> None:
        super().__init__(f"{{server_initiated_close,{code},<<\"{text}\">>}}", code)


def _shortstr(data: bytes, pos: int) -> tuple[str, int]:
    size = data[pos]
    return data[pos + 1:pos + 1 + size].decode(errors="replace"), pos + 1 + size


class Client(asyncio.Protocol):
    """One connection.  :meth:`connect` logs in and opens it; channels are numbers the caller picks."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.server_properties: dict[str, Any] = {}
        self.transport: asyncio.Transport | None = None
        self.closed: asyncio.Future[ClientError] = asyncio.get_running_loop().create_future()
        self.frame_max = FRAME_MAX
        self._buffer = bytearray()
        self._waiters: dict[int, asyncio.Future[Any]] = {}
        self._working: set[int] = set()  # channels whose close ends the connection
        self._content: dict[int, list[Any]] = {}  # channel -> [tag, exchange, key, header, size, parts]
        self.on_deliver: dict[int, Delivered] = {}
        self.on_confirm: dict[int, Confirmed] = {}
        self.on_writable: Callable[[bool], None] | None = None
        self._last_read = time.monotonic()
        self._heartbeat_task: asyncio.Task[None] | None = None
        self._handshake: asyncio.Queue[Any] = asyncio.Queue()
        self.blocked = False
        self._publish_frames: dict[tuple[int, str, str], bytes] = {}

    # -- connection ---------------------------------------------------------------------------

    @classmethod
    async def connect(cls, uri: AMQPURI, host: str, port: int, user: str, password: str, name: str,
                      product: str) -> "Client":
        loop = asyncio.get_running_loop()
        client = cls(name)
        try:
            await asyncio.wait_for(loop.create_connection(lambda: client, host, port, ssl=uri.ssl_context(),
                                                          server_hostname=uri.server_hostname()), uri.timeout())
            await asyncio.wait_for(client._open(uri, user, password, product), uri.timeout())
        except (OSError, asyncio.TimeoutError) as exc:
            client.close()
            raise ClientError(f"{{error,{type(exc).__name__}: {exc or 'timeout'}}}") from None
        except ClientError:
            client.close()
            raise
        return client

    async def _open(self, uri: AMQPURI, user: str, password: str, product: str) -> None:
        assert self.transport is not None
        self.transport.write(b"AMQP\x00\x00\x09\x01")
        start = await self._next_handshake()
        if not isinstance(start, commands.Connection.Start):
            raise ClientError(f"unexpected {start.name} before connection.start")
        self.server_properties = start.server_properties or {}
        properties: dict[str, Any] = {"product": product, "version": __version__, "connection_name": self.name,
                      "capabilities": {"publisher_confirms": True, "consumer_cancel_notify": True,
                                       "connection.blocked": True, "basic.nack": True}}
        self.send(0, commands.Connection.StartOk(client_properties=properties, mechanism="PLAIN",
                                                 response=f"\0{user}\0{password}", locale="en_US"))
        tune = await self._next_handshake()
        if not isinstance(tune, commands.Connection.Tune):
            raise ClientError(f"unexpected {tune.name} before connection.tune")
        self.frame_max = min(tune.frame_max or FRAME_MAX, FRAME_MAX)
        heartbeat = min(tune.heartbeat, uri.heartbeat()) if tune.heartbeat and uri.heartbeat() else 0
        self.send(0, commands.Connection.TuneOk(channel_max=tune.channel_max or 2047, frame_max=self.frame_max,
                                                heartbeat=heartbeat))
        self.send(0, commands.Connection.Open(virtual_host=uri.vhost))
        opened = await self._next_handshake()
        if not isinstance(opened, commands.Connection.OpenOk):
            raise ClientError(f"unexpected {opened.name} before connection.open-ok")
        if heartbeat:
            self._heartbeat_task = asyncio.create_task(self._heartbeats(heartbeat))

    async def _next_handshake(self) -> Any:
        getter = asyncio.ensure_future(self._handshake.get())
        await asyncio.wait([getter, self.closed], return_when=asyncio.FIRST_COMPLETED)
        if not getter.done():
            getter.cancel()
            raise self.closed.result()
        return getter.result()

    async def _heartbeats(self, interval: int) -> None:
        while self.transport is not None:
            await asyncio.sleep(interval / 2)
            if time.monotonic() - self._last_read > interval * 2:
                self._fail(ClientError("{missed_heartbeats_from_server}"))
                return
            self.write(HEARTBEAT_FRAME)

    def close(self) -> None:
        """Close the connection (politely if it is open: connection.close, then the socket)."""
        if self.transport is not None and not self.closed.done():
            self.send(0, commands.Connection.Close(reply_code=200, reply_text="Goodbye", class_id=0, method_id=0))
        self._fail(ClientError("closed"))

    def _fail(self, reason: ClientError) -> None:
        if not self.closed.done():
            self.closed.set_result(reason)
        for waiter in self._waiters.values():
            if not waiter.done():
                waiter.set_exception(reason)
        self._waiters.clear()
        if self._heartbeat_task is not None:
            self._heartbeat_task.cancel()
        if self.transport is not None:
            self.transport.close()
            self.transport = None

    # -- asyncio.Protocol ---------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]  # (uvloop's transports are no asyncio.Transport)

    def connection_lost(self, exc: Exception | None) -> None:
        self.transport = None
        self._fail(ClientError(f"{{connection_lost,{exc}}}" if exc else "{shutdown,connection_closed}"))

    def pause_writing(self) -> None:
        if self.on_writable is not None:
            self.on_writable(False)

    def resume_writing(self) -> None:
        if self.on_writable is not None:
            self.on_writable(True)

    def data_received(self, data: bytes) -> None:
        self._last_read = time.monotonic()
        buffer = self._buffer
        buffer += data
        pos = 0
        size = len(buffer)
        try:
            while size - pos >= 8:
                kind, channel, length = FRAME_HEADER.unpack_from(buffer, pos)
                end = pos + 7 + length
                if end >= size:
                    break
                if buffer[end] != 0xCE:
                    raise ClientError("{bad_frame_end}")
                payload = bytes(buffer[pos + 7:end])
                if kind == 1:
                    self._method(channel, payload, bytes(buffer[pos:end + 1]))
                elif kind == 2:
                    self._header(channel, payload)
                elif kind == 3:
                    self._body(channel, payload)
                elif kind != 8:
                    raise ClientError(f"{{unexpected_frame_type,{kind}}}")
                pos = end + 1
        except ClientError as exc:
            self._fail(exc)
            return
        del buffer[:pos]

    # -- frames in ----------------------------------------------------------------------------

    def _method(self, channel: int, payload: bytes, raw: bytes) -> None:
        class_id, method_id = DELIVER.unpack_from(payload, 0)
        if class_id == 60 and method_id == 60:  # basic.deliver: parsed here, per message
            _tag, pos = _shortstr(payload, 4)
            delivery_tag = struct.unpack_from(">Q", payload, pos)[0]
            redelivered = bool(payload[pos + 8] & 1)
            exchange, pos = _shortstr(payload, pos + 9)
            routing_key, _ = _shortstr(payload, pos)
            self._content[channel] = [delivery_tag, exchange, routing_key, b"", 0, [], redelivered]
            return
        if class_id == 60 and method_id in (80, 120):  # basic.ack / basic.nack from the server: confirms
            _, _, seq, flags = BASIC_ACK.unpack_from(payload, 0)
            callback = self.on_confirm.get(channel)
            if callback is not None:
                callback(seq, bool(flags & 1), method_id == 120)
            return
        try:
            _, _, method = pframe.unmarshal(raw)
        except Exception as exc:  # pamqp's errors for a frame it cannot read
            raise ClientError(f"{{undecodable_frame,{exc}}}") from None
        if isinstance(method, commands.Connection.Close):
            self.send(0, commands.Connection.CloseOk())
            raise ClientError(f"{{shutdown,{{server_initiated_close,{method.reply_code},"
                              f"<<\"{method.reply_text}\">>}}}}", method.reply_code or 0)
        if isinstance(method, commands.Channel.Close):
            self.send(channel, commands.Channel.CloseOk())
            closed = ChannelClosed(method.reply_code or 0, method.reply_text or "")
            if channel in self._working:
                raise ClientError(f"{{shutdown,{closed}}}", closed.code)
            waiter = self._waiters.pop(channel, None)
            if waiter is not None and not waiter.done():
                waiter.set_exception(closed)
            return
        if isinstance(method, commands.Basic.Cancel):
            raise ClientError("{consumer_cancelled,the queue was deleted or moved}")
        if isinstance(method, commands.Connection.Blocked):
            self.blocked = True
            return
        if isinstance(method, commands.Connection.Unblocked):
            self.blocked = False
            return
        if channel == 0 and not isinstance(method, commands.Connection.CloseOk):
            self._handshake.put_nowait(method)
            return
        waiter = self._waiters.pop(channel, None)
        if waiter is not None and not waiter.done():
            waiter.set_result(method)

    def _header(self, channel: int, payload: bytes) -> None:
        content = self._content.get(channel)
        if content is None:
            raise ClientError("{unexpected_content_header}")
        content[3] = payload
        content[4] = struct.unpack_from(">Q", payload, 4)[0]
        if not content[4]:
            self._delivered(channel, content)

    def _body(self, channel: int, payload: bytes) -> None:
        content = self._content.get(channel)
        if content is None:
            raise ClientError("{unexpected_content_body}")
        content[5].append(payload)
        content[4] -= len(payload)
        if content[4] <= 0:
            self._delivered(channel, content)

    def _delivered(self, channel: int, content: list[Any]) -> None:
        del self._content[channel]
        callback = self.on_deliver.get(channel)
        if callback is not None:
            parts = content[5]
            callback(content[0], content[6], content[1], content[2], content[3],
                     parts[0] if len(parts) == 1 else b"".join(parts))

    # -- frames out ---------------------------------------------------------------------------

    def write(self, data: bytes) -> None:
        if self.transport is not None:
            self.transport.write(data)

    def send(self, channel: int, method: Frame) -> None:
        self.write(pframe.marshal(method, channel))

    async def call(self, channel: int, method: Frame | bytes) -> Any:
        """Send a synchronous method (or its frame, see :func:`typed_arguments`) and wait for its reply
        (ChannelClosed if the server closes the channel)."""
        if self.closed.done():
            raise self.closed.result()
        waiter: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self._waiters[channel] = waiter
        if isinstance(method, bytes):
            self.write(method)
        else:
            self.send(channel, method)
        return await waiter

    async def open_channel(self, channel: int, working: bool = True) -> None:
        await self.call(channel, commands.Channel.Open())
        if working:
            self._working.add(channel)

    async def disposable_call(self, method: Frame) -> Any:
        """A synchronous method on a channel of its own, closed after: an error (ChannelClosed) closes only that
        channel (RabbitMQ's disposable_channel_call)."""
        await self.open_channel(DISPOSABLE_CHANNEL, working=False)
        reply = await self.call(DISPOSABLE_CHANNEL, method)
        await self.close_channel(DISPOSABLE_CHANNEL)
        return reply

    async def close_channel(self, channel: int) -> None:
        self._working.discard(channel)
        await self.call(channel, commands.Channel.Close(reply_code=200, reply_text="Goodbye", class_id=0, method_id=0))

    def publish(self, channel: int, exchange: str, routing_key: str, header: bytes, body: bytes) -> None:
        """basic.publish with a content header's payload as it is (its body size must be ``len(body)``)."""
        key = (channel, exchange, routing_key)
        method = self._publish_frames.get(key)
        if method is None:  # the same few destinations, message after message: marshal each once
            if len(self._publish_frames) >= PUBLISH_FRAMES_KEPT:
                self._publish_frames.clear()
            method = self._publish_frames[key] = pframe.marshal(
                commands.Basic.Publish(exchange=exchange, routing_key=routing_key), channel)
        out = [method, FRAME_HEADER.pack(2, channel, len(header)), header, FRAME_END]
        step = self.frame_max - 8
        for start in range(0, len(body), step):
            chunk = body[start:start + step]
            out += (FRAME_HEADER.pack(3, channel, len(chunk)), chunk, FRAME_END)
        self.write(b"".join(out))

    def ack(self, channel: int, tag: int, multiple: bool, nack: bool = False) -> None:
        method = 120 if nack else 80
        flags = (1 if multiple else 0) | (2 if nack else 0)  # basic.nack: requeue, as RabbitMQ's shovel does
        self.write(FRAME_HEADER.pack(1, channel, BASIC_ACK.size) + BASIC_ACK.pack(60, method, tag, flags) + FRAME_END)


def typed_arguments(method: Frame, channel: int, arguments: dict[str, Field]) -> bytes:
    """The frame of ``method`` (whose last field is its arguments table, left empty) with ``arguments`` written
    with their AMQP types: pamqp picks an integer's width by its value, and RabbitMQ wants some arguments of one
    type (an ``x-federation-upstream`` exchange's ``x-max-hops`` a long)."""
    payload = struct.pack(">I", method.index) + method.marshal()
    table = encode_table(arguments)
    payload = payload[:-4] + struct.pack(">I", len(table)) + table
    return FRAME_HEADER.pack(1, channel, len(payload)) + payload + FRAME_END
