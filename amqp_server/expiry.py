"""Expiry (per-message and per-queue TTL) and dead-lettering: expired entries are found through an expiry heap
wherever they sit, marked gone in place and skipped when the ready list reaches them, so expiring a message in the
middle of a long queue costs O(log n); entries that leave for good go to the dead-letter exchange if one is set.
"""
from __future__ import annotations

import asyncio

from .clock import now_ms
from .disk_tail import DiskTail
from .message import Message
from .ready import Entry


class Expiry(DiskTail):
    """Expiry (per-message and per-queue TTL) and dead-lettering: a part of :class:`queue.Queue`."""

    def _expiry_for(self, message: Message) -> int:
        ttl = self.args.message_ttl
        expiration = message.expiration_ms
        if expiration is not None and (ttl is None or expiration < ttl):
            ttl = expiration
        return now_ms() + ttl if ttl is not None else 0

    def _track_expiry(self, entry: Entry) -> None:
        key = self.row_key(entry)
        self._expiring[key] = entry
        self._schedule_expiry(entry.expiry, key)

    def _schedule_expiry(self, expiry: int, seq: int) -> None:
        first = self._expiry.next_deadline()
        self._expiry.push(expiry, seq)
        if first is None or expiry < first or self._expiry_timer is None:
            self._arm_expiry()

    def _arm_expiry(self) -> None:
        if self._expiry_timer is not None:
            self._expiry_timer.cancel()
            self._expiry_timer = None
        deadline = self._expiry.next_deadline()
        if deadline is not None and not self.deleted:
            loop = asyncio.get_running_loop()
            self._expiry_timer = loop.call_later(max(0.0, (deadline - now_ms()) / 1000), self._expire_due)

    def _expire_due(self) -> None:
        """Mark every entry whose time is up as gone, wherever it is, and dead-letter it."""
        self._expiry_timer = None
        expired = []
        for seq in self._expiry.pop_due(now_ms()):
            entry = self._expiring.pop(seq, None)
            if entry is None:
                if self.paged and seq >= max(self.paged_from, self._drop_below):
                    entry = self._expire_paged(seq)
                    if entry is not None:
                        expired.append(entry)
                continue  # delivered or already expired
            entry.gone = True
            self.gone_in_ready += 1
            self.ready_bytes -= entry.message.body_size
            expired.append(entry)
        if expired:
            self._dead_letter(expired, "expired")
            if self.gone_in_ready > 1024 and self.gone_in_ready * 2 > len(self.ready):
                self._compact_ready()
                self.gone_in_ready = 0
        self._arm_expiry()

    def _expire_paged(self, seq: int) -> Entry | None:
        """An entry on disk whose time is up leaves the queue without coming into memory."""
        index, queue_id = self._page_index()
        row = index.get(queue_id, seq)
        if row is None:
            return None
        self._unpage(row.size)
        return self._paged_entry(row)

    def _dead_letter(self, entries: list[Entry], reason: str, persisted: bool = True) -> None:
        """Entries leave the queue for good: to the dead-letter exchange if one is set."""
        if self.args.dead_letter_exchange is not None and self.host is not None:
            for entry in entries:
                if entry.message.body is None:
                    self.host.load_body(entry.message)
            self.host.dead_letter(self, entries, reason)
        if persisted:
            for entry in entries:
                self._forget(entry)
