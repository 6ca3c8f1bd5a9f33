"""Vhost limits (``max-connections``, ``max-queues``) and user limits (``max-connections``, ``max-channels``), as
RabbitMQ's: the values are definitions (``AccessControl`` stores them); this module checks them, against the
node's open connections it counts here.  A negative value means no limit, 0 allows none."""
from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

from .. import errors
from ..errors import ConnectionError

if TYPE_CHECKING:
    from ..access_control import AccessControl

VHOST_LIMITS = ("max-connections", "max-queues")
USER_LIMITS = ("max-connections", "max-channels")


class LimitedConnection(Protocol):
    """An open client connection, as limits count it."""

    channels: dict


def reached(limit: int | None, count: int) -> bool:
    return limit is not None and 0 <= limit <= count


class Limits:
    """The node's open connections by vhost and by user, and the checks a new connection, channel or queue passes."""

    def __init__(self, access: "AccessControl") -> None:
        self.access = access
        self._by_vhost: dict[str, set[LimitedConnection]] = {}
        self._by_user: dict[str, set[LimitedConnection]] = {}

    def open_connection(self, connection: LimitedConnection, vhost: str, user: str) -> None:
        """connection.open: refused (530) over the vhost's, then the user's ``max-connections``; else counted."""
        self.check_connection(vhost, user)
        self._by_vhost.setdefault(vhost, set()).add(connection)
        self._by_user.setdefault(user, set()).add(connection)

    def check_connection(self, vhost: str, user: str) -> None:
        """``open_connection``'s refusals alone: AMQP 0-9-1 checks them before the vhost permission, as
        rabbit_reader does (a user refused both is told of the limit)."""
        limit = self.access.vhost_limits(vhost).get("max-connections")
        if reached(limit, len(self._by_vhost.get(vhost, ()))):
            raise ConnectionError(errors.NOT_ALLOWED, f"access to vhost '{vhost}' refused for user '{user}': "
                                                      f"connection limit ({limit}) is reached")
        limit = self.access.user_limits(user).get("max-connections")
        if reached(limit, len(self._by_user.get(user, ()))):
            raise ConnectionError(errors.NOT_ALLOWED, f"connection refused for user '{user}': "
                                                      f"user connection limit ({limit}) is reached")

    def close_connection(self, connection: LimitedConnection, vhost: str, user: str) -> None:
        for counted, key in ((self._by_vhost, vhost), (self._by_user, user)):
            connections = counted.get(key)
            if connections is not None:
                connections.discard(connection)
                if not connections:
                    del counted[key]

    def open_channel(self, user: str) -> None:
        """channel.open: refused (530) once the user's connections hold ``max-channels`` channels."""
        limit = self.access.user_limits(user).get("max-channels")
        if limit is not None and reached(limit, sum(len(c.channels) for c in self._by_user.get(user, ()))):
            raise ConnectionError(errors.NOT_ALLOWED, f"number of channels opened for user '{user}' has reached "
                                                      f"the maximum allowed user limit of ({limit})")

    def new_queue(self, vhost: str, queues: int, name: str) -> None:
        """A queue not yet there is declared (by a client): refused (406) once the vhost has ``max-queues``."""
        exceeded = self.would_exceed_queue_limit(vhost, 1, queues)
        if exceeded is not None:
            raise errors.QueueLimitReached(f"cannot declare queue '{name}': queue limit in vhost '{vhost}' "
                                           f"({exceeded[0]}) is reached")

    def would_exceed_queue_limit(self, vhost: str, adding: int, queues: int) -> tuple[int, int] | None:
        """Whether ``adding`` queues to the vhost's ``queues`` would pass its ``max-queues``: its limit and the
        count, as rabbit_vhost_limit:would_exceed_queue_limit/2 answers (a limit of 0 with a count of 0)."""
        limit = self.access.vhost_limits(vhost).get("max-queues")
        if limit == 0:
            return 0, 0
        if limit is not None and limit > 0 and queues + adding > limit:
            return limit, queues
        return None
