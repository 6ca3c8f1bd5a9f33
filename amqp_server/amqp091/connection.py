"""One client connection (RabbitMQ's rabbit_reader): framing, handshake, heartbeats, channels.

The frame loop keeps an offset into one ``bytearray`` and compacts it once per
read.  ``basic.publish`` and content frames are parsed here without pamqp and
handed to the channel; every other method is unmarshalled by pamqp.  Output is
gathered per loop iteration and written with one ``transport.write``.
"""
from __future__ import annotations

import asyncio
import logging
import select
import struct
import sys
import time
from typing import TYPE_CHECKING, Any, Callable, Coroutine, Iterable

from pamqp import commands, decode
from pamqp.base import Frame
from pamqp.common import FieldValue

from .. import __version__, errors
from ..frontend import auth_mechanisms
from ..framing import codec, file_out
from ..access_control import Principal, loopback_refused
from ..frontend.front_end import (EVERY_REASON, FLOW, FRAMES_PER_TURN, LEADERLESS, STOPPED, WAITING, Complaints,
                                  FrontEnd, ListedPublisher, ListedSubscription, Registry, read_buffer)
from ..memory import MEMORY_CHECK_BYTES
from ..publisher_flow import LEADER_WAITS, PublisherFlow
from ..errors import AMQPError, ConnectionError
from ..logs import untrusted

if TYPE_CHECKING:
    from ..broker import Broker
    from ..broker.vhost import VHost
    from .channel import Channel
    from ..config import Config
    from ..access_control import User
    from ..stats import MessageStats

log = logging.getLogger("warren.connection")
complaints = Complaints(log)

_HEAD = struct.Struct(">BHI")
_METHOD_ID = struct.Struct(">I")
_PUBLISH = (60 << 16) | 40
# the payload sizes rabbit_command_assembler:analyze_frame reads, by frame type: a method's class and method ids, a
# content header's class, weight and body size, a body of any size, an empty heartbeat; no other type
_PAYLOAD_SIZES = tuple({1: (4, 1 << 32), 2: (12, 1 << 32), 3: (0, 1 << 32), 8: (0, 0)}.get(ftype, (1, 0))
                       for ftype in range(256))
MIN_FRAME_MAX = 4096
DIRECT_FROM = 32 * 1024  # a body frame at least this large, not read whole, goes into its message as it is read,
DIRECT_BODY_FROM = 256 * 1024  # if its body is at least this large (_body_direct)
LARGE_READ_SIZE = 4096  # what it takes while large bodies arrive: their frames are read into the bodies (get_buffer)
AHEAD = 8  # a large body frame's end octet and the next frame's head, read with its last bytes (get_buffer)
CLOSE_TIMEOUT = 3.0
SILENT_CLOSE_DELAY = 3.0  # rabbit_reader's ?SILENT_CLOSE_DELAY
INTERNAL_ERROR_TEXT = "internal error; see the node's log"  # a bug of ours: no exception text, it may quote input
AMQP10_SASL_HEADER = b"AMQP\x03\x01\x00\x00"  # an AMQP 1.0 client: served by amqp1.connection
AMQP10_HEADER = b"AMQP\x00\x01\x00\x00"  # AMQP 1.0 without SASL, which RabbitMQ refuses
LOGIN_REFUSED = "Login was refused using authentication mechanism {}. For details see the broker logfile."

CAPABILITIES = {
    "publisher_confirms": True,
    "exchange_exchange_bindings": True,
    "basic.nack": True,
    "consumer_cancel_notify": True,
    "connection.blocked": True,
    "consumer_priorities": True,
    "authentication_failure_close": True,
    "per_consumer_qos": True,
    "direct_reply_to": True,
}

# Handshake states; DRAINING: close-ok sent, frames still arriving are read and dropped until the client
# closes the socket (closing it with unread data would reset it under a client still writing)
AWAIT_HEADER, AWAIT_START_OK, AWAIT_TUNE_OK, AWAIT_OPEN, OPEN, CLOSING, DRAINING, CLOSED = range(8)
# what rabbit_reader names the states that read methods on channel 0, and the methods each takes (handle_method0; a
# connection closing reads only close and close-ok, _closing_frame); any other is 504 CHANNEL_ERROR
_STATES = {AWAIT_START_OK: "starting", AWAIT_TUNE_OK: "tuning", AWAIT_OPEN: "opening", OPEN: "running"}
_TAKES: dict[int, tuple[type, ...]] = {AWAIT_START_OK: (commands.Connection.StartOk,),
                                       AWAIT_TUNE_OK: (commands.Connection.TuneOk,),
                                       AWAIT_OPEN: (commands.Connection.Open,),
                                       OPEN: (commands.Connection.Close, commands.Connection.UpdateSecret)}


class Connection(FrontEnd, asyncio.BufferedProtocol):
    """Protocol instance per TCP connection."""

    kind = "AMQP"
    protocol = "AMQP 0-9-1"  # as the management API names it

    def __init__(self, broker: "Broker", config: "Config", flow: PublisherFlow, clients: Registry) -> None:
        super().__init__(clients.handshakes, complaints, config.write_buffer_high)
        self.broker = broker
        self.config = config
        self.flow = flow
        self.clients = clients
        self.loop = asyncio.get_running_loop()
        self.state = AWAIT_HEADER
        self.buf = bytearray()
        self.direct: tuple[int, int] | None = None  # (channel, payload bytes to come) of a large body frame being read
        self._into: "Channel | None" = None  # the channel whose body the read under way goes into
        self._large = False  # large bodies arrive: reads are small, so that their frames are read into them
        self._reads = read_buffer()
        self.out: list[bytes] = []
        self.large_out = False  # the output holds a large body: it is written from its buffer (codec.gather)
        self.file_out = False  # the output holds a body in a file: it goes through the outbox
        self._flush_scheduled = False
        self.channels: dict[int, "Channel"] = {}
        self.closing_channels: set[int] = set()
        self.channel_max = config.channel_max
        self.frame_max = config.initial_frame_max  # until tune-ok, as rabbit_reader's initial_frame_max
        self.heartbeat = 0
        self.user: "User | None" = None
        self.vhost: "VHost | None" = None
        self.vhost_name = ""
        self.principal: "Principal | None" = None  # user + permissions: what broker operations check
        self.client_properties: dict[str, Any] = {}
        self.client_capabilities: dict[str, Any] = {}
        self.ssl_object = None  # the ssl.SSLObject of an AMQPS connection
        self.auth_mechanism = ""
        self.exclusive_queues: set = set()
        self.suspended = False  # a channel method awaits the cluster: later frames wait behind it
        self.stalled = False  # write_paused or suspended: the one flag the frame loop tests per frame
        self.paused_output = 0  # bytes added to the output while writes are paused, since memory was checked
        self.blocked_notified = False
        self.flow_held = False  # held by the publisher flow: it published while a reason stood
        self._leader_waits = 0  # its channels' publishes waiting for a quorum queue's leader
        self.deliver_budget = config.deliveries_per_flush
        self._received = True
        self._sent = False
        self.recv_oct = self.recv_cnt = self.send_oct = self.send_cnt = 0  # per read / write, for the HTTP API
        self._silent_ticks = 0
        self._timer: asyncio.TimerHandle | None = None
        self.connected_at = time.time()

    # -- transport callbacks ------------------------------------------------------------------

    def opened(self) -> None:
        assert self.transport is not None
        self.ssl_object = self.transport.get_extra_info("ssl_object")
        self.clients.add(self)
        self.broker.churn.connection_created += 1

    def connection_lost(self, exc: Exception | None) -> None:
        if self.state == OPEN:  # as rabbit_reader logs it: a lost consumer is told apart from one the node closed
            complaints.warning("closing connection %s: client unexpectedly closed TCP connection", self.name)
        self.state = CLOSED
        super().connection_lost(exc)
        if self._timer is not None:
            self._timer.cancel()
        for channel in list(self.channels.values()):
            channel.closed()
        self.channels.clear()
        self.buf = bytearray()  # a half-sent frame goes with the socket
        self.direct = None
        self._discard_out()
        self.flow.gone(self)
        self.clients.remove(self)
        if self.user is not None:
            self.broker.limits.close_connection(self, self.vhost_name, self.user.name)
        self.broker.connection_closed(self)

    def pause_writing(self) -> None:
        """The client reads slower than we write: read no more, and leave the frames already read until it
        catches up (a get answered now would copy another body into an output nobody takes)."""
        super().pause_writing()
        self.stalled = True

    def writable(self) -> None:
        self.stalled = self.suspended
        super().writable()

    def drained(self) -> None:
        self.resume_deliveries()

    def read_on(self) -> None:
        self._frames()

    def resume_deliveries(self) -> None:
        """Credit came back (writes drained, flow on): let this connection's queues deliver again."""
        for channel in list(self.channels.values()):
            channel.resume_deliveries()

    # -- output -------------------------------------------------------------------------------

    def schedule_flush(self) -> None:
        """Output waits until the current read is processed (or the loop turns), then goes in one write."""
        if not self._flush_scheduled:
            self._flush_scheduled = True
            self.clients.schedule_flush(self)

    def flush(self) -> None:
        self._flush_scheduled = False
        for channel in self.channels.values():
            if channel.confirm_pending:
                channel.emit_confirms()
        if self.out and self.transport is not None and not self.transport.is_closing():
            if self.file_out or self.files:
                size = self.files.send(self.transport, self.out, self.write_high)
                self.out.clear()  # (the outbox's now)
                self.file_out = False
            elif self.large_out:
                parts, size = codec.gather(self.out)
                self.transport.writelines(parts)
            else:
                data = b"".join(self.out)
                size = len(data)
                self.transport.write(data)
            self.send_oct += size
            self.send_cnt += 1
            self._sent = True
            if self.write_paused:
                self._unsent(size)
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

    def _unsent(self, size: int) -> None:
        """Output that waits for a client not reading is memory like a publisher's partial body: each
        ``MEMORY_CHECK_BYTES`` of it checks the memory alarm (others' publishes can fill it faster than the
        once-a-second check sees)."""
        self.paused_output += size
        if self.paused_output >= MEMORY_CHECK_BYTES:
            self.paused_output = 0
            self.flow.recheck()

    def content_out(self, size: int) -> None:
        """A get or a return put ``size`` bytes of content in the output: it counts against this
        turn's delivery budget (see :func:`codec.content_cost`), and a spent budget is written out at once, so that
        one read of small requests cannot copy an unbounded number of bodies before the client is seen not
        to read (the write pauses us, and the frames still unread wait)."""
        self.deliver_budget -= codec.content_cost(size)
        if self.deliver_budget <= 0:
            self.flush()

    def send_method(self, channel: int, method: Frame) -> None:
        self.out.append(codec.method_frame(channel, method))
        self.schedule_flush()

    # -- input --------------------------------------------------------------------------------

    def get_buffer(self, sizehint: int) -> memoryview:
        """Where the next read goes.  Inside a large body frame, its message's buffer: the socket's bytes land
        where they stay, copied by no one, and ``AHEAD`` octets more where the body has room for them (the next
        frame's bytes overwrite them): the frame's end and the next frame's head, which ``buffer_updated`` hands
        to the frame loop, come with the frame's last bytes rather than in a read of their own.  Else the
        thread's read buffer, whose bytes ``buffer_updated`` hands to ``data_received``: while large bodies
        arrive, ``LARGE_READ_SIZE``, so that their frames are seldom read whole there (a frame read whole is
        copied), until a read of that size holds no large body frame.  After a body's last frame (which has no
        room after it), that read takes its end octet with the frames after it (the next publish, its header,
        its body's head): one read, where reading the end octet and the next frame's head alone took two."""
        direct = self.direct
        self._into = None
        if direct is None and not self._large:  # (the common case, first)
            return self._reads
        if direct is not None:
            channel = self.channels.get(direct[0])
            view = channel.body_into(direct[1], AHEAD) if channel is not None and self.state == OPEN else None
            if view is not None:
                self._into = channel
                return view
        return self._reads[:LARGE_READ_SIZE] if self._large else self._reads

    def buffer_updated(self, nbytes: int) -> None:
        channel = self._into
        if channel is None:
            self.data_received(self._reads[:nbytes])
            if self._large and nbytes > 8 and self.direct is None:
                self._large = False  # (the frames read were of no large body)
            return
        self._into = None
        self._received = True
        self.recv_oct += nbytes
        self.recv_cnt += 1
        assert self.direct is not None  # (get_buffer read into the channel's body for it)
        ch, left = self.direct
        if nbytes < left:
            channel.body_read(nbytes)
            self.direct = (ch, left - nbytes)
            return
        channel.body_read(left)
        self._large = True
        ahead = channel.read_ahead(nbytes - left)
        if len(ahead) == AHEAD and ahead[0] == codec.FRAME_END_BYTE and not self.stalled:
            ftype, next_ch, size = _HEAD.unpack_from(ahead, 1)
            if ftype == 3 and next_ch == ch and DIRECT_FROM <= size <= self.frame_max:
                self.direct = (ch, size)  # the body's next frame (there was room after this one: not its last),
                return  # read into it as this one was: what the frame loop would make of these octets, without it
        self.direct = None  # the frame's end octet follows, behind a head of its own: the frame loop
        self.buf += _HEAD.pack(3, ch, 0)  # checks it and completes the message as it does any frame's
        if ahead:  # (else the body had no room after the frame, its last: the end octet comes with the next read)
            self.buf += ahead
            self._frames()

    def data_received(self, data: bytes | memoryview) -> None:
        self._received = True
        self.recv_oct += len(data)
        self.recv_cnt += 1
        if self.state == DRAINING:
            return
        buf = self.buf
        if self.direct is not None:
            data = self._into_body(data)
        buf += data
        if self.state == AWAIT_HEADER:
            if len(buf) < 8:
                return
            if bytes(buf[:8]) == AMQP10_SASL_HEADER:
                self._hand_over()
                return
            if bytes(buf[:8]) != codec.PROTOCOL_HEADER:
                assert self.transport is not None  # data came through it
                # AMQP 1.0 without SASL is refused with the 1.0 header RabbitMQ takes; anything else with 0-9-1's
                self.transport.write(AMQP10_SASL_HEADER if bytes(buf[:8]) == AMQP10_HEADER else codec.PROTOCOL_HEADER)
                self.transport.close()
                self.state = CLOSED
                return
            del buf[:8]
            self._start()
        self._frames()

    def _hand_over(self) -> None:
        """An AMQP 1.0 client (the SASL header): its transport goes to the AMQP 1.0 front end, which takes this
        connection's place in the pre-login pool and the node's connections."""
        from ..amqp1.connection import Amqp10Connection

        transport = self.transport
        assert transport is not None  # data came through it
        self.state = CLOSED
        successor = Amqp10Connection(self.broker, self.config, self.flow, self.clients)
        if self.prelogin is not None:  # (its place and deadline in the pre-login pool the successor's)
            self.prelogin.hand_over(self, successor)
        FrontEnd.connection_lost(self, None)
        self.clients.remove(self)
        transport.set_protocol(successor)
        successor.connection_made(transport)
        rest = bytes(self.buf[8:])
        successor.recv_oct, successor.recv_cnt = self.recv_oct - len(rest), self.recv_cnt - 1  # (counted again)
        successor.data_received(rest)
        self.buf = bytearray()

    def _frames(self) -> None:
        """Handle the complete frames read, until one makes the rest wait (``stalled``) or the state ends it."""
        buf = self.buf
        pos = 0
        n = len(buf)
        channels = self.channels
        limit = self.frame_max
        budget = FRAMES_PER_TURN
        try:
            while n - pos >= 8 and self.state < DRAINING and not self.stalled:
                budget -= 1
                if budget < 0:
                    self.next_turn()
                    break
                ftype, ch, size = _HEAD.unpack_from(buf, pos)
                end = pos + 7 + size
                if size > limit:  # RabbitMQ lets a payload reach frame_max (its FRAME_SIZE_FUDGE)
                    raise frame_error(ftype, b"", ("frame_too_large", size, limit - 8))
                if end >= n:
                    if ftype == 3 and size >= DIRECT_FROM:
                        pos = self._body_direct(ch, buf, pos, n, end)
                    break
                if buf[end] != codec.FRAME_END_BYTE:
                    raise frame_error(ftype, buf[pos + 7:end], ("invalid_frame_end_marker", buf[end]))
                start = pos + 7
                pos = end + 1
                if self.state == CLOSING:
                    self._closing_frame(ftype, ch, buf, start, end)
                    continue
                channel = channels.get(ch)
                if channel is None and ch and self.state != OPEN:  # rabbit_reader: no channel frame before open
                    raise unexpected_frame(ftype, buf[start:end])
                try:  # a publish's frames here (of shapes analyze_frame reads), the rest in _frame
                    if channel is None:
                        self._frame(ftype, ch, None, buf, start, end)
                    elif ftype == 3:
                        channel.on_body(buf, start, end)
                    elif ftype == 2 and size >= 12:
                        channel.on_header(bytes(buf[start:end]))
                    elif ftype == 1 and size >= 4 and _METHOD_ID.unpack_from(buf, start)[0] == _PUBLISH:
                        self._publish(channel, buf, start, end)
                    else:
                        self._frame(ftype, ch, channel, buf, start, end)
                except errors.ChannelError as exc:
                    if channel is None or ch == 0:
                        raise ConnectionError(exc.code, exc.text.partition(" - ")[2], exc.class_id,
                                              exc.method_id) from None
                    channel.fail(exc)
        except ConnectionError as exc:
            self.close_with(exc)
            pos = len(buf)
        except Exception:  # a bug must not take the server down; the reply quotes nothing (credentials)
            complaints.internal("connection", self.name)
            self.close_with(ConnectionError(errors.INTERNAL_ERROR, INTERNAL_ERROR_TEXT))
            pos = len(buf)
        del buf[:pos]
        if self.out:
            self.schedule_flush()
        self.clients.flush()

    def _frame(self, ftype: int, ch: int, channel: "Channel | None", buf: bytearray, start: int, end: int) -> None:
        """A frame other than a publish's on an open channel: a method, a heartbeat, content on a channel that is not
        open; one of a shape rabbit_command_assembler:analyze_frame cannot read is refused first, whatever the channel
        (the publish path in ``_frames`` checks its own frames' shapes)."""
        low, high = _PAYLOAD_SIZES[ftype]
        if not low <= end - start <= high:
            raise frame_error(ftype, buf[start:end], "unknown_frame")
        if ftype == 8:
            if ch != 0:
                raise unexpected_frame(ftype, buf[start:end])
            return
        if channel is None and ch and ch not in self.closing_channels:
            self._create_channel()
        if ftype == 1:
            self._method(ch, channel, self._unmarshal(buf, start, end, ch))
        else:  # content (an open channel's is _frames')
            self._no_channel(ch, ftype, buf[start:end])

    def _body_direct(self, ch: int, buf: bytearray, pos: int, n: int, end: int) -> int:
        """A large body frame read in part: what has come goes into its message's buffer now, and what follows
        as it is read (``_into_body``), rather than through ``buf``; where the frame loop goes on.  Only for a
        body of ``DIRECT_BODY_FROM`` or more: a smaller one's frames wait in ``buf`` for reads of ``READ_SIZE``,
        which take several publishes at once.  Read into its message, each publish took two reads at least (the
        frames before the body, the body) and loop turns of its own, which cost more than the copy they saved
        (64 KiB persistent-confirm: 330 -> 260 us of broker CPU a message)."""
        channel = self.channels.get(ch)
        if channel is None or self.state != OPEN or channel.body_size < DIRECT_BODY_FROM:
            return pos
        channel.body_part(buf, pos + 7, n)
        self.direct = (ch, end - n)
        return n

    def _into_body(self, data: bytes | memoryview) -> bytes | memoryview:
        """Bytes read inside a large body frame go into its message's buffer; the frame's last bytes come back
        behind a frame head of their own, for the frame loop to check and complete the message as any frame."""
        assert self.direct is not None  # (the caller tests it)
        ch, left = self.direct
        if len(data) < left:
            channel = self.channels.get(ch)
            if channel is not None:  # (else the channel closed meanwhile: the frame's bytes are dropped)
                channel.body_part(data, 0, len(data))
            self.direct = (ch, left - len(data))
            return b""
        self.direct = None
        self.buf += _HEAD.pack(3, ch, left)
        return data

    def suspend(self, channel: "Channel", method: Frame, work: Coroutine[Any, Any, None]) -> None:
        """A channel method that must await (cluster agreement): frames after it are read once it is done.

        Its errors close the channel or connection as a synchronous method's would.
        """
        self.suspended = self.stalled = True
        self.hold_reading(WAITING)
        self.loop.create_task(work).add_done_callback(lambda task: self._resume(channel, method, task))

    def _resume(self, channel: "Channel", method: Frame, task: asyncio.Task) -> None:
        self.suspended = False
        self.stalled = self.write_paused
        exc = None if task.cancelled() else task.exception()
        if isinstance(exc, AMQPError) and not exc.class_id:
            exc.class_id, exc.method_id = divmod(method.index, 0x10000)
        if isinstance(exc, errors.ChannelError):
            if channel.open:
                channel.fail(exc)
        elif isinstance(exc, ConnectionError):
            self.close_with(exc)
        elif exc is not None:
            log.error("internal error on connection %s", self.name, exc_info=exc)
            self.close_with(ConnectionError(errors.INTERNAL_ERROR, INTERNAL_ERROR_TEXT))
        if self.state in (CLOSING, DRAINING, CLOSED):
            return
        self.release_reading(WAITING)
        self._frames()

    def _publish(self, channel: "Channel", buf: bytearray, start: int, end: int) -> None:
        """basic.publish parsed in place: exchange and routing key stay encoded for delivery."""
        route_start = start + 6  # class, method, reserved short
        try:
            rk_at = route_start + 1 + buf[route_start]
            flags_at = rk_at + 1 + buf[rk_at]
            if flags_at != end - 1:  # the flags' octet ends the frame: decode_method_fields matches it exactly
                raise IndexError
        except IndexError:
            raise cannot_decode(buf[start + 4:end], 60, 40) from None
        channel.on_publish(bytes(buf[route_start:flags_at]), buf[flags_at])

    def _unmarshal(self, buf: bytearray, start: int, end: int, ch: int = 0) -> Frame:
        index = _METHOD_ID.unpack_from(buf, start)[0]
        cls = commands.INDEX_MAPPING.get(index)
        if cls is None:
            raise ConnectionError(errors.COMMAND_INVALID, f"unknown method class {index >> 16} method {index & 0xFFFF}")
        method = cls()
        fields = bytes(buf[start + 4:end])
        size = _FIXED_SIZES.get(cls)
        try:
            if size is None:
                decode_fields(method, fields)
            elif len(fields) != size:  # (an ack's, a qos's: their fields are of one size, pamqp's unmarshal quicker)
                raise ValueError("method fields do not fill the frame")
            else:
                method.unmarshal(fields)
        except Exception:
            error = cannot_decode(fields, index >> 16, index & 0xFFFF)
            if ch == 0:  # handle_method0 catches an amqp_error naming no method alone: this one crashes it, a bare 541
                complaints.warning("connection %s: %s", self.name, untrusted(error.text))
                error = ConnectionError(errors.INTERNAL_ERROR, "")
            raise error from None
        return method

    def _no_channel(self, ch: int, ftype: int, payload: bytearray) -> None:
        """Content for a channel that is not open: dropped while we await its close-ok, else an error."""
        if ch in self.closing_channels:
            return
        if ch == 0:  # rabbit_reader: only methods and heartbeats on channel 0
            raise unexpected_frame(ftype, payload)
        # rabbit_command_assembler: a fresh channel expects a method frame first
        raise ConnectionError(errors.UNEXPECTED_FRAME, "expected method frame, got non method frame instead")

    def _closing_frame(self, ftype: int, ch: int, buf: bytearray, start: int, end: int) -> None:
        """After we sent connection.close only close / close-ok matter."""
        if ftype != 1 or ch != 0 or end - start < 4:  # (what analyze_frame cannot read is ignored too)
            return
        method = self._unmarshal(buf, start, end)
        if isinstance(method, commands.Connection.Close):
            self.send_method(0, commands.Connection.CloseOk())
            self.flush()
        if isinstance(method, (commands.Connection.CloseOk, commands.Connection.Close)):
            self._drop()

    # -- methods ------------------------------------------------------------------------------

    def _method(self, ch: int, channel: "Channel | None", method: Frame) -> None:
        if ch == 0:
            self._connection_method(method)
        elif channel is not None:
            channel.on_method(method)
        elif ch in self.closing_channels:
            if isinstance(method, commands.Channel.CloseOk):
                self.closing_channels.discard(ch)
            elif isinstance(method, commands.Channel.Close):
                self.send_method(ch, commands.Channel.CloseOk())
        elif isinstance(method, commands.Channel.Open):
            self._open_channel(ch)
        else:
            raise ConnectionError(errors.CHANNEL_ERROR, "expected 'channel.open'", *divmod(method.index, 0x10000))

    def _create_channel(self) -> None:
        """The first frame on a channel number that has no channel, whatever the frame (rabbit_reader:process_frame
        calls create_channel before the channel reads it): refused (530) at the negotiated channel_max, which counts
        the channels open and those awaiting our close's close-ok (any number 1-65535, as RabbitMQ), or at the
        user's max-channels."""
        count = len(self.channels) + len(self.closing_channels)
        if self.channel_max and count >= self.channel_max:
            raise ConnectionError(errors.NOT_ALLOWED, f"number of channels opened ({count}) has reached the "
                                  f"negotiated channel_max ({self.channel_max})")
        assert self.user is not None  # (a channel's frame is read once the connection is open)
        self.broker.limits.open_channel(self.user.name)

    def _open_channel(self, ch: int) -> None:
        from .channel import Channel

        if self.state != OPEN or self.user is None:  # (open: a user logged in)
            raise ConnectionError(errors.CHANNEL_ERROR, "channel.open before connection.open")
        self.channels[ch] = Channel(self, ch)
        self.send_method(ch, commands.Channel.OpenOk())

    def channel_closed(self, ch: int, awaiting_close_ok: bool) -> None:
        self.channels.pop(ch, None)
        if awaiting_close_ok:
            self.closing_channels.add(ch)

    def _connection_method(self, method: Frame) -> None:
        handlers: dict[type, Callable[[Any], None]] = {
            commands.Connection.StartOk: self._start_ok,
            commands.Connection.TuneOk: self._tune_ok,
            commands.Connection.Open: self._open,
            commands.Connection.Close: self._close,
            commands.Connection.UpdateSecret: self._update_secret,
        }
        if not isinstance(method, _TAKES[self.state]):  # handle_method0's last clause
            raise ConnectionError(errors.CHANNEL_ERROR, f"unexpected method in connection state {_STATES[self.state]}",
                                  *divmod(method.index, 0x10000))
        handlers[type(method)](method)

    def _start(self) -> None:
        properties: dict[str, Any] = {
            "product": "Warren",
            "version": __version__,
            "platform": f"Python {sys.version.split()[0]}",
            "copyright": "Warren contributors",
            "information": "Licensed under the MPL 2.0",
            "cluster_name": self.broker.access.cluster_name(self.broker.node_name),
            "capabilities": CAPABILITIES,
        }
        self.state = AWAIT_START_OK
        mechanisms = " ".join(auth_mechanisms.offered(self.config, self.ssl_object))
        self.send_method(0, commands.Connection.Start(server_properties=properties, mechanisms=mechanisms,
                                                      locales="en_US"))

    def _start_ok(self, method: commands.Connection.StartOk) -> None:
        self.client_properties = method.client_properties or {}
        capabilities = self.client_properties.get("capabilities")
        self.client_capabilities = capabilities if isinstance(capabilities, dict) else {}  # a table, or none
        username, user = auth_mechanisms.authenticate(self.broker.access, self.config, self.ssl_object,
                                                      method.mechanism, method.response, self.peer[0])
        if loopback_refused(user, self.peer[0], self.config.loopback_users_only):
            self.clients.handshakes.log.warning("user 'guest' can only connect via localhost (from %s)", self.peer[0])
            user = None
        self.broker.auth_attempts.record("amqp091", user is not None)
        if user is None:
            self.clients.handshakes.log.warning("login refused for user %s from %s", untrusted(username), self.peer[0])
            raise ConnectionError(errors.ACCESS_REFUSED, LOGIN_REFUSED.format(method.mechanism))
        self.user = user
        self.auth_mechanism = method.mechanism
        self.state = AWAIT_TUNE_OK
        self.send_method(0, commands.Connection.Tune(channel_max=self.config.channel_max,
                                                     frame_max=self.config.frame_max,
                                                     heartbeat=self.config.heartbeat))

    def _tune_ok(self, method: commands.Connection.TuneOk) -> None:
        server = self.config
        frame_max = method.frame_max  # 0 ("no limit") is above any limit the server set, as in rabbit_reader
        if 0 < frame_max < MIN_FRAME_MAX:
            raise ConnectionError(errors.NOT_ALLOWED, f"negotiated frame_max = {frame_max} is lower than the "
                                  f"minimum allowed value ({MIN_FRAME_MAX})", 10, 30)
        if server.frame_max and (frame_max == 0 or frame_max > server.frame_max):
            raise ConnectionError(errors.NOT_ALLOWED, f"negotiated frame_max = {frame_max} is higher than the "
                                  f"maximum allowed value ({server.frame_max})", 10, 30)
        channel_max = method.channel_max
        if server.channel_max and (channel_max == 0 or channel_max > server.channel_max):
            raise ConnectionError(errors.NOT_ALLOWED, f"negotiated channel_max = {channel_max} is higher than "
                                  f"the maximum allowed value ({server.channel_max})", 10, 30)
        self.frame_max = frame_max
        self.channel_max = channel_max
        self.heartbeat = method.heartbeat
        self.state = AWAIT_OPEN

    def _open(self, method: commands.Connection.Open) -> None:
        assert self.user is not None  # (awaiting open: a user logged in)
        name = method.virtual_host
        if not self.broker.access.vhost_exists(name):
            raise ConnectionError(errors.NOT_ALLOWED, f"vhost {name} not found")
        self.broker.limits.check_connection(name, self.user.name)
        principal = self.broker.access.principal(name, self.user.name)
        if principal.permissions is None:
            raise ConnectionError(errors.NOT_ALLOWED, f"access to vhost '{name}' refused for user '{self.user.name}'")
        self.broker.limits.open_connection(self, name, self.user.name)
        self.vhost = self.broker.vhost(name)
        self.vhost_name = name
        self.principal = principal
        self.state = OPEN
        self.logged_in()
        if self.heartbeat:
            self._timer = self.loop.call_later(self.heartbeat / 2, self._heartbeat_tick)
        self.send_method(0, commands.Connection.OpenOk())

    def _update_secret(self, method: commands.Connection.UpdateSecret) -> None:
        self.send_method(0, commands.Connection.UpdateSecretOk())

    def _close(self, method: commands.Connection.Close) -> None:
        """The client closes: its channels go now, then close-ok; the client closes the socket (bounded wait)."""
        for channel in list(self.channels.values()):
            channel.closed()
        self.channels.clear()
        self.send_method(0, commands.Connection.CloseOk())
        self.flush()
        self.state = DRAINING
        self.buf.clear()
        self.release_reading(EVERY_REASON)  # read (and drop) until the client closes
        if self._timer is not None:
            self._timer.cancel()
        self._timer = self.loop.call_later(CLOSE_TIMEOUT, self._drop)

    # -- closing ------------------------------------------------------------------------------

    def close_with(self, error: AMQPError) -> None:
        """Send connection.close with the error and wait (bounded) for close-ok.

        Before tune-ok is accepted, RabbitMQ trusts no client: it logs the error and drops the socket after
        SILENT_CLOSE_DELAY, telling only a refused login (403) why, and only to a client with the
        authentication_failure_close capability (rabbit_reader:auth_fail); so does Warren unless
        ``explain_handshake_errors`` is set.
        """
        if self.state in (CLOSING, DRAINING, CLOSED):
            return
        told = error.code == errors.ACCESS_REFUSED and self.client_capabilities.get("authentication_failure_close")
        if self.state in (AWAIT_START_OK, AWAIT_TUNE_OK) and not told and not self.config.explain_handshake_errors:
            self.clients.handshakes.log.warning("closing connection %s in its handshake: %s", self.name,
                                                untrusted(error.text))
            self.state = CLOSING
            self.hold_reading(STOPPED)
            if self._timer is not None:
                self._timer.cancel()
            self._timer = self.loop.call_later(SILENT_CLOSE_DELAY, self._drop)
            return
        log.warning("closing connection %s: %s", self.name, untrusted(error.text))
        self.flush()  # the answers to the frames handled before this go first, in order
        for channel in list(self.channels.values()):
            channel.closed()
        self.channels.clear()
        self.state = CLOSING
        self._discard_out()  # (what closing the channels queued: the close is the connection's last word)
        self.send_method(0, commands.Connection.Close(reply_code=error.code, reply_text=error.text[:255],
                                                      class_id=error.class_id, method_id=error.method_id))
        self.flush()
        if self._timer is not None:
            self._timer.cancel()
        self._timer = self.loop.call_later(CLOSE_TIMEOUT, self._drop)

    def force_close(self, reason: str) -> None:
        """Closed by an operator (management API, vhost deletion): 320 CONNECTION_FORCED."""
        self.close_with(ConnectionError(errors.CONNECTION_FORCED, reason))

    def _drop(self) -> None:
        if self.transport is not None:
            self.transport.close()
        self.state = CLOSED

    def abandon(self) -> None:
        """Not open within the handshake timeout, or closed to make room for a newer handshake."""
        super().abandon()
        self.state = CLOSED

    def _heartbeat_tick(self) -> None:
        """Every half interval: send a heartbeat if we were quiet; close after two silent intervals.  A publisher held
        (not read: a resource alarm, flow) is not counted silent: its heartbeats wait unread with its publishes, and
        its silence is counted afresh once it is read again (rabbit_reader's maybe_block pauses the heartbeat
        monitor, rabbit_heartbeat:pause_monitor, and maybe_unblock resumes it)."""
        if self.state != OPEN:
            return
        self._silent_ticks = 0 if self._received or self.held else self._silent_ticks + 1
        self._received = False
        if not self._sent:
            self.out.append(codec.HEARTBEAT_FRAME)
            self.flush()
        self._sent = False  # our own heartbeat does not count: quiet, we send one every half interval as RabbitMQ
        if self._silent_ticks >= 4:
            log.warning("missed heartbeats from client %s, timeout: %ds", self.name, self.heartbeat)
            self._drop()
            return
        self._timer = self.loop.call_later(self.heartbeat / 2, self._heartbeat_tick)

    # -- publisher flow (amqp_server.publisher_flow) -------------------------------------------

    @property
    def held(self) -> bool:
        """A connection that published while the flow had a reason to hold publishers, or while too many of its
        publishes wait for a quorum queue's leader: not read."""
        return self.flow_held or self._leader_waits > LEADER_WAITS

    @property
    def flow_state(self) -> str:
        """RabbitMQ's connection state: blocked (a publisher during an alarm), blocking (an alarm stands; it
        has not published), flow (held by back-pressure), else running or closing."""
        if self.state != OPEN:
            return "closing"
        alarm = self.flow.alarm() is not None
        if self.held:
            return "blocked" if alarm else "flow"
        return "blocking" if alarm else "running"

    def hold(self, alarm: str | None) -> None:
        """Stop reading, also in the middle of a message; an alarm is told to clients that asked."""
        self.flow_held = True
        if alarm is not None:
            self.notify_blocked(alarm)
        else:
            self._notify_unblocked()  # the alarm cleared, while flow still holds: reading stays paused
        self.hold_reading(FLOW)

    def release(self) -> None:
        self.flow_held = False
        self._notify_unblocked()
        self.release_reading(FLOW)

    def leader_waits(self, change: int) -> None:
        """Its channels' publishes waiting for a quorum queue's leader: past ``LEADER_WAITS`` of them it is read no
        more until they go to one (as RabbitMQ's credit flow holds a channel whose quorum commands pend); this
        connection alone is held, not the node's other publishers."""
        self._leader_waits += change
        if self._leader_waits > LEADER_WAITS:
            self.hold_reading(LEADERLESS)
        else:
            self.release_reading(LEADERLESS)

    def notify_blocked(self, alarm: str) -> None:
        if self.client_capabilities.get("connection.blocked") and not self.blocked_notified:
            self.blocked_notified = True
            self.send_method(0, commands.Connection.Blocked(reason=alarm))

    def _notify_unblocked(self) -> None:
        if self.blocked_notified:
            self.blocked_notified = False
            self.send_method(0, commands.Connection.Unblocked())

    def listed_sessions(self) -> None:
        return None

    def listed_publishers(self) -> list[ListedPublisher]:
        return []

    def listed_subscriptions(self) -> list[ListedSubscription]:
        return []

    def message_stats(self) -> Iterable[MessageStats]:
        return [channel.stats for channel in self.channels.values()]

    def drop_if_peer_gone(self) -> None:
        """A connection we stopped reading cannot see its peer hang up: ask the socket (POLLRDHUP), and let
        go of what it holds (partial messages) at once instead of when the alarm clears."""
        transport = self.transport
        sock = transport.get_extra_info("socket") if transport is not None else None
        if transport is None or sock is None or self.state == CLOSED:
            return
        poller = select.poll()
        poller.register(sock.fileno(), select.POLLRDHUP | select.POLLHUP | select.POLLERR)
        if poller.poll(0):
            log.info("client of blocked connection %s went away", self.name)
            transport.abort()


_ERLANG_ESCAPES = {0x0A: "\\n", 0x0D: "\\r", 0x09: "\\t", 0x0B: "\\v", 0x08: "\\b", 0x0C: "\\f", 0x1B: "\\e",
                   0x22: '\\"', 0x5C: "\\\\"}


_SIZES = {"octet": 1, "short": 2, "long": 4, "longlong": 8}


def _fixed_size(method: Frame) -> int | None:
    """The octets a method's fields take when none is of a variable size (strings, tables), else None: consecutive
    bits share an octet, eight at most."""
    size, bits = 0, 0
    for name in method.__slots__:
        kind = method.amqp_type(name)
        if kind == "bit":
            bits += 1
            continue
        if kind not in _SIZES:
            return None
        size, bits = size + _SIZES[kind] + (bits + 7) // 8, 0
    return size + (bits + 7) // 8


_FIXED_SIZES = {cls: size for cls in commands.INDEX_MAPPING.values() if (size := _fixed_size(cls())) is not None}


def decode_fields(method: Frame, fields: bytes) -> None:
    """Set ``method``'s fields from ``fields``, which they must fill exactly, as the generated
    rabbit_framing_amqp_0_9_1:decode_method_fields matches each method's fields whole (pamqp's unmarshal lets octets
    after them, or a string cut short at the end, through): ValueError if they do not."""
    pos = 0
    bit = -1  # the bit of the octet at ``pos`` the next bit field reads; -1: no bit octet under way
    for name in method.__slots__:
        kind = method.amqp_type(name)
        value: FieldValue
        if kind == "bit":
            if bit == 8:
                pos, bit = pos + 1, 0
            _, value = decode.bit(fields[pos:pos + 1], max(bit, 0))
            bit = max(bit, 0) + 1
        else:
            if bit >= 0:
                pos, bit = pos + 1, -1
            consumed, value = decode.by_type(fields[pos:], kind)
            pos += consumed
        setattr(method, name, value)
    if pos + (bit >= 0) != len(fields):
        raise ValueError("method fields do not fill the frame")


def cannot_decode(fields: bytes | bytearray, class_id: int, method_id: int) -> ConnectionError:
    """Method fields decode_method_fields cannot match (rabbit_misc:frame_error/2): 501 naming the method."""
    return ConnectionError(errors.FRAME_ERROR, f"cannot decode {binary_w(fields[:128])}", class_id, method_id)


def binary_w(data: bytes | bytearray) -> str:
    """A binary as Erlang's ~w writes it: ``<<0,20,0,40>>``, every octet a number.  (Of a longer one, cut to fit a
    reply text, the first 128 octets are enough: its text is cut before their end.)"""
    return f"<<{','.join(map(str, data))}>>"


def frame_text(ftype: int, payload: bytes | bytearray) -> str:
    """rabbit_reader's "type ~p, ~s octets = ~p": the frame's type and all of its payload up to 16 octets, else the
    first 16, as Erlang's ~p prints a binary: ``<<"text">>`` when every octet is printable ASCII, else
    ``<<0,20,0,40>>``.  (Where that line, or the frame error's after it, would pass column 80, io_lib_pretty breaks it
    over lines, which this does not.)"""
    part = bytes(payload[:16])
    which = "all" if len(payload) <= 16 else "first 16"
    if part and all(0x20 <= b < 0x7F or b in _ERLANG_ESCAPES for b in part):
        return f'type {ftype}, {which} octets = <<"' + "".join(_ERLANG_ESCAPES.get(b, chr(b)) for b in part) + '">>'
    return f"type {ftype}, {which} octets = {binary_w(part)}"


def frame_error(ftype: int, payload: bytes | bytearray, error: str | tuple[str | int, ...]) -> ConnectionError:
    """A frame the reader cannot take (rabbit_reader's frame_error, "type ~p, ~s octets = ~p: ~p"): 501; ``error``
    the Erlang term it names, an atom or a tuple of atoms and numbers."""
    term = error if isinstance(error, str) else "{" + ",".join(map(str, error)) + "}"
    return ConnectionError(errors.FRAME_ERROR, f"{frame_text(ftype, payload)}: {term}")


def unexpected_frame(ftype: int, payload: bytes | bytearray) -> ConnectionError:
    """A frame the connection's state does not take (rabbit_reader's unexpected_frame): 505."""
    return ConnectionError(errors.UNEXPECTED_FRAME, frame_text(ftype, payload))

