"""An AMQP 1.0 session and its links (RabbitMQ 4.x's rabbit_amqp_session), on the broker operations the AMQP
0-9-1 channel uses: a link from the client publishes (``broker.publish``, with the confirm path's outcomes), a link
to the client consumes (``broker.consume``, link credit as the consumer's credit), and dispositions settle as
``basic.ack``/``reject``/``nack`` do.

Session windows: the node's incoming window is ``INCOMING_WINDOW`` transfer frames, opened again by a flow once
half is used; deliveries stop while the client's incoming window is spent.  Link credit: a publishing link gets
``LINK_CREDIT`` and more once half is used, none while an alarm holds publishers or while more than a few of its
transfers wait for a quorum queue's leader; a transfer beyond its credit
detaches the link.
"""
from __future__ import annotations

import struct
from collections import deque
from itertools import repeat
from typing import TYPE_CHECKING, Any, Coroutine

from urllib.parse import quote

from ..broker import server_name
from .. import errors
from ..errors import AMQPError, ChannelError
from ..framing.file_out import FileRange, Part, cut
from ..frontend.stored_bodies import SEND_FROM_FILE, body_out, forget_left, release_body
from ..memory import MEMORY_CHECK_BYTES
from ..message import RELEASE_FROM, encode_route
from ..publisher_flow import LEADER_WAITS
from ..frontend.front_end import ListedLink, ListedSession
from ..ports import ClientChannel
from ..logs import untrusted
from ..stats import MessageStats
from stream_log import amqp10
from stream_log.amqp10 import NULL, Value, binary, boolean, described, encode_list, uint, utf8
from ..queues.queue_type import LOG
from . import address, filters, frames, management, terminus
from .frames import Amqp10Error, LinkError, SessionError

if TYPE_CHECKING:
    from exchanges import Exchange

    from ..broker.direct_reply import ReplyConsumer
    from ..message import Message
    from ..queues.queue import AnyQueue, Consumer, Entry
    from .host import SessionHost

INCOMING_WINDOW = 400  # RabbitMQ's ?MAX_INCOMING_WINDOW
_HALF_WINDOW = INCOMING_WINDOW // 2  # a flow opens the window again once half is used
HANDLE_MAX = 255  # RabbitMQ's link_max_per_session (256) less one
LINK_CREDIT = 128  # RabbitMQ's ?LINK_CREDIT_RCV: what a publishing link is granted, topped up at half
_HALF_CREDIT = LINK_CREDIT // 2
MANAGEMENT_LINK_CREDIT = 8  # RabbitMQ's ?MAX_MANAGEMENT_LINK_CREDIT: a /management request link's, topped up at half
MAX_UINT = 0xFFFFFFFF
_TAG = struct.Struct(">I")
_TAG_BIN4 = 0xA004  # a delivery tag's constructor: a binary of 4 bytes
LARGE_BODY = 64 * 1024  # a body at least this large is written from where it is, not copied into the output
MAX_RESPONSES = 256  # direct replies kept for a client that gives their link no credit
_TRANSFER_OVERHEAD = 64  # frame header and transfer performative, at most (a 4-byte tag)


def _error_of(exc: AMQPError) -> tuple[str, str]:
    if isinstance(exc, errors.QueueLimitReached):
        return frames.RESOURCE_LIMIT_EXCEEDED, exc.detail
    return frames.condition_of(exc.code), exc.detail


class Session:
    """One ``begin``..``end`` on a channel: its windows, links and unsettled deliveries."""

    def __init__(self, connection: SessionHost, channel: int, fields: list[Value]) -> None:
        self.connection = connection
        self.channel = channel
        self.broker = connection.broker
        self.next_incoming_id = frames.typed(fields, 1, ("uint",), "next-outgoing-id", 0)
        self.incoming_window = INCOMING_WINDOW
        self.remote_incoming_window = frames.typed(fields, 2, ("uint",), "incoming-window", 0)
        self.remote_outgoing_window = frames.typed(fields, 3, ("uint",), "outgoing-window", 0)
        # the highest handle either end may use: the client's, when lower (RabbitMQ's EffectiveHandleMax)
        self.handle_max = min(HANDLE_MAX, frames.typed(fields, 4, ("uint",), "handle-max", HANDLE_MAX))
        self.next_outgoing_id = 0  # transfer frames sent (what the windows count)
        self.next_delivery_id = 0
        self.links: dict[int, LinkEndpoint] = {}
        self.unsettled: dict[int, tuple[Entry, AnyQueue, Consumer | None]] = {}  # (the consumer's link: its channel)
        self.confirming: set[Incoming] = set()  # links with outcomes to send at the next flush
        self.stats = MessageStats()
        vhost = connection.vhost
        assert vhost is not None  # begin comes after open
        self.vhost_stats = self.broker.vhost_stats(vhost.name)
        connection.send(channel, frames.performative(
            frames.BEGIN, amqp10.ushort(channel), uint(0), uint(INCOMING_WINDOW), uint(MAX_UINT),
            uint(self.handle_max)))

    def send(self, body: bytes) -> None:
        self.connection.send(self.channel, body)

    def sent_transfers(self, count: int) -> None:
        self.next_outgoing_id = (self.next_outgoing_id + count) & MAX_UINT
        self.remote_incoming_window -= count

    def session_fields(self) -> list[bytes]:
        """The session's part of a flow: next-incoming-id, incoming-window, next-outgoing-id, outgoing-window."""
        return [uint(self.next_incoming_id), uint(self.incoming_window), uint(self.next_outgoing_id), uint(MAX_UINT)]

    # -- frames ------------------------------------------------------------------------------

    def on_frame(self, code: int, fields: list[Value]) -> None:
        """A frame of this session but a transfer; its error detaches a link or ends the session."""
        try:
            self._on_frame(code, fields)
        except LinkError as exc:
            self.detach_with(exc.handle, exc)
        except SessionError as exc:
            self.end_with(exc)

    def _on_frame(self, code: int, fields: list[Value]) -> None:
        if code == frames.DISPOSITION:
            self._disposition(fields)
        elif code == frames.FLOW:
            self._flow(fields)
        elif code == frames.ATTACH:
            self._attach(fields)
        elif code == frames.DETACH:
            self._detach(fields)
        elif code == frames.END:  # the outcomes due go out first, as RabbitMQ's handle_frame(end) sends them
            self.emit_confirms()
            self.closed()
            self.connection.ended(self.channel)
            self.send(frames.performative(frames.END))
        elif code == frames.BEGIN:
            raise Amqp10Error(frames.NOT_ALLOWED, f"begin on channel {self.channel}, which has a session")
        else:
            raise Amqp10Error(frames.DECODE_ERROR, f"unknown performative 0x{code:02x}")

    def _link(self, fields: list[Value], index: int = 0) -> LinkEndpoint:
        handle = frames.typed(fields, index, ("uint",), "handle")
        link = self.links.get(handle) if handle is not None else None
        if link is None:
            raise SessionError(frames.UNATTACHED_HANDLE, f"link handle {handle} is not attached")
        return link

    def _attach(self, fields: list[Value]) -> None:
        """An attach; a field of it that does not decode ends the session (RabbitMQ's session process exits with
        the error and ends the session alone), not the connection."""
        try:
            self._attach_fields(fields)
        except SessionError:
            raise
        except Amqp10Error as exc:
            raise SessionError(exc.condition, exc.description) from None

    def _attach_fields(self, fields: list[Value]) -> None:
        name = frames.typed(fields, 0, ("string",), "name", "")
        handle = frames.typed(fields, 1, ("uint",), "handle")
        role = frames.typed(fields, 2, ("bool",), "role")
        if handle is None or role is None:
            raise SessionError(frames.DECODE_ERROR, "attach without handle or role")
        settle_mode = frames.typed(fields, 3, ("ubyte",), "snd-settle-mode", 2)
        rcv_settle_mode = frames.typed(fields, 4, ("ubyte",), "rcv-settle-mode", 0)
        _validate_attach(fields, settle_mode, rcv_settle_mode)
        if handle > self.handle_max:
            raise SessionError(frames.FRAMING_ERROR, f"link handle value ({handle}) exceeds maximum link handle "
                               f"value ({self.handle_max})")
        if handle in self.links:
            raise SessionError(frames.HANDLE_IN_USE, f"link handle {handle} in use")
        source = frames.composite(fields, 5, frames.SOURCE)
        target = frames.composite(fields, 6, frames.TARGET)
        if role:  # the client receives: the node sends from a queue
            link: LinkEndpoint = Outgoing(self, name, handle, settle_mode, source, target)
        else:
            link = Incoming(self, name, handle, settle_mode, source, target)
        link.properties = fields[13] if len(fields) > 13 else None
        try:
            declaration = link.declaration()
        except (Amqp10Error, AMQPError) as exc:
            self._refuse(link, exc)
            return
        if declaration is None:
            self._attach_link(link)
        else:  # the frames after this attach wait until it is answered, so the handle stays free meanwhile
            self.connection.await_request(self._declare(link, declaration), lambda _: self._attach_link(link))

    async def _declare(self, link: LinkEndpoint, declaration: Coroutine[Any, Any, None]) -> bytes:
        try:
            await declaration
        except (Amqp10Error, AMQPError) as exc:
            link.refusal = exc
        return b""

    def _attach_link(self, link: LinkEndpoint) -> None:
        try:
            if link.refusal is not None:
                raise link.refusal
            link.attach()
        except (Amqp10Error, AMQPError) as exc:
            self._refuse(link, exc)
            return
        self.links[link.handle] = link
        link.attached()

    @staticmethod
    def _refuse(link: LinkEndpoint, exc: Amqp10Error | AMQPError) -> None:
        condition, description = (exc.condition, exc.description) if isinstance(exc, Amqp10Error) \
            else _error_of(exc)
        link.refuse(condition, description)

    def _detach(self, fields: list[Value]) -> None:
        handle = frames.typed(fields, 0, ("uint",), "handle")
        if handle is None:
            raise SessionError(frames.UNATTACHED_HANDLE, "link handle None is not attached")
        link = self.links.pop(handle, None)
        if link is None:  # the client's answer to a detach of the node's (a refused attach, a deleted queue, a
            return  # transfer beyond credit): taken quietly, as RabbitMQ's detach_reply sends nothing for it
        link.closed()
        self.send(frames.performative(frames.DETACH, uint(link.handle), boolean(frames.field(fields, 1) is True)))

    def detach_with(self, handle: int, error: Amqp10Error) -> None:
        link = self.links.pop(handle, None)
        if link is not None:
            link.closed()
            self.send(frames.performative(frames.DETACH, uint(handle), boolean(True),
                                          frames.error(error.condition, error.description)))

    def end_with(self, error: Amqp10Error) -> None:
        self.closed()
        self.connection.ended(self.channel)
        self.send(frames.performative(frames.END, frames.error(error.condition, error.description)))

    def closed(self) -> None:
        """The session ended (or its connection closed): its links go, what its client held is requeued."""
        for link in list(self.links.values()):
            link.closed()
        self.links.clear()
        if self.unsettled:
            taken = list(self.unsettled.values())
            self.unsettled.clear()
            self.broker.settle_taken(taken, True, left=True)
        for link in list(self.confirming):
            link.dropped()
        self.confirming.clear()
        self.connection.clients.fold(self.connection.protocol, self.stats)

    def listed(self) -> ListedSession:
        """As the HTTP API lists it."""
        listed = ListedSession(self.channel, self.handle_max, self.next_incoming_id, self.incoming_window,
                               self.next_outgoing_id, self.remote_incoming_window, self.remote_outgoing_window,
                               len(self.unsettled))
        for handle in sorted(self.links):
            link = self.links[handle]
            (listed.incoming if isinstance(link, Incoming) else listed.outgoing).append(link.listed())
        return listed

    def _flow(self, fields: list[Value]) -> None:
        next_incoming = frames.typed(fields, 0, ("uint",), "next-incoming-id", 0)
        window = frames.typed(fields, 1, ("uint",), "incoming-window", 0)
        self.remote_incoming_window = max(0, next_incoming + window - self.next_outgoing_id)
        self.remote_outgoing_window = frames.typed(fields, 3, ("uint",), "outgoing-window", 0)
        handle = frames.typed(fields, 4, ("uint",), "handle")
        if handle is None:
            if frames.field(fields, 9, False):  # echo
                self.send(frames.performative(frames.FLOW, *self.session_fields()))
            self.resume_deliveries()
            return
        self._link(fields, 4).on_flow(fields)
        if window:
            self.resume_deliveries()

    def on_transfer(self, handle: int | None, delivery_id: int | None, settled: bool, more: bool, aborted: bool,
                    buf: bytes | bytearray, at: int, end: int) -> None:
        """A transfer whose payload is ``buf[at:end]`` (the connection's read buffer: copied only as needed); its
        error detaches the link or ends the session."""
        try:
            if self.incoming_window <= 0:
                raise SessionError(frames.WINDOW_VIOLATION, "incoming window is exhausted")
            self.incoming_window -= 1
            self.next_incoming_id = (self.next_incoming_id + 1) & MAX_UINT
            link = self.links.get(handle) if handle is not None else None
            if link is None:
                raise SessionError(frames.UNATTACHED_HANDLE, f"link handle {handle} is not attached")
            if not isinstance(link, Incoming):
                raise SessionError(frames.NOT_ALLOWED, f"transfer on link {link.handle}, which sends to the client")
            link.on_transfer(delivery_id, settled, more, aborted, buf, at, end)
            if self.incoming_window <= _HALF_WINDOW:
                self.incoming_window = INCOMING_WINDOW
                self.send(frames.performative(frames.FLOW, *self.session_fields()))
        except LinkError as exc:
            self.detach_with(exc.handle, exc)
        except SessionError as exc:
            self.end_with(exc)

    def _disposition(self, fields: list[Value]) -> None:
        role = frames.typed(fields, 0, ("bool",), "role")
        first = frames.typed(fields, 1, ("uint",), "first")
        if not role or first is None:  # (the node settles what it receives itself: a sender's disposition says
            return  # nothing it waits for)
        last = frames.typed(fields, 2, ("uint",), "last", first)
        settled = frames.field(fields, 3, False)
        state = frames.outcome(fields, 4)
        unsettled = self.unsettled
        if last < first:
            raise SessionError(frames.INVALID_FIELD, f"disposition last ({last}) < first ({first})")
        if not unsettled:  # (RabbitMQ answers nothing while nothing is unsettled)
            return
        code = state[0] if state is not None else None
        if code not in _OUTCOMES:  # no outcome, or received: nothing is settled (settle_op_from_outcome)
            raise SessionError(frames.INVALID_FIELD, f"Unrecognised state: {_state_name(code)} in DISPOSITION")
        annotations = _modified_annotations(state[1]) if state is not None and code == frames.MODIFIED else b""
        if last - first + 1 <= len(unsettled):  # (each id looked up where C does it: a range settles thousands)
            taken = list(filter(None, map(unsettled.pop, range(first, last + 1), repeat(None, last - first + 1))))
        else:
            taken = [unsettled.pop(i) for i in [i for i in unsettled if first <= i <= last]]
        if not taken:
            return
        try:
            if code == frames.ACCEPTED:
                self.broker.settle_taken(taken, False)
                self.stats.ack += len(taken)
            elif code == frames.RELEASED:  # requeued, no delivery counted (RabbitMQ 4.x)
                self.broker.settle_taken(taken, True, counted=False)
            elif code == frames.REJECTED:
                self.broker.nack_taken(taken, False)
            elif code == frames.MODIFIED:  # dead-lettered if undeliverable here, else requeued, counted if failed
                assert state is not None
                failed = frames.field(state[1], 0, False) is True
                undeliverable = frames.field(state[1], 1, False) is True
                self.broker.nack_taken(taken, not undeliverable, counted=failed, annotations=annotations)
        except AMQPError as exc:  # a stream refuses reject and release
            raise SessionError(*_error_of(exc)) from None
        if not settled:  # the client awaits the node's settlement
            self.send(frames.performative(frames.DISPOSITION, boolean(False), uint(first), uint(last),
                                          boolean(True), described(code, b"\x45")))

    # -- deliveries --------------------------------------------------------------------------

    def resume_deliveries(self) -> None:
        for link in list(self.links.values()):
            if isinstance(link, Outgoing) and link.consumer is not None:
                link.queue.deliver_ready()

    def grant_credit(self) -> None:
        for link in list(self.links.values()):
            if isinstance(link, Incoming):
                link.top_up()

    def emit_confirms(self) -> None:
        if self.confirming:
            links, self.confirming = self.confirming, set()
            for link in links:
                link.emit_outcomes()


_OUTCOMES = (frames.ACCEPTED, frames.RELEASED, frames.REJECTED, frames.MODIFIED)
_STATES = {frames.RECEIVED: "received", 0x34: "declared", 0x38: "transactional-state"}


def _state_name(code: Any) -> str:
    """A delivery state's name as a disposition's error names it (``undefined`` for none, as RabbitMQ's)."""
    if code is None:
        return "undefined"
    return _STATES.get(code, f"0x{code:02x}" if isinstance(code, int) else str(code))


COORDINATOR = 0x30  # a transaction coordinator target
_COORDINATOR_SYMBOL = "amqp:coordinator:list"


def _validate_attach(fields: list[Value], settle_mode: int, rcv_settle_mode: int) -> None:
    """What RabbitMQ's ``validate_attach`` refuses before anything else of an attach, ending the session with
    amqp:not-implemented: a coordinator target (transactions), link recovery (an unsettled map, incomplete
    unsettled), and rcv-settle-mode second unless the sender settles."""
    target = fields[6] if len(fields) > 6 else None
    if target is not None and target.kind == "described" and target.value[0] in (COORDINATOR, _COORDINATOR_SYMBOL):
        raise SessionError(frames.NOT_IMPLEMENTED, "Transactions not supported")
    unsettled = fields[7] if len(fields) > 7 else None
    if unsettled is not None and unsettled.kind == "map" and unsettled.value or frames.field(fields, 8) is True:
        raise SessionError(frames.NOT_IMPLEMENTED, "Link recovery not supported")
    if rcv_settle_mode == 1 and settle_mode != frames.SETTLED:
        raise SessionError(frames.NOT_IMPLEMENTED, "rcv-settle-mode second not supported")


class LinkEndpoint:
    """What both directions share: the attach exchange and detach."""

    role = False  # the node's role: False sender, True receiver

    def __init__(self, session: Session, name: str, handle: int, settle_mode: int, source: list[Value] | None,
                 target: list[Value] | None) -> None:
        self.session = session
        self.connection = session.connection
        self.broker = session.broker
        self.name = name
        self.handle = handle
        self.settled = settle_mode == frames.SETTLED
        self.settle_mode = settle_mode
        self.source = source
        self.target = target
        self.credit = 0
        self.delivery_count = 0
        self.refusal: Amqp10Error | AMQPError | None = None  # what a declaration before the attach raised
        self.filter_set = NULL  # the source's filters in place, echoed ("the sending endpoint sets the filter")
        self.properties: Value | None = None  # the attach's link properties

    def declaration(self) -> Coroutine[Any, Any, None] | None:
        """What a v1 address declares before the link attaches (``terminus.declare``), if anything."""
        return None

    def attach(self) -> None:
        """Resolve the link's address and check what the user may do there; raises what refuses it."""

    def attached(self) -> None:
        """Accepted: the node's attach goes out."""
        self.session.send(self._attach_frame(self._terminus(frames.SOURCE, self.source, self.filter_set),
                                             self._terminus(frames.TARGET, self.target)))

    def refuse(self, condition: str, description: str) -> None:
        """RabbitMQ's refusal: an attach with no terminus on the node's side, then a detach with the error."""
        null_source = self.role is False
        self.session.send(self._attach_frame(NULL if null_source else self._terminus(frames.SOURCE, self.source),
                                             self._terminus(frames.TARGET, self.target) if null_source else NULL))
        self.session.send(frames.performative(frames.DETACH, uint(self.handle), boolean(True),
                                              frames.error(condition, description)))

    def _attach_frame(self, source: bytes, target: bytes) -> bytes:
        return frames.performative(
            frames.ATTACH, utf8(self.name), uint(self.handle), boolean(self.role), amqp10.ubyte(self._settle_answer()),
            amqp10.ubyte(0), source, target, NULL, NULL, uint(0) if not self.role else NULL,
            amqp10.ulong(self.connection.config.message_size_limit) if self.role else NULL)

    def _settle_answer(self) -> int:
        """The snd-settle-mode the attach answers: a link the client sends on, the client's; one the node sends
        on, settled or else unsettled (mixed too), as RabbitMQ's handle_attach answers (EffectiveSndSettleMode)."""
        if self.role:
            return self.settle_mode
        return frames.SETTLED if self.settled else 0

    @staticmethod
    def _terminus(code: int, fields: list[Value] | None, filter_set: bytes = NULL) -> bytes:
        if fields is None:
            return NULL
        address_value = fields[0].value if fields and fields[0].kind == "string" else None
        items = [utf8(address_value) if address_value is not None else NULL]
        if filter_set != NULL:
            items += [NULL] * 6 + [filter_set]
        return described(code, encode_list(items))

    def on_flow(self, fields: list[Value]) -> None:
        """A flow naming this link."""

    def listed(self) -> ListedLink:
        """As the HTTP API lists it."""
        terminus = self.target if self.role else self.source
        address_value = terminus[0].value if terminus and terminus[0].kind == "string" else None
        return ListedLink(self.handle, self.name, address_value, self.delivery_count, self.credit, self.settle_mode)

    def closed(self) -> None:
        """Detached, or its session ended."""

    def dropped(self) -> None:
        """Its session ended with outcomes still to send."""


MIXED = 2  # sender-settle-mode mixed: the sender says per transfer
_SETTLE_MODES = {0: "unsettled", 1: "settled", 2: "mixed"}


def _check_paired(properties: Value | None) -> None:
    """A /management link is one of a pair: its properties say ``paired`` true, else it is refused with RabbitMQ's
    check_paired's amqp:invalid-field."""
    if properties is None or properties.kind != "map" or not any(
            key.kind == "symbol" and key.value == "paired" and value.kind == "bool" and value.value is True
            for key, value in properties.value):
        raise Amqp10Error(frames.INVALID_FIELD, "Link property 'paired' is not set to boolean value 'true'")


def _attach_arguments(properties: Value | None) -> dict[str, int]:
    """The consumer arguments a receiving link's properties ask for: ``rabbitmq:priority`` (an int) is the
    consumer's ``x-priority``, as RabbitMQ 4.x's parse_attach_properties reads it (another type is ignored)."""
    if properties is None or properties.kind != "map":
        return {}
    found = next((value for key, value in properties.value
                  if key.kind == "symbol" and key.value == "rabbitmq:priority"), None)
    return {"x-priority": found.value} if found is not None and found.kind == "int" else {}


def _durable(fields: list[Value] | None) -> bool:
    """A terminus asking for configuration (1) or unsettled-state (2) durability: a queue it declares is durable."""
    return fields is not None and frames.typed(fields, 1, ("uint",), "durable", 0) in (1, 2)


def _address(fields: list[Value] | None) -> str | None:
    if fields is None or not fields or fields[0].kind == "null":
        return None
    if fields[0].kind != "string":
        raise Amqp10Error(frames.INVALID_FIELD, "address is not a string")
    return str(fields[0].value)


class Incoming(LinkEndpoint):
    """A link the client sends on: every message is published, and (unsettled) answered with its outcome once
    the 0-9-1 confirm path would confirm it: at once, or after the fsync (or the owner nodes) that covers it."""

    role = True

    def __init__(self, *args: Any) -> None:
        super().__init__(*args)
        self.destination: address.TargetAddress | None = None  # None: each message's ``to``
        self.exchange: Exchange | None = None
        self.partial: bytearray | None = None  # a message arriving in several transfers
        self.partial_id = 0
        self.partial_settled = False
        self.decoder = amqp10.Decoder("", native=True)
        self.checked: dict[str, Exchange] = {}  # exchanges the user may publish to (checked once each)
        # the outcomes to send: runs of consecutive delivery ids with one outcome, (first, last, outcome), and the
        # run still growing (a run of one outcome object: ``frames.ACCEPTED_STATE``…, or none)
        self.outcomes: list[tuple[int, int, bytes]] = []
        self.run_first = self.run_last = 0
        self.run_state: bytes | None = None
        self.unsynced: deque[tuple[int, int]] = deque()  # (delivery id, group commit batch) awaiting fsync
        self.forwarded_copies: dict[int, int] = {}  # delivery id -> copies other nodes have yet to accept
        self.forwarded_rejected: set[int] = set()
        self.current = 0  # the delivery being published (what a forwarded copy confirms)
        self.management = False  # the /management node's requests: answered on the paired link
        self.routed = ("", "")  # the exchange and routing key of the last message, and their encoding
        self.leader_waits = 0  # its transfers waiting for a quorum queue's leader (``waiting``)
        self.route = encode_route("", "")
        self.fixed = False  # the target names the exchange and routing key: every message goes there
        self.looked_up = False  # the target's exchange is looked up at each transfer (``_look_up``)
        self.target_queue: str | None = None  # the queue the target names, while the link is told of its deletion
        self.max_size = self.connection.config.message_size_limit

    def listed(self) -> ListedLink:
        listed = super().listed()
        listed.unconfirmed = len(self.unsynced) + len(self.forwarded_copies)
        return listed

    def declaration(self) -> Coroutine[Any, Any, None] | None:
        target = _address(self.target)
        if target is None or target == management.ADDRESS:
            return None
        destination = address.target(target)
        if destination.routing_key is None:
            return None
        if destination.declare:
            return terminus.declare(self.connection, destination.routing_key, _durable(self.target))
        if destination.exchange == "":
            found = self.broker.replies.found_elsewhere(destination.routing_key)
            if found is not None:
                return _reply_found(self.connection, destination.routing_key, found)
        return None

    def attach(self) -> None:
        target = _address(self.target)
        if target is None:
            return  # the anonymous terminus: each message's ``to`` names where it goes
        if target == management.ADDRESS:
            _check_paired(self.properties)
            self.management = True
            return
        self.destination = destination = address.target(target)
        vhost = self.connection.vhost
        assert vhost is not None and self.connection.principal is not None
        if destination.exchange == "" and destination.routing_key is not None:
            self._check_queue(destination.routing_key)
        self.exchange = self._exchange(destination.exchange)
        # only the default exchange and the amq.* ones, which cannot be deleted, are kept: another is looked up
        # by name at each transfer, as RabbitMQ's check_exchange keeps only its name (lookup_target)
        self.looked_up = not (destination.exchange == "" or destination.exchange.startswith("amq."))
        if destination.routing_key is not None:
            self.fixed = True
            self.routed = (self.exchange.name, destination.routing_key)
            self.route = encode_route(*self.routed)

    def _look_up(self, delivery_id: int, settled: bool) -> None:
        """The target's exchange, as it is now (declared again, it is another object); gone, the message is
        released (its outcome sent first) and the link detaches with amqp:not-found, as RabbitMQ's
        lookup_target finds no exchange of that name."""
        assert self.destination is not None
        try:
            self.exchange = self._exchange(self.destination.exchange)
        except AMQPError as exc:
            if not settled:
                self._outcome(delivery_id, False, frames.RELEASED_STATE)
                self.session.confirming.discard(self)
                self.emit_outcomes()
            raise LinkError(*_error_of(exc), self.handle) from None

    def _check_queue(self, name: str) -> None:
        """A queue, or a direct reply-to name, is there: else ``not-found``.  Whether it can take a message now
        is not asked (RabbitMQ 4.x checks that the queue exists): a quorum queue electing a leader is a target.
        Another node's reply name is that node's to answer for: a target naming it was asked there
        (``declaration``), a message's ``to`` goes there as it is."""
        vhost = self.connection.vhost
        assert vhost is not None
        if name not in vhost.queues and not self.broker.replies.known(name):
            raise errors.not_found(f"no queue '{name}' in vhost '{vhost.name}'")

    def _exchange(self, name: str) -> Exchange:
        vhost = self.connection.vhost
        assert vhost is not None
        exchange = vhost.exchanges.get(name)
        if exchange is None:
            raise errors.not_found(f"no exchange '{name}' in vhost '{vhost.name}'")
        if self.checked.get(name) is not exchange:
            self.broker.check_publish(vhost, exchange, self.connection.principal, "")
            self.checked[name] = exchange
        return exchange

    def attached(self) -> None:
        super().attached()
        destination = self.destination
        if destination is not None and destination.exchange == "" and destination.routing_key is not None:
            self.target_queue = destination.routing_key  # its deletion detaches the link (``target_deleted``)
            self.broker.watch_target(self.connection.vhost_name, self.target_queue, self)
        if not self.connection.publishing:  # held by alarms from now on: no credit while one stands
            self.connection.started_publishing()
        self.top_up()

    def top_up(self) -> None:
        """Link credit, unless an alarm holds publishers or too many of its transfers wait for a quorum queue's
        leader: topped up once half is used, as RabbitMQ does."""
        if self.management:  # (granted as RabbitMQ grants it, alarms or not: maybe_grant_mgmt_link_credit)
            if self.credit > MANAGEMENT_LINK_CREDIT // 2:
                return
            self.credit = MANAGEMENT_LINK_CREDIT
        elif self.connection.credit_held or self.leader_waits > LEADER_WAITS or self.credit > _HALF_CREDIT:
            return
        else:
            self.credit = LINK_CREDIT
        self.session.send(frames.performative(
            frames.FLOW, *self.session.session_fields(), uint(self.handle), uint(self.delivery_count),
            uint(self.credit)))

    def on_transfer(self, delivery_id: int | None, settled: bool, more: bool, aborted: bool,
                    buf: bytes | bytearray, at: int, end: int) -> None:
        if aborted:  # what came of it is dropped
            self.partial = None
            return
        if self.partial is None:
            if delivery_id is None:
                raise SessionError(frames.DECODE_ERROR, "first transfer of a delivery without delivery-id")
            if self.credit <= 0:  # the condition alone, as RabbitMQ's incoming_link_transfer detaches
                raise LinkError(frames.TRANSFER_LIMIT_EXCEEDED, "", self.handle)
            self.credit -= 1
            self.delivery_count = (self.delivery_count + 1) & MAX_UINT
            if self.settle_mode != MIXED and settled != self.settled:
                mode = _SETTLE_MODES.get(self.settle_mode, self.settle_mode)
                raise SessionError(frames.FRAMING_ERROR, f"sender settle mode is '{mode}' but transfer settled flag "
                                   f"is interpreted as being '{str(settled).lower()}'")
            if end - at > self.max_size:
                self._too_large(end - at)
            if more:
                self.partial = bytearray(buf[at:end])
                self.partial_id, self.partial_settled = delivery_id, settled
                return
            self._publish(buf, at, end, delivery_id, settled)
        else:  # a continuation: its delivery-id and settled, if said, are the first transfer's
            if delivery_id is not None and delivery_id != self.partial_id:
                raise SessionError(frames.FRAMING_ERROR, "delivery-id of continuation transfer "
                                   f"({{uint,{delivery_id}}}) differs from delivery-id on first transfer "
                                   f"({self.partial_id})")
            if settled and not self.partial_settled:  # (an absent flag reads false: only a true one can differ)
                raise SessionError(frames.FRAMING_ERROR, "field 'settled' of continuation transfer (true) differs "
                                   "from (interpreted) field 'settled' on first transfer (false)")
            before = len(self.partial)
            with memoryview(buf) as view:
                self.partial += view[at:end]
            if len(self.partial) > self.max_size:
                self._too_large(len(self.partial))
            if len(self.partial) // MEMORY_CHECK_BYTES != before // MEMORY_CHECK_BYTES:
                self.connection.growing()  # a large message can outrun the once-a-second memory check
            if more:
                return
            record, self.partial = self.partial, None
            self._publish(record, 0, len(record), self.partial_id, self.partial_settled)
        if self.credit <= _HALF_CREDIT:
            self.top_up()

    def _too_large(self, size: int) -> None:
        """The session ends with amqp:link:message-size-exceeded: RabbitMQ's validate_message_size exits the
        session process (protocol_error), which ends the session, not just the link."""
        self.partial = None
        raise SessionError(frames.MESSAGE_SIZE_EXCEEDED,
                           f"message size ({size} bytes) > maximum message size ({self.max_size} bytes)")

    def _publish(self, buf: bytes | bytearray, at: int, end: int, delivery_id: int, settled: bool) -> None:
        """The message ``buf[at:end]``: decoded where it lies, its body alone copied out."""
        connection = self.connection
        if self.management:
            self._request(bytes(buf[at:end]), delivery_id, settled)
            return
        try:
            message = self.decoder.message(buf, at, end)
        except (amqp10.Invalid, amqp10.TooLarge) as exc:
            raise LinkError(frames.DECODE_ERROR, f"cannot decode message: {exc}", self.handle) from None
        if self.looked_up:
            self._look_up(delivery_id, settled)
        exchange = self.exchange
        principal = connection.principal
        if not self.fixed or (principal is not None and principal.topics):
            try:
                exchange, routing_key = self._route(buf, at, end)
            except Amqp10Error as exc:
                self._outcome(delivery_id, settled, frames.rejected(exc.condition, exc.description))
                return
            except AMQPError as exc:
                self._outcome(delivery_id, settled, frames.rejected(*_error_of(exc)))
                return
            if (exchange.name, routing_key) != self.routed:
                self.routed = (exchange.name, routing_key)
                self.route = encode_route(exchange.name, routing_key)
        assert exchange is not None  # (a fixed target's)
        message.exchange, message.routing_key = self.routed
        message.route = self.route
        vhost = connection.vhost
        assert vhost is not None
        if message.needs_checks:
            try:
                self.broker.check_message(vhost, exchange, principal, message, connection.user)
            except ChannelError as exc:
                self._outcome(delivery_id, settled, frames.rejected(*_error_of(exc)))
                return
        self.current = delivery_id
        routed, rejected = self.broker.publish(vhost, exchange, message, None, None if settled else self)
        session = self.session
        session.stats.publish += 1
        session.vhost_stats.publish += 1
        if not routed:
            session.stats.drop_unroutable += 1
            session.vhost_stats.drop_unroutable += 1
        if settled:
            return
        if not routed:
            self._outcome(delivery_id, False, frames.RELEASED_STATE)
        elif rejected:
            self._outcome(delivery_id, False, frames.REJECTED_STATE)
        elif message.awaits_commit:
            persistence = self.broker.persistence
            self.unsynced.append((delivery_id, persistence.batch))
            persistence.waiters.add(self)
        elif delivery_id not in self.forwarded_copies:
            self._outcome(delivery_id, False, frames.ACCEPTED_STATE)

    def _request(self, record: bytes, delivery_id: int, settled: bool) -> None:
        """A request to the /management node: its response goes on the outgoing link of the same name, which must
        be attached and have credit for it, else the session ends (RabbitMQ's incoming_mgmt_link_transfer)."""
        paired = next((link for link in self.session.links.values()
                       if isinstance(link, Outgoing) and link.management and link.name == self.name), None)
        if paired is None:
            raise SessionError(frames.PRECONDITION_FAILED, "received transfer on half open management link pair")
        if paired.credit <= 0:
            raise SessionError(frames.PRECONDITION_FAILED, f"insufficient credit ({paired.credit}) for management "
                               "link from RabbitMQ to client")
        self.connection.await_request(management.handle(self.connection, record),
                                      lambda response: self._answered(paired, response, delivery_id, settled))

    def _answered(self, paired: Outgoing, response: bytes | SessionError, delivery_id: int, settled: bool) -> None:
        if isinstance(response, SessionError):
            self.session.end_with(response)
            return
        if self.session.links.get(paired.handle) is paired:
            paired.respond(response)
        if self.session.links.get(self.handle) is self:
            self._outcome(delivery_id, settled, frames.ACCEPTED_STATE)

    def _route(self, buf: bytes | bytearray, at: int, end: int) -> tuple[Exchange, str]:
        """The exchange and routing key of a message: the link's target's, else its ``to`` (and ``subject``)."""
        destination = self.destination
        if destination is not None and destination.routing_key is not None:
            assert self.exchange is not None
            if self.connection.principal is not None and self.connection.principal.topics:
                self.broker.check_topic_write(self.connection.vhost, self.exchange,  # type: ignore[arg-type]
                                              self.connection.principal, destination.routing_key)
            return self.exchange, destination.routing_key
        to, subject = _to_and_subject(bytes(buf[at:end]))
        if destination is None:
            if to is None:
                raise Amqp10Error(frames.PRECONDITION_FAILED, "anonymous terminus requires 'to' address to be set")
            destination = address.target(to)
            if destination.exchange == "" and destination.routing_key is not None:
                self._check_queue(destination.routing_key)
        exchange = self.exchange if destination is self.destination and self.exchange is not None \
            else self._exchange(destination.exchange)
        routing_key = destination.routing_key if destination.routing_key is not None else (subject or "")
        if self.connection.principal is not None and self.connection.principal.topics:
            self.broker.check_topic_write(self.connection.vhost, exchange,  # type: ignore[arg-type]
                                          self.connection.principal, routing_key)
        return exchange, routing_key

    def _outcome(self, delivery_id: int, settled: bool, state: bytes) -> None:
        """``state`` (one of ``frames``' outcome objects) is due for ``delivery_id``: it joins the run it follows,
        else starts one, sent at the next flush (``emit_outcomes``)."""
        if settled:
            return
        if state is self.run_state and delivery_id == self.run_last + 1:
            self.run_last = delivery_id
            return
        if self.run_state is not None:
            self.outcomes.append((self.run_first, self.run_last, self.run_state))
        self.run_first = self.run_last = delivery_id
        self.run_state = state
        self.session.confirming.add(self)
        self.connection.schedule_flush()

    # -- the confirm path (persistence.SyncWaiter, ports.ConfirmSink) -------------------------

    def synced(self, batch: int) -> None:
        unsynced = self.unsynced
        while unsynced and unsynced[0][1] <= batch:
            delivery_id = unsynced.popleft()[0]
            if delivery_id not in self.forwarded_copies:
                self._outcome(delivery_id, False, frames.ACCEPTED_STATE)
        if not unsynced:
            self.broker.persistence.waiters.discard(self)

    def refused(self, batch: int) -> None:
        """Group commit ``batch`` failed: what waited for it is rejected."""
        unsynced = self.unsynced
        while unsynced and unsynced[0][1] <= batch:
            delivery_id = unsynced.popleft()[0]
            if delivery_id not in self.forwarded_copies:
                self._outcome(delivery_id, False, frames.REJECTED_STATE)
        if not unsynced:
            self.broker.persistence.waiters.discard(self)

    def forwarded(self) -> int:
        self.forwarded_copies[self.current] = self.forwarded_copies.get(self.current, 0) + 1
        return self.current

    def remote_confirmed(self, seq: int, rejected: bool) -> None:
        if rejected:
            self.forwarded_rejected.add(seq)
        left = self.forwarded_copies.pop(seq, 1) - 1
        if left:
            self.forwarded_copies[seq] = left
            return
        if any(delivery_id == seq for delivery_id, _ in self.unsynced):
            return
        self._outcome(seq, False, frames.REJECTED_STATE if seq in self.forwarded_rejected else frames.ACCEPTED_STATE)
        self.forwarded_rejected.discard(seq)

    def waiting(self, change: int) -> None:
        """``change`` more (or fewer) of its transfers wait for a quorum queue's leader (``remote_queue.Window``):
        past ``LEADER_WAITS`` of them the link is granted no more credit until they go to one, as RabbitMQ 4.x's
        session grants none to a link whose target queue blocks it; this link alone is held."""
        self.leader_waits += change
        if change < 0 and self.session.links.get(self.handle) is self:
            self.top_up()

    def emit_outcomes(self) -> None:
        """The outcomes due, one disposition per run of consecutive delivery ids with the same outcome."""
        runs, self.outcomes = self.outcomes, []
        if self.run_state is not None:
            runs.append((self.run_first, self.run_last, self.run_state))
            self.run_state = None
        if len(runs) > 1:
            runs = _joined(sorted(runs))
        session = self.session
        for first, last, state in runs:
            if state is frames.ACCEPTED_STATE:
                session.stats.confirm += last - first + 1
                session.vhost_stats.confirm += last - first + 1
            session.send(frames.disposition(first, last, state))

    def target_deleted(self, queue: AnyQueue) -> None:
        """The queue the target names was deleted (``ports.QueueTarget``): the outcomes due go out, what waits
        for the queue's fsync is released, then the link detaches with amqp:resource-deleted, as RabbitMQ's
        handle_stashed_eol (settle_eol, then destroy_incoming_link: the condition alone)."""
        self.target_queue = None
        for delivery_id, _ in self.unsynced:
            if delivery_id not in self.forwarded_copies:
                self._outcome(delivery_id, False, frames.RELEASED_STATE)
        self.unsynced.clear()
        self.session.confirming.discard(self)
        self.emit_outcomes()
        self.session.detach_with(self.handle, Amqp10Error(frames.RESOURCE_DELETED, ""))

    def closed(self) -> None:
        self.partial = None
        self.broker.persistence.waiters.discard(self)
        if self.target_queue is not None:
            self.broker.unwatch_target(self.connection.vhost_name, self.target_queue, self)
            self.target_queue = None

    def dropped(self) -> None:
        self.outcomes.clear()
        self.run_state = None


def _joined(runs: list[tuple[int, int, bytes]]) -> list[tuple[int, int, bytes]]:
    """Sorted runs of outcomes with each run that continues the one before (the next delivery id, the same
    outcome) joined to it."""
    joined = [runs[0]]
    for first, last, state in runs[1:]:
        before_first, before_last, before_state = joined[-1]
        if first == before_last + 1 and state == before_state:
            joined[-1] = (before_first, last, state)
        else:
            joined.append((first, last, state))
    return joined


def _to_and_subject(record: bytes) -> tuple[str | None, str | None]:
    """The ``to`` and ``subject`` properties of a message (the slow way: only links that need them read them)."""
    try:
        found = amqp10.sections(record)
    except (amqp10.Invalid, amqp10.TooLarge):
        return None, None
    for descriptor, content, _ in found:
        if descriptor == amqp10.PROPERTIES and content.kind == "list":
            values = content.value
            to = values[2].value if len(values) > 2 and values[2].kind == "string" else None
            subject = values[3].value if len(values) > 3 and values[3].kind == "string" else None
            return to, subject
    return None, None


def _modified_annotations(fields: list[Value]) -> bytes:
    """A modified outcome's message-annotations, encoded (b"" for none); a key that is no ``x-opt-`` symbol ends
    the session, as RabbitMQ 4.x refuses it, before anything is settled."""
    found = fields[2] if len(fields) > 2 else None
    if found is None or found.kind == "null":
        return b""
    if found.kind != "map":
        raise SessionError(frames.DECODE_ERROR, f"message-annotations of type {found.kind}, expected map")
    for key, _ in found.value:
        if key.kind != "symbol" or not key.value.startswith(amqp10.MODIFIABLE):
            raise SessionError(frames.INVALID_FIELD, "only message annotation keys starting with "
                               f"'{amqp10.MODIFIABLE}' can be modified: {untrusted(key.value)}")
    return amqp10.encode(found) if found.value else b""


_OFFSET_ANNOTATION = amqp10.symbol("x-stream-offset")
_LONG = struct.Struct(">q")
_U32 = struct.Struct(">I")


def _with_offset(head: bytes, seq: int) -> bytes:
    """A stream message's record head with the ``x-stream-offset`` annotation (a long) RabbitMQ 4.x gives it, at
    the end of the message-annotations section ``record_parts`` always writes (after a header section, if any: a
    list8 of at most five fields)."""
    at = 0 if head.startswith(b"\x00\x53\x72") else 5 + head[4]
    if head[at + 3] == 0xC1:
        size, count, data_at = head[at + 4], head[at + 5], at + 6
        end = at + 5 + size
    else:
        size, count, data_at = _U32.unpack_from(head, at + 4)[0], _U32.unpack_from(head, at + 8)[0], at + 12
        end = at + 8 + size
    data = head[data_at:end] + _OFFSET_ANNOTATION + b"\x81" + _LONG.pack(seq)
    count += 2
    if count < 255 and len(data) < 255:
        annotations = bytes((0xC1, len(data) + 1, count)) + data
    else:
        annotations = b"\xd1" + _U32.pack(len(data) + 4) + _U32.pack(count) + data
    return head[:at + 3] + annotations + head[end:]


async def _reply_found(connection: SessionHost, name: str, found: Coroutine[None, None, bool]) -> None:
    """A target naming another node's reply consumer attaches if that node has it."""
    if not await found:
        assert connection.vhost is not None
        raise errors.not_found(f"no queue '{name}' in vhost '{connection.vhost.name}'")


VOLATILE_QUEUE = "rabbitmq:volatile-queue"


def _volatile(fields: list[Value] | None) -> bool:
    """A dynamic source asking for RabbitMQ 4.2's volatile queue: a direct reply-to link."""
    if fields is None or len(fields) < 11 or fields[4].value is not True:
        return False
    capabilities = fields[10]
    items = capabilities.value if capabilities.kind in ("array", "list") else [capabilities]
    return any(isinstance(item, Value) and item.value == VOLATILE_QUEUE for item in items)


class Outgoing(LinkEndpoint):
    """A link the client receives on: a consumer of a queue whose credit is the link's."""

    role = False

    def __init__(self, *args: Any) -> None:
        super().__init__(*args)
        self.queue: AnyQueue = None  # type: ignore[assignment]  # set by attach
        self.consumer: Consumer | None = None
        self.drain = False
        self.management = False  # the /management node's responses
        self.offsets = False  # a stream's consumer: each message says its offset
        self.reply: ReplyConsumer | None = None  # a direct reply-to link: replies go out as they come
        self.responses: deque[bytes] = deque()
        self.queue_name: str | None = None  # what a v1 source declared (``declaration``)
        # a one-frame transfer's frame header and performative, packed at once around its size and delivery id
        # (the id is the tag too): handle, delivery-id, delivery-tag, message-format 0, settled
        handle = uint(self.handle)
        self._transfer_head = (bytes((2, frames.AMQP_FRAME)) + struct.pack(">H", self.session.channel)
                               + b"\x00\x53\x14\xc0" + bytes((len(handle) + 14, 5)) + handle + b"\x70")
        self._transfer_tail = b"\x43" + boolean(self.settled)
        self._transfer = struct.Struct(f">I{len(self._transfer_head)}sIHI{len(self._transfer_tail)}s")
        self.room = self.connection.peer_frame_max - _TRANSFER_OVERHEAD  # what a message sent in one transfer fits

    def listed(self) -> ListedLink:
        listed = super().listed()
        listed.queue = self.queue.name if self.consumer is not None else ""
        return listed

    def declaration(self) -> Coroutine[Any, Any, None] | None:
        source = _address(self.source)
        if source is None or source == management.ADDRESS:
            return None
        wanted = address.source(source)
        if wanted.exchange is not None:
            self.queue_name = server_name("amq.gen-")
            return terminus.declare(self.connection, self.queue_name, _durable(self.source), wanted.exchange,
                                    wanted.binding_key)
        if wanted.declare and wanted.queue is not None:
            return terminus.declare(self.connection, wanted.queue, _durable(self.source))
        return None

    def attach(self) -> None:
        source = _address(self.source)
        if source == management.ADDRESS:
            _check_paired(self.properties)
            self.management = True
            return
        if source is None and _volatile(self.source):
            self.reply = self.broker.replies.add(self, f"ctag-{self.session.channel}-{self.handle}", b"",
                                                volatile_queue=True)
            assert self.source is not None
            self.source = [Value("string", "/queues/" + quote(self.reply.name, safe=""))] + self.source[1:]
            return
        if source is None:
            raise Amqp10Error(frames.INVALID_FIELD, "source address required")
        name = self.queue_name if self.queue_name is not None else address.source(source).queue
        assert name is not None
        connection = self.connection
        vhost = connection.vhost
        assert vhost is not None
        wanted = filters.read(self.source)
        if wanted.applied is not None:
            self.filter_set = amqp10.encode_map([(amqp10.encode(key), amqp10.encode(entry))
                                                 for key, entry in wanted.applied])
        try:
            queue = self.queue = self.broker.consumable(vhost, name, connection, connection.principal)
        except AMQPError as exc:  # (RabbitMQ 4.x's handle_attach words it without 0-9-1's explanation)
            if exc.code != errors.RESOURCE_LOCKED:
                raise
            raise Amqp10Error(frames.RESOURCE_LOCKED, "cannot obtain exclusive access to locked "
                              f"{errors.resource_name('queue', name, vhost.name)}") from None
        local, log = queue.local(), LOG in queue.type.capabilities
        tag = f"ctag-{self.session.channel}-{self.handle}"
        # a stream consumer needs a prefetch (the queue counts it); credit bounds deliveries here, not prefetch;
        # a stream of another node gets the filters with the consumer, its owner applying them
        self.consumer = self.broker.consume(queue, self, tag, self.settled, False,
                                            {**wanted.arguments, **_attach_arguments(self.properties)}, 0xFFFF,
                                            filter_set=self.filter_set if wanted.accepts is not None and log
                                            and local is None else None)
        self.consumer.sends_from = SEND_FROM_FILE
        self.offsets = log
        if wanted.accepts is not None and local is not None:
            local.filter_consumer(self.consumer, wanted.accepts)

    def on_flow(self, fields: list[Value]) -> None:
        delivery_count = frames.typed(fields, 5, ("uint",), "delivery-count", self.delivery_count)
        credit = frames.typed(fields, 6, ("uint",), "link-credit", 0)
        self.drain = frames.field(fields, 8, False) is True
        self.credit = max(0, (delivery_count + credit - self.delivery_count) & MAX_UINT)
        if self.management or self.reply is not None:
            self._send_responses()
        elif self.credit > 0:
            self.queue.deliver_ready()
        if self.drain:  # drained whether deliveries used the credit or not (RabbitMQ's handle_credit_reply0)
            self.delivery_count = (self.delivery_count + self.credit) & MAX_UINT
            self.credit = 0
            self._send_flow(True)
        elif frames.field(fields, 9, False) is True:
            self._send_flow(self.drain)

    def _send_flow(self, drain: bool) -> None:
        self.session.send(frames.performative(
            frames.FLOW, *self.session.session_fields(), uint(self.handle), uint(self.delivery_count),
            uint(self.credit), uint(0), boolean(drain)))

    def respond(self, response: bytes) -> None:
        """A /management response: the request was taken only with credit for it (``Incoming._request``)."""
        self.responses.append(response)
        self._send_responses()

    def _send_responses(self) -> None:
        while self.responses and self.credit > 0:
            record = self.responses.popleft()
            delivery_id = self.session.next_delivery_id
            self.session.next_delivery_id = (delivery_id + 1) & MAX_UINT
            self.credit -= 1
            self.delivery_count = (self.delivery_count + 1) & MAX_UINT
            fields = [uint(self.handle), uint(delivery_id), binary(_TAG.pack(delivery_id)), uint(0), boolean(True)]
            self._deliver_frames(fields, (record,), self.room)
        self.connection.schedule_flush()

    def deliver_reply(self, consumer: ReplyConsumer, message: Message) -> None:
        """A reply to this link's address (``ports.ReplyTarget``): sent settled as credit allows, as RabbitMQ
        4.2's volatile queue sends; past ``MAX_RESPONSES`` waiting for credit, dropped (never stored)."""
        if len(self.responses) < MAX_RESPONSES:
            self.responses.append(amqp10.record(message, native=True))
            self._send_responses()

    # -- ports.DeliveryTarget ----------------------------------------------------------------

    def client(self) -> ClientChannel:
        connection = self.connection
        return ClientChannel(connection.name, self.session.channel, connection.peer,
                             connection.user.name if connection.user else "", self.broker.node_name)

    def can_deliver(self, shared: bool) -> bool:
        connection = self.connection
        return (self.credit > 0 and self.session.remote_incoming_window > 0 and not connection.write_paused
                and connection.deliver_budget > 0)

    def deliver(self, consumer: Consumer, entry: Entry) -> None:
        session = self.session
        connection = self.connection
        message = entry.message
        delivery_id = session.next_delivery_id
        session.next_delivery_id = (delivery_id + 1) & MAX_UINT
        self.credit -= 1
        self.delivery_count = (self.delivery_count + 1) & MAX_UINT
        stats = session.stats
        if consumer.no_ack:
            stats.deliver_no_ack += 1
        else:
            session.unsettled[delivery_id] = (entry, consumer.queue, consumer)
            stats.deliver += 1
        left = consumer.no_ack and message.body is None  # in the store for the file (Queue.took): forgotten once sent
        body: bytes | FileRange = (message.body if message.body_size < SEND_FROM_FILE
                                   else body_out(connection, message, consumer.queue))
        envelope, data_head, footer = amqp10.record_parts(message, True)
        if entry.redelivered:
            stats.redeliver += 1
            envelope = amqp10.redelivered(envelope, consumer.queue.returns(entry))
        if self.offsets:
            envelope, data_head = _with_offset(envelope + data_head, entry.seq), b""
        size = len(envelope) + len(data_head) + len(body) + len(footer)
        if size <= self.room:
            transfer = self._transfer
            connection.out += (transfer.pack(transfer.size + size, self._transfer_head, delivery_id, _TAG_BIN4,
                                             delivery_id, self._transfer_tail), envelope, data_head, body)
            if footer:
                connection.out.append(footer)
            if len(body) >= LARGE_BODY:
                connection.large_out = True
            session.next_outgoing_id = (session.next_outgoing_id + 1) & MAX_UINT
            session.remote_incoming_window -= 1
        else:
            fields = [uint(self.handle), uint(delivery_id), binary(_TAG.pack(delivery_id)), uint(0),
                      boolean(consumer.no_ack)]
            self._deliver_frames(fields, (envelope, data_head, body, footer), self.room)
            connection.large_out = True
        if left:
            forget_left(consumer.queue, entry)
        connection.deliver_budget -= 1 + (size >> 16)
        if not connection.flush_scheduled:
            connection.schedule_flush()
        if message.body_size >= RELEASE_FROM and not consumer.no_ack:
            release_body(entry, consumer.queue)

    def _deliver_frames(self, fields: list[bytes], record: tuple[Part, ...], room: int) -> None:
        """A message (``record``: its parts, a body in a file among them) larger than the client's frames, in
        transfers of ``room`` bytes of it that say ``more`` but the last; nothing of it is copied."""
        session = self.session
        out = self.connection.out
        left = sum(map(len, record))
        first = True
        for chunk in cut(record, room):
            size = sum(map(len, chunk))
            left -= size
            perf = frames.performative(frames.TRANSFER, *fields, boolean(left > 0)) if first else \
                frames.performative(frames.TRANSFER, uint(self.handle), NULL, NULL, NULL, NULL, boolean(left > 0))
            first = False
            out.append(frames.FRAME_HEAD.pack(8 + len(perf) + size, 2, 0, session.channel) + perf)
            out.extend(chunk)
            session.sent_transfers(1)

    def cancelled_by_broker(self, consumer: Consumer) -> None:
        """The queue was deleted: the link detaches as RabbitMQ 4.x detaches it."""
        self.consumer = None
        vhost = self.connection.vhost_name
        self.session.detach_with(self.handle, Amqp10Error(
            "amqp:resource-deleted", f"queue '{consumer.queue.name}' in vhost '{vhost}' was deleted"))

    def failed(self, consumer: Consumer, reason: str) -> None:
        self.connection.close_with(Amqp10Error(frames.INTERNAL_ERROR, reason))

    def handed_over(self, consumer: Consumer, old: Any, new: Any) -> None:
        """(What the link's client holds goes on under the same delivery ids: ``Broker.hand_over``.)"""
        self.queue = new
        unsettled = self.session.unsettled
        ids = [i for i, (_, queue, held_by) in unsettled.items() if held_by is consumer and queue is old]
        for i, entry in zip(ids, self.broker.hand_over(consumer, old, new, [unsettled[i][0] for i in ids])):
            if entry is not None:
                unsettled[i] = (entry, new, consumer)

    def closed(self) -> None:
        """Detached: the consumer goes, and what the link's client held is requeued."""
        if self.reply is not None:
            self.broker.replies.remove(self.reply)
            self.reply = None
        consumer, self.consumer = self.consumer, None
        if consumer is not None:
            self.broker.remove_consumer(consumer)
        unsettled = self.session.unsettled
        ids = [i for i, (_, _, held_by) in unsettled.items() if held_by is not None and held_by.channel is self]
        if ids:
            self.broker.settle_taken([unsettled.pop(i) for i in ids], True)
        if consumer is not None:
            consumer.queue.deliver_ready()

