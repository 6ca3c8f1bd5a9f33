"""Quorum queues (``x-queue-type: quorum``) as RabbitMQ 3.10 has them, on top of the classic queue.

What a client sees differs from a classic queue:

- a delivery carries an ``x-delivery-count`` header: how many times the message came back (nack or
  reject with requeue, a consumer or channel gone with it unacked); RabbitMQ 3.10 sets it on every
  basic.get-ok, and on a basic.deliver only from the first return on;
- ``x-delivery-limit``: a message returned more often than that is dead-lettered (reason
  ``delivery_limit``) or dropped;
- the queue is durable, shared and kept (the declaration's properties are checked in
  :func:`queue_args.check_properties`), and global QoS is refused at basic.consume;
- the HTTP API shows its leader and members.

A queue's replicas are the cluster's business (``forwarder.quorum``, which it tells of every change through
``replicator``); on a single node the group is this node.
The counts are kept per seq, not per entry, so they survive an entry paging out and back; they are not
persisted (after a restart a message is only ``redelivered``).
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any, Iterable

from queue_index import IndexEntry

from . import header_table
from .message import Message
from .queue import Entry, Queue

if TYPE_CHECKING:
    from .ports import ConfirmSink

DELIVERY_COUNT = "x-delivery-count"


class QuorumQueue(Queue):
    queue_type = "quorum"
    counts_deliveries = True
    persists_all = True  # as RabbitMQ's: every message is on disk, whatever its delivery mode

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.returns: dict[int, int] = {}  # seq -> times returned, for entries returned at least once
        self.members: list[str] = []  # the nodes holding a replica, leader first (set by the broker)
        self.taken: dict[int, Entry] = {}  # unacked entries (a replicated queue's snapshot includes them)

    @property
    def leader(self) -> str:
        return self.members[0] if self.members else ""

    def enqueue(self, message: Message, confirm: "ConfirmSink | None" = None) -> bool:
        if not message.persistent and self.persistence is not None and not message.msg_id:
            message = message.copy()  # stored here; the other queues it went to keep theirs in memory
        return super().enqueue(message, confirm)

    def delivery_header(self, entry: Entry, get: bool = False) -> bytes:
        """The content header a consumer (``get``: basic.get) receives: the message's, with ``x-delivery-count``."""
        count = self.returns.get(entry.seq, 0)
        if not count and not get:
            return entry.message.header
        return header_table.with_int_set(entry.message.header, DELIVERY_COUNT, count)

    def _take(self, entry: Entry, no_ack: bool) -> Entry:
        entry = super()._take(entry, no_ack)
        if not no_ack:
            self.taken[entry.seq] = entry
            if self.replicator is not None:
                self.replicator.delivered(entry.seq)
        return entry

    def requeue(self, entries: Iterable[Entry]) -> None:
        """Returned entries count one more return; those past the delivery limit leave for good."""
        limit = self.args.delivery_limit
        returns = self.returns
        kept, over = [], []
        for entry in entries:
            self.taken.pop(entry.seq, None)
            count = returns[entry.seq] = returns.get(entry.seq, 0) + 1
            (over if limit is not None and count > limit else kept).append(entry)
        if over:
            self.unacked -= len(over)
            self._dead_letter(over, "delivery_limit")
        super().requeue(kept)

    def _forget(self, entry: Entry) -> None:
        self.returns.pop(entry.seq, None)
        self.taken.pop(entry.seq, None)
        if self.replicator is not None:
            self.replicator.removed(entry.seq)
        super()._forget(entry)

    def _release_row(self, row: IndexEntry) -> None:
        self.returns.pop(row.seq, None)
        if self.replicator is not None:
            self.replicator.removed(row.seq)
        super()._release_row(row)
