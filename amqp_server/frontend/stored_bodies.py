"""Large stored bodies as the front ends send them (AMQP 0-9-1's deliveries and gets, AMQP 1.0's transfers): from
the store's file (or a stream's segment file), never read into the node (``framing.file_out``), and let go of once
sent for a settlement, so that neither a ready entry nor a delivery waiting for its ack holds a body its queue
stored (``message.RELEASE_FROM``)."""
from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

from ..framing.file_out import FileRange
from ..message import RELEASE_FROM, Message

if TYPE_CHECKING:
    from ..queues.persistence import Persistence
    from ..queues.queue import AnyQueue, Entry

# a stored body at least this large is sent from the store's file (``body_out``); a smaller one is held for its ack
# anyway, and goes from memory: a range of the file cost each delivery a descriptor (taken, closed) and the outbox's
# path, 64 KiB persistent-confirm 260 -> 230 us of broker CPU a message
SEND_FROM_FILE = RELEASE_FROM


class FileOutput(Protocol):
    """A connection whose output may hold ranges of files (``framing.file_out``): it is told when it does."""

    file_out: bool


def store_of(message: Message, queue: AnyQueue) -> Persistence | None:
    """The store that holds ``message``'s body for ``queue`` (a durable queue's persistent message, or any a
    quorum queue stored, whose record the queue holds a reference to while it holds the entry); None if no
    store does."""
    local = queue.local()  # (another node's delivered it without its body's reference here)
    if (message.msg_id and local is not None and local.persistence is not None
            and (message.persistent or local.persists_all)):
        return local.persistence
    return None


def release_body(entry: Entry, queue: AnyQueue) -> None:
    """A large body sent for manual ack is not held for the ack: the output holds it until it is written, and a
    requeue or a dead-lettering reads it back from the store, where the queue holds a reference for the entry,
    so that a consumer's prefetch of large messages does not keep as many bodies in memory.  Another node's
    queue (a proxy's entry) settles by the entry's tag there, its node holding the body: none is needed here."""
    if entry.message.body is not None and (queue.local() is None or store_of(entry.message, queue) is not None):
        entry.message = entry.message.without_body()


def forget_left(queue: AnyQueue, entry: Entry) -> None:
    """An entry taken without ack whose body ``Queue.took`` left in the store leaves its queue for good (and its
    store reference goes) once its delivery has the body's file."""
    local = queue.local()
    assert local is not None  # (a queue of this node took it)
    local.forget(entry)


def stored_range(message: Message, queue: AnyQueue) -> FileRange | None:
    """The body of ``message`` as a range of the store's file where it is stored, or of a stream's segment file
    where its entry left it (``LocalQueue.logged_body``; the range owns a descriptor: its user closes it), with
    the body's bytes if the node holds them; None if it is not in a file, its body then in memory (read now if
    ``Queue.took`` left it in the store)."""
    store = store_of(message, queue)
    local = queue.local()
    found = store.body_file(message) if store is not None else local.logged_body(message) if local else None
    if found is None:
        if message.body is None:  # (left in the store for the file by ``Queue.took``, and not there after all)
            assert local is not None and local.host is not None  # (a queue of this node took it)
            local.host.load_body(message)
        return None
    return FileRange(found[0], found[1], message.body_size, owns=True, data=message.body, loan=found[2])


def body_out(connection: FileOutput, message: Message, queue: AnyQueue) -> bytes | FileRange:
    """A large body as a delivery sends it: from the store's file where it is stored (``sendfile``: the output
    does not hold the body, so neither does a delivery waiting for its ack), else from memory.  A stored body
    still in memory goes with the range: what the socket takes at once is written from it (``framing.file_out``)."""
    found = stored_range(message, queue)
    if found is None:
        return message.body
    connection.file_out = True
    return found


def body_head(message: Message, queue: AnyQueue, size: int | None = None) -> bytes:
    """The body's first ``size`` bytes (all of it by default) for a reader that needs them in memory (the HTTP
    API's get, ``truncate``): a body ``Queue.took`` left in the store is read from its file (counted as the
    store's reads), or from a stream's, that much only, and not kept by the message."""
    if message.body is None:
        store = store_of(message, queue)
        if store is not None and (head := store.body_head(message, size)) is not None:
            return head
        if (found := stored_range(message, queue)) is not None:
            try:
                return found.read(size)
            finally:
                found.close()
    return message.body if size is None else message.body[:size]
