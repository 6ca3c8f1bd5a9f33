"""The shared message store: append-only segment files of CRC'd records, a
msg_id → (segment, offset, size, refcount) index, a read cache, delayed
deletion and compaction.  It stores opaque payloads and knows nothing of AMQP
or of queues' order.

Offers :class:`MessageStore` and :class:`StoreStats`.
"""
from .store import DEFAULT_CACHE_BYTES, DEFAULT_SEGMENT_SIZE, MessageStore, StoreStats

__all__ = ["DEFAULT_CACHE_BYTES", "DEFAULT_SEGMENT_SIZE", "MessageStore", "StoreStats"]
