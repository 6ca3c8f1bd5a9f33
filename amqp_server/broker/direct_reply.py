"""Direct reply-to (RabbitMQ's ``amq.rabbitmq.reply-to``): RPC replies go straight to the requesting channel.

A client consumes (no-ack) from the pseudo-queue ``amq.rabbitmq.reply-to`` and publishes requests with
``reply_to=amq.rabbitmq.reply-to``; the broker rewrites that to ``amq.rabbitmq.reply-to.<token>``, a name
only this channel's consumer answers to.  A reply published to the default exchange with that routing key
is delivered to the consumer at once, never queued: routing sees the consumer as a destination that, like
a queue, has a ``name`` and takes ``enqueue(message)``.
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

    __slots__ = ("name", "tag", "channel", "prefix")

    def __init__(self, name: str, tag: str, channel: "ReplyTarget[ReplyConsumer, Message]", prefix: bytes) -> None:
        self.name = name  # amq.rabbitmq.reply-to.<token>: the reply_to requests carry
        self.tag = tag
        self.channel = channel
        self.prefix = prefix  # encoded Basic.Deliver class/method + consumer tag

    def enqueue(self, message: Message, confirm: "ConfirmSink | None" = None) -> bool:
        """A reply goes straight to the consumer's channel (confirmed at once: it is never stored)."""
        self.channel.deliver_reply(self, message)
        return True


class ReplyConsumers:
    """Every channel's reply consumer, by its reply-to name."""

    def __init__(self) -> None:
        self._by_name: dict[str, ReplyConsumer] = {}

    def add(self, channel: "ReplyTarget[ReplyConsumer, Message]", tag: str, prefix: bytes) -> ReplyConsumer:
        token = base64.urlsafe_b64encode(os.urandom(18)).decode()
        consumer = self._by_name[PREFIX + token] = ReplyConsumer(PREFIX + token, tag, channel, prefix)
        return consumer

    def remove(self, consumer: ReplyConsumer) -> None:
        self._by_name.pop(consumer.name, None)

    def get(self, name: str) -> ReplyConsumer | None:
        return self._by_name.get(name)

    def route(self, routing_key: str) -> tuple[ReplyConsumer, ...]:
        """Where a default-exchange publish that found no queue goes: the reply consumer named, if it exists."""
        consumer = self._by_name.get(routing_key) if routing_key.startswith(PREFIX) else None
        return (consumer,) if consumer is not None else ()


def with_reply_to(message: Message, reply_to: str) -> Message:
    """The message with its reply_to property replaced on the bytes (every other property stays as sent)."""
    header = properties.replace(message.header, codec.FLAG_REPLY_TO, codec.shortstr(reply_to))
    return Message(message.exchange, message.routing_key, message.route, header, message.body)
