"""Paging under memory pressure: bodies of messages deep in long queues leave memory.

A persistent message already in the persistent store just drops its body; a
transient one is written to the transient store first (wiped at every start).
Bodies come back on demand when a message nears delivery.  A transient store
record lives exactly as long as its message object: a finalizer removes it.
"""
from __future__ import annotations

import itertools
import logging
import os
import weakref
from typing import TYPE_CHECKING, Iterable

from msg_store import MessageStore

from .message import Message

if TYPE_CHECKING:
    from .persistence import Persistence
    from .queue import Queue

log = logging.getLogger("warren.paging")

KEEP_IN_MEMORY = 2048  # entries at each queue's head that keep their bodies
TRANSIENT_CACHE = 8 * 1024 * 1024


class Pager:
    def __init__(self, data_dir: str, segment_size: int, persistence: "Persistence") -> None:
        self.store = MessageStore(os.path.join(data_dir, "msg_store_transient"), segment_size, TRANSIENT_CACHE,
                                  wipe=True)
        self.store.start()
        self.persistence = persistence
        self.paged_out = 0

    def load_body(self, message: Message) -> None:
        if message.msg_id:
            self.persistence.load_body(message)
        else:
            message.body = self.store.read(message.transient_id)

    def page_out(self, queues: Iterable["Queue"], keep: int = KEEP_IN_MEMORY) -> int:
        """Drop the bodies of entries beyond the first ``keep`` of each queue; returns bytes freed."""
        freed = 0
        store = self.store
        for queue in sorted(queues, key=lambda q: q.ready_bytes, reverse=True):
            for entry in itertools.islice(queue.ready, keep, None):
                message = entry.message
                if entry.gone or message.body is None:
                    continue
                if not message.msg_id:
                    if not message.transient_id:
                        message.transient_id = store.new_id()
                        store.write(message.transient_id, (message.body,), 1)
                        weakref.finalize(message, store.remove, message.transient_id)
                freed += message.body_size
                message.body = None
        store.flush()
        self.paged_out += freed
        if freed:
            log.info("paged out %d bytes of message bodies", freed)
        return freed

    def housekeeping(self) -> None:
        if self.store.needs_compaction:
            self.store.compact_step()

    def close(self) -> None:
        self.store.close()
