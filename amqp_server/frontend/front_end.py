"""What every front end's connections need, written once: AMQP 0-9-1 (``amqp091/connection.py``), the stream protocol
(``stream/reader.py``) and the cluster link (``forwarder/peers/node_link.py``) are :class:`FrontEnd` subclasses; the
management port's gate (``mgmt_http/gate.py``) shares the pre-login pool and the TLS accept.

- **Pre-login limits.**  Until its peer has proved who it is, a connection is one of :class:`Unauthenticated`'s:
  a deadline, and at most ``cap`` at once across every port that shares the pool (the node's client ports share
  one; one connection too many closes the one that has waited longest, so peers trickling bytes cannot keep out a
  client that logs in at once).  A TLS port counts a connection from accept: its handshake runs inside the pool
  (:func:`accept_tls`), not before it.  Before login the protocol reads frames of at most its pre-login size, and
  its output may buffer ``PRELOGIN_WRITE_HIGH`` bytes before reading stops.
- **Back-pressure on reads.**  A connection is read only while nothing holds it (:meth:`FrontEnd.hold_reading`):
  its writes are full (the peer does not read what it asked for), a publisher is held by the node's flow, a
  command awaits the cluster, or a read's work was spent.  Frames already read wait with the socket.
- **Bounded work per read.**  A frame loop handles at most ``FRAMES_PER_TURN`` frames, then yields the loop
  (:meth:`FrontEnd.next_turn`) with reading held until it is back.
- **What the management API lists.**  A client connection (AMQP 0-9-1's, the stream protocol's) is a
  :class:`ClientConnection`, its channels :class:`ListedChannel`: the node and the HTTP API reach them through these,
  and the API imports neither front end.  The cluster link is not one: RabbitMQ's API lists no inter-node connection.
- **An error path that never raises.**  :class:`Complaints` logs refusals a few lines a second and internal
  errors with a traceback once a second, untrusted text quoted and cut, and swallows whatever logging raises
  (with no file descriptor left, rendering a traceback does).
"""
from __future__ import annotations

import asyncio
import ctypes
import logging
import socket
import ssl
import threading
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, ClassVar, Iterable, Mapping, Protocol, Sized, cast

from .. import tls
from ..framing.file_out import FileSender
from ..logs import Throttle, untrusted

READ_SIZE = 256 * 1024  # what one read takes (into the thread's read buffer, see read_buffer)
_reads = threading.local()  # the thread's read buffer (read_buffer)

# a bytearray grown to a size without zeroing what it sets aside (bytearray's only way to grow): what is read into it
# writes every octet, and zeroing them first cost 0.5 ms a MiB, as much as a copy
grow = ctypes.pythonapi.PyByteArray_Resize
grow.argtypes = (ctypes.py_object, ctypes.c_ssize_t)
grow.restype = ctypes.c_int


def read_buffer() -> memoryview:
    """The thread's read buffer, which its connections share: each read's bytes are copied out of it before the
    next read."""
    view = getattr(_reads, "view", None)
    if view is None:
        view = _reads.view = memoryview(bytearray(READ_SIZE))
    return view

if TYPE_CHECKING:
    from ..access_control import User
    from ..stats import MessageStats
    from ..broker.vhost import VHost

FRAMES_PER_TURN = 1024  # frames one read handles before the loop turns: others' work waits at most that long
BYTES_PER_TURN = 1 << 20  # and bytes of frames (the one crossing it too), for front ends whose frames are large
PRELOGIN_WRITE_HIGH = 64 * 1024  # output buffered for a peer not logged in before it is read no more
ACCEPT_RETRY = 1.0  # seconds before a TLS port that could not accept (EMFILE) tries again
BACKLOG = 1024
TRACEBACK_INTERVAL = 1.0  # seconds: at most one internal error's traceback each, the others a line

# why a connection is not read (FrontEnd.hold_reading): a bit each
WRITES_FULL = 1  # the peer does not read what it is sent
FLOW = 2  # a publisher while the node holds publishers (memory alarm, flow)
WAITING = 4  # a command awaits the cluster: what follows waits for it
TURN = 8  # the read's work is spent: on at the next loop turn
STOPPED = 16  # closing: nothing more is read
LEADERLESS = 32  # its publishes wait for a quorum queue's leader (``publisher_flow.LEADER_WAITS``)
EVERY_REASON = WRITES_FULL | FLOW | WAITING | TURN | STOPPED | LEADERLESS


class Complaints:
    """One front end's log of what its peers did wrong and of its own internal errors: a few lines a second of
    refusals, a traceback at most once a second, and nothing raised whatever logging meets."""

    def __init__(self, logger: logging.Logger) -> None:
        self.logger = logger
        self.refusals = Throttle(logger)
        self._traced = -TRACEBACK_INTERVAL  # when a traceback was last logged

    def warning(self, msg: str, *args: Any) -> None:
        try:
            self.refusals.warning(msg, *args)
        except Exception:  # noqa: BLE001 - the error path must not become an error
            pass

    def internal(self, what: str, name: str) -> None:
        """An internal error (a bug) on connection ``name``, called in the ``except`` that caught it."""
        try:
            now = time.monotonic()
            if now - self._traced < TRACEBACK_INTERVAL:
                self.refusals.warning("internal error on %s %s (its traceback left out: one a second)", what,
                                      untrusted(name))
                return
            self._traced = now
            self.logger.error("internal error on %s %s", what, untrusted(name), exc_info=True)
        except Exception:  # noqa: BLE001 - e.g. EMFILE while rich opens source files for the traceback
            pass


class Waiting(Protocol):
    def abandon(self) -> None:
        """Close the connection now (it timed out, or made room for a newer one)."""


class Unauthenticated:
    """The connections of one or more ports not logged in yet: each has ``timeout`` seconds to log in, and at most
    ``cap`` wait at once; one more closes the one that has waited longest."""

    def __init__(self, what: str, cap: int, timeout: float, logger: logging.Logger) -> None:
        self.what = what  # "client", "HTTP", "cluster link": for the log
        self.cap = cap
        self.timeout = timeout
        self.log = Complaints(logger)
        self._waiting: dict[Waiting, tuple[str, asyncio.TimerHandle]] = {}  # in the order they came
        self.timed_out = 0
        self.evicted = 0

    @property
    def waiting(self) -> int:
        return len(self._waiting)

    def enter(self, peer: Waiting, name: str) -> None:
        if peer in self._waiting:  # (handed over: it has its predecessor's place and deadline)
            return
        timer = asyncio.get_running_loop().call_later(self.timeout, self._time_out, peer)
        self._waiting[peer] = (name, timer)
        if len(self._waiting) > self.cap:
            oldest = next(iter(self._waiting))
            self.evicted += 1
            self.log.warning("%s connection %s closed in its handshake to make room: %d others are in theirs (the "
                             "most there may be)", self.what, self._waiting[oldest][0], self.cap)
            self._drop(oldest)

    def hand_over(self, old: Waiting, new: Waiting) -> None:
        """``new`` speaks for ``old``'s connection (another protocol's front end took it over): it takes its place
        and the deadline counted from accept, as RabbitMQ's one reader process keeps its handshake timer."""
        waiting = self._waiting.get(old)
        if waiting is None:
            return
        name, timer = waiting
        timer.cancel()
        handed = (name, asyncio.get_running_loop().call_at(timer.when(), self._time_out, new))
        self._waiting = {new if peer is old else peer: handed if peer is old else entry
                         for peer, entry in self._waiting.items()}

    def leave(self, peer: Waiting) -> None:
        """Logged in, or closed."""
        waiting = self._waiting.pop(peer, None)
        if waiting is not None:
            waiting[1].cancel()

    def _time_out(self, peer: Waiting) -> None:
        if peer in self._waiting:
            self.timed_out += 1
            self.log.warning("%s connection %s closed: its handshake took more than %.0f s", self.what,
                             self._waiting[peer][0], self.timeout)
            self._drop(peer)

    def _drop(self, peer: Waiting) -> None:
        self.leave(peer)
        peer.abandon()


class _Handshake:
    """An accepted TLS connection in its handshake, counted in the pre-login pool: abandoned, it is closed."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.task: asyncio.Task[Any] | None = None
        self.started = False  # the socket is the handshake's transport's (which closes it when cancelled)

    def abandon(self) -> None:
        if self.task is not None:
            self.task.cancel()
        if not self.started:
            self.sock.close()


class TlsListener:
    """A TLS port whose connections count among those not logged in from accept, their handshake included
    (``create_server(ssl=...)`` makes the protocol only once the handshake is done, beyond any cap): each
    accepted socket enters ``pool`` and has its handshake run by ``connect_accepted_socket``, and the protocol
    ``factory`` makes then enters the pool in its turn (``FrontEnd.connection_made``)."""

    def __init__(self, factory: Callable[[], asyncio.BaseProtocol], sock: socket.socket, context: ssl.SSLContext,
                 pool: Unauthenticated) -> None:
        self.factory = factory
        self.sock = sock
        self.context = context
        self.pool = pool
        self.port = int(sock.getsockname()[1])
        self._accepting = asyncio.get_running_loop().create_task(self._accept())

    async def _accept(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            try:
                sock, address = await loop.sock_accept(self.sock)
            except OSError as exc:  # EMFILE and the like: accept again in a while, as asyncio's servers do
                self.pool.log.warning("TLS port %d cannot accept: %s", self.port, exc)
                await asyncio.sleep(ACCEPT_RETRY)
                continue
            handshake = _Handshake(sock)
            handshake.task = loop.create_task(self._handshake(handshake))
            self.pool.enter(handshake, f"{address[0]}:{address[1]} (TLS)")

    async def _handshake(self, handshake: _Handshake) -> None:
        handshake.started = True
        try:
            await asyncio.get_running_loop().connect_accepted_socket(
                self.factory, handshake.sock, ssl=self.context, ssl_handshake_timeout=tls.HANDSHAKE_TIMEOUT)
        except Exception as exc:  # noqa: BLE001 - whatever ended the handshake: a line, the port goes on
            self.pool.log.warning("TLS connection on port %d closed in its handshake: %s", self.port,
                                  untrusted(exc))
        finally:
            self.pool.leave(handshake)

    def close(self) -> None:
        self._accepting.cancel()
        self.sock.close()

    async def wait_closed(self) -> None:
        """(``asyncio.Server``'s, which aiohttp's sites await)"""


async def listen_tls(factory: Callable[[], asyncio.BaseProtocol], host: str, port: int, context: ssl.SSLContext,
                     pool: Unauthenticated) -> TlsListener:
    """Serve TLS on ``host:port`` (:class:`TlsListener`)."""
    loop = asyncio.get_running_loop()
    infos = await loop.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    family, kind, proto, _, address = infos[0]
    sock = socket.socket(family, kind, proto)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(address)
        sock.listen(BACKLOG)
        sock.setblocking(False)
    except OSError:
        sock.close()
        raise
    return TlsListener(factory, sock, context, pool)


class ChannelConnection(Protocol):
    """A channel's connection as the channel's listing names it."""

    @property
    def name(self) -> str: ...

    @property
    def peer(self) -> tuple[str, int]: ...

    @property
    def vhost_name(self) -> str: ...


@dataclass
class ListedLink:
    """An AMQP 1.0 link as the HTTP API lists it (RabbitMQ 4.x's ``/api/connections/{name}/sessions``)."""

    handle: int
    name: str
    address: str | None  # its target (the client sends) or source (the node sends)
    delivery_count: int
    credit: int
    settle_mode: int  # snd-settle-mode: 0 unsettled, 1 settled, 2 mixed
    queue: str = ""  # what a link the node sends on consumes
    unconfirmed: int = 0  # messages the client sent that have no outcome yet


@dataclass
class ListedSession:
    """An AMQP 1.0 session as the HTTP API lists it."""

    channel: int
    handle_max: int
    next_incoming_id: int
    incoming_window: int
    next_outgoing_id: int
    remote_incoming_window: int
    remote_outgoing_window: int
    outgoing_unsettled: int
    incoming: list[ListedLink] = field(default_factory=list)  # links the client sends on
    outgoing: list[ListedLink] = field(default_factory=list)  # links the node sends on


@dataclass
class ListedPublisher:
    """A stream-protocol publisher as the HTTP API lists it (rabbitmq_stream_management's publishers; the counts
    rabbit_stream_reader keeps of it: messages published to it, confirmed, and refused with a publish error)."""

    id: int
    reference: str
    stream: str
    published: int
    confirmed: int
    errored: int


@dataclass
class ListedSubscription:
    """A stream-protocol subscription as the HTTP API lists it (rabbitmq_stream_management's consumers):
    ``offset`` is the first offset of the chunk last sent (where it attached, before one is sent),
    ``offset_lag`` the newest chunk's first offset (-1 with none) less it, as rabbit_stream_reader counts them."""

    id: int
    stream: str
    credits: int
    consumed: int
    offset: int
    offset_lag: int
    properties: dict[str, str]


class ListedChannel(Protocol):
    """A client's channel as the management API lists it (``channel.Channel``)."""

    @property
    def connection(self) -> ChannelConnection: ...

    @property
    def number(self) -> int: ...

    @property
    def user(self) -> User: ...

    @property
    def flow_active(self) -> bool: ...

    @property
    def consumers(self) -> Sized: ...

    @property
    def unacked(self) -> Sized: ...

    @property
    def confirm_mode(self) -> bool: ...

    @property
    def publish_seq(self) -> int: ...

    @property
    def confirmed(self) -> int: ...

    @property
    def tx(self) -> Sized | None: ...

    @property
    def prefetch(self) -> int: ...

    @property
    def global_prefetch(self) -> int: ...

    @property
    def stats(self) -> MessageStats: ...


class ClientConnection(Protocol):
    """A client connection, AMQP 0-9-1's (``amqp091/connection.py``) or the stream protocol's (``stream/reader.py``,
    whose channels are none), as the node's registry (``clients.Clients``) holds it and the management API lists it."""

    @property
    def name(self) -> str: ...

    @property
    def protocol(self) -> str:
        """As RabbitMQ's API names it: "AMQP 0-9-1", "stream"."""

    @property
    def peer(self) -> tuple[str, int]: ...

    @property
    def transport(self) -> asyncio.Transport | None: ...

    @property
    def ssl_object(self) -> Any: ...

    @property
    def flow_state(self) -> str: ...

    @property
    def user(self) -> User | None: ...

    @property
    def vhost(self) -> VHost | None: ...

    @property
    def vhost_name(self) -> str: ...

    @property
    def auth_mechanism(self) -> str: ...

    @property
    def client_properties(self) -> dict[str, Any]: ...

    @property
    def channels(self) -> Mapping[int, ListedChannel]: ...

    @property
    def channel_max(self) -> int: ...

    @property
    def frame_max(self) -> int: ...

    @property
    def heartbeat(self) -> int: ...

    @property
    def connected_at(self) -> float: ...

    @property
    def recv_oct(self) -> int: ...

    @property
    def recv_cnt(self) -> int: ...

    @property
    def send_oct(self) -> int: ...

    @property
    def send_cnt(self) -> int: ...

    @property
    def reading_paused(self) -> bool: ...

    def listed_sessions(self) -> list[ListedSession] | None:
        """Its AMQP 1.0 sessions; None for a protocol without them (the API's 400)."""

    def listed_publishers(self) -> list[ListedPublisher]:
        """Its stream publishers (a protocol without them has none)."""

    def listed_subscriptions(self) -> list[ListedSubscription]:
        """Its stream subscriptions (a protocol without them has none)."""

    def message_stats(self) -> Iterable[MessageStats]:
        """The message counters of its live channels or sessions (or its own): what ``Registry.fold`` is given of
        each when it goes."""

    def drop_if_peer_gone(self) -> None:
        """Under a memory alarm: a connection read no more asks its socket whether its peer hung up, and lets go of
        what it holds if so."""

    def force_close(self, reason: str) -> None:
        """Close with 320 CONNECTION_FORCED and ``reason``."""


class Registry(Protocol):
    """The node's client connections (``clients.Clients``), which every front end's connection joins, leaves and
    flushes its output through."""

    handshakes: Unauthenticated  # the connections not logged in yet, on every port

    def add(self, connection: Any) -> None: ...

    def remove(self, connection: Any) -> None: ...

    def schedule_flush(self, connection: Any) -> None: ...

    def flush(self) -> None: ...

    def fold(self, protocol: str, stats: MessageStats) -> None:
        """Keep the counters of a channel, session or connection of ``protocol`` that is gone."""


class FrontEnd(asyncio.BaseProtocol):
    """One connection of a front end.  A subclass sets ``kind`` and the pre-login frame size it reads
    (``frame_max``, raised at login), implements :meth:`opened` (the connection is made, its TLS handshake done)
    and :meth:`read_on` (handle the frames already read), counts the frames it handles against
    ``FRAMES_PER_TURN`` and calls :meth:`next_turn` when they are spent, calls :meth:`logged_in` once its peer
    proved who it is, and calls ``super().connection_lost``."""

    kind: ClassVar[str] = "?"  # "AMQP", "stream", "cluster link": for the log
    pause_reads_on_full_writes: ClassVar[bool] = True

    def __init__(self, prelogin: Unauthenticated | None, complaints: Complaints, write_high: int) -> None:
        self.prelogin = prelogin
        self.complaints = complaints
        self.write_high = write_high  # output buffered once logged in before the peer is read no more
        self.transport: asyncio.Transport | None = None
        self.peer: tuple[str, int] = ("?", 0)
        self.name = "?"
        self.write_paused = False
        self._holds = 0  # why reading is paused (WRITES_FULL, FLOW…): read while none
        self._turn: asyncio.Handle | None = None
        self.files = FileSender()  # output behind a body in a file the socket did not take at once

    # -- life cycle ------------------------------------------------------------------------------

    def eof_received(self) -> bool | None:
        """(``asyncio.Protocol``'s: the transport closes.  A front end is no ``asyncio.Protocol``, so that one
        may read into buffers of its own, an ``asyncio.BufferedProtocol``.)"""
        return None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport = cast(asyncio.Transport, transport)  # a TCP connection's
        self.peer = transport.get_extra_info("peername") or ("?", 0)
        sock = transport.get_extra_info("sockname") or ("?", 0)
        self.name = f"{self.peer[0]}:{self.peer[1]} -> {sock[0]}:{sock[1]}"
        high = self.write_high if self.prelogin is None else min(self.write_high, PRELOGIN_WRITE_HIGH)
        transport.set_write_buffer_limits(high=high)
        if self.prelogin is not None:
            self.prelogin.enter(self, self.name)
        self.opened()

    def opened(self) -> None:
        """The connection is made (a TLS one's handshake done): ``self.transport`` is set."""

    def logged_in(self) -> None:
        """The peer proved who it is: out of the pre-login pool, and its output may buffer ``write_high``."""
        if self.prelogin is not None:
            self.prelogin.leave(self)
        if self.transport is not None:
            self.transport.set_write_buffer_limits(high=self.write_high)

    def connection_lost(self, exc: Exception | None) -> None:
        if self.prelogin is not None:
            self.prelogin.leave(self)
        if self._turn is not None:
            self._turn.cancel()
            self._turn = None
        self.files.close()

    def abandon(self) -> None:
        """Closed at once: not logged in within the deadline, or to make room for a newer connection."""
        if self.transport is not None:
            self.transport.abort()

    # -- reading ------------------------------------------------------------------------------

    @property
    def reading_paused(self) -> bool:
        return bool(self._holds)

    def hold_reading(self, reason: int) -> None:
        if not self._holds and self.transport is not None:
            self.transport.pause_reading()
        self._holds |= reason

    def release_reading(self, reason: int) -> None:
        """``reason`` (one or more) holds no more: read on if nothing else holds."""
        if not self._holds & reason:
            return
        self._holds &= ~reason
        if not self._holds and self.transport is not None and not self.transport.is_closing():
            self.transport.resume_reading()

    def pause_writing(self) -> None:
        """The peer reads slower than it is written to: it is read no more, and the frames already read wait."""
        self.write_paused = True
        if self.pause_reads_on_full_writes:
            self.hold_reading(WRITES_FULL)

    def resume_writing(self) -> None:
        self.write_paused = False
        self.release_reading(WRITES_FULL)
        self.writable()
        if self._turn is None:  # the frames read meanwhile: at the next turn, not inside the write that resumed us
            self._turn = asyncio.get_running_loop().call_soon(self._turned)

    def writable(self) -> None:
        """The peer caught up: output waiting behind a body in a file goes first, and once it has gone (the
        transport not full again), what waited for room to write (:meth:`drained`)."""
        if self.files:
            self.files.pump(self.transport, self.write_high)
            if self.write_paused:
                return
        self.drained()

    def drained(self) -> None:
        """What waited for room to write may go on."""

    def next_turn(self) -> None:
        """The frames one read may handle are spent and more are waiting: the rest at the next loop turn, the
        socket unread meanwhile."""
        if self._turn is None:
            self.hold_reading(TURN)
            self._turn = asyncio.get_running_loop().call_soon(self._turned)

    def _turned(self) -> None:
        self._turn = None
        self.release_reading(TURN)
        self.read_on()

    def read_on(self) -> None:
        """Handle the frames read and not handled yet, as far as the connection may now."""
