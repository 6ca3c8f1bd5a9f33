"""One stream-protocol connection (RabbitMQ's rabbit_stream_reader): handshake, publishers, subscriptions.

Before login a peer may send only small frames (``PRE_LOGIN_FRAME_MAX``) and must have opened a vhost within the
node's ``handshake_timeout``, counted among the connections of every client port not logged in (``frontend``: the
connection is one of its front ends, read only while its client reads what it is sent); afterwards frames up to
``FRAME_LIMIT`` (RabbitMQ 3.10 takes frames above the frame max tune agreed, and rstream 1.0.1 sends them: it
publishes what it buffered in one frame).  A frame that does not
parse, or an unknown command, closes the connection with UNKNOWN_FRAME as RabbitMQ 3.10 does; every refused
request gets its response code.  Streams are the node's stream queues, reached through :class:`StreamManager`'s
operations.

A publish frame's messages are chunks of the stream's log (``stream.log``), cut as osiris's writer cuts them
(``StreamLog.batches``), written at once and confirmed once the group commit holding them is on disk.  A
subscription is sent the log's chunks from its offset, one per credit, from the segment file while the socket takes
them: when a chunk is written, or credit comes, the next goes at the end of the loop turn.
"""
from __future__ import annotations

import asyncio
import datetime
import logging
import os
import socket
import struct
import time
from collections import deque
from typing import TYPE_CHECKING, Any, Callable, Iterable

import numpy as np

from .. import __version__
from ..access_control import loopback_refused
from ..errors import AMQPError
from ..frontend import auth_mechanisms
from ..framing.file_out import FileRange, Part, direct_socket, read_rest, write_direct
from ..frontend.front_end import (FLOW, FRAMES_PER_TURN, WAITING, Complaints, FrontEnd, ListedPublisher,
                                  ListedSubscription)
from ..logs import untrusted
from ..publisher_flow import DISK
from ..stats import MessageStats
from ..queues.stream_queue import StreamQueue
from stream_log import chunk
from . import wire as core
from .wire import Fields, MalformedFrame
from .manager import StreamError, StreamManager

if TYPE_CHECKING:
    from ..access_control import Principal, User
    from ..broker import Broker
    from ..frontend.clients import Clients
    from ..config import Config
    from ..publisher_flow import PublisherFlow
    from ..broker.vhost import VHost

log = logging.getLogger("warren.stream")
complaints = Complaints(log)

PRE_LOGIN_FRAME_MAX = 4096  # peer properties, SASL: a login needs no more
FRAME_LIMIT = 64 << 20  # the largest frame taken once open
CLOSE_TIMEOUT = 3.0
TURN_CHUNKS = 64  # chunks a subscription sends per loop turn at most
TURN_BYTES = 4 << 20  # and bytes
SENDFILE_FROM = 16 << 10  # a chunk at least this large is sent with sendfile; a smaller one read and written
RUN_BELOW = 128 << 10  # chunks below this size that lie side by side are read at once and written with one writev
_ID_SIZE = struct.Struct(">QI")  # a message of a publish frame: publishing id, entry size (or sub-batch type)
_ENTRY = struct.Struct(">I")
_DELIVER_HEAD = struct.Struct(">IHHB")  # size, key, version, subscription id
_CONFIRM_HEAD = struct.Struct(">IHHBI")  # size, key, version, publisher id, count

def _uniform(buf: bytes | bytearray | memoryview, pos: int, end: int, count: int,
             last: int | None) -> tuple[bytes, bytes, int, int] | None:
    """A v1 publish frame whose messages are simple entries of one size (a client batching records of one shape)
    taken apart as arrays, with no work per message: (its publishing ids, packed; its entries; their records'
    size; the last id).  None for any other frame, or (``last``: a named publisher's) one that repeats an id
    already written or whose ids do not rise: the general way takes it."""
    if count < 2 or pos + 12 > end:
        return None
    size = _ENTRY.unpack_from(buf, pos + 8)[0]
    stride = 12 + size
    if size & 0x80000000 or count * stride != end - pos:
        return None
    rows = np.frombuffer(buf, np.uint8, count * stride, pos).reshape(count, stride)
    if not (rows[:, 8:12] == rows[0, 8:12]).all():
        return None
    ids = rows[:, :8].tobytes()
    rising = np.frombuffer(ids, ">u8")
    if last is not None and (int(rising[0]) <= last or not (rising[1:] > rising[:-1]).all()):
        return None
    return ids, rows[:, 8:].tobytes(), size, int(rising[-1])


_SPECS = {core.OFFSET_FIRST: "first", core.OFFSET_LAST: "last", core.OFFSET_NEXT: "next"}
NONE_YET = -1  # a name's publishing sequence before its first message: osiris finds none, so 0 is no duplicate
_LAST_MS = 253_402_300_799_000  # 9999-12-31T23:59:59Z, the last time a datetime holds

# states
AWAIT_LOGIN, AWAIT_TUNE, AWAIT_OPEN, OPEN, CLOSE_SENT, CLOSED = range(6)


class StreamPublisher:
    __slots__ = ("id", "reference", "stream", "published", "confirmed", "errored")

    def __init__(self, publisher_id: int, reference: str, stream: StreamQueue) -> None:
        self.id = publisher_id
        self.reference = reference  # with one, deduplicated against the stream's last id for it (``writers``)
        self.stream = stream
        self.published = self.confirmed = self.errored = 0  # messages, as rabbit_stream_reader counts them

    def listed(self) -> ListedPublisher:
        return ListedPublisher(self.id, self.reference, self.stream.name, self.published, self.confirmed,
                               self.errored)


class Subscription:
    __slots__ = ("id", "stream", "offset", "credit", "properties", "consumed", "chunk")

    def __init__(self, subscription_id: int, stream: StreamQueue, offset: int, credit: int,
                 properties: dict[str, str]) -> None:
        self.id = subscription_id
        self.stream = stream
        self.offset = offset  # the next offset to send
        self.credit = credit  # chunks it may still be sent
        self.properties = properties  # as the client subscribed with them
        self.consumed = 0  # messages sent
        self.chunk = offset  # the first offset of the chunk last sent (where it attached, before one)

    def listed(self) -> ListedSubscription:
        stream_log = self.stream.log
        committed = stream_log.last_chunk if stream_log.next else -1  # (osiris: the newest chunk's id, -1 for none)
        return ListedSubscription(self.id, self.stream.name, self.credit, self.consumed, self.chunk,
                                  committed - self.chunk, self.properties)


class StreamConnection(FrontEnd):
    """Also what the management API lists as a connection (the attributes it reads), and a ``StreamListener`` of
    every stream it writes to or reads from."""

    kind = "stream"
    protocol = "stream"  # as rabbit_stream_reader reports it (i(protocol, ...)), the API and its UI show it
    auth_mechanism = "PLAIN"
    ssl_object = None
    channels: dict[int, Any] = {}
    channel_max = 0

    def __init__(self, broker: "Broker", manager: StreamManager, config: "Config", flow: "PublisherFlow",
                 clients: "Clients") -> None:
        super().__init__(clients.handshakes, complaints, config.write_buffer_high)
        self.broker = broker
        self.manager = manager
        self.config = config
        self.flow = flow
        self.clients = clients
        self.loop = asyncio.get_running_loop()
        self._socket: socket.socket | None = None  # the client's, written directly while the transport has nothing
        self.state = AWAIT_LOGIN
        self.buf = bytearray()
        self.out: list[bytes] = []
        self._flush_scheduled = False
        self.user: "User | None" = None
        self.vhost: "VHost | None" = None
        self.vhost_name = ""
        self.principal: "Principal | None" = None
        self.client_properties: dict[str, str] = {}
        self.frame_max = PRE_LOGIN_FRAME_MAX  # the largest frame taken now
        self._unframed = False  # a frame was refused: what follows cannot be told apart, and is not read
        self.heartbeat = 0
        self.exclusive_queues: set = set()
        self._waiting: asyncio.Task | None = None  # a command waiting for the cluster: what follows waits for it
        self.publishers: dict[int, StreamPublisher] = {}
        self.subscriptions: dict[int, Subscription] = {}
        self._pending: dict[Subscription, None] = {}  # subscriptions with something to send at the flush
        self._unsynced: deque[tuple[int, StreamPublisher, bytes]] = deque()  # (group commit, publisher, packed ids)
        self._confirms: dict[StreamPublisher, list[bytes]] = {}  # packed ids to confirm at the next flush
        self.publishing = False
        self.held = False
        self._correlation = 0
        self._received = True
        self._sent = False
        self._silent_ticks = 0
        self._timer: asyncio.TimerHandle | None = None
        self.recv_oct = self.recv_cnt = self.send_oct = self.send_cnt = 0
        self.connected_at = time.time()
        self.stats = MessageStats()  # counted per frame and per chunk, not per message

    # -- transport ----------------------------------------------------------------------------

    def opened(self) -> None:
        transport = self.transport
        assert transport is not None
        self._socket = direct_socket(transport)
        self.clients.add(self)

    def connection_lost(self, exc: Exception | None) -> None:
        self.state = CLOSED
        super().connection_lost(exc)
        if self._timer is not None:
            self._timer.cancel()
        for stream in {p.stream for p in self.publishers.values()} | {s.stream for s in self.subscriptions.values()}:
            stream.listeners.pop(self, None)
        self.publishers.clear()
        self.subscriptions.clear()
        self._pending.clear()
        self.broker.persistence.waiters.discard(self)
        self.buf = bytearray()
        self.out.clear()
        if self._socket is not None:
            self._socket.close()
            self._socket = None
        self.flow.gone(self)
        self.clients.remove(self)
        self.clients.fold(self.protocol, self.stats)
        if self.user is not None and self.vhost is not None:
            self.broker.limits.close_connection(self, self.vhost_name, self.user.name)

    def writable(self) -> None:
        for subscription in self.subscriptions.values():
            self._pending[subscription] = None
        self.schedule_flush()

    def read_on(self) -> None:
        if self._waiting is None:
            self._read_frames()

    # -- what the management API and the node ask --------------------------------------------

    @property
    def flow_state(self) -> str:
        if self.state != OPEN:
            return "closing"
        return "blocked" if self.held else "running"

    def force_close(self, reason: str) -> None:
        self._close(core.OK, reason)

    def listed_sessions(self) -> None:
        return None

    def listed_publishers(self) -> list[ListedPublisher]:
        return [publisher.listed() for publisher in self.publishers.values()]

    def listed_subscriptions(self) -> list[ListedSubscription]:
        return [subscription.listed() for subscription in self.subscriptions.values()]

    def message_stats(self) -> Iterable[MessageStats]:
        return (self.stats,)

    def drop_if_peer_gone(self) -> None:
        """(The memory alarm's sweep of paused connections: a stream connection it holds is dropped on close.)"""

    def hold(self, alarm: str | None) -> None:
        """A publisher while the node holds publishers (memory alarm, flow): not read."""
        self.held = True
        self.hold_reading(FLOW)

    def release(self) -> None:
        self.held = False
        self.release_reading(FLOW)

    # -- output -------------------------------------------------------------------------------

    def send(self, data: bytes) -> None:
        self.out.append(data)
        self.schedule_flush()

    def schedule_flush(self) -> None:
        if not self._flush_scheduled:
            self._flush_scheduled = True
            self.clients.schedule_flush(self)  # type: ignore[arg-type]  # Clients holds stream connections too (they answer what it asks)

    def flush(self) -> None:
        self._flush_scheduled = False
        if self._confirms:
            self._emit_confirms()
        self._write_out()
        if self._pending and self.state == OPEN:
            pending = list(self._pending)
            self._pending.clear()
            for subscription in pending:
                self._pump(subscription)
            if self._pending:  # more to send: after the socket took these, and other work had its turn
                self.loop.call_soon(self.schedule_flush)
            self._write_out()

    def _write_out(self) -> None:
        if self.out and self.transport is not None and not self.transport.is_closing():
            data = b"".join(self.out)
            self.transport.write(data)
            self.send_oct += len(data)
            self.send_cnt += 1
            self._sent = True
        self.out.clear()

    # -- input --------------------------------------------------------------------------------

    def data_received(self, data: bytes) -> None:
        self._received = True
        self.recv_oct += len(data)
        self.recv_cnt += 1
        if self.state >= CLOSED or self._unframed:
            return
        self.buf += data
        if self._waiting is None:
            self._read_frames()

    def _read_frames(self) -> None:
        """The frames in ``buf``, in order, while the client reads what they answer, ``FRAMES_PER_TURN`` at most;
        a command that waits for the cluster holds the ones after it."""
        buf = self.buf
        pos = 0
        size_of = core.SIZE.unpack_from
        budget = FRAMES_PER_TURN
        try:
            while len(buf) - pos >= 4 and self.state < CLOSED and self._waiting is None and not self.write_paused:
                budget -= 1
                if budget < 0:
                    self.next_turn()
                    break
                size = size_of(buf, pos)[0]
                if size > self.frame_max:
                    complaints.warning("stream connection %s: frame of %d bytes, above the %d taken", self.name,
                                       size, self.frame_max)
                    self._close(core.FRAME_TOO_LARGE, "frame too large")
                    self._unframed = True
                    pos = len(buf)
                    break
                if len(buf) - pos - 4 < size:
                    break
                start, end = pos + 4, pos + 4 + size
                pos = end
                if size < 4:
                    raise MalformedFrame("frame shorter than its key and version")
                key, version = core.HEAD.unpack_from(buf, start)
                self._frame(key, version, Fields(buf, start + 4, end))
        except MalformedFrame as exc:
            complaints.warning("stream connection %s: malformed frame (%s)", self.name, untrusted(exc))
            self._close(core.UNKNOWN_FRAME, "unknown frame")
            self._unframed = True
            pos = len(buf)
        except Exception:  # a bug must not take the node down
            complaints.internal("stream connection", self.name)
            self._close(core.INTERNAL_ERROR, "internal error")
            self._unframed = True
            pos = len(buf)
        del buf[:pos]
        if self.out or self._pending or self._confirms:
            self.schedule_flush()
        self.clients.flush()

    def _frame(self, key: int, version: int, fields: Fields) -> None:
        state = self.state
        if state == CLOSE_SENT:
            if key == core.CLOSE | core.RESPONSE:
                self._drop()
            elif key == core.CLOSE:
                self.send(core.response(core.CLOSE, fields.u32(), core.OK))
                self.flush()
                self._drop()
            return
        if key == core.HEARTBEAT:
            return
        if key == core.PUBLISH and state == OPEN:
            self._publish(version, fields)
            return
        handler = self._HANDLERS.get(key)
        if handler is None or (state != OPEN and key not in _BEFORE_OPEN) or (state == OPEN and key in _LOGIN):
            if key & core.RESPONSE and state == OPEN:
                return  # a response to something we asked (a close racing its own): nothing to do
            complaints.warning("stream connection %s: unknown or unexpected command %#06x", self.name, key)
            self._close(core.UNKNOWN_FRAME, "unknown frame")
            return
        handler(self, fields)

    # -- login --------------------------------------------------------------------------------

    def _peer_properties(self, fields: Fields) -> None:
        correlation = fields.u32()
        self.client_properties = fields.properties()
        fields.done()
        server = {"product": "RabbitMQ", "version": "3.10.8", "platform": "Warren " + __version__,
                  "copyright": "Warren contributors", "information": "Licensed under the MPL 2.0",
                  "cluster_name": self.broker.access.cluster_name(self.broker.node_name)}
        self.send(core.response(core.PEER_PROPERTIES, correlation, core.OK, core.properties(server)))

    def _sasl_handshake(self, fields: Fields) -> None:
        correlation = fields.u32()
        fields.done()
        offered = auth_mechanisms.offered(self.config, None)  # (no TLS on the stream port)
        self.send(core.response(core.SASL_HANDSHAKE, correlation, core.OK, core.strings(offered)))

    def _login_failed(self, correlation: int, code: int) -> None:
        """A failed sasl_authenticate is answered and the connection closed, as rabbit_stream_reader's step
        ``failure`` (an unknown mechanism, a malformed response, refused credentials)."""
        self.send(core.response(core.SASL_AUTHENTICATE, correlation, code))
        self.flush()
        self._drop()

    def _sasl_authenticate(self, fields: Fields) -> None:
        correlation = fields.u32()
        mechanism = fields.string()
        data = fields.bytes_()
        fields.done()
        if self.state != AWAIT_LOGIN:
            self._close(core.UNKNOWN_FRAME, "unknown frame")
            return
        if mechanism not in auth_mechanisms.offered(self.config, None):
            self._login_failed(correlation, core.SASL_MECHANISM_NOT_SUPPORTED)
            return
        try:  # the mechanisms AMQP's logins use (rabbit_stream_utils:auth_mechanism_to_module, the node's)
            username, user = auth_mechanisms.authenticate(self.broker.access, self.config, None, mechanism, data)
        except AMQPError:  # a response the mechanism cannot read: its protocol_error
            self.broker.auth_attempts.record("stream", False)
            self._login_failed(correlation, core.SASL_ERROR)
            return
        refused = loopback_refused(user, self.peer[0], self.config.loopback_users_only)
        self.broker.auth_attempts.record("stream", user is not None and not refused)
        if user is None or refused:
            self.clients.handshakes.log.warning("stream login refused for user %s from %s", untrusted(username),
                                                self.peer[0])
            self._login_failed(correlation, core.SASL_AUTHENTICATION_FAILURE_LOOPBACK if refused
                               else core.AUTHENTICATION_FAILURE)
            return
        self.user = user
        self.auth_mechanism = mechanism
        self.state = AWAIT_TUNE
        self.send(core.response(core.SASL_AUTHENTICATE, correlation, core.OK))
        self.send(core.frame(core.TUNE, core.u32(self.config.stream_frame_max) + core.u32(self.config.heartbeat)))

    def _tune(self, fields: Fields) -> None:
        fields.u32()  # (the frame max: what a client sends is taken up to FRAME_LIMIT, whatever it is)
        heartbeat = fields.u32()
        fields.done()
        if self.state != AWAIT_TUNE:
            self._close(core.UNKNOWN_FRAME, "unknown frame")
            return
        self.heartbeat = heartbeat
        self.state = AWAIT_OPEN

    def _open(self, fields: Fields) -> None:
        correlation = fields.u32()
        name = fields.string()
        fields.done()
        if self.state != AWAIT_OPEN or self.user is None:
            self._close(core.UNKNOWN_FRAME, "unknown frame")
            return
        access = self.broker.access
        principal = access.principal(name, self.user.name) if access.vhost_exists(name) else None
        if principal is None or principal.permissions is None:
            complaints.warning("stream connection %s: access to vhost %s refused for user %s", self.name,
                               untrusted(name), untrusted(self.user.name))
            self.send(core.response(core.OPEN, correlation, core.VHOST_ACCESS_FAILURE))
            self.flush()
            self._drop()
            return
        try:
            self.broker.limits.open_connection(self, name, self.user.name)
        except AMQPError:
            self.send(core.response(core.OPEN, correlation, core.VHOST_ACCESS_FAILURE))
            self.flush()
            self._drop()
            return
        self.vhost = self.broker.vhost(name)
        self.vhost_name = name
        self.principal = principal
        self.frame_max = FRAME_LIMIT
        self.state = OPEN
        self.logged_in()
        if self.heartbeat:
            self._timer = self.loop.call_later(self.heartbeat, self._heartbeat_tick)
        advertised = {"advertised_host": self._advertised_host(),
                      "advertised_port": str(self.config.stream_advertised_port or self.config.stream_port)}
        self.send(core.response(core.OPEN, correlation, core.OK, core.properties(advertised)))

    def _advertised_host(self) -> str:
        """The host open and metadata name for this node (``Config.stream_host``), else the address this client
        reached."""
        return self.config.stream_host or self._local_host()

    def _local_host(self) -> str:
        sock = self.transport.get_extra_info("sockname") if self.transport is not None else None
        return str(sock[0]) if sock else "localhost"

    def _close_request(self, fields: Fields) -> None:
        correlation = fields.u32()
        fields.u16()
        fields.string()
        self.send(core.response(core.CLOSE, correlation, core.OK))
        self.flush()
        self._drop()

    # -- streams ------------------------------------------------------------------------------

    def _who(self) -> "Principal":
        assert self.principal is not None
        return self.principal

    def _create(self, fields: Fields) -> None:
        correlation = fields.u32()
        name = fields.string()
        arguments = fields.properties()
        fields.done()
        self._wait_for(self._created(correlation, name, arguments))

    async def _created(self, correlation: int, name: str, arguments: dict[str, str]) -> None:
        try:
            await self.manager.create(self.vhost_name, name, arguments, self._who())
        except StreamError as exc:
            self.send(core.response(core.CREATE, correlation, exc.code))
            return
        self.send(core.response(core.CREATE, correlation, core.OK))

    def _wait_for(self, operation: Any) -> None:
        """Run ``operation`` (a coroutine); frames after this one wait until it is done, unread meanwhile."""
        self._waiting = self.loop.create_task(operation)
        self.hold_reading(WAITING)

        def done(task: asyncio.Task) -> None:
            self._waiting = None
            if not task.cancelled() and task.exception() is not None:
                complaints.warning("stream connection %s: %s", self.name, untrusted(task.exception()))
                self._close(core.INTERNAL_ERROR, "internal error")
            if self.state < CLOSED:
                self.release_reading(WAITING)
                self._read_frames()

        self._waiting.add_done_callback(done)

    def _delete(self, fields: Fields) -> None:
        correlation = fields.u32()
        name = fields.string()
        fields.done()
        self._answer(core.DELETE, correlation, lambda: self.manager.delete(self.vhost_name, name, self._who()))

    def _answer(self, key: int, correlation: int, operation: Callable[[], None]) -> None:
        try:
            operation()
        except StreamError as exc:
            self.send(core.response(key, correlation, exc.code))
            return
        self.send(core.response(key, correlation, core.OK))

    def _metadata(self, fields: Fields) -> None:
        """Each stream's leader: this node (reference 0) for a stream that lives here; in cluster mode the node
        that owns it, at the stream address it registered (RabbitMQ's leader).  No replicas."""
        correlation = fields.u32()
        names = fields.strings()
        fields.done()
        cluster = self.broker.cluster
        brokers = {"": (0, self._advertised_host(),
                        self.config.stream_advertised_port or self.config.stream_port)}
        streams = []
        for name in dict.fromkeys(names):
            where = self.manager.locate(self.vhost_name, name)
            address = cluster.stream_address(where) if where and cluster is not None else None
            if where is not None and where not in brokers and address is not None:
                brokers[where] = (len(brokers), *address)
            if where is not None and where in brokers:
                streams.append(core.string(name) + core.u16(core.OK) + core.u16(brokers[where][0]) + core.u32(0))
            else:  # no such stream; or its node serves no stream protocol, or is not known to be up
                code = core.STREAM_DOES_NOT_EXIST if where is None else core.STREAM_NOT_AVAILABLE
                streams.append(core.string(name) + core.u16(code) + core.u16(0xFFFF) + core.u32(0))
        body = [core.u32(correlation), core.u32(len(brokers))]
        body.extend(core.u16(reference) + core.string(host) + core.u32(port) for reference, host, port in
                    brokers.values())
        body.append(core.u32(len(streams)))
        self.send(core.frame(core.METADATA | core.RESPONSE, b"".join(body + streams)))

    def _route(self, fields: Fields) -> None:
        correlation = fields.u32()
        routing_key = fields.string()
        super_stream = fields.string()
        fields.done()
        try:
            streams = self.manager.route(self.vhost_name, super_stream, routing_key, self._who())
        except StreamError as exc:
            self.send(core.response(core.ROUTE, correlation, exc.code, core.strings([])))
            return
        self.send(core.response(core.ROUTE, correlation, core.OK, core.strings(streams)))

    def _partitions(self, fields: Fields) -> None:
        correlation = fields.u32()
        super_stream = fields.string()
        fields.done()
        try:
            streams = self.manager.partitions(self.vhost_name, super_stream, self._who())
        except StreamError as exc:
            self.send(core.response(core.PARTITIONS, correlation, exc.code, core.strings([])))
            return
        self.send(core.response(core.PARTITIONS, correlation, core.OK, core.strings(streams)))

    # -- publishing ---------------------------------------------------------------------------

    def _declare_publisher(self, fields: Fields) -> None:
        correlation = fields.u32()
        publisher_id = fields.u8()
        reference = fields.string()
        name = fields.string()
        fields.done()
        try:  # in rabbit_stream_reader's order: the disk alarm (a clause of its own), permission, the ids, the stream
            if self.flow.alarmed(DISK):
                raise StreamError(core.PRECONDITION_FAILED)
            if len(reference.encode()) > core.MAX_REFERENCE:
                raise StreamError(core.PRECONDITION_FAILED)
            self.manager.permit("write", self.vhost_name, name, self._who())
            if publisher_id in self.publishers or (reference and any(
                    p.reference == reference and p.stream.name == name for p in self.publishers.values())):
                raise StreamError(core.PRECONDITION_FAILED)
            stream = self.manager.find(self.vhost_name, name)
        except StreamError as exc:
            self.send(core.response(core.DECLARE_PUBLISHER, correlation, exc.code))
            return
        self.publishers[publisher_id] = StreamPublisher(publisher_id, reference, stream)
        stream.listeners[self] = None
        self.send(core.response(core.DECLARE_PUBLISHER, correlation, core.OK))

    def _delete_publisher(self, fields: Fields) -> None:
        correlation = fields.u32()
        publisher_id = fields.u8()
        fields.done()
        publisher = self.publishers.pop(publisher_id, None)
        if publisher is None:
            self.send(core.response(core.DELETE_PUBLISHER, correlation, core.PUBLISHER_DOES_NOT_EXIST))
            return
        self._forget(publisher.stream)
        self.send(core.response(core.DELETE_PUBLISHER, correlation, core.OK))

    def _query_publisher_sequence(self, fields: Fields) -> None:
        correlation = fields.u32()
        reference = fields.string()
        name = fields.string()
        fields.done()
        try:
            stream = self.manager.for_("read", self.vhost_name, name, self._who())
        except StreamError as exc:
            self.send(core.response(core.QUERY_PUBLISHER_SEQUENCE, correlation, exc.code, core.u64(0)))
            return
        sequence = self.manager.writers(stream).get(reference, 0)
        self.send(core.response(core.QUERY_PUBLISHER_SEQUENCE, correlation, core.OK, core.u64(sequence)))

    def _publish(self, version: int, fields: Fields) -> None:
        """publish (v1; v2 carries a filter value per message, read and ignored): the frame's messages are the chunks
        osiris's writer cuts, their entries as they came (a sub-batch stays as the client compressed it), written
        at once and confirmed after the group commit's fsync.  A named publisher's messages whose publishing id is
        not above the stream's last for its name (whichever connection wrote it: osiris_writer's tracking) are
        confirmed, not written; each chunk's trailer holds its last id there."""
        publisher_id = fields.u8()
        count = fields.count(12)
        self.stats.publish += count
        publisher = self._counted(publisher_id, count)
        if not self.publishing:
            self.publishing = True
            self.flow.publishing(self)
        buf, pos, end = fields.buf, fields.pos, fields.end
        stream = publisher.stream if publisher is not None else None
        dedup = publisher is not None and bool(publisher.reference)
        last = NONE_YET
        if publisher is not None and publisher.reference and not publisher.stream.deleted:
            last = self.manager.writers(publisher.stream).get(publisher.reference, NONE_YET)
        if version == 1 and stream is not None and not stream.deleted and stream.writable():
            uniform = _uniform(buf, pos, end, count, last if dedup else None)
            if uniform is not None:
                assert publisher is not None
                self._write_uniform(publisher, stream, count, *uniform, dedup)
                return
        ids: list[int] = []  # written: confirmed once on disk
        duplicates: list[int] = []
        spans: list[tuple[int, int]] = []  # each written entry's place in the frame
        sub_batches = 0
        unpack = _ID_SIZE.unpack_from
        for _ in range(count):
            if pos + 12 > end:
                raise MalformedFrame("publish frame too short")
            publishing_id, size = unpack(buf, pos)
            start = pos + 8
            if version >= 2:  # a filter value (RabbitMQ 3.13) before the entry
                fields.pos = start
                fields.string()
                start = fields.pos
                if start + 4 > end:
                    raise MalformedFrame("publish frame too short")
                size = _ENTRY.unpack_from(buf, start)[0]
            sub_batch = size & 0x80000000
            if sub_batch:
                if start + chunk.SUB_BATCH.size > end:
                    raise MalformedFrame("sub-batch too short")
                _type, in_batch, _uncompressed, stored = chunk.SUB_BATCH.unpack_from(buf, start)
                if not in_batch:
                    raise MalformedFrame("sub-batch of no records")
                pos = start + chunk.SUB_BATCH.size + stored
            else:
                pos = start + 4 + size
            if pos > end:
                raise MalformedFrame("message runs past the frame")
            if dedup and publishing_id <= last:
                duplicates.append(publishing_id)
                continue
            spans.append((start, pos))
            ids.append(publishing_id)
            if sub_batch:
                sub_batches += 1
            last = publishing_id
        if pos != end:
            raise MalformedFrame("bytes left over in the publish frame")
        if publisher is None or stream is None or stream.deleted or not stream.writable():
            code = core.PUBLISHER_DOES_NOT_EXIST if publisher is None else core.STREAM_DOES_NOT_EXIST \
                if stream is None or stream.deleted else core.INTERNAL_ERROR
            self._publish_errors(publisher_id, [(pid, code) for pid in ids + duplicates])
            return
        if spans:
            self._write(publisher, stream, buf, spans, ids, sub_batches, last if dedup else None)
        if duplicates:
            self._confirms.setdefault(publisher, []).append(struct.pack(f">{len(duplicates)}Q", *duplicates))
        if ids:
            self._to_confirm(publisher, struct.pack(f">{len(ids)}Q", *ids))

    def _counted(self, publisher_id: int, count: int) -> StreamPublisher | None:
        """The frame's publisher if it was declared, its ``count`` messages counted published (rabbit_stream_reader
        counts them as the frame comes, whether they are written or refused)."""
        publisher = self.publishers.get(publisher_id)
        if publisher is not None:
            publisher.published += count
        return publisher

    def _write_uniform(self, publisher: StreamPublisher, stream: StreamQueue, count: int, ids: bytes, data: bytes,
                       size: int, last: int, dedup: bool) -> None:
        """A frame ``_uniform`` took apart: its ``count`` entries of ``size`` bytes in the chunks osiris's writer
        cuts (slices of ``data``, written with one write), ``ids`` confirmed once they are on disk."""
        stride = 4 + size
        view = memoryview(data)
        reference = publisher.reference.encode()
        rising = np.frombuffer(ids, ">u8") if dedup else None
        chunks: list[tuple[bytes | memoryview, int, int, int, bytes]] = []
        at = 0
        for n in stream.log.batches(count):
            end = at + n
            trailer = chunk.writer_trailer(reference, int(rising[end - 1])) if rising is not None else b""
            chunks.append((view[at * stride:end * stride], n, n, n * size, trailer))
            at = end
        stream.append_chunks(chunks)
        if dedup:
            stream.log.wrote(publisher.reference, last)
        self._to_confirm(publisher, ids)

    def _to_confirm(self, publisher: StreamPublisher, ids: bytes) -> None:
        """Publishing ids (packed) written: confirmed once the group commit that has them is on disk."""
        persistence = self.broker.persistence
        if persistence.staged:
            self._unsynced.append((persistence.batch, publisher, ids))
            persistence.waiters.add(self)
        else:
            self._confirms.setdefault(publisher, []).append(ids)

    def _write(self, publisher: StreamPublisher, stream: StreamQueue, buf: bytes | bytearray | memoryview,
               spans: list[tuple[int, int]], ids: list[int], sub_batches: int, last: int | None) -> None:
        """The entries at ``spans`` of the frame in ``buf`` (publishing ids ``ids``) in the chunks osiris's writer
        cuts, written with one write; with ``last`` (a named publisher's), each chunk's trailer holds its last
        id."""
        reference = publisher.reference.encode()
        chunks: list[tuple[bytes | memoryview, int, int, int, bytes]] = []
        at = 0
        with memoryview(buf) as view:
            for n in stream.log.batches(len(spans)):
                part = spans[at:at + n]
                data = b"".join([view[a:b] for a, b in part])
                records, in_sub_batches = n, 0
                if sub_batches:
                    for a, _ in part:
                        if buf[a] & 0x80:
                            records += chunk.SUB_BATCH.unpack_from(buf, a)[1] - 1
                            in_sub_batches += 1
                body = len(data) - 4 * (n - in_sub_batches) - chunk.SUB_BATCH.size * in_sub_batches
                trailer = chunk.writer_trailer(reference, ids[at + n - 1]) if last is not None else b""
                chunks.append((data, n, records, body, trailer))
                at += n
        stream.append_chunks(chunks)
        if last is not None:
            stream.log.wrote(publisher.reference, last)

    def _publish_errors(self, publisher_id: int, errors: list[tuple[int, int]]) -> None:
        publisher = self.publishers.get(publisher_id)
        if publisher is not None:
            publisher.errored += len(errors)
        body = core.u8(publisher_id) + core.u32(len(errors)) + b"".join(
            core.u64(pid) + core.u16(code) for pid, code in errors)
        self.send(core.frame(core.PUBLISH_ERROR, body))

    def synced(self, batch: int) -> None:
        """Group commit ``batch`` is on disk: what waited for it is confirmed."""
        unsynced = self._unsynced
        while unsynced and unsynced[0][0] <= batch:
            _, publisher, ids = unsynced.popleft()
            if self.publishers.get(publisher.id) is publisher:
                self._confirms.setdefault(publisher, []).append(ids)
        if not unsynced:
            self.broker.persistence.waiters.discard(self)
        self.schedule_flush()

    def refused(self, batch: int) -> None:
        """Group commit ``batch`` failed: what waited for it gets a publish error (internal error)."""
        unsynced = self._unsynced
        while unsynced and unsynced[0][0] <= batch:
            _, publisher, ids = unsynced.popleft()
            if self.publishers.get(publisher.id) is publisher:
                self._publish_errors(publisher.id, [(pid, core.INTERNAL_ERROR)
                                                    for pid in struct.unpack(f">{len(ids) // 8}Q", ids)])
        if not unsynced:
            self.broker.persistence.waiters.discard(self)
        self.schedule_flush()

    def _emit_confirms(self) -> None:
        for publisher, blocks in self._confirms.items():
            ids = b"".join(blocks)
            self.out.append(_CONFIRM_HEAD.pack(9 + len(ids), core.PUBLISH_CONFIRM, 1, publisher.id, len(ids) // 8))
            self.out.append(ids)
            self.stats.confirm += len(ids) // 8
            publisher.confirmed += len(ids) // 8
        self._confirms.clear()

    # -- consuming ----------------------------------------------------------------------------

    def _subscribe(self, fields: Fields) -> None:
        correlation = fields.u32()
        subscription_id = fields.u8()
        name = fields.string()
        offset_type = fields.u16()
        if offset_type in (core.OFFSET_OFFSET, core.OFFSET_TIMESTAMP):
            value = fields.u64() if offset_type == core.OFFSET_OFFSET else fields.i64()
        elif offset_type in (core.OFFSET_FIRST, core.OFFSET_LAST, core.OFFSET_NEXT):
            value = 0
        else:
            raise MalformedFrame("unknown offset specification")
        credit = fields.u16()
        properties = fields.properties()  # (single-active-consumer, super-stream: RabbitMQ 3.11; 3.10 lists them)
        fields.done()
        try:  # in rabbit_stream_reader's order: permission, the stream, the id
            stream = self.manager.for_("read", self.vhost_name, name, self._who())
            if subscription_id in self.subscriptions:
                raise StreamError(core.SUBSCRIPTION_ID_ALREADY_EXISTS)
        except StreamError as exc:
            self.send(core.response(core.SUBSCRIBE, correlation, exc.code))
            return
        if offset_type in _SPECS:
            start = stream.attach_at(_SPECS[offset_type])
        elif offset_type == core.OFFSET_OFFSET:
            start = stream.attach_at(value)
        else:
            ms = min(max(value, 0), _LAST_MS)  # (any i64 is taken, as RabbitMQ takes it)
            start = stream.attach_at(datetime.datetime.fromtimestamp(ms / 1000, datetime.timezone.utc))
        subscription = self.subscriptions[subscription_id] = Subscription(subscription_id, stream, start, credit,
                                                                                  properties)
        stream.listeners[self] = None
        self.send(core.response(core.SUBSCRIBE, correlation, core.OK))
        self._pending[subscription] = None

    def _credit(self, fields: Fields) -> None:
        subscription_id = fields.u8()
        credit = fields.u16()
        fields.done()
        subscription = self.subscriptions.get(subscription_id)
        if subscription is None:
            self.send(core.SIZE.pack(7) + core.HEAD.pack(core.CREDIT | core.RESPONSE, 1)
                      + core.u16(core.SUBSCRIPTION_ID_DOES_NOT_EXIST) + core.u8(subscription_id))
            return
        subscription.credit = min(subscription.credit + credit, 0xFFFF)
        self._pending[subscription] = None

    def _unsubscribe(self, fields: Fields) -> None:
        correlation = fields.u32()
        subscription_id = fields.u8()
        fields.done()
        subscription = self.subscriptions.pop(subscription_id, None)
        if subscription is None:
            self.send(core.response(core.UNSUBSCRIBE, correlation, core.SUBSCRIPTION_ID_DOES_NOT_EXIST))
            return
        self._pending.pop(subscription, None)
        self._forget(subscription.stream)
        self.send(core.response(core.UNSUBSCRIBE, correlation, core.OK))

    def _store_offset(self, fields: Fields) -> None:
        reference = fields.string()
        name = fields.string()
        offset = fields.u64()
        fields.done()
        if len(reference.encode()) > core.MAX_REFERENCE:  # RabbitMQ 3.10.8's osiris fails it, and the connection
            self._close(core.PRECONDITION_FAILED, f"reference longer than {core.MAX_REFERENCE} bytes")
            return
        if not reference:
            return
        try:
            stream = self.manager.for_("write", self.vhost_name, name, self._who())
        except StreamError:
            return  # no response to store_offset, as in RabbitMQ
        self.manager.store_offset(stream, reference, offset)

    def _query_offset(self, fields: Fields) -> None:
        correlation = fields.u32()
        reference = fields.string()
        name = fields.string()
        fields.done()
        try:
            stream = self.manager.for_("read", self.vhost_name, name, self._who())
            offset = self.manager.offset(stream, reference)
            if offset is None:
                raise StreamError(core.NO_OFFSET)
        except StreamError as exc:
            self.send(core.response(core.QUERY_OFFSET, correlation, exc.code, core.u64(0)))
            return
        self.send(core.response(core.QUERY_OFFSET, correlation, core.OK, core.u64(offset)))

    def _pump(self, subscription: Subscription) -> None:
        """Send chunks while the subscription has credit, its stream has more and the socket takes them: from the
        segment file, a run of chunks side by side there (each below ``RUN_BELOW``) read at once and written with
        one ``writev``, a chunk alone with ``sendfile`` where the transport has nothing waiting.  At most
        ``TURN_CHUNKS`` chunks or ``TURN_BYTES`` per loop turn: a large credit does not read a stream at once."""
        stream_log = subscription.stream.log
        sent = chunks = 0
        while chunks < TURN_CHUNKS and sent < TURN_BYTES:
            if not (subscription.credit > 0 and not self.write_paused
                    and self.subscriptions.get(subscription.id) is subscription):
                return
            found = stream_log.find(max(subscription.offset, stream_log.first))
            if found is None:
                subscription.offset = max(subscription.offset, stream_log.first)
                return
            segment, i = found
            run = stream_log.rows(segment)[i:i + min(subscription.credit, TURN_CHUNKS - chunks, segment.count - i)]
            sizes = run["sent"].astype(np.int64)
            taken = int(np.searchsorted(np.cumsum(sizes), TURN_BYTES - sent, "left")) + 1  # the one reaching it too
            large = np.flatnonzero(sizes[:taken] >= RUN_BELOW)
            if len(large):  # a large chunk goes alone, by sendfile
                taken = max(int(large[0]), 1)
            run = run[:taken]
            fd = stream_log.fd(segment)
            if len(run) == 1:
                chunk_id, _ts, pos, records, size, _whole, _body = run[0].item()
                self._send_chunk(_DELIVER_HEAD.pack(size + 5, core.DELIVER, 1, subscription.id), fd, pos, size)
                sent_records = records
            else:
                self._send_run(subscription.id, fd, run)
                chunk_id, records = int(run[-1]["id"]), int(run[-1]["records"])
                size = int(sizes[:len(run)].sum())
                sent_records = int(run["records"].sum())
            self.stats.deliver_no_ack += sent_records
            subscription.consumed += sent_records
            subscription.chunk = chunk_id
            subscription.offset = chunk_id + records
            subscription.credit -= len(run)
            chunks += len(run)
            sent += size
        self._pending[subscription] = None  # the turn's share sent: the rest at the next

    def _send_run(self, subscription_id: int, fd: int, run: np.ndarray) -> None:
        """Deliver frames of chunks that lie one after the other in the segment file ``fd`` (index rows ``run``):
        one read of them all (their trailers too, which are not sent), one ``writev`` of their frames."""
        positions, sizes = run["pos"].tolist(), run["sent"].tolist()
        start = positions[0]
        data = memoryview(os.pread(fd, positions[-1] + sizes[-1] - start, start))
        parts: list[Part] = []
        pack = _DELIVER_HEAD.pack
        for pos, size in zip(positions, sizes):
            parts.append(pack(size + 5, core.DELIVER, 1, subscription_id))
            parts.append(data[pos - start:pos - start + size])
        self.send_oct += sum(sizes) + _DELIVER_HEAD.size * len(sizes)
        self.send_cnt += len(sizes)
        self._sent = True
        self._send(parts)

    def _send_chunk(self, head: bytes, fd: int, pos: int, size: int) -> None:
        """A deliver frame: ``head``, then ``size`` bytes of the segment file ``fd`` at ``pos`` (by ``sendfile``
        where it is large)."""
        self.send_oct += len(head) + size
        self.send_cnt += 1
        self._sent = True
        self._send([head, FileRange(fd, pos, size) if size >= SENDFILE_FROM else os.pread(fd, size, pos)])

    def _send(self, parts: list[Part]) -> None:
        """Straight to the socket while the transport has nothing waiting; what the socket does not take (all of
        it otherwise) read and written through the transport."""
        transport = self.transport
        if transport is None or transport.is_closing():
            return
        written = 0
        if self._socket is not None and not transport.get_write_buffer_size():
            written = write_direct(self._socket, parts)
        if written < sum(map(len, parts)):
            transport.write(read_rest(parts, written))

    # -- what the streams tell ----------------------------------------------------------------

    def appended(self, stream: StreamQueue) -> None:
        for subscription in self.subscriptions.values():
            if subscription.stream is stream and subscription.credit:
                if subscription not in self._pending:
                    self._pending[subscription] = None
                    self.schedule_flush()

    def deleted(self, stream: StreamQueue) -> None:
        """RabbitMQ's metadata update: the stream is not available any more; what used it here goes."""
        for publisher_id in [p.id for p in self.publishers.values() if p.stream is stream]:
            del self.publishers[publisher_id]
        for subscription_id in [s.id for s in self.subscriptions.values() if s.stream is stream]:
            self._pending.pop(self.subscriptions.pop(subscription_id), None)
        update = core.frame(core.METADATA_UPDATE, core.u16(core.STREAM_NOT_AVAILABLE) + core.string(stream.name))
        self.loop.call_soon(self.send, update)  # after the answer to a delete of this connection's

    def _forget(self, stream: StreamQueue) -> None:
        """Stop listening to a stream nothing here uses any more."""
        if not any(p.stream is stream for p in self.publishers.values()) and \
                not any(s.stream is stream for s in self.subscriptions.values()):
            stream.listeners.pop(self, None)

    # -- closing ------------------------------------------------------------------------------

    def _close(self, code: int, reason: str) -> None:
        """Close request to the client; the socket goes when it answers, or after CLOSE_TIMEOUT."""
        if self.state >= CLOSE_SENT:
            return
        self.state = CLOSE_SENT
        self._correlation += 1
        self.send(core.frame(core.CLOSE, core.u32(self._correlation) + core.u16(code) + core.string(reason)))
        self.flush()
        if self._timer is not None:
            self._timer.cancel()
        self._timer = self.loop.call_later(CLOSE_TIMEOUT, self._drop)

    def _drop(self) -> None:
        if self.transport is not None:
            self.transport.close()
        self.state = CLOSED

    def _heartbeat_tick(self) -> None:
        if self.state != OPEN:
            return
        self._silent_ticks = 0 if self._received else self._silent_ticks + 1
        self._received = False
        if not self._sent:
            self.send(core.frame(core.HEARTBEAT))
            self.flush()
        self._sent = False
        if self._silent_ticks >= 2:
            log.warning("stream connection %s: missed heartbeats, timeout %d s", self.name, self.heartbeat)
            self._drop()
            return
        self._timer = self.loop.call_later(self.heartbeat, self._heartbeat_tick)

    _HANDLERS: dict[int, Callable[["StreamConnection", Fields], None]] = {
        core.PEER_PROPERTIES: _peer_properties, core.SASL_HANDSHAKE: _sasl_handshake,
        core.SASL_AUTHENTICATE: _sasl_authenticate, core.TUNE: _tune, core.OPEN: _open,
        core.CLOSE: _close_request, core.CREATE: _create, core.DELETE: _delete, core.METADATA: _metadata,
        core.ROUTE: _route, core.PARTITIONS: _partitions, core.DECLARE_PUBLISHER: _declare_publisher,
        core.DELETE_PUBLISHER: _delete_publisher, core.QUERY_PUBLISHER_SEQUENCE: _query_publisher_sequence,
        core.SUBSCRIBE: _subscribe, core.CREDIT: _credit, core.UNSUBSCRIBE: _unsubscribe,
        core.STORE_OFFSET: _store_offset, core.QUERY_OFFSET: _query_offset,
    }


_LOGIN = frozenset({core.PEER_PROPERTIES, core.SASL_HANDSHAKE, core.SASL_AUTHENTICATE, core.TUNE, core.OPEN})
_BEFORE_OPEN = _LOGIN | {core.CLOSE}


async def start(broker: "Broker", config: "Config", flow: "PublisherFlow", clients: "Clients"
                ) -> tuple[asyncio.AbstractServer, StreamManager]:
    """Listen on the stream port."""
    manager = StreamManager(broker)
    loop = asyncio.get_running_loop()
    server = await loop.create_server(lambda: StreamConnection(broker, manager, config, flow, clients),
                                      config.bind, config.stream_port, reuse_address=True, backlog=1024)
    return server, manager
