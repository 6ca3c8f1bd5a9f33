"""Quorum queues (``x-queue-type: quorum``) as RabbitMQ 3.10 has them, on top of the classic queue.

What a client sees differs from a classic queue:

- a message that comes back (nack, reject or a consumer gone) goes to the back of the queue, with a new
  offset, as RabbitMQ 3.10's quorum queues put it (a classic queue puts it back in its place);
- a delivery carries an ``x-delivery-count`` header: how many times the message came back (nack or
  reject with requeue, a consumer or channel gone with it unacked); RabbitMQ 3.10 sets it on every
  basic.get-ok, and on a basic.deliver only from the first return on;
- ``x-delivery-limit``: a message returned more often than that is dead-lettered (reason
  ``delivery_limit``) or dropped;
- ``x-overflow: reject-publish`` refuses only once the queue is over its limit (RabbitMQ 3.10 takes the
  publish that goes over it);
- the queue is durable, shared and kept (the declaration's properties are checked in
  its type, :mod:`queue_types.quorum`), and global QoS is refused at basic.consume;
- ``x-dead-letter-strategy: at-least-once`` (with ``x-overflow: reject-publish``, as RabbitMQ requires;
  otherwise at-most-once): a dead letter no queue takes stays with the queue, counted apart
  (``messages_dlx``), and is tried again every ``DLX_RETRY`` seconds until one does;
- the HTTP API shows its leader and members.

A queue's replicas are the cluster's business (``forwarder.quorum``, which it tells of every change through
``replicator``); on a single node the group is this node.
The counts are kept per seq, not per entry, so they survive an entry paging out and back, and in the queue
index's flags (up to 63: ``queue_index.MAX_RETURNS``), so they survive a restart and, replicated, a failover.
"""
from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Any, Iterable

import numpy as np

from queue_index import IndexEntry

from . import header_table
from .message import Message
from .queue import Entry, Queue

if TYPE_CHECKING:
    from .ports import ConfirmSink

DELIVERY_COUNT = "x-delivery-count"
DLX_RETRY = 1.0  # seconds between tries of at-least-once dead letters that no queue took


class QuorumQueue(Queue):
    counts_deliveries = True
    persists_all = True  # as RabbitMQ's: every message is on disk, whatever its delivery mode
    DROPS_COMMITTED_LATER = False  # a commit's drops replicate as they are made (_release_rows): all at once
    PURGES_LATER = False  # and so do a purge's

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.returns: dict[int, int] = {}  # seq -> times returned, for entries returned at least once
        self.members: list[str] = []  # the nodes holding a replica, leader first (set by the broker)
        self.taken: dict[int, Entry] = {}  # unacked entries (a replicated queue's snapshot includes them)
        self.dlx_pending: list[tuple[Entry, str]] = []  # at-least-once dead letters no queue took yet, reason
        self._dlx_timer: asyncio.TimerHandle | None = None
        self._no_ack_taken = (-1, 0)  # (seq, returns) of the entry a no-ack delivery or get just took

    def enqueue(self, message: Message, confirm: "ConfirmSink | None" = None) -> bool:
        return super().enqueue(self._stored_copy(message), confirm)

    def delivery_header(self, entry: Entry, get: bool = False) -> bytes:
        """The content header a consumer (``get``: basic.get) receives: the message's, with ``x-delivery-count``."""
        seq = entry.seq
        count = self.returns.get(seq) or (self._no_ack_taken[1] if self._no_ack_taken[0] == seq else 0)
        if not count and not get:
            return entry.message.header
        return header_table.with_int_set(entry.message.header, DELIVERY_COUNT, count)

    def _full(self, incoming: int) -> bool:
        """RabbitMQ 3.10's quorum queues refuse a publish (reject-publish) only once they are over a limit: the
        one that reaches it is taken."""
        args = self.args
        return ((args.max_length is not None and self.message_count > args.max_length)
                or (args.max_length_bytes is not None and self.ready_bytes > args.max_length_bytes))

    def deliver_ready(self) -> None:
        super().deliver_ready()
        self._ship()

    def get(self, no_ack: bool) -> Entry | None:
        entry = super().get(no_ack)
        self._ship()
        return entry

    def _ship(self) -> None:
        """The deliveries just made go to the followers before any reaches a client (connections write at
        the end of the loop turn), so that a new leader redelivers whatever a client may have seen."""
        if self.replicator is not None:
            self.replicator.flush()

    def _take(self, entry: Entry, no_ack: bool) -> Entry:
        if no_ack:  # the entry is forgotten now, its count with it: kept for the header built next
            self._no_ack_taken = (entry.seq, self.returns.get(entry.seq, 0))
        entry = super()._take(entry, no_ack)
        if not no_ack:
            self.taken[entry.seq] = entry
            if self.replicator is not None:
                self.replicator.delivered(entry.seq)
        return entry

    def requeue(self, entries: Iterable[Entry]) -> None:
        """Returned entries count one more return and go to the back (under a new seq, their index entry
        moved); those past the delivery limit leave for good."""
        limit = self.args.delivery_limit
        returns = self.returns
        over = []
        persistence, replicator = self.persistence, self.replicator
        count = 0
        for entry in sorted(entries, key=lambda e: e.seq):
            old = entry.seq
            self.taken.pop(old, None)
            self.unacked_bytes -= entry.message.body_size
            times = returns.pop(old, 0) + 1
            if limit is not None and times > limit:
                returns[old] = times
                over.append(entry)
                continue
            entry.seq = new = self.next_seq
            self.next_seq += 1
            returns[new] = times
            entry.redelivered = True
            if persistence is not None and entry.message.msg_id:
                persistence.moved(self, old, entry, times)
            if replicator is not None:
                replicator.moved(old, new, times)
            self._append(entry)
            count += 1
        self.unacked -= count + len(over)
        if over:
            self._dead_letter(over, "delivery_limit")
        if count:
            self.deliver_ready()
            if self._expiring:
                self._expire_due()

    @property
    def dlx_bytes(self) -> int:
        return sum(entry.message.body_size for entry, _ in self.dlx_pending)

    def _at_least_once(self) -> bool:
        args = self.args
        return (args.dead_letter_strategy == "at-least-once" and args.overflow == "reject-publish"
                and args.dead_letter_exchange is not None and self.host is not None)

    def _dead_letter(self, entries: list[Entry], reason: str, persisted: bool = True) -> None:
        """At least once: an entry leaves only once a queue took its dead letter; until then it waits here."""
        if not (persisted and self._at_least_once()):
            super()._dead_letter(entries, reason, persisted)
            return
        for entry in entries:
            if entry.message.body is None:
                self.host.load_body(entry.message)
        self._settle_dead_letters([(entry, reason) for entry in entries])

    def _settle_dead_letters(self, letters: list[tuple[Entry, str]]) -> None:
        untaken: list[tuple[Entry, str]] = []
        for reason in {reason for _, reason in letters}:
            entries = [entry for entry, why in letters if why == reason]
            left = {id(entry) for entry in self.host.dead_letter(self, entries, reason)}
            for entry in entries:
                if id(entry) in left:
                    untaken.append((entry, reason))
                else:
                    self._forget(entry)
        self.dlx_pending.extend(untaken)
        if self.dlx_pending and self._dlx_timer is None and not self.deleted:
            self._dlx_timer = asyncio.get_running_loop().call_later(DLX_RETRY, self._retry_dead_letters)

    def _retry_dead_letters(self) -> None:
        self._dlx_timer = None
        letters, self.dlx_pending = self.dlx_pending, []
        if self.deleted:
            return
        if self._at_least_once():
            self._settle_dead_letters(letters)
            return
        for reason in {reason for _, reason in letters}:  # the strategy changed (a policy): at most once now
            super()._dead_letter([entry for entry, why in letters if why == reason], reason)

    def drop_all(self) -> None:
        """Deleted: the dead letters still waiting go too, and the entries on disk now, each removal replicated."""
        self._stop_dead_letters()
        if self.paged:
            self._drop_paged(self.next_seq)
        super().drop_all()

    def detach(self) -> None:
        super().detach()
        self._stop_dead_letters()

    def _stop_dead_letters(self) -> None:
        for entry, _ in self.dlx_pending:
            self._forget(entry)
        self.dlx_pending = []
        if self._dlx_timer is not None:
            self._dlx_timer.cancel()
            self._dlx_timer = None

    def _forget(self, entry: Entry) -> None:
        self.returns.pop(entry.seq, None)
        self.taken.pop(entry.seq, None)
        if self.replicator is not None:
            self.replicator.removed(entry.seq)
        super()._forget(entry)

    def _paged_entry(self, row: IndexEntry) -> Entry:
        if row.returns:  # counted before a restart (or by the copy this node leads from)
            self.returns[row.seq] = row.returns
        return super()._paged_entry(row)

    def _release_rows(self, seqs: np.ndarray, rows: np.ndarray) -> None:
        for seq in seqs.tolist():
            self.returns.pop(seq, None)
            if self.replicator is not None:
                self.replicator.removed(seq)
        super()._release_rows(seqs, rows)
