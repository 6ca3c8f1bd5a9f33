"""Direct reply-to (RabbitMQ's ``amq.rabbitmq.reply-to``): RPC replies go straight to the requesting channel.

A client consumes (no-ack) from the pseudo-queue ``amq.rabbitmq.reply-to`` and publishes requests with
``reply_to=amq.rabbitmq.reply-to``; the broker rewrites that to ``amq.rabbitmq.reply-to.<token>``, a name
only this channel's consumer answers to.  A reply published to the default exchange with that routing key
is delivered to the consumer at once, never queued.  An AMQP 0-9-1 consumer's reply is delivered by routing
itself and routes to no queue, as RabbitMQ 3.10's rabbit_exchange:route/2 hands it to
rabbit_channel:deliver_reply/2 and answers no queue name: a mandatory reply is delivered and also returned
(312 NO_ROUTE).  An AMQP 1.0 link's (RabbitMQ 4.2's volatile queue) is a destination that, like a queue, has a
``name`` and takes ``enqueue(message)``.
"""
from __future__ import annotations

import base64
import os
from typing import TYPE_CHECKING

from ..framing import codec, properties
from ..message import Message

if TYPE_CHECKING:
    from ..ports import ConfirmSink, ReplyTarget

PSEUDO_QUEUE = "amq.rabbitmq.reply-to"
PREFIX = PSEUDO_QUEUE + "."


class ReplyConsumer:
    """One channel's consumer on ``amq.rabbitmq.reply-to``."""

    __slots__ = ("name", "tag", "channel", "prefix", "volatile_queue")

    def __init__(self, name: str, tag: str, channel: "ReplyTarget[ReplyConsumer, Message]", prefix: bytes,
                 volatile_queue: bool = False) -> None:
        self.name = name  # amq.rabbitmq.reply-to.<token>: the reply_to requests carry
        self.tag = tag
        self.channel = channel
        self.prefix = prefix  # encoded Basic.Deliver class/method + consumer tag
        self.volatile_queue = volatile_queue  # routed to as a queue (an AMQP 1.0 link's), not beside routing

    def enqueue(self, message: Message, confirm: "ConfirmSink | None" = None) -> bool:
        """A reply goes straight to the consumer's channel (confirmed at once: it is never stored)."""
        self.channel.deliver_reply(self, message)
        return True


class ReplyConsumers:
    """Every channel's reply consumer, by its reply-to name."""

    def __init__(self) -> None:
        self._by_name: dict[str, ReplyConsumer] = {}

    def add(self, channel: "ReplyTarget[ReplyConsumer, Message]", tag: str, prefix: bytes,
            volatile_queue: bool = False) -> ReplyConsumer:
        """A new reply consumer: an AMQP 1.0 link's is a ``volatile_queue``, a 0-9-1 channel's is not."""
        token = base64.urlsafe_b64encode(os.urandom(18)).decode()
        consumer = self._by_name[PREFIX + token] = ReplyConsumer(PREFIX + token, tag, channel, prefix, volatile_queue)
        return consumer

    def remove(self, consumer: ReplyConsumer) -> None:
        self._by_name.pop(consumer.name, None)

    def get(self, name: str) -> ReplyConsumer | None:
        return self._by_name.get(name)

    def route(self, routing_key: str, message: Message) -> tuple[ReplyConsumer, ...]:
        """Where a default-exchange publish that found no queue goes: the reply consumer named, if it exists and
        is a volatile queue; a 0-9-1 one gets the message here, and it routes to no queue."""
        consumer = self._by_name.get(routing_key) if routing_key.startswith(PREFIX) else None
        if consumer is None:
            return ()
        if consumer.volatile_queue:
            return (consumer,)
        consumer.enqueue(message)
        return ()


def with_reply_to(message: Message, reply_to: str) -> Message:
    """The message with its reply_to property replaced on the bytes (every other property stays as sent)."""
    header = properties.replace(message.header, codec.FLAG_REPLY_TO, codec.shortstr(reply_to))
    return Message(message.exchange, message.routing_key, message.route, header, message.body)
