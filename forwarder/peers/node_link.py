"""Node-to-node links: persistent TCP connections carrying length-prefixed frames.

Every node dials every other node; the dialing side (:class:`ClientLink`) sends requests —
publishes for queues the other node owns, consumer registrations, acks — and the listening
side (:class:`ServerLink`) answers with confirms and deliveries.  Frames written during one
event-loop turn go out in one write (batched), nothing waits for a reply before the next frame
(pipelined), and a full socket buffer pauses the producers (flow control).  Each end is a front end
(``amqp_server.frontend.front_end``): a read handles a bounded number of frames, and the listening end reads no more
while its dialer does not read what it is sent (the dialing end always reads: were both ends to stop, neither would
drain the other).  A large frame (``LARGE_FRAME``) is read straight into one buffer of its declared size, which
becomes its message's body (no copy), and a large body leaves through the outbox, never joined with its frame (what
the socket does not take is copied into the transport a piece at a time, as it has room).

A link is authenticated with the shared cluster secret, as Erlang's cookie: the listener sends a
random nonce, the dialer answers with its name and an HMAC of the nonce; the listener proves it
knows the secret the same way.  Nothing else is read before that, and little: frames of at most
``HANDSHAKE_FRAME_MAX`` bytes, one proof per connection, ``HANDSHAKE_TIMEOUT`` seconds, and at most
``HANDSHAKES_MAX`` connections at once in their handshake on the listener (``amqp_server.frontend.front_end``), whose
output may buffer ``PRELOGIN_WRITE_HIGH`` meanwhile.  A peer that breaks these is closed with one line in the log
(a few a second at most), its name quoted and cut.  The challenge carries the listener's ``LINK_VERSION``, the
layout of the frames below: a dialer of another version refuses it, so that nodes of two releases whose frames
differ never misread each other in a rolling upgrade (they refuse each other, in the log).  Heartbeats every
second notice a peer that vanished without closing its socket (a dead host) within five seconds.
"""
from __future__ import annotations

import asyncio
import datetime
import hashlib
import hmac
import json
import logging
import os
import struct
from typing import Any, Callable, cast

from amqp_server.config import MAX_MESSAGE_SIZE
from amqp_server.framing import file_out
from amqp_server.framing.file_out import FileRange, Part
from amqp_server.frontend.front_end import (BYTES_PER_TURN, FRAMES_PER_TURN, Complaints, FrontEnd, Unauthenticated,
                                           grow, read_buffer)
from amqp_server.logs import untrusted
from amqp_server.message import Message
from amqp_server.payload import decode_head, encode, route_names
from amqp_server.queues.queue import Checked, SettleMode

log = logging.getLogger("warren.forwarder.link")
complaints = Complaints(log)

FRAME = struct.Struct(">IB")  # payload length, frame type
WRITE_BUFFER_HIGH = 8 * 1024 * 1024
# a frame may carry one message of the largest size any protocol takes, with its route, header and op head around
# it (a quorum queue's op, a publish forwarded); frames of many ops or rows stop at ``oplog.FRAME_BYTES``
MAX_FRAME = MAX_MESSAGE_SIZE + 16 * 1024 * 1024
# a frame at least this large not read whole with the frames before it is read into a buffer of its own, of its declared
# size (``FrameLink.get_buffer``): a large body crosses the node with no copy, where the read buffer and the payload
# cut from it held it three times
LARGE_FRAME = 256 * 1024
HANDSHAKE_FRAME_MAX = 512  # before the handshake is done: a nonce, a proof and a node name (at most 255 bytes)
HANDSHAKE_TIMEOUT = 5.0  # seconds from connect to a proven peer, on both ends
HANDSHAKES_MAX = 16  # connections in their handshake at once on a listener; one more closes the oldest

HEARTBEAT_INTERVAL = 1.0  # a quiet link sends a heartbeat frame this often
HEARTBEAT_MISSES = 5  # and is closed after this many intervals without hearing anything
STALL = (HEARTBEAT_MISSES - 2) * HEARTBEAT_INTERVAL  # a node stalled this long may be heard from no more

LINK_VERSION = 13  # the frames' layout; one more whenever a frame changes (2: DELIVER's seq, RELAY; 3: ENQUEUE;
# 4: SILENT; 5: SETTLE_RELEASE; 6: CONSUME's filter_set, an AMQP 1.0 consumer's filters the owner applies;
# 7: MODIFY; 8: CONFIRMS; 9: a quorum log's Enqueue carries its body's size; 10: a Checkout carries its term,
# DELIVER's AGREED flag, DIFF snapshots, REQUEST's sync and count; 11: DIRECT_REPLY, REQUEST's reply, ALARMS,
# SHARE, WANT, UNUSED, RECALL, DELIVER's GRANTED flag, CONSUME's shared; 12: a quorum snapshot row's delivery count
# in a u64; 13: a quorum Return served first, the state's returns, a snapshot row's ROW_FRONT)
VERSION = struct.Struct(">H")
NONCE_SIZE = 16

# frame types
CHALLENGE, AUTH, AUTH_OK, HEARTBEAT = 1, 2, 3, 4
# the last frame of a link its end closes for it heard nothing for ``HEARTBEAT_MISSES`` intervals: the other end,
# which may still hear this one (an asymmetric cut), takes the link for silent, not for its node gone
SILENT = 5
PUBLISH, CONFIRM = 10, 11  # dialer -> owner, owner -> dialer
RELAY = 12  # a publish a deposed leader passes on to the leader it knows: as PUBLISH, but never passed on again
CONFIRMS = 14  # owner -> dialer: CONFIRM_BODYs, the answers of one turn (a CONFIRM_MOVED with its hint: a CONFIRM)
ENQUEUE = 13  # a publish of a quorum queue's window (``remote_queue.Window``) to its leader: never passed on
# a reply for a direct reply-to consumer of the other node's: its name (after its length, as a queue id's), then the
# message; never answered
DIRECT_REPLY = 15
CONSUME, CONSUMED, CANCEL, CANCELLED = 20, 21, 22, 23
DELIVER, SETTLE, CREDIT = 30, 31, 32
MODIFY = 33  # a SETTLE (requeue, release or reject) with an AMQP 1.0 modified outcome's annotations for the messages
# a consumer whose channel has a shared prefetch (CONSUME's shared) gets only what its node granted it of the
# channel's room: SHARE (dialer -> owner, CREDIT_BODY: that many more, 0 to one not held so: held from now on, its
# channel's shared limit set after it consumed; ``ports.UNLIMITED``: no shared limit any more),
# WANT (owner -> dialer, ID: a message waits for it and it has no grant), UNUSED (owner -> dialer, CREDIT_BODY: the
# grant it had not used, given back when its node asked: RECALL, dialer -> owner, ID)
SHARE, WANT, UNUSED, RECALL = 34, 35, 36, 37
REQUEST, REPLY = 50, 51  # basic.get and purge on the owner: JSON request; JSON reply (+ message)
REPLY_HEAD = struct.Struct(">I")  # JSON length; then JSON, then the message if one was got
STATS = 40  # owner -> dialer, every second: {"vhost\0queue": [ready messages, consumers]}
ALARMS = 41  # owner -> dialer, with STATS: the resources alarmed on the owner's node (["memory", "disk"])
REPLICATE, REPLICATED = 60, 61  # a quorum queue's leader -> follower: its log (see quorum); follower -> leader

PUBLISH_HEAD = struct.Struct(">QI")  # link seq (0: no confirm wanted), length of the queue ids that follow
QID = struct.Struct(">H")  # each queue id ("vhost\0name") is prefixed by its length
ENQUEUER_HEAD = struct.Struct(">QQQ")  # ENQUEUE, after its queue id: the window's id, the seq, its oldest unanswered
CONFIRM_BODY = struct.Struct(">QB")  # link seq, status; CONFIRM_MOVED's then the leader known there (MOVED_HINT)
MOVED_HINT = struct.Struct(">Q")  # its term (0: none known), then its name
# consumer id, delivery tag, the entry's seq in its queue, flags: REDELIVERED, AGREED (the queue's ``agreed``),
# GRANTED (sent under a SHARE)
DELIVER_HEAD = struct.Struct(">IQQB")
REDELIVERED, AGREED, GRANTED = 1, 2, 4
SETTLE_HEAD = struct.Struct(">B")  # mode, then delivery tags
MODIFY_HEAD = struct.Struct(">BI")  # SETTLE's mode, the annotations' length; then the annotations, the delivery tags
TAG = struct.Struct(">Q")
ID = struct.Struct(">I")
CREDIT_BODY = struct.Struct(">II")  # consumer id, deliveries made to the client

CONFIRM_OK, CONFIRM_REJECTED, CONFIRM_NO_QUEUE = 0, 1, 2
# an ENQUEUE not taken: the node does not lead the queue; an earlier publish of the window never came
CONFIRM_MOVED, CONFIRM_RESEND = 3, 4
SETTLE_ACK, SETTLE_REQUEUE, SETTLE_REJECT, SETTLE_RELEASE = 0, 1, 2, 3
SETTLE_MODES: tuple[SettleMode, ...] = ("ack", "requeue", "reject", "release")  # by a SETTLE frame's mode
# the frames whose handlers take a large frame's payload as the bytearray it was read into (``read_message`` makes it
# the body); the others get bytes
IN_PLACE = frozenset((PUBLISH, RELAY, ENQUEUE, DIRECT_REPLY, DELIVER, REPLY))


def read_queue_ids(payload: bytes | bytearray, pos: int, end: int) -> list[bytes]:
    qids = []
    while pos < end:
        size = QID.unpack_from(payload, pos)[0]
        pos += QID.size
        qids.append(bytes(payload[pos:pos + size]))  # (bytes of bytes is the same object)
        pos += size
    return qids


_names: dict[bytes, tuple[str, str]] = {}  # route -> (exchange, routing key): a stream repeats a few routes
MAX_NAMES = 4096


def _route_names(route: bytes) -> tuple[str, str]:
    if len(_names) >= MAX_NAMES:
        _names.clear()
    names = _names[route] = route_names(route)
    return names


def read_message(payload: bytes | bytearray, pos: int) -> Message:
    """The message of a frame whose payload from ``pos`` on is a message's (``amqp_server.payload``).  A bytearray
    (a large frame's own buffer, ``FrameLink.get_buffer``) becomes the body, what comes before it cut off in place
    (bytearray moves its start: no copy): its caller reads nothing more of it."""
    body: bytes | bytearray
    if type(payload) is bytearray:
        head, header_in, body_at, sections = decode_head(payload, pos)
        route, header, body = bytes(head), bytes(header_in), payload
        del payload[:body_at]
    else:
        route, header, body_at, sections = decode_head(cast(bytes, payload), pos)
        body = payload[body_at:]
    exchange, routing_key = _names.get(route) or _route_names(route)
    message = Message(exchange, routing_key, route, header, body)  # type: ignore[arg-type]  # (read as bytes)
    message.amqp10 = sections
    return message


def read_checked(value: Any) -> Checked:
    """A checkout as a peer names it in JSON, ``[seq, term, agreed]``; one that names nothing if it is not that."""
    if (isinstance(value, list) and len(value) == 3 and all(type(v) is int and v >= 0 for v in value[:2])
            and type(value[2]) is bool):
        return value[0], value[1], value[2]
    return -1, 0, False


def encode_json(value: Any) -> bytes:
    return json.dumps(value, default=str).encode()


def portable_arguments(arguments: dict[str, Any]) -> tuple[dict[str, Any], dict[str, float]]:
    """A consumer's arguments for JSON, and apart (by name, as epoch seconds) those that are AMQP timestamps
    (a stream's x-stream-offset), which ``arguments_from`` makes timestamps again: nothing a client sends can
    pass for one."""
    stamps = {name: value.timestamp() for name, value in arguments.items() if isinstance(value, datetime.datetime)}
    return {name: value for name, value in arguments.items() if name not in stamps}, stamps


def arguments_from(arguments: dict[str, Any], stamps: dict[str, float]) -> dict[str, Any]:
    return {**arguments, **{name: datetime.datetime.fromtimestamp(seconds, datetime.timezone.utc)
                            for name, seconds in stamps.items()}}


def _proof(secret: bytes, nonce: bytes, name: str, role: bytes) -> bytes:
    return hmac.new(secret, role + nonce + name.encode(), hashlib.sha256).digest()


class FrameLink(FrontEnd, asyncio.BufferedProtocol):
    """Framing, batched output and write flow control shared by both ends of a link."""

    kind = "cluster link"
    direction = "with"  # "from" a dialer, "to" a listener: for the log
    handshake_log: Complaints  # where a broken handshake is told

    def __init__(self, secret: bytes, node_name: str, handshakes: Unauthenticated | None = None) -> None:
        super().__init__(handshakes, complaints, WRITE_BUFFER_HIGH)
        self.secret = secret
        self.node_name = node_name
        self.peer_name = ""
        self.authenticated = False
        self._buf = bytearray()
        self._reads = read_buffer()
        self._large: bytearray | None = None  # the payload of a large frame being read (``get_buffer``)
        self._large_type = 0
        self._filled = 0  # how much of it has come
        self._into_large = False  # the read under way goes into it
        self._out: list[Part] = []
        # ``_out`` holds a body in a file (``stored_bodies.body_out``) or a large one: it goes by ``files``
        self.file_out = False
        self._scheduled = False
        self._held: Callable[[], None] | None = None
        self._heard = True
        self._quiet_ticks = 0
        self._sent = False
        self._refused = False  # a broken handshake: nothing more is read
        # the link fell silent, not its peer's node or host: closed here after heartbeats went unheard, or by the
        # other end after this node was stalled (paused, its loop held) long enough for it to hear nothing, or
        # for it heard nothing of what this one sent (it said so: ``SILENT``)
        self.silent = False
        self.closed = asyncio.get_running_loop().create_future()
        self._beat = asyncio.get_running_loop().time()  # when the heartbeat timer last ran
        self._woke = float("-inf")  # when it last ran after a stall of ``STALL`` or more

    def opened(self) -> None:
        self._beat = asyncio.get_running_loop().time()
        asyncio.get_running_loop().call_later(HEARTBEAT_INTERVAL, self._heartbeat)

    def _heartbeat(self) -> None:
        if self.transport is None:
            return
        now = asyncio.get_running_loop().time()
        if now - self._beat >= STALL:
            self._woke = now
        self._beat = now
        self._quiet_ticks = 0 if self._heard else self._quiet_ticks + 1
        self._heard = False
        if self._quiet_ticks >= HEARTBEAT_MISSES:
            log.warning("link with %s silent for %.0f s: closing", self.peer_name or "?",
                        HEARTBEAT_MISSES * HEARTBEAT_INTERVAL)
            self.silent = True
            if self.authenticated and not self.files:  # (behind a body part sent, it would land inside the body)
                self.transport.write(FRAME.pack(0, SILENT))  # (what waits in ``_out`` goes with the link)
            self.transport.abort()
            return
        if not self._sent:
            self.send(HEARTBEAT)
        self._sent = False
        asyncio.get_running_loop().call_later(HEARTBEAT_INTERVAL, self._heartbeat)

    def connection_lost(self, exc: Exception | None) -> None:
        super().connection_lost(exc)
        self._discard_out()
        self._large = None  # (a frame cut short: none of it stays)
        self._buf.clear()
        now = asyncio.get_running_loop().time()
        if now - self._beat >= STALL or now - self._woke <= 2 * HEARTBEAT_INTERVAL:
            self.silent = True  # (this node stalled: the other end may have closed it for hearing nothing)
        self.transport = None
        if not self.closed.done():
            self.closed.set_result(None)

    def close(self) -> None:
        if self.transport is not None:
            self.transport.close()

    def hold(self, complete: Callable[[], None]) -> None:
        """A frame still being assembled (a publish gathering its queues): ``complete`` sends it
        before any other frame, and at the latest at the end of this event-loop turn."""
        self._complete_held()
        self._held = complete
        if not self._scheduled:
            self._scheduled = True
            asyncio.get_running_loop().call_soon(self.flush)

    def _complete_held(self) -> None:
        held = self._held
        if held is not None:
            self._held = None
            held()

    def send(self, ftype: int, *parts: bytes) -> None:
        if self._held is not None:
            self._complete_held()
        out = self._out
        out.append(FRAME.pack(sum(map(len, parts)), ftype))
        out.extend(parts)
        if not self._scheduled:
            self._scheduled = True
            asyncio.get_running_loop().call_soon(self.flush)

    def send_message(self, ftype: int, head: bytes, message: Message | None, header: bytes | None = None,
                     body: bytes | FileRange | None = None) -> None:
        """A frame of ``head`` and then the message, if any (route, header and body as published, or with
        ``header`` as its queue delivers it; ``body``: the body as it goes, from a file where ``body_out`` says so
        and the message's own by default)."""
        if message is None:
            self.send(ftype, head)
            return
        if self._held is not None:
            self._complete_held()
        route = message.route
        if body is None:
            body = message.body
        if header is None:
            header = message.header
        lengths, *parts = encode(route, header, body, message.amqp10)
        if len(body) >= LARGE_FRAME:  # (in memory too: written from where it is, never joined with the rest)
            self.file_out = True
        self._out += (FRAME.pack(len(head) + len(lengths) + len(route) + len(header) + len(body), ftype), head,
                      lengths, *parts)
        if not self._scheduled:
            self._scheduled = True
            asyncio.get_running_loop().call_soon(self.flush)

    def flush(self) -> None:
        self._complete_held()
        self._scheduled = False
        if self._out and self.transport is not None and not self.transport.is_closing():
            if self.file_out or self.files:  # (what follows output waiting there goes after it)
                self.files.send(self.transport, self._out, self.write_high)
                self._out.clear()  # (the outbox's now)
                self.file_out = False
            else:
                self.transport.write(b"".join(cast(list[bytes], self._out)))
            self._sent = True
        self._discard_out()

    def _discard_out(self) -> None:
        """The output is done with (written, or dropped): the descriptors of bodies in files not sent are closed."""
        if self.file_out:
            file_out.discard(self._out)
            self.file_out = False
        self._out.clear()

    def get_buffer(self, sizehint: int) -> memoryview:
        """Where the next read goes: inside a large frame, the rest of its own buffer (the socket's bytes land where
        its handler takes them, copied by no one); else the thread's read buffer, whose bytes ``data_received``
        takes."""
        large = self._large
        self._into_large = large is not None
        if large is not None:
            return memoryview(large)[self._filled:]
        return self._reads

    def buffer_updated(self, nbytes: int) -> None:
        if not self._into_large:
            self.data_received(self._reads[:nbytes])
            return
        self._heard = True
        self._filled += nbytes
        assert self._large is not None  # (``get_buffer`` read into it)
        if self._filled == len(self._large):  # handled at the next turn: the transport's view of it is gone then
            self.next_turn()

    def data_received(self, data: bytes | memoryview) -> None:
        if self._refused:
            return
        self._heard = True
        large = self._large
        if large is not None:  # (read whole in the read buffer, or a test's: copied into the frame's buffer)
            take = min(len(large) - self._filled, len(data))
            with memoryview(large) as into, memoryview(data) as view:
                into[self._filled:self._filled + take] = view[:take]
                self._filled += take
                self._buf += view[take:]
        else:
            self._buf += data
        self.read_on()

    def read_on(self) -> None:
        """The frames read, ``FRAMES_PER_TURN`` at most and ``BYTES_PER_TURN`` or a frame more, while the peer
        reads what they answer (a listener).  (A snapshot's frames of 4,096 rows each, all read in one turn,
        held a follower's loop past its etcd lease on a loaded machine.)  A large frame read into a buffer of its
        own is a turn's frames."""
        buf = self._buf
        pos = 0
        n = len(buf)
        budget = FRAMES_PER_TURN
        try:
            large = self._large
            if large is not None:
                if self._filled < len(large) or self.reading_paused:
                    return
                self._large = None
                self.frame(self._large_type, large if self._large_type in IN_PLACE else bytes(large))
                if n and self.transport is not None:
                    self.next_turn()
                return
            while n - pos >= FRAME.size and not self.reading_paused:
                budget -= 1
                if budget < 0 or pos >= BYTES_PER_TURN:
                    self.next_turn()
                    break
                size, ftype = FRAME.unpack_from(buf, pos)
                if size > (MAX_FRAME if self.authenticated else HANDSHAKE_FRAME_MAX):
                    raise ValueError(f"frame of {size} bytes")
                end = pos + FRAME.size + size
                if end > n:
                    if size >= LARGE_FRAME and self.authenticated and ftype > SILENT:
                        self._read_large(ftype, size, pos + FRAME.size)
                        pos = n
                    break
                payload = bytes(buf[pos + FRAME.size:end])
                pos = end
                if ftype == HEARTBEAT:
                    continue
                if ftype == SILENT and self.authenticated:
                    self.silent = True
                    continue
                if self.authenticated:
                    self.frame(ftype, payload)
                else:
                    self.handshake(ftype, payload)
                if self.transport is None or self._refused:
                    return
        except Exception as exc:
            if not self.authenticated:  # a stranger's garbage: a line, no traceback
                self.refuse(f"broken handshake ({untrusted(exc)})")
                return
            complaints.internal("link with", self.peer_name or "?")
            self.close()
            return
        del buf[:pos]

    def _read_large(self, ftype: int, size: int, start: int) -> None:
        """A large frame whose payload begins at ``start`` of the read buffer, which holds no more of it: its
        own buffer is set aside, of its declared size (checked against ``MAX_FRAME`` already), and what came of it
        goes there; the rest is read there (``get_buffer``)."""
        large = bytearray()
        grow(large, size)
        taken = len(self._buf) - start
        with memoryview(large) as into, memoryview(self._buf) as view:
            into[:taken] = view[start:]
        self._large, self._large_type, self._filled = large, ftype, taken

    def handshake(self, ftype: int, payload: bytes) -> None:
        raise NotImplementedError

    def refuse(self, why: str) -> None:
        """The peer failed its handshake: closed at once, nothing more read, one line (throttled) said."""
        self._refused = True
        self._buf.clear()
        self.handshake_log.warning("link %s %s refused: %s", self.direction, self.address, why)
        self.abandon()

    @property
    def address(self) -> str:
        peer = self.transport.get_extra_info("peername") if self.transport is not None else None
        return f"{peer[0]}:{peer[1]}" if peer else "?"

    def frame(self, ftype: int, payload: bytes | bytearray) -> None:
        """A frame read; its payload is a bytearray only for a large frame of ``IN_PLACE``."""
        raise NotImplementedError


def listener(secret: bytes, node_name: str,
             open_session: Callable[["ServerLink"], Any]) -> Callable[[], "ServerLink"]:
    """The protocol factory of a node's link port, its connections in their handshake counted together."""
    handshakes = Unauthenticated("cluster link", HANDSHAKES_MAX, HANDSHAKE_TIMEOUT, log)
    return lambda: ServerLink(secret, node_name, open_session, handshakes)


class ServerLink(FrameLink):
    """The listening end: authenticates the dialer, then hands its frames to a session."""

    direction = "from"

    def __init__(self, secret: bytes, node_name: str, open_session: Callable[["ServerLink"], Any],
                 handshakes: Unauthenticated) -> None:
        super().__init__(secret, node_name, handshakes)
        self._nonce = os.urandom(NONCE_SIZE)
        self._open_session = open_session
        self.handshakes = handshakes
        self.handshake_log = handshakes.log
        self.session: Any = None

    def opened(self) -> None:
        super().opened()
        self.send(CHALLENGE, self._nonce, VERSION.pack(LINK_VERSION))

    def handshake(self, ftype: int, payload: bytes) -> None:
        proof_end = NONCE_SIZE + 32  # the dialer's nonce, then its HMAC-SHA256
        if ftype != AUTH or len(payload) < proof_end:
            self.refuse(f"its first frame (type {ftype}, {len(payload)} bytes) is no proof")
            return
        nonce, proof, name = payload[:NONCE_SIZE], payload[NONCE_SIZE:proof_end], payload[proof_end:].decode()
        if not hmac.compare_digest(proof, _proof(self.secret, self._nonce, name, b"dialer")):
            self.refuse(f"wrong cluster secret (it says it is {untrusted(name)})")
            return
        self.logged_in()
        self.peer_name = name
        self.authenticated = True
        self.send(AUTH_OK, _proof(self.secret, nonce, self.node_name, b"listener"), self.node_name.encode())
        self.session = self._open_session(self)
        log.info("link from node %s accepted", untrusted(name))

    def frame(self, ftype: int, payload: bytes | bytearray) -> None:
        self.session.frame(ftype, payload)

    def drained(self) -> None:
        if self.session is not None:
            self.session.writable()

    def connection_lost(self, exc: Exception | None) -> None:
        super().connection_lost(exc)
        if self.session is not None:
            self.session.closed()


_dialed = Complaints(log)  # the dialing ends' refusals


class ClientLink(FrameLink):
    """The dialing end: proves the secret, then feeds frames from the owner to ``handler``.  Its handshake's
    deadline is the dialer's (``Peer``)."""

    direction = "to"
    handshake_log = _dialed
    pause_reads_on_full_writes = False  # (see the module's docstring)

    def __init__(self, secret: bytes, node_name: str, expected_peer: str, handler: Any) -> None:
        super().__init__(secret, node_name)
        self.expected_peer = expected_peer
        self.handler = handler
        self._nonce = os.urandom(NONCE_SIZE)
        self._challenged = False
        self.ready = asyncio.get_running_loop().create_future()

    def handshake(self, ftype: int, payload: bytes) -> None:
        if ftype == CHALLENGE and not self._challenged and len(payload) in (NONCE_SIZE, NONCE_SIZE + VERSION.size):
            version = VERSION.unpack_from(payload, NONCE_SIZE)[0] if len(payload) > NONCE_SIZE else 1
            if version != LINK_VERSION:
                self.refuse(f"node {untrusted(self.expected_peer)} speaks link version {version}, this node "
                            f"{LINK_VERSION}: the nodes of a cluster must run releases whose links agree")
                return
            self._challenged = True  # one proof per connection
            self.send(AUTH, self._nonce, _proof(self.secret, payload[:NONCE_SIZE], self.node_name, b"dialer"),
                      self.node_name.encode())
            return
        if ftype != AUTH_OK or not self._challenged:
            self.refuse(f"frame of type {ftype} in the handshake with node {untrusted(self.expected_peer)}")
            return
        proof, name = payload[:32], payload[32:].decode()
        if name != self.expected_peer or not hmac.compare_digest(
                proof, _proof(self.secret, self._nonce, name, b"listener")):
            self.refuse(f"node {untrusted(self.expected_peer)} expected, it is {untrusted(name)} or has another "
                        "cluster secret")
            return
        self.peer_name = name
        self.authenticated = True
        if not self.ready.done():
            self.ready.set_result(None)

    def frame(self, ftype: int, payload: bytes | bytearray) -> None:
        self.handler.frame(ftype, payload)

    def drained(self) -> None:
        self.handler.writable()

    def connection_lost(self, exc: Exception | None) -> None:
        super().connection_lost(exc)
        if not self.ready.done():
            self.ready.set_exception(ConnectionError("link closed during handshake"))
