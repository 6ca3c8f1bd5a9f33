"""Per-queue ordered entries (seq → msg_id, expiry, size, delivered), acks, recovery of
order, and the expiry structure that finds any expired entry on time.  Knows
nothing of message bodies or AMQP.

Offers :class:`QueueIndex`, :class:`IndexEntry` and :class:`ExpiryHeap`.
"""
from .expiry import ExpiryHeap
from .index import IndexEntry, QueueIndex

__all__ = ["ExpiryHeap", "IndexEntry", "QueueIndex"]
