"""One AMQP 1.0 connection (RabbitMQ 4.x's rabbit_amqp_reader): SASL, open, sessions, close.

The AMQP port's connection (``connection.Connection``) hands its transport over when a client's first 8 bytes
are the SASL protocol header; from there this :class:`FrontEnd` owns it, still in the pre-login pool until its
``open`` is accepted.  Frames are read from one ``bytearray`` with an offset; a performative is decoded where it
lies, and only a transfer's payload is copied out.

The ``open`` frame says ``product: RabbitMQ`` and ``version: 4.2.0`` (and ``platform``/``information`` say
Warren): RabbitMQ's own AMQP 1.0 clients refuse a broker that does not say it is RabbitMQ 4.x, and this front end
answers as RabbitMQ 4.2 does.  It is the default rather than an option because the point of serving the protocol
is that those clients connect unchanged; the 0-9-1 side keeps ``product: Warren``.
"""
from __future__ import annotations

import asyncio
import logging
import sys
import time
from typing import TYPE_CHECKING, Any, Callable, Coroutine, Iterable

from .. import __version__, errors
from ..frontend import auth_mechanisms
from ..framing import file_out
from ..framing.file_out import Part
from ..access_control import loopback_refused
from ..frontend.front_end import (FLOW, FRAMES_PER_TURN, STOPPED, WAITING, Complaints, FrontEnd, ListedPublisher,
                                  ListedSession, ListedSubscription, Registry)
from ..logs import untrusted
from stream_log import amqp10
from stream_log.amqp10 import NULL, symbol, symbols, uint, ushort, utf8
from . import frames
from .frames import Amqp10Error
from .host import Answer
from .session import Session

if TYPE_CHECKING:
    from ..access_control import Principal, User
    from ..broker import Broker
    from ..config import Config
    from ..publisher_flow import PublisherFlow
    from ..broker.vhost import VHost
    from ..stats import MessageStats

log = logging.getLogger("warren.amqp10")
complaints = Complaints(log)

SASL, AWAIT_HEADER, AWAIT_OPEN, OPEN, CLOSE_SENT, CLOSED = range(6)
SILENT_CLOSE_DELAY = 3.0  # rabbit_amqp_reader's: a client failing its handshake waits this long for the answer
CLOSE_TIMEOUT = 3.0  # after our close, how long the client has to answer with its own
SESSION_MAX = 64  # RabbitMQ's session_max_per_connection: channel-max is one less
INTERNAL_ERROR_TEXT = "internal error; see the node's log"
SASL_OK, SASL_AUTH = 0, 1


class Amqp10Connection(FrontEnd):
    """An AMQP 1.0 client, from the SASL header on."""

    kind = "AMQP 1.0"
    protocol = "AMQP 1.0"  # what the HTTP API lists

    def __init__(self, broker: Broker, config: Config, flow: PublisherFlow, clients: Registry) -> None:
        super().__init__(clients.handshakes, complaints, config.write_buffer_high)
        self.broker = broker
        self.config = config
        self.flow = flow
        self.clients = clients
        self.loop = asyncio.get_running_loop()
        self.state = SASL
        self.frame_kind = frames.SASL_FRAME  # the frame type expected: SASL until its outcome, AMQP after
        self.buf = bytearray()
        self.transfers = frames.Transfers()
        self.out: list[Part] = []
        self.large_out = False  # the output holds a large body: written from where it is, not joined
        self.file_out = False  # the output holds a body in a file (``stored_bodies``): it goes through the outbox
        self.flush_scheduled = False
        self.sessions: dict[int, Session] = {}
        self.channels: dict[int, Any] = {}  # (0-9-1 channels: none; the HTTP API counts and lists them)
        self.exclusive_queues: set[Any] = set()
        self.frame_max = config.initial_frame_max  # what we read: until open, the pre-login size
        self.peer_frame_max = 0xFFFFFFFF  # what the client reads
        self.channel_max = SESSION_MAX - 1
        self.heartbeat = config.heartbeat
        self.user: User | None = None
        self.vhost: VHost | None = None
        self.vhost_name = ""
        self.principal: Principal | None = None
        self.auth_mechanism = ""
        self.container_id = ""
        self.client_properties: dict[str, Any] = {}
        self.ssl_object = None
        self.publishing = False
        self.credit_held = False  # an alarm or flow holds publishers: no link credit is granted
        self.deliver_budget = config.deliveries_per_flush
        self.recv_oct = self.recv_cnt = self.send_oct = self.send_cnt = 0
        self.connected_at = time.time()
        self._received = True
        self._sent = False
        self._timer: asyncio.TimerHandle | None = None
        self._silent = 0

    # -- life cycle ------------------------------------------------------------------------------

    def opened(self) -> None:
        assert self.transport is not None
        self.ssl_object = self.transport.get_extra_info("ssl_object")
        self.clients.add(self)  # listed beside the 0-9-1 connections
        mechanisms = auth_mechanisms.offered(self.config, self.ssl_object)
        self.out.append(frames.SASL_HEADER)
        self.out.append(frames.frame(0, frames.performative(frames.SASL_MECHANISMS, symbols(mechanisms)),
                                     frames.SASL_FRAME))
        self.flush()

    def connection_lost(self, exc: Exception | None) -> None:
        self.state = CLOSED
        super().connection_lost(exc)
        if self._timer is not None:
            self._timer.cancel()
        self._end_sessions()
        self.buf = bytearray()
        self._discard_out()
        self.flow.gone(self)
        self.clients.remove(self)
        if self.user is not None and self.vhost is not None:
            self.broker.limits.close_connection(self, self.vhost_name, self.user.name)
        self.broker.connection_closed(self)

    def _end_sessions(self) -> None:
        for session in list(self.sessions.values()):
            session.closed()
        self.sessions.clear()

    def abandon(self) -> None:
        super().abandon()
        self.state = CLOSED

    def ended(self, channel: int) -> None:
        self.sessions.pop(channel, None)

    # -- output ------------------------------------------------------------------------------

    def send(self, channel: int, body: bytes) -> None:
        self.out.append(frames.frame(channel, body))
        self.schedule_flush()

    def schedule_flush(self) -> None:
        if not self.flush_scheduled:
            self.flush_scheduled = True
            self.clients.schedule_flush(self)

    def flush(self) -> None:
        self.flush_scheduled = False
        for session in self.sessions.values():
            session.emit_confirms()
        transport = self.transport
        if self.out and transport is not None and not transport.is_closing():
            if self.file_out or self.files:  # a body from a file, or output waiting behind one
                size = self.files.send(transport, self.out, self.write_high)
                self.out.clear()  # (the outbox's now)
                self.file_out = False
            elif self.large_out:  # a large body goes from where it is
                size = sum(map(len, self.out))
                transport.writelines(self.out)  # type: ignore[arg-type]  # (no file range: file_out is not set)
            else:
                data = b"".join(self.out)  # type: ignore[arg-type]  # (as writelines')
                size = len(data)
                transport.write(data)
            self.send_oct += size
            self.send_cnt += 1
            self._sent = True
        self._discard_out()
        self.large_out = False
        if self.deliver_budget <= 0:
            self.deliver_budget = self.config.deliveries_per_flush
            if not self.write_paused:
                self.resume_deliveries()

    def _discard_out(self) -> None:
        """The output is done with (written, or dropped): the descriptors of bodies in files not sent are closed."""
        if self.file_out:
            file_out.discard(self.out)
            self.file_out = False
        self.out.clear()

    def drained(self) -> None:
        self.resume_deliveries()

    def resume_deliveries(self) -> None:
        for session in list(self.sessions.values()):
            session.resume_deliveries()

    # -- input -------------------------------------------------------------------------------

    def data_received(self, data: bytes) -> None:
        self._received = True
        self.recv_oct += len(data)
        self.recv_cnt += 1
        if self.state == CLOSED:
            return
        self.buf += data
        self._frames()

    def read_on(self) -> None:
        self._frames()

    def _frames(self) -> None:
        """The frames read, as far as the connection may go on: a transfer is read in place (``frames.Transfers``)
        and handed to its session with where its payload lies; any other frame is decoded (``_frame``)."""
        buf = self.buf
        pos = 0
        n = len(buf)
        budget = FRAMES_PER_TURN
        frame_head = frames.FRAME_HEAD.unpack_from
        transfers = self.transfers
        sessions = self.sessions
        try:
            while self.state != CLOSED and not self._holds:
                if self.state == AWAIT_HEADER:
                    if n - pos < 8:
                        break
                    header = bytes(buf[pos:pos + 8])
                    pos += 8
                    self._amqp_header(header)
                    continue
                if n - pos < 8:
                    break
                budget -= 1
                if budget < 0:
                    self.next_turn()
                    break
                if self.state == OPEN:  # the publish path: a transfer frame like the last, read in place
                    fast = transfers.like_the_last(buf, pos, n, self.frame_max)
                    if fast is not None:
                        channel, handle, delivery_id, settled, more, at, pos = fast
                        session = sessions.get(channel)
                        if session is not None:
                            session.on_transfer(handle, delivery_id, settled, more, False, buf, at, pos)
                        continue
                size, doff, kind, channel = frame_head(buf, pos)
                if doff != 2 or kind != self.frame_kind or not 8 <= size <= self.frame_max:
                    self._check_head(size, doff, kind)
                if n - pos < size:
                    break
                start, end = pos + doff * 4, pos + size
                pos = end
                if start == end:
                    continue  # an empty frame: the client's heartbeat
                if self.state == OPEN and channel <= self.channel_max:
                    head = transfers.read(buf, end - size, start, end, channel)
                    if head is not None:  # a transfer read in place (its layout kept for the next)
                        session = sessions.get(channel)
                        if session is not None:
                            session.on_transfer(head[0], head[1], head[2], head[3], False, buf, head[4], end)
                        continue
                self._frame(channel, buf, start, end)
        except Amqp10Error as exc:
            self.close_with(exc)
            pos = n
        except Exception:  # a bug must not take the node down; the answer quotes nothing of the input
            complaints.internal("AMQP 1.0 connection", self.name)
            self.close_with(Amqp10Error(frames.INTERNAL_ERROR, INTERNAL_ERROR_TEXT))
            pos = n
        del buf[:pos]
        if self.out:
            self.schedule_flush()
        self.clients.flush()

    def _check_head(self, size: int, doff: int, kind: int) -> None:
        """rabbit_amqp_reader's checks of a frame header, in its order and words."""
        if size < 8:
            raise Amqp10Error(frames.FRAMING_ERROR, f"frame size ({size} bytes) < minimum frame size (8 bytes)")
        if size > self.frame_max:
            raise Amqp10Error(frames.FRAMING_ERROR,
                              f"frame size ({size} bytes) > maximum frame size ({self.frame_max} bytes)")
        if doff < 2:
            raise Amqp10Error(frames.FRAMING_ERROR, f"data offset ({doff}) < minimum data offset (2)")
        if doff * 4 > size:
            raise Amqp10Error(frames.FRAMING_ERROR, f"data offset ({doff * 4} bytes) > frame size ({size} bytes)")
        expected = self.frame_kind
        if kind != expected:
            mode = "sasl" if self.state == SASL else "amqp"
            raise Amqp10Error(frames.FRAMING_ERROR,
                              f"unexpected frame type {kind} in {mode} mode (expected {expected})")

    def _frame(self, channel: int, buf: bytearray, start: int, end: int) -> None:
        """A frame the publish path does not read in place: decoded the general way."""
        try:
            value, at = amqp10.value_at(buf, start)  # type: ignore[arg-type]  # (read in place)
        except (amqp10.Invalid, amqp10.TooLarge) as exc:
            raise Amqp10Error(frames.DECODE_ERROR, f"cannot decode frame body: {exc}") from None
        if at > end or value.kind != "described" or not isinstance(value.value[0], int) \
                or value.value[1].kind != "list":
            raise Amqp10Error(frames.DECODE_ERROR, "frame body is not a performative")
        code, fields = value.value[0], value.value[1].value
        if self.state == SASL:
            self._sasl(code, fields)
            return
        if code in (frames.OPEN, frames.CLOSE):
            if code == frames.OPEN:
                self._open(fields)
            else:
                self._close(fields)
            return
        if self.state == CLOSE_SENT:
            return  # after our close, only the client's close matters
        if self.state != OPEN:
            raise Amqp10Error(frames.NOT_ALLOWED, f"{frames.NAMES.get(code, hex(code))} before open")
        if channel > self.channel_max:
            raise Amqp10Error(frames.FRAMING_ERROR, f"channel number ({channel}) exceeds maximum channel number "
                              f"({self.channel_max})")
        session = self.sessions.get(channel)
        if session is None:
            if code == frames.BEGIN:
                self.sessions[channel] = Session(self, channel, fields)
            return  # a frame for no session: ignored, as RabbitMQ does
        if code == frames.TRANSFER:
            session.on_transfer(*frames.transfer_of(fields), buf, at, end)
        else:
            session.on_frame(code, fields)

    # -- SASL --------------------------------------------------------------------------------

    def _sasl(self, code: int, fields: list[amqp10.Value]) -> None:
        if code != frames.SASL_INIT:
            raise Amqp10Error(frames.NOT_ALLOWED, f"unexpected SASL frame 0x{code:02x}")
        mechanism = frames.typed(fields, 0, ("symbol",), "mechanism", "")
        response = frames.typed(fields, 1, ("binary",), "initial-response", b"")
        try:
            username, user = auth_mechanisms.authenticate(self.broker.access, self.config, self.ssl_object,
                                                          mechanism, response)
        except errors.ConnectionError as exc:  # an unknown or unoffered mechanism, a malformed response: as
            # rabbit_amqp_reader's protocol_error before open, no sasl-outcome, the socket closed after the delay
            if exc.code != errors.COMMAND_INVALID:  # (auth_phase's protocol_error counts a failed attempt)
                self.broker.auth_attempts.record("amqp10", False)
            self.clients.handshakes.log.warning("AMQP 1.0 login refused from %s: %s", self.peer[0],
                                                untrusted(exc.detail))
            self._stop_after(SILENT_CLOSE_DELAY)
            return
        self.broker.auth_attempts.record("amqp10", user is not None)
        if user is None:
            self._refuse_login(username, Amqp10Error(frames.UNAUTHORIZED_ACCESS, f"{mechanism} login refused: "
                                                     f"user '{username}' - invalid credentials"))
            return
        self.user = user
        self.auth_mechanism = mechanism
        self.out.append(frames.frame(0, frames.performative(frames.SASL_OUTCOME, amqp10.ubyte(SASL_OK)),
                                     frames.SASL_FRAME))
        self.state = AWAIT_HEADER
        self.frame_kind = frames.AMQP_FRAME

    def _refuse_login(self, username: str, error: Amqp10Error) -> None:
        """As RabbitMQ: the client waits SILENT_CLOSE_DELAY for a sasl-outcome ``auth``, then the socket closes."""
        self.clients.handshakes.log.warning("AMQP 1.0 login refused for user %s from %s: %s", untrusted(username),
                                            self.peer[0], untrusted(error.description))
        self._stop_after(SILENT_CLOSE_DELAY, frames.frame(
            0, frames.performative(frames.SASL_OUTCOME, amqp10.ubyte(SASL_AUTH)), frames.SASL_FRAME))

    def _stop_after(self, delay: float, last: bytes = b"") -> None:
        """Read nothing more; in ``delay`` seconds write ``last`` and close."""
        self.state = CLOSED
        self.hold_reading(STOPPED)
        if self._timer is not None:
            self._timer.cancel()
        self._timer = self.loop.call_later(delay, self._last_words, last)

    def _last_words(self, last: bytes) -> None:
        if self.transport is not None and not self.transport.is_closing():
            if last:
                self.transport.write(last)
            self.transport.close()

    def _amqp_header(self, header: bytes) -> None:
        if header != frames.AMQP_HEADER:
            self.clients.handshakes.log.warning("AMQP 1.0 connection %s sent protocol header %r after SASL",
                                                self.name, header)
            self.out.append(frames.AMQP_HEADER)
            self.flush()
            self._stop_after(0)
            return
        self.out.append(frames.AMQP_HEADER)
        self.state = AWAIT_OPEN

    # -- open / close ------------------------------------------------------------------------

    def _open(self, fields: list[amqp10.Value]) -> None:
        if self.state != AWAIT_OPEN or self.user is None:
            raise Amqp10Error(frames.NOT_ALLOWED, "unexpected open")
        self.container_id = frames.typed(fields, 0, ("string",), "container-id", "")
        hostname = frames.typed(fields, 1, ("string",), "hostname", "")
        max_frame = frames.typed(fields, 2, ("uint",), "max-frame-size", 0xFFFFFFFF)
        channel_max = frames.typed(fields, 3, ("ushort",), "channel-max", 0xFFFF)
        idle = frames.typed(fields, 4, ("uint",), "idle-time-out", 0)
        properties = frames.field(fields, 9)
        if isinstance(properties, list):
            self.client_properties = {str(key.value): _plain(value) for key, value in properties
                                      if key.kind in ("symbol", "string")}
        self.state = OPEN  # (a refusal below is told in a close after our open)
        name = hostname[len("vhost:"):] if hostname.startswith("vhost:") else "/"
        user = self.user
        try:
            if loopback_refused(user, self.peer[0], self.config.loopback_users_only):
                raise Amqp10Error(frames.UNAUTHORIZED_ACCESS, f"user '{user.name}' can only connect via localhost")
            if not self.broker.access.vhost_exists(name):
                raise Amqp10Error(frames.UNAUTHORIZED_ACCESS,
                                  f"AMQP 1.0 connection failed: virtual host '{name}' does not exist")
            principal = self.broker.access.principal(name, user.name)
            if principal.permissions is None:
                raise Amqp10Error(frames.UNAUTHORIZED_ACCESS,
                                  f"access to vhost '{name}' refused for user '{user.name}'")
            if max_frame < frames.MIN_MAX_FRAME:
                raise Amqp10Error(frames.FRAME_SIZE_TOO_SMALL, f"max_frame_size ({max_frame}) < minimum maximum "
                                  f"frame size ({frames.MIN_MAX_FRAME})")
            if 0 < idle < 1000:
                raise Amqp10Error(frames.NOT_ALLOWED, f"idle-time-out ({idle} ms) < minimum idle-time-out "
                                  "(1000 ms)")
            try:
                self.broker.limits.open_connection(self, name, user.name)
            except errors.AMQPError as exc:
                raise Amqp10Error(frames.RESOURCE_LIMIT_EXCEEDED, exc.detail) from None
        except Amqp10Error as exc:
            self.broker.auth_attempts.record("amqp10", False)
            self._send_open()
            self.close_with(exc)
            return
        self.vhost = self.broker.vhost(name)
        self.vhost_name = name
        self.principal = principal
        self.peer_frame_max = max_frame
        self.channel_max = min(channel_max, SESSION_MAX - 1)
        self.frame_max = self.config.frame_max
        self.logged_in()
        self._send_open()
        if idle or self.heartbeat:
            self._timer = self.loop.call_later(self._tick_every(idle), self._tick, idle)
        log.info("AMQP 1.0 connection %s: user %s authenticated using SASL mechanism %s and granted access to "
                 "vhost %s", self.name, untrusted(user.name), self.auth_mechanism, untrusted(name))

    def _send_open(self) -> None:
        properties = [
            (symbol("product"), utf8("RabbitMQ")),
            (symbol("version"), utf8("4.2.0")),
            (symbol("platform"), utf8(f"Warren {__version__} on Python {sys.version.split()[0]}")),
            (symbol("information"), utf8("Warren, serving AMQP 1.0 as RabbitMQ 4.2 does")),
            (symbol("copyright"), utf8("Warren contributors")),
            (symbol("cluster_name"), utf8(self._cluster_name())),
            (symbol("node"), utf8(self.broker.node_name)),
        ]
        self.send(0, frames.performative(
            frames.OPEN, utf8(self._cluster_name()), NULL, uint(self.config.frame_max), ushort(self.channel_max),
            uint(self.heartbeat * 1000 // 2), NULL, NULL,
            symbols(["LINK_PAIR_V1_0", "ANONYMOUS-RELAY"]), NULL, amqp10.encode_map(properties)))

    def _cluster_name(self) -> str:
        return self.broker.access.cluster_name(self.broker.node_name)

    def _tick_every(self, idle: int) -> float:
        """Half the shorter of the two sides' idle timeouts, in seconds."""
        spans = [span for span in (idle / 1000, float(self.heartbeat)) if span]
        return min(spans) / 2

    def _tick(self, idle: int) -> None:
        """An empty frame when we were quiet for half the client's idle-time-out; closed after the node's
        ``heartbeat`` seconds without a frame from the client (RabbitMQ's receive timeout)."""
        if self.state != OPEN:
            return
        every = self._tick_every(idle)
        if idle and not self._sent:
            self.out.append(frames.EMPTY_FRAME)
            self.flush()
        self._sent = False
        self._silent = 0 if self._received else self._silent + 1
        self._received = False
        if self.heartbeat and self._silent * every >= self.heartbeat:
            self.close_with(Amqp10Error(frames.RESOURCE_LIMIT_EXCEEDED,
                                        "no frame received from client within idle timeout threshold"))
            return
        self._timer = self.loop.call_later(every, self._tick, idle)

    def _close(self, fields: list[amqp10.Value]) -> None:
        """The client closes: its sessions go, our close answers, and the socket closes once it is written."""
        if self.state in (SASL, AWAIT_HEADER, AWAIT_OPEN):
            raise Amqp10Error(frames.NOT_ALLOWED, "close before open")
        self._end_sessions()
        if self.state == OPEN:
            self.send(0, frames.performative(frames.CLOSE))
        self.flush()
        self._stop_after(0)

    def close_with(self, error: Amqp10Error) -> None:
        """Close with ``error``; before open, as RabbitMQ, the client learns nothing and waits
        SILENT_CLOSE_DELAY for the socket to close."""
        if self.state in (CLOSE_SENT, CLOSED):
            return
        if self.state != OPEN:
            self.clients.handshakes.log.warning("closing AMQP 1.0 connection %s in its handshake: %s", self.name,
                                                untrusted(error.description))
            self._stop_after(SILENT_CLOSE_DELAY)
            return
        log.warning("closing AMQP 1.0 connection %s: %s", self.name, untrusted(str(error)))
        self._end_sessions()
        self.state = CLOSE_SENT
        self.send(0, frames.performative(frames.CLOSE, frames.error(error.condition, error.description)))
        self.flush()
        if self._timer is not None:
            self._timer.cancel()
        self._timer = self.loop.call_later(CLOSE_TIMEOUT, self._last_words, b"")

    def force_close(self, reason: str) -> None:
        """Closed by an operator (HTTP API, vhost deleted)."""
        self.close_with(Amqp10Error(frames.CONNECTION_FORCED, reason))

    # -- publisher flow (publisher_flow.Publisher) -------------------------------------------

    @property
    def flow_state(self) -> str:
        if self.state != OPEN:
            return "closing"
        alarm = self.flow.alarm() is not None
        if self.publishing and self.credit_held:
            return "blocked" if alarm else "flow"
        return "blocking" if alarm else "running"

    def started_publishing(self) -> None:
        self.publishing = True
        self.flow.publishing(self)

    def hold(self, alarm: str | None) -> None:
        """An alarm or flow: publishing links get no more credit (RabbitMQ 4.x's answer to alarms on AMQP 1.0)."""
        self.credit_held = True

    def growing(self) -> None:
        """A message arriving in many transfers grew by ``MEMORY_CHECK_BYTES``: memory is checked, and during an
        alarm the socket is read no more (what is already read waits), as 0-9-1's large bodies wait."""
        self.flow.recheck()
        if self.flow.blocked:
            self.hold_reading(FLOW)

    def release(self) -> None:
        self.release_reading(FLOW)
        if self.buf:  # frames read before the hold: handled at the next turn
            self.next_turn()
        self.credit_held = False
        for session in list(self.sessions.values()):
            session.grant_credit()
        self.schedule_flush()

    def await_request(self, work: Coroutine[Any, Any, Answer], answer: Callable[[Answer], None]) -> None:
        self.hold_reading(WAITING)
        asyncio.get_running_loop().create_task(work).add_done_callback(
            lambda task: self._request_done(task, answer))

    def _request_done(self, task: asyncio.Task[Answer], answer: Callable[[Answer], None]) -> None:
        if task.cancelled() or self.state != OPEN:
            return
        try:
            response = task.result()
        except Exception:  # a bug: the connection goes, the node carries on
            complaints.internal("AMQP 1.0 connection", self.name)
            self.close_with(Amqp10Error(frames.INTERNAL_ERROR, INTERNAL_ERROR_TEXT))
            return
        answer(response)
        self.release_reading(WAITING)
        if self.buf:  # frames read after the request: handled at the next turn
            self.next_turn()
        self.schedule_flush()

    def listed_sessions(self) -> list[ListedSession]:
        return [session.listed() for session in self.sessions.values()]

    def listed_publishers(self) -> list[ListedPublisher]:
        return []

    def listed_subscriptions(self) -> list[ListedSubscription]:
        return []

    def message_stats(self) -> Iterable[MessageStats]:
        return [session.stats for session in self.sessions.values()]

    def drop_if_peer_gone(self) -> None:
        """(The memory alarm asks of connections not read; this one is read through alarms.)"""


def _plain(value: amqp10.Value) -> Any:
    if value.kind in ("string", "symbol", "bool", "uint", "ulong", "int", "long", "ushort", "ubyte"):
        return value.value
    return None
