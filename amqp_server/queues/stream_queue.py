"""Streams (``x-queue-type: stream``) over AMQP 0-9-1, as RabbitMQ 3.10 serves them to AMQP clients.

A stream is an append-only log: a consumer reads it from an offset of its choosing (``x-stream-offset``:
``first``, ``last``, ``next``, a number, a timestamp or an interval such as ``1h``) without taking
anything, each delivery carrying its ``x-stream-offset`` header; acks only give credit back.  Messages
leave by retention alone (``x-max-length-bytes``, ``x-max-age``), a whole segment at a time and only
when a segment fills (``x-stream-max-segment-size-bytes``, 500 MB by default), as RabbitMQ's log does.

The messages are in the stream's log (``stream.log``): osiris chunks in segment files.  An AMQP 0-9-1 publish is
stored as the AMQP 1.0 record RabbitMQ 3.10 writes (``stream.amqp10``); the publishes of one loop turn make one
chunk, written at the end of the turn (or by the group commit, which makes it durable: the publisher's confirm
follows).  A stream-protocol publish frame is chunks of its own, cut as osiris's writer cuts it
(``append_chunks``).  AMQP consumers read chunks back, each decoded once into entries kept while memory allows
(``DECODED_BYTES``).  A body of ``RELEASE_FROM`` bytes or more (one data section that ends its record) is not
read: its entry holds none, and a delivery sends it from the segment file (``logged_body``), as a classic queue
sends a stored body, so that consumers with large prefetches make the node hold frames, not bodies.  An offset is
the record's place in the log; ``last`` is the newest chunk's first offset, as in RabbitMQ.
"""
from __future__ import annotations

import asyncio
import datetime
import logging
import os
from collections import OrderedDict
from itertools import islice
from typing import TYPE_CHECKING, Any, Callable, Iterable, Iterator, NamedTuple
from weakref import WeakKeyDictionary

from .. import errors
from ..framing import header_table
from ..clock import now_ms
from ..logs import Throttle
from ..message import RELEASE_FROM, Message
from .consumers import Consumers
from .queue import Checked, Consumer, Entry, ParkedSettle, QueueHost, taken_over
from .queue_args import MIN_SEGMENT_BYTES, QueueArgs, interval_ms
from .queue_type import DELIVERY_HEADER, STORES_ALL
from ..stats import MessageStats
from stream_log import amqp10, chunk
from stream_log.chunk import Left
from stream_log.log import DEFAULT_SEGMENT_BYTES, ChunkSpan, StreamLog, StreamLogs, StreamSegment

if TYPE_CHECKING:
    from .persistence import Persistence
    from .policy import Policy
    from .queue_type import QueueType
    from ..ports import ConfirmSink, ExclusiveOwner, StreamListener

OFFSET_HEADER = "x-stream-offset"
CHUNK_BYTES = 1 << 20  # records of AMQP publishes buffered before they are written as a chunk (else: the turn's end)
DECODED_BYTES = 16 << 20  # chunks decoded for AMQP consumers, kept while they take no more memory than this
ENTRY_OVERHEAD = 400  # bytes of memory a decoded message takes beside its body (its objects)
DECODE_SLICE = 256  # records of a chunk decoded at a time for AMQP consumers
DECODE_BATCH = 8  # records decoded between two looks at ``TURN_WORK``
TURN_WORK = 4 << 20  # what consumers' decoding may cost per loop turn: memory of entries, ``VALUE_COST`` a value
VALUE_COST = 64  # (an AMQP 1.0 value decoded the slow way costs about as much as this many bytes copied)
RECORD_HEAD = 64 << 10  # bytes of a large record read for its sections before the body (more: it is read whole)

log = logging.getLogger("warren.stream")
_refused = Throttle(log, burst=1, interval=10.0)  # a full disk refuses every turn's chunk: said once in a while


class Unreadable(NamedTuple):
    """A record at offset ``seq`` too large to decode (``amqp10.TooLarge``): a consumer reaching it fails."""

    seq: int
    reason: str


class _Decoded:
    """A chunk's records decoded for AMQP consumers so far (``records``: the rest, None once all are).  A chunk
    that may hold a body of ``RELEASE_FROM`` bytes is read a part at a time, such records left in the file
    (``chunk.file_records``); a smaller one is read whole."""

    __slots__ = ("entries", "records", "size", "refused", "segment")

    def __init__(self, stream_log: StreamLog, segment: StreamSegment, i: int) -> None:
        self.entries: list[Entry | Unreadable | None] = []
        self.refused: list[str] = []  # why sub-batches were passed over (``chunk.records``)
        self.segment = segment
        self.size = 0  # the memory its entries take
        row = stream_log.rows(segment)[i]
        self.records: Iterator[bytes | Left | None] | None
        if row["sent"] < RELEASE_FROM:
            raw = stream_log.chunk_bytes(segment, i)
            entries_count, data_len = chunk.HEADER.unpack_from(raw)[2], chunk.HEADER.unpack_from(raw)[8]
            self.records = chunk.records(
                memoryview(raw)[chunk.HEADER.size:chunk.HEADER.size + data_len], entries_count, self.refused)
        else:  # (read as the consumers go, while ``_entries`` finds the segment in the log: its file is open)
            self.records = chunk.file_records(lambda pos, size: os.pread(stream_log.fd(segment), size, pos),
                                              int(row["pos"]), int(row["sent"]), RELEASE_FROM, RECORD_HEAD,
                                              self.refused)


def _unexpired() -> None:
    """(A stream has no x-expires to run out: its type refuses the argument and the policy key.)"""


class StreamQueue:
    """A stream of this node (``queue.LocalQueue``): its log, its consumers (each with its own offset) and its
    stream-protocol readers and writers.  It holds no ready list: nothing is taken, paged, expired or settled."""

    available = True  # (as AnyQueue says: this node's queue is)
    leaderless = False
    remote = False
    term = 0  # (no leader checks entries out: ``LocalQueue.term``)
    committed = 0  # (no commit moves it: ``remove_upto``)
    committed_drops = 0
    held_bytes = 0  # (its log is on disk; decoded chunks are a cache of their own size: ``DECODED_BYTES``)

    def __init__(self, name: str, vhost: str, durable: bool = False,
                 exclusive_owner: "ExclusiveOwner[Any] | None" = None, auto_delete: bool = False,
                 arguments: dict[str, Any] | None = None, args: QueueArgs | None = None,
                 host: QueueHost | None = None, *, queue_type: "QueueType") -> None:
        self.type = queue_type
        self.counts_deliveries = DELIVERY_HEADER in queue_type.capabilities  # (x-stream-offset: delivery_header)
        self.persists_all = STORES_ALL in queue_type.capabilities
        self.name, self.vhost, self.durable, self.host = name, vhost, durable, host
        self.exclusive_owner, self.auto_delete = exclusive_owner, auto_delete  # (its type refuses both)
        self.arguments = arguments or {}
        self.args = args or QueueArgs()
        self.policy: "Policy | None" = None  # the user / operator policy applied (see policy.py)
        self.operator_policy: "Policy | None" = None
        self.consumers = Consumers(self.args, _unexpired)
        self.stats = MessageStats()
        self.unacked = 0  # deliveries not acked yet: an ack gives credit back
        self.deleted = False
        self.index_id = 0
        self.persistence: "Persistence | None" = None  # (an earlier version's stream is moved from it: ``recover``)
        self.logs: StreamLogs | None = None  # its type's storage, the node's streams' logs (set when it is attached)
        self._log: StreamLog | None = None
        self._turn: list[bytes] = []  # this turn's AMQP publishes: the next chunk's entries
        self._open_body = 0
        self._flush_scheduled = False
        self._bytes = 0  # of the bodies in its log and this turn's
        self.cursors: dict[Consumer, int] = {}  # each consumer's next offset
        self.filters: dict[Consumer, Callable[[Message], bool]] = {}  # the messages a consumer takes, if not all
        # stream-protocol readers and writers (stream.reader)
        self.listeners: dict["StreamListener[StreamQueue]", None] = {}
        self._decoder = amqp10.Decoder(self.name)
        self._decoded: OrderedDict[int, _Decoded] = OrderedDict()  # chunk id -> its entries, by offset
        self._decoded_bytes = 0
        self._decoded_work = 0  # memory of the entries decoded (``_work``)
        self._later = False  # a delivery is due at the next loop turn (``TURN_WORK`` was reached)
        self._failed: set[Consumer] = set()  # consumers that reached an unreadable record, being failed
        # the messages of decoded entries whose bodies are left in the log: their segment, and the body's position
        self._in_log: WeakKeyDictionary[Message, tuple[StreamSegment, int]] = WeakKeyDictionary()

    # -- the log ------------------------------------------------------------------------------

    @property
    def log(self) -> StreamLog:
        """The stream's log (opened, and recovered, on first use)."""
        stream_log = self._log
        if stream_log is None:
            assert self.logs is not None, "a stream is durable"
            stream_log = self._log = self.logs.open(self.index_id)
            self._limits(stream_log)
        return stream_log

    def _limits(self, stream_log: StreamLog) -> None:
        args = self.args
        stream_log.segment_bytes = max(args.segment_bytes, MIN_SEGMENT_BYTES) if args.segment_bytes \
            else DEFAULT_SEGMENT_BYTES  # (below the floor: taken, as RabbitMQ takes it, and segmented at the floor)
        stream_log.max_bytes = args.max_length_bytes
        stream_log.max_age_ms = args.max_age

    @property
    def first(self) -> int:
        """The lowest offset still in the stream."""
        return self.log.first

    @property
    def next_seq(self) -> int:
        """The offset the next message gets: the log's next, after this turn's publishes."""
        return (self._log.next if self._log is not None else 0) + len(self._turn)

    @next_seq.setter
    def next_seq(self, value: int) -> None:
        """(A stream's offsets are its log's: what a restart sets is not used.)"""

    @property
    def message_count(self) -> int:
        return self.next_seq - self.first

    @property
    def ready_bytes(self) -> int:
        return self._bytes

    @property
    def exclusive(self) -> bool:
        return False

    @property
    def node(self) -> str:
        return self.host.node_name if self.host is not None else ""

    def local(self) -> StreamQueue:
        return self

    def __repr__(self) -> str:
        return f"<Stream {self.vhost}/{self.name}>"

    # -- in -----------------------------------------------------------------------------------

    def enqueue(self, message: Message, confirm: "ConfirmSink | None" = None) -> bool:
        """The message joins this turn's chunk as RabbitMQ's AMQP 1.0 record; its confirm waits for the group
        commit that makes the chunk durable (``message.logged``)."""
        opened = self._turn
        if not opened and not self.writable():
            return False
        opened.append(amqp10.entry(message))
        size = message.body_size
        self._open_body += size
        self._bytes += size
        self.stats.publish += 1
        message.logged = True
        if len(opened) >= chunk.MAX_ENTRIES or self._open_body >= CHUNK_BYTES:
            self.flush()
        elif not self._flush_scheduled:  # the turn's first: the chunk is written at its end, or by the next commit
            self._flush_scheduled = True
            asyncio.get_running_loop().call_soon(self.flush)
            assert self.logs is not None
            self.logs.buffered(self.write_turn)
        return True

    def flush(self) -> None:
        """This turn's AMQP publishes become a chunk; consumers and stream-protocol readers read on.  A chunk the
        disk refuses is logged and left to the group commit, which confirms nothing until it is written."""
        try:
            self.write_turn()
        except OSError as exc:
            _refused.warning("stream %s: %d publishes not written (%s): tried again with the next group commit",
                             self, len(self._turn), exc)

    def write_turn(self) -> None:
        """``flush``, for the group commit: OSError if the disk refuses the chunk, whose publishes stay this turn's
        (to be written, and confirmed, when it takes them)."""
        self._flush_scheduled = False
        if not self._turn or self.deleted:
            return
        count, body = len(self._turn), self._open_body
        self.log.append(b"".join(self._turn), count, count, body, chunk.body_trailer(body))
        self._turn = []
        self._open_body = 0
        self._appended()

    def writable(self) -> bool:
        """Whether the log takes chunks now (it has a segment open, or can open one): a publish is refused if
        not."""
        return self.log.writable()

    def append_chunks(self, chunks: list[tuple[bytes | memoryview, int, int, int, bytes]]) -> int:
        """A stream-protocol publish frame's chunks, each (data, entries, records, body bytes, trailer), after this
        turn's AMQP publishes (which are written first); the first one's id."""
        self.flush()
        chunk_id = self.log.append_chunks(chunks)
        self.stats.publish += sum(part[2] for part in chunks)
        self._appended()
        return chunk_id

    def _appended(self) -> None:
        self._bytes = self.log.body + self._open_body  # (retention may have removed segments)
        if self.cursors:
            self.deliver_ready()
        for listener in self.listeners:
            listener.appended(self)

    def set_args(self, args: QueueArgs) -> None:
        """A policy changed the retention: it applies when the next segment fills, as RabbitMQ's does."""
        self.args = args
        if self._log is not None:
            self._limits(self._log)

    # -- consumers ----------------------------------------------------------------------------

    def touch(self) -> None:
        """(No x-expires countdown runs on a stream.)"""

    def add_consumer(self, consumer: Consumer) -> None:
        self.cursors[consumer] = self.attach_at(consumer.arguments.get(OFFSET_HEADER, "next"))
        self.consumers.join(consumer)

    def accepted(self, consumer: Consumer) -> asyncio.Future[None] | None:
        return None

    @property
    def active_consumer(self) -> Consumer | None:
        return None  # (no single active consumer: its type refuses it)

    @property
    def unused_auto_delete(self) -> bool:
        return False

    def filter_consumer(self, consumer: Consumer, accepts: Callable[[Message], bool]) -> None:
        """The consumer takes only the messages ``accepts`` says (an AMQP 1.0 source's filters): it reads past
        the others, which cost it no credit."""
        self.filters[consumer] = accepts

    def remove_consumer(self, consumer: Consumer) -> None:
        self.cursors.pop(consumer, None)
        self.filters.pop(consumer, None)
        self._failed.discard(consumer)
        self.consumers.leave(consumer)

    def take_consumer(self, consumer: Consumer, held: list[tuple[Entry, Checked]]) -> list[Entry | None]:
        return taken_over(self, consumer, held)

    def release(self, consumer: Consumer, entries: list[Entry]) -> tuple[list[Checked], list[ParkedSettle]]:
        return [self.checked(entry) for entry in entries], []

    def keep_settles(self, settles: list[ParkedSettle]) -> None:
        """Nothing to keep: a stream's consumers settle nothing a leader holds."""

    def adopt(self, held: list[Checked]) -> list[Entry | None]:
        """What a consumer held: nothing to take back (its offsets are read)."""
        return [None] * len(held)

    def checked(self, entry: Entry) -> Checked:
        return entry.seq, 0, False

    def holds(self, checked: Checked) -> bool:
        return False

    def agreed(self, seq: int) -> bool:
        return False

    def when_agreed(self, done: Callable[[bool], None]) -> bool:
        return False  # (settles change nothing in a stream)

    def attach_at(self, spec: Any) -> int:
        """The offset a consumer starts from, within the stream (its type, ``queue_types.stream``, checked the
        spec).  ``last`` is the newest chunk's first offset, as osiris has it."""
        self.flush()
        if isinstance(spec, (bytes, bytearray)):
            spec = spec.decode(errors="replace")
        stream_log = self.log
        if spec == "next":
            return stream_log.next
        if spec == "first":
            return stream_log.first
        if spec == "last":
            return stream_log.last_chunk
        if isinstance(spec, int) and not isinstance(spec, bool):
            return min(max(spec, stream_log.first), stream_log.next)
        if isinstance(spec, datetime.datetime):
            return stream_log.at_time(int(spec.timestamp() * 1000))
        if isinstance(spec, str) and (ms := interval_ms(spec)) is not None:
            return stream_log.at_time(now_ms() - ms)
        return stream_log.next

    def deliver_ready(self) -> None:
        """Each consumer reads on from its own offset while it has credit.  Decoding counts against
        ``TURN_WORK``: past it, the rest waits for the next loop turn, after other clients had theirs.  A
        consumer that reaches a record too large to decode is failed as RabbitMQ fails it (541)."""
        stream_log = self.log
        end = stream_log.next
        stats = self.stats
        budget = self._work() + TURN_WORK
        for consumer in self.consumers:
            if consumer in self._failed:
                continue
            cursor = max(self.cursors[consumer], stream_log.first)
            accepts = self.filters.get(consumer)
            while cursor < end and consumer.has_credit():
                if self._work() >= budget:
                    self.cursors[consumer] = cursor
                    self._deliver_later()
                    return
                entries, cursor_end = self._entries(cursor, budget)
                channel = consumer.channel
                for entry in entries:
                    if entry is None:  # a record this node cannot read: its offset is passed over
                        cursor += 1
                        continue
                    if isinstance(entry, Unreadable):
                        self._fail(consumer, entry)
                        break
                    if accepts is not None and not accepts(entry.message):
                        cursor = entry.seq + 1
                        continue
                    if not consumer.has_credit():
                        break
                    consumer.unacked += 1
                    self.unacked += 1
                    stats.deliver += 1
                    cursor = entry.seq + 1
                    if entry.message.body is None and not 0 < consumer.sends_from <= entry.message.body_size:
                        entry = self._whole(entry)  # (a consumer whose body goes from memory)
                    channel.deliver(consumer, entry)
                else:
                    cursor = cursor_end
                    continue
                break
            self.cursors[consumer] = cursor

    def _deliver_later(self) -> None:
        if not self._later:
            self._later = True
            asyncio.get_running_loop().call_soon(self._deliver_now)

    def _deliver_now(self) -> None:
        self._later = False
        if not self.deleted:
            self.deliver_ready()

    def _fail(self, consumer: Consumer, unreadable: "Unreadable") -> None:
        """The consumer reached a record that is not decoded: its client is failed (after this turn: the
        consumers are being iterated)."""
        self._failed.add(consumer)
        reason = (f"message at offset {unreadable.seq} of "
                  f"{errors.resource_name('queue', self.name, self.vhost)} cannot be read: {unreadable.reason}")
        log.warning("%s", reason)
        asyncio.get_running_loop().call_soon(consumer.channel.failed, consumer, reason)

    def _work(self) -> int:
        """What decoding for consumers has cost so far (``TURN_WORK``'s unit)."""
        return self._decoded_work + self._decoder.values * VALUE_COST

    def _entries(self, offset: int, budget: float = float("inf")) -> tuple[list[Entry | Unreadable | None], int]:
        """The entries of the chunk holding ``offset``, from ``offset`` on (one at least, and more while
        ``_work`` is below ``budget``), and the offset after the last one given."""
        stream_log = self.log
        found = stream_log.find(offset)
        if found is None:
            return [], offset
        segment, i = found
        row = stream_log.rows(segment)[i]
        chunk_id = int(row["id"])
        decoded = self._decoded.get(chunk_id)
        if decoded is None:
            decoded = self._decoded[chunk_id] = _Decoded(stream_log, segment, i)
        else:
            self._decoded.move_to_end(chunk_id)
        entries = decoded.entries
        at = max(offset - chunk_id, 0)
        if at >= len(entries) and decoded.records is not None:
            self._decoded_bytes += self._decode(decoded, chunk_id, at + DECODE_SLICE, budget)
            while self._decoded_bytes > DECODED_BYTES and len(self._decoded) > 1:
                _, dropped = self._decoded.popitem(last=False)
                self._decoded_bytes -= dropped.size
        return entries[at:], chunk_id + len(entries)

    def _decode(self, decoded: _Decoded, chunk_id: int, upto: int, budget: float) -> int:
        """Records of a chunk decoded until it has ``upto`` entries (or all), or ``_work`` reaches ``budget``:
        the memory they take."""
        decoder = self._decoder
        message = decoder.message
        entries = decoded.entries
        append = entries.append
        records = decoded.records
        assert records is not None
        size = 0
        left = budget - self._work()
        while len(entries) < upto and left > 0:
            before, values, had = size, decoder.values, len(entries)
            for offset, record in enumerate(islice(records, min(DECODE_BATCH, upto - had)), chunk_id + had):
                if record is None:
                    append(None)
                    if decoded.refused:
                        log.warning("%s: records from offset %d passed over: %s",
                                    errors.resource_name("queue", self.name, self.vhost), offset,
                                    decoded.refused[0])
                        decoded.refused.clear()
                    continue
                try:
                    converted = (self._message_left(decoded.segment, record) if isinstance(record, Left)
                                 else message(record))
                except amqp10.TooLarge as exc:
                    append(Unreadable(offset, str(exc)))
                else:
                    size += (converted.body_size if converted.body is not None else 0) + ENTRY_OVERHEAD
                    append(Entry(offset, converted))
            if len(entries) == had:
                decoded.records = None
                break
            left -= size - before + (decoder.values - values) * VALUE_COST
        self._decoded_work += size
        decoded.size += size
        return size

    def _message_left(self, segment: StreamSegment, record: Left) -> Message:
        """The message of a record ``chunk.file_records`` left in the file: without its body where the body is one
        data section of ``RELEASE_FROM`` bytes or more that ends the record or its footer follows, else read
        whole."""
        found = self._decoder.head(record.head, record.size,
                                   lambda at, size: self._pread(segment, size, record.pos + at))
        if found is None or found[0].body_size < RELEASE_FROM:
            return self._decoder.message(self._pread(segment, record.size, record.pos))
        converted, body_at = found
        self._in_log[converted] = (segment, record.pos + body_at)
        return converted

    def _pread(self, segment: StreamSegment, size: int, pos: int) -> bytes:
        data = os.pread(self.log.fd(segment), size, pos)
        if len(data) != size:
            raise OSError(f"short read of {size} bytes at {pos} of {segment.path}.segment")
        return data

    def _whole(self, entry: Entry) -> Entry:
        """An entry whose body is left in the log (``logged_body``), with its body read (for this reader only: the
        decoded entry keeps none)."""
        message = entry.message
        segment, pos = self._in_log[message]
        whole = Message(message.exchange, message.routing_key, message.route, message.header,
                        self._pread(segment, message.body_size, pos))
        whole.amqp10 = message.amqp10
        return Entry(entry.seq, whole)

    def logged_body(self, message: Message) -> tuple[int, int, None] | None:
        """Where the body of ``message``, delivered from a decoded entry that holds none, lies in the log: a
        descriptor of the caller's own (which keeps the file readable whatever retention does meanwhile: a
        segment file is never written again, only unlinked) and the body's position there; None for a message
        that holds its body."""
        found = self._in_log.get(message) if message.body is None else None
        if found is None:
            return None
        segment, pos = found
        return os.dup(self.log.fd(segment)), pos, None

    def read(self, start: int, count: int) -> list[Entry]:
        """Up to ``count`` entries from offset ``start`` (within the stream) with their contents; a record too
        large to decode is an error (541), as it is to a consumer."""
        self.flush()
        found: list[Entry] = []
        cursor = max(start, self.first)
        end = self.log.next
        while cursor < end and len(found) < count:
            entries, cursor = self._entries(cursor)
            for entry in entries[:count - len(found)]:
                if isinstance(entry, Unreadable):
                    raise errors.ChannelError(errors.INTERNAL_ERROR, f"message at offset {entry.seq} of "
                                              f"{errors.resource_name('queue', self.name, self.vhost)} cannot "
                                              f"be read: {entry.reason}")
                if entry is not None:
                    found.append(self._whole(entry) if entry.message.body is None else entry)
        return found

    def delivery_header(self, entry: Entry, get: bool = False) -> bytes:
        return header_table.with_int_set(entry.message.header, OFFSET_HEADER, entry.seq)

    def settle(self, entries: list[Entry]) -> None:
        """An ack gives credit back; the message stays."""
        self.unacked -= len(entries)
        self.stats.ack += len(entries)

    def requeue(self, entries: Iterable[Entry]) -> None:
        """What a closed channel or cancelled consumer held: nothing comes back (the offsets are read)."""
        self.unacked -= sum(1 for _ in entries)

    def requeue_released(self, entries: Iterable[Entry]) -> None:
        self.requeue(entries)

    def requeue_left(self, entries: Iterable[Entry]) -> None:
        self.requeue(entries)

    def reject(self, entries: list[Entry]) -> None:
        """An AMQP 1.0 reader's rejected outcome: credit comes back, nothing is dead-lettered (no acks counted)."""
        self.unacked -= len(entries)

    def modify(self, entries: list[Entry], requeue: bool, counted: bool, annotations: bytes) -> None:
        """As ``reject`` or ``requeue``: the message stays, its annotations are not kept."""
        self.unacked -= len(entries)

    def returns(self, entry: Entry) -> int:
        return 0

    def forget(self, entry: Entry) -> None:
        """(Nothing is taken from a stream: its entries leave by retention.)"""

    def get(self, no_ack: bool, sends_from: int = 0) -> Entry | None:
        raise errors.ConnectionError(
            errors.NOT_IMPLEMENTED,
            f"basic.get not supported by stream queues {errors.resource_name('queue', self.name, self.vhost)}")

    async def fetch(self, no_ack: bool, sends_from: int = 0) -> Entry | None:
        return self.get(no_ack, sends_from)

    async def purged(self) -> int:
        return self.purge()

    async def counted(self) -> tuple[int, int]:
        return self.message_count, len(self.consumers)

    async def deleted_by_node(self, if_unused: bool, if_empty: bool) -> int | None:
        return None  # (this node's: ``delete_queue`` decides)

    # -- what reads or changes the whole stream -----------------------------------------------

    def purge(self) -> int:
        raise errors.ConnectionError(
            errors.NOT_IMPLEMENTED,
            f"queue.purge not supported by stream queues {errors.resource_name('queue', self.name, self.vhost)}")

    def drop_all(self) -> None:
        """The stream is deleted: its log goes; its stream-protocol readers and writers are told."""
        for listener in list(self.listeners):
            listener.deleted(self)
        self.listeners.clear()
        self.consumers.reset()
        self.cursors.clear()
        self._turn = []
        self._decoded.clear()
        self._in_log.clear()
        self._failed.clear()
        if self.logs is not None:
            self.logs.forget(self.index_id)  # (its log object stays, empty: nothing reads it any more)

    def stop_timers(self) -> None:
        """(No timer runs on a stream: a turn's chunk is written by the group commit at the latest.)"""

    def page_out(self, keep: int, written: dict[int, tuple[Message, int]] | None = None) -> int:
        """Memory runs short: a stream holds none of its log (its decoded chunks are bounded: ``DECODED_BYTES``)."""
        return 0

    def recover(self, count: int, size: int, last_seq: int | None, expiries: Iterable[tuple[int, int]]) -> None:
        """The log from disk (a stream kept in the queue index by an earlier version is moved into one first)."""
        if count:
            from . import stream_migrate as migrate

            assert self.persistence is not None and self.logs is not None
            migrate.legacy_stream(self.persistence, self.logs, self, f"'{self.name}' in vhost '{self.vhost}'")
        self._bytes = self.log.body

    def restarted(self) -> None:
        """(Its log is all its state, read back by ``recover``.)"""

    def offsets(self) -> tuple[int, int]:
        self.flush()
        return self.first, self.next_seq

    def peek(self, offset: int = 0, count: int = 10, after: Entry | None = None) -> list[Entry]:
        return self.read(self.first + offset if after is None else after.seq + 1, count)

    def read_range(self, start: int, end: int, step: int, limit: int | None = None) -> Iterator[list[Entry]]:
        cursor, remaining = max(start, self.first), limit
        while cursor < min(end, self.next_seq) and (remaining is None or remaining > 0):
            want = step if remaining is None else min(step, remaining)
            batch = [entry for entry in self.read(cursor, want) if entry.seq < end]
            if not batch:
                return
            cursor = batch[-1].seq + 1
            if remaining is not None:
                remaining -= len(batch)
            yield batch

    def chunk_span(self, start: int, end: int, rows: int, max_bytes: int) -> "ChunkSpan":
        self.flush()
        return self.log.span(max(start, self.first), end, rows, max_bytes)

    def remove_upto(self, offset: int) -> int:
        raise errors.precondition_failed(
            f"{errors.resource_name('queue', self.name, self.vhost)} is a stream: its messages leave by "
            "retention only")

    def count_committed(self) -> bool:
        return False
