"""Message counters kept where the work happens (channel, queue, vhost), read by the management plugin.

Field names are RabbitMQ's ``message_stats`` keys; rates are derived from
successive samples of these counters, never by scanning queues.
"""
from __future__ import annotations


class MessageStats:
    __slots__ = ("publish", "deliver", "deliver_no_ack", "get", "get_no_ack", "get_empty", "ack", "redeliver",
                 "confirm", "return_unroutable", "drop_unroutable")
    publish: int
    deliver: int
    deliver_no_ack: int
    get: int
    get_no_ack: int
    get_empty: int
    ack: int
    redeliver: int
    confirm: int
    return_unroutable: int
    drop_unroutable: int

    def __init__(self) -> None:
        for name in self.__slots__:
            setattr(self, name, 0)

    @property
    def deliver_get(self) -> int:
        return self.deliver + self.deliver_no_ack + self.get + self.get_no_ack

    def as_dict(self) -> dict[str, int]:
        values = {name: getattr(self, name) for name in self.__slots__}
        values["deliver_get"] = self.deliver_get
        return values

    def add(self, other: MessageStats) -> None:
        for name in self.__slots__:
            setattr(self, name, getattr(self, name) + getattr(other, name))


class ChurnStats:
    """How many connections, channels and queues came and went: RabbitMQ's ``churn_rates`` counters."""

    __slots__ = ("connection_created", "connection_closed", "channel_created", "channel_closed", "queue_declared",
                 "queue_created", "queue_deleted")
    connection_created: int
    connection_closed: int
    channel_created: int
    channel_closed: int
    queue_declared: int
    queue_created: int
    queue_deleted: int

    def __init__(self) -> None:
        for name in self.__slots__:
            setattr(self, name, 0)

    def as_dict(self) -> dict[str, int]:
        return {name: getattr(self, name) for name in self.__slots__}
