"""Why publishers are held, and who is held: one owner for blocking and unblocking.

A publishing connection is not read while any reason stands: an alarm (memory, disk) of this node or of
another node of its cluster (RabbitMQ's alarms hold the whole cluster's publishers), or a full link to another
node (back-pressure, as RabbitMQ's credit flow).  Each reason is set and cleared by whoever knows about it;
a publisher is released only when the last one is gone, so clearing the memory alarm does not let loose a
publisher that a full link still holds.  Alarms are told to clients that asked (``connection.blocked`` with
RabbitMQ's texts); flow is not, as in RabbitMQ.

Who is held: a publisher of AMQP 1.0 or the stream protocol from its first publishing link or publish on
(``publishing``); an AMQP 0-9-1 connection only once it publishes while a reason stands, until none is
left (``published``, rabbit_reader's ``publish_received``: a connection that published before an alarm, or
only consumes, is read through it, and the next alarm holds it only at its next publish).
"""
from __future__ import annotations

from typing import Callable, Protocol

LEADER_WAITS = 32  # publishes a connection may have waiting for a quorum queue's leader before it is read no more
# (``rabbit_fifo_client``'s soft limit of pending commands, past which RabbitMQ's credit flow blocks the channel)
MEMORY = "memory"
DISK = "disk"
RESOURCES = {MEMORY: "memory", DISK: "disk"}  # each alarm's word in ``connection.blocked``


def link(node: str) -> str:
    """The reason a full link to ``node`` holds publishers."""
    return f"link to {node}"


def alarm_on(resource: str, node: str) -> str:
    """The reason another node's ``resource`` (MEMORY, DISK) alarm holds this node's publishers."""
    return f"{resource} alarm on {node}"


class Publisher(Protocol):
    """A connection that has published: the flow holds and releases it."""

    def hold(self, alarm: str | None) -> None:
        """Stop reading; ``alarm`` is the text for ``connection.blocked``, None when only flow holds."""

    def release(self) -> None:
        """No reason is left: read again (and send ``connection.unblocked`` if blocked was sent)."""


class PublisherFlow:
    def __init__(self) -> None:
        self._reasons: dict[str, str | None] = {}  # each reason standing: its alarm's resource, None for flow
        self._publishers: set[Publisher] = set()
        self._published: set[Publisher] = set()  # publishers held until no reason is left
        self.recheck: Callable[[], object] = lambda: None  # the node's alarm check, for a large message

    @property
    def blocked(self) -> bool:
        return bool(self._reasons)

    @property
    def reasons(self) -> list[str]:
        return list(self._reasons)

    def alarmed(self, reason: str = MEMORY) -> bool:
        return reason in self._reasons

    def alarm(self) -> str | None:
        """The ``connection.blocked`` text of the alarms standing, if any: rabbit_reader's ``blocked_by_message``
        ("low on memory", "low on disk & memory": the order of its set)."""
        words = sorted({RESOURCES[resource] for resource in self._reasons.values() if resource is not None})
        return f"low on {' & '.join(words)}" if words else None

    def publishing(self, publisher: Publisher) -> None:
        """``publisher`` has a publishing link or sent a publish: from now on it is held whenever a reason stands
        (at once if one does)."""
        self._publishers.add(publisher)
        if self._reasons:
            publisher.hold(self.alarm())

    def published(self, publisher: Publisher) -> None:
        """``publisher`` sent a publish (or part of one): held at once if a reason stands, until none is left."""
        if self._reasons:
            self._published.add(publisher)
            publisher.hold(self.alarm())

    def gone(self, publisher: Publisher) -> None:
        self._publishers.discard(publisher)
        self._published.discard(publisher)

    def block(self, reason: str, resource: str | None = None) -> None:
        """``reason`` holds publishers: an alarm of ``resource`` (this node's MEMORY or DISK are their own), or
        flow (None)."""
        if reason in self._reasons:
            return
        self._reasons[reason] = resource if reason not in RESOURCES else reason
        self._tell()

    def unblock(self, reason: str) -> None:
        if reason in self._reasons:
            del self._reasons[reason]
            self._tell()

    def _tell(self) -> None:
        held = self._publishers | self._published
        if self._reasons:
            alarm = self.alarm()
            for publisher in held:
                publisher.hold(alarm)
            return
        self._published.clear()
        for publisher in held:
            publisher.release()
