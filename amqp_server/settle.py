"""Settling a queue's entries: what consumers and basic.get took comes back acked, rejected (dead-lettered) or
requeued to its place; a purge empties the ready list; a deletion or a deposed leader lets everything go.
"""
from __future__ import annotations

from functools import partial
from typing import Iterable

from .expiry import Expiry
from .ready import Entry


class Settling(Expiry):
    """Settling a queue's entries: a part of :class:`queue.Queue`."""

    def settle(self, entries: list[Entry]) -> None:
        """Entries taken for manual ack were acked."""
        self._settled(entries)
        self.stats.ack += len(entries)
        for entry in entries:
            self._forget(entry)

    def reject(self, entries: list[Entry]) -> None:
        """Rejected or nacked without requeue: dead-lettered (if configured) and settled."""
        self._settled(entries)
        self._dead_letter(entries, "rejected")

    def _settled(self, entries: list[Entry]) -> None:
        """Unacked entries are no longer."""
        self.unacked -= len(entries)
        self.unacked_bytes -= sum(entry.message.body_size for entry in entries)

    def requeue(self, entries: Iterable[Entry]) -> None:
        """Put unacked entries back in their original places, marked redelivered.  Newest first: each goes
        in front of the ready head at once (oldest first, every one after the first went into the middle of
        the deque, and 50,000 requeued into a queue of 150,000 held the loop 5 s)."""
        count = 0
        for entry in sorted(entries, key=lambda e: e.seq, reverse=True):
            entry.redelivered = True
            count += 1
            self.ready_bytes += entry.message.body_size
            self.unacked_bytes -= entry.message.body_size
            if entry.expiry:
                self._track_expiry(entry)
            self._put_back(entry)
        self.unacked -= count
        if count:
            self.deliver_ready()
            if self._expiring:
                self._expire_due()

    def purge(self) -> int:
        """Every ready entry leaves the queue; how many.  Those on disk (a deep queue's backlog) at once to
        every reader, and from the index in the background: a million held every client for seconds.  Drop
        marks in the index name them until they are gone, so a restart meanwhile drops them too."""
        count = self.message_count
        self._forget_ready()
        if self.paged and self.PURGES_LATER:
            index, queue_id = self._page_index()
            on_disk = self._paged_ranges(self.next_seq)
            marks = [index.mark_dropped(queue_id, start, end) for start, end in on_disk] + self._drop_marks
            self._drop_marked(on_disk, marks)
            self.paged_from, self._drop_below, self._drop_marks = self.next_seq, 0, []  # a commit's drop: part of it
        elif self.paged:
            self._drop_paged(self.next_seq)
        self._clear_ready()
        return count

    def drop_all(self) -> None:
        """The queue is deleted: its ready entries go, and its index rows.  Those in memory go now; those on disk,
        a deep queue's backlog, in the background (``Pager.drop_later``), as do the rows of entries consumers
        still hold (their store references are theirs to release)."""
        on_disk = self._paged_ranges() if self.paged else []
        self._forget_ready()
        self._clear_ready()
        if self.pager is not None:
            self.pager.shallow(self)
            if self.persistence is not None or self.page_id:
                index, queue_id = self._page_index()
                self.pager.drop_later(index, queue_id, on_disk, self._release, partial(index.delete_queue, queue_id))
        self._groups = []
        self.active_consumer = None
        for timer in (self._expiry_timer, self._expires_timer):
            if timer is not None:
                timer.cancel()

    def detach(self) -> None:
        """This object stops standing for the queue, whose storage lives on without it (a replicated queue's
        leader was deposed): it takes nothing more, forgets what it held in memory and touches no storage;
        what its clients still settle is dropped."""
        self.deleted = True
        self.persistence = None
        self.window = None
        self._clear_ready()
        for timer in (self._expiry_timer, self._expires_timer):
            if timer is not None:
                timer.cancel()
        self._expiry_timer = self._expires_timer = None
        if self.pager is not None:
            self.pager.shallow(self)

    def _clear_ready(self) -> None:
        self.ready.clear()
        self.gone_in_ready = 0
        self.ready_bytes = 0
        self.tail.clear()
        self._expiring.clear()
        self._expiry.clear()
