"""Why publishers are held, and who is held: one owner for blocking and unblocking.

A publishing connection is not read while any reason stands: an alarm of the node (memory, disk) or a
full link to another node (back-pressure, as RabbitMQ's credit flow).  Each reason is set and cleared by
whoever knows about it; a publisher is released only when the last one is gone, so clearing the memory
alarm does not let loose a publisher that a full link still holds.  Alarms are told to clients that
asked (``connection.blocked`` with RabbitMQ's texts); flow is not, as in RabbitMQ.
"""
from __future__ import annotations

from typing import Callable, Protocol

LEADER_WAITS = 32  # publishes a connection may have waiting for a quorum queue's leader before it is read no more
# (``rabbit_fifo_client``'s soft limit of pending commands, past which RabbitMQ's credit flow blocks the channel)
MEMORY = "memory"
DISK = "disk"
ALARM_TEXTS = {MEMORY: "low on memory", DISK: "low on disk space"}


def link(node: str) -> str:
    """The reason a full link to ``node`` holds publishers."""
    return f"link to {node}"


class Publisher(Protocol):
    """A connection that has published: the flow holds and releases it."""

    def hold(self, alarm: str | None) -> None:
        """Stop reading; ``alarm`` is the text for ``connection.blocked``, None when only flow holds."""

    def release(self) -> None:
        """No reason is left: read again (and send ``connection.unblocked`` if blocked was sent)."""


class PublisherFlow:
    def __init__(self) -> None:
        self._reasons: dict[str, None] = {}  # insertion-ordered set: the first alarm names connection.blocked
        self._publishers: set[Publisher] = set()
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
        """The ``connection.blocked`` text of the first alarm standing, if any."""
        for reason in self._reasons:
            text = ALARM_TEXTS.get(reason)
            if text is not None:
                return text
        return None

    def publishing(self, publisher: Publisher) -> None:
        """``publisher`` has sent a publish: from now on it is held whenever a reason stands (at once if one does)."""
        self._publishers.add(publisher)
        if self._reasons:
            publisher.hold(self.alarm())

    def gone(self, publisher: Publisher) -> None:
        self._publishers.discard(publisher)

    def block(self, reason: str) -> None:
        if reason in self._reasons:
            return
        self._reasons[reason] = None
        self._tell()

    def unblock(self, reason: str) -> None:
        if self._reasons.pop(reason, 0) is None:
            self._tell()

    def _tell(self) -> None:
        alarm = self.alarm()
        for publisher in list(self._publishers):
            if self._reasons:
                publisher.hold(alarm)
            else:
                publisher.release()
