"""Queues: a queue and its components, its types, what shapes it and where its messages are kept.

``queue.Queue`` holds its ready entries (``ready_list.ReadyList``, paged by ``paging``; a priority queue's in
``priority_queue``), its consumers (``consumers``) and its per-message expiry (``expiry``).  ``queue_type.QueueType``
is what the node asks of a type; ``types.TYPES`` the registry of the types (classic, priority, quorum, stream).
``queue_args`` and ``policy`` check and apply what shapes a queue; ``persistence.Persistence`` keeps durable
messages (the message store, the queue index, group commit), what a type keeps apart its type's storage
(``priority_queue.RankedRows``, ``replica_store.ReplicaStore``).  A quorum queue's state is ``quorum_machine``'s; a
stream is a ``stream_queue.StreamQueue`` over the stream log (``stream_log``), a class of its own that composes the
consumers and stats it shares with ``queue.Queue``.
"""
