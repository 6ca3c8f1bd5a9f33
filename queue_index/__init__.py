"""Per-queue ordered entries (seq → msg_id, expiry, size, delivered), acks, recovery of
order, the expiry structure that finds any expired entry on time, and the
schedule of messages held until a time (delayed exchanges).  Knows nothing of
message bodies or AMQP.

Offers :class:`QueueIndex`, :class:`IndexEntry`, :class:`IndexRows`, :class:`Totals`, :class:`ExpiryHeap`,
:class:`Schedule` and :class:`ScheduledEntry`.
"""
from .expiry_heap import ExpiryHeap
from .index import (FLAG_DELIVERED, FLAG_TRANSIENT, IndexEntry, IndexRows, QueueIndex, Totals, as_columns, as_rows,
                    open_reader, walk)
from .schedule import Schedule, ScheduledEntry

__all__ = ["FLAG_DELIVERED", "FLAG_TRANSIENT", "ExpiryHeap", "IndexEntry", "IndexRows", "QueueIndex", "Schedule",
           "ScheduledEntry", "Totals", "as_columns", "as_rows", "open_reader", "walk"]
