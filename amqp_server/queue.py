"""A queue: its ready messages, its consumers, and the round-robin that joins them.

Delivery is synchronous: an enqueue with a consumer that has credit goes out
in the same call, so a message published and consumed on one broker touches
no scheduler.  The channel owns delivery tags and the unacked map; the queue
only hands entries over and takes them back.
"""
from __future__ import annotations

from bisect import insort
from collections import deque
from typing import TYPE_CHECKING, Any, Iterable

from .message import Message

if TYPE_CHECKING:
    from .channel import Channel
    from .connection import Connection
    from .persistence import Persistence


class Entry:
    """A message's place in one queue: its sequence number keeps requeues in order."""

    __slots__ = ("seq", "message", "redelivered", "expiry")

    def __init__(self, seq: int, message: Message, redelivered: bool = False, expiry: int = 0) -> None:
        self.seq = seq
        self.message = message
        self.redelivered = redelivered
        self.expiry = expiry  # epoch ms, 0 for none

    def __lt__(self, other: "Entry") -> bool:
        return self.seq < other.seq


class Consumer:
    """basic.consume on one queue; ``prefetch`` 0 means unlimited."""

    __slots__ = ("tag", "channel", "queue", "no_ack", "exclusive", "arguments", "prefetch",
                 "unacked", "prefix")

    def __init__(self, tag: str, channel: "Channel", queue: "Queue", no_ack: bool, exclusive: bool,
                 arguments: dict, prefetch: int, prefix: bytes) -> None:
        self.tag = tag
        self.channel = channel
        self.queue = queue
        self.no_ack = no_ack
        self.exclusive = exclusive
        self.arguments = arguments
        self.prefetch = prefetch
        self.unacked = 0
        self.prefix = prefix  # encoded Basic.Deliver class/method + consumer tag

    def has_credit(self) -> bool:
        if self.prefetch and self.unacked >= self.prefetch:
            return False
        return self.channel.can_deliver()


class Queue:
    """A FIFO of entries plus its consumers, as RabbitMQ's classic queue behaves."""

    def __init__(self, name: str, vhost: str, durable: bool = False, exclusive_owner: "Connection | None" = None,
                 auto_delete: bool = False, arguments: dict[str, Any] | None = None) -> None:
        self.name = name
        self.vhost = vhost
        self.durable = durable
        self.exclusive_owner = exclusive_owner
        self.auto_delete = auto_delete
        self.arguments = arguments or {}
        self.ready: deque[Entry] = deque()
        self.consumers: list[Consumer] = []
        self.unacked = 0
        self.next_seq = 0
        self._rr = 0
        self.had_consumer = False
        self.deleted = False
        self.index_id = 0
        self.persistence: "Persistence | None" = None  # set for durable queues

    @property
    def exclusive(self) -> bool:
        return self.exclusive_owner is not None

    @property
    def message_count(self) -> int:
        return len(self.ready)

    def __repr__(self) -> str:
        return f"<Queue {self.vhost}/{self.name}>"

    def enqueue(self, message: Message) -> None:
        entry = Entry(self.next_seq, message)
        self.next_seq += 1
        if self.persistence is not None and message.persistent:
            self.persistence.write(self, entry)
        self.ready.append(entry)
        if self.consumers:
            self.run()

    def recover_entry(self, entry: Entry) -> None:
        """An entry read back from the queue index at start-up, in order."""
        self.ready.append(entry)
        self.next_seq = entry.seq + 1

    def run(self) -> None:
        """Hand ready entries to consumers with credit, round-robin."""
        ready = self.ready
        consumers = self.consumers
        n = len(consumers)
        if not ready or not n:
            return
        i = self._rr
        idle = 0
        while ready and idle < n:
            if i >= n:
                i = 0
            consumer = consumers[i]
            i += 1
            if consumer.has_credit():
                idle = 0
                entry = self._take(ready.popleft(), consumer.no_ack)
                consumer.channel.deliver(consumer, entry)
            else:
                idle += 1
        self._rr = i

    def _take(self, entry: Entry, no_ack: bool) -> Entry:
        """An entry leaves the ready list for a consumer or basic.get."""
        message = entry.message
        persisted = message.msg_id and self.persistence is not None
        if message.body is None:
            self.persistence.load(message)
        if no_ack:
            if persisted:
                self.persistence.remove(self, entry)
        else:
            self.unacked += 1
            if persisted and not entry.redelivered:
                self.persistence.delivered(self, entry)
        return entry

    def get(self, no_ack: bool) -> Entry | None:
        """basic.get: the head entry, or None."""
        if not self.ready:
            return None
        return self._take(self.ready.popleft(), no_ack)

    def settle(self, entries: list[Entry]) -> None:
        """Entries taken for manual ack were acked or dropped."""
        self.unacked -= len(entries)
        if self.persistence is not None:
            for entry in entries:
                if entry.message.msg_id:
                    self.persistence.remove(self, entry)

    def requeue(self, entries: Iterable[Entry]) -> None:
        """Put unacked entries back in their original places, marked redelivered."""
        ready = self.ready
        count = 0
        for entry in sorted(entries, key=lambda e: e.seq):
            entry.redelivered = True
            count += 1
            if not ready or entry.seq > ready[-1].seq:
                ready.append(entry)
            elif entry.seq < ready[0].seq:
                ready.appendleft(entry)
            else:
                insort(ready, entry)
        self.unacked -= count
        if count:
            self.run()

    def purge(self) -> int:
        count = len(self.ready)
        if self.persistence is not None:
            for entry in self.ready:
                if entry.message.msg_id:
                    self.persistence.remove(self, entry)
        self.ready.clear()
        return count

    def drop_all(self) -> None:
        """The queue is deleted: its ready entries and (durable) index go with it."""
        if self.persistence is not None:
            self.persistence.delete_queue(self, list(self.ready))
        self.ready.clear()

    def add_consumer(self, consumer: Consumer) -> None:
        self.consumers.append(consumer)
        self.had_consumer = True

    def remove_consumer(self, consumer: Consumer) -> None:
        try:
            index = self.consumers.index(consumer)
        except ValueError:
            return
        del self.consumers[index]
        if index < self._rr:
            self._rr -= 1

    @property
    def unused_auto_delete(self) -> bool:
        """An auto-delete queue goes once its last consumer has gone."""
        return self.auto_delete and self.had_consumer and not self.consumers
