"""Direct reply-to (RabbitMQ's ``amq.rabbitmq.reply-to``): RPC replies go straight to the requesting channel.

A client consumes (no-ack) from the pseudo-queue ``amq.rabbitmq.reply-to`` and publishes requests with
``reply_to=amq.rabbitmq.reply-to``; the broker rewrites that to ``amq.rabbitmq.reply-to.<token>``, a name
only this channel's consumer answers to.  A reply published to the default exchange with that routing key
is delivered to the consumer at once, never queued.  An AMQP 0-9-1 consumer's reply is delivered by routing
itself and routes to no queue, as RabbitMQ 3.10's rabbit_exchange:route/2 hands it to
rabbit_channel:deliver_reply/2 and answers no queue name: a mandatory reply is delivered and also returned
(312 NO_ROUTE).  An AMQP 1.0 link's (RabbitMQ 4.2's volatile queue) is a destination that, like a queue, has a
``name`` and takes ``enqueue(message)``.

In a cluster a reply may be published through any node, as RabbitMQ's reply name carries the requesting channel's
pid (rabbit_direct_reply_to:compute_key_and_suffix_v2, its node a hash) and rabbit_channel:deliver_reply/2 on any
node hands the reply to that channel.  Here the name is ``amq.rabbitmq.reply-to.<node tag>.<token>``: the tag, a
digest of the consumer's node and kind, says where the reply goes (over the link, ``ReplyNode``), and the node
hands it to the consumer the whole name is registered under, as a reply published there is.  The token alone
finds a consumer, so a client that makes up a name reaches none (its publish is dropped, as one to a gone
consumer).  On a single node the name stays ``amq.rabbitmq.reply-to.<token>``.
"""
from __future__ import annotations

import base64
import hashlib
import os
from typing import TYPE_CHECKING, Coroutine, Mapping

from ..framing import codec, properties
from ..message import Message

if TYPE_CHECKING:
    from ..ports import ConfirmSink, ReplyNode, ReplyTarget

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


class NodeReply:
    """Another node's reply consumer, as a reply routed here goes to it: over the link, to its node."""

    __slots__ = ("name", "node", "volatile_queue")

    def __init__(self, name: str, node: "ReplyNode[Message]", volatile_queue: bool) -> None:
        self.name = name
        self.node = node
        self.volatile_queue = volatile_queue

    def enqueue(self, message: Message, confirm: "ConfirmSink | None" = None) -> bool:
        """Sent, confirmed at once (as rabbit_channel:deliver_reply/2 casts it and routes to no queue)."""
        self.node.send_reply(self.name, message)
        return True


def _node_tag(node: str, volatile_queue: bool) -> str:
    """The part of a reply name that says which node's consumer it is, and of which kind: a digest, opaque to
    clients (RabbitMQ's name carries a hash of its node too)."""
    digest = hashlib.sha256(b"%d\0%s" % (volatile_queue, node.encode())).digest()
    return base64.urlsafe_b64encode(digest[:9]).decode()


class ReplyConsumers:
    """Every channel's reply consumer, by its reply-to name."""

    def __init__(self) -> None:
        self._by_name: dict[str, ReplyConsumer] = {}
        self._tags = ("", "")  # this node's tags (cluster mode): a 0-9-1 channel's, a volatile queue's
        self._nodes: Mapping[str, ReplyNode[Message]] | None = None  # the other nodes, by name (cluster mode)
        self._node_tags: dict[str, tuple[str, bool]] = {}  # their tags: (node, volatile queue)
        self._tagged: set[str] = set()  # the nodes ``_node_tags`` was made of

    def clustered(self, node: str, nodes: "Mapping[str, ReplyNode[Message]]") -> None:
        """Cluster mode: names tell this node, ``node``; a name another node's tag begins goes there (``nodes``,
        which the cluster keeps up to date)."""
        self._tags = (_node_tag(node, False) + ".", _node_tag(node, True) + ".")
        self._nodes = nodes

    def add(self, channel: "ReplyTarget[ReplyConsumer, Message]", tag: str, prefix: bytes,
            volatile_queue: bool = False) -> ReplyConsumer:
        """A new reply consumer: an AMQP 1.0 link's is a ``volatile_queue``, a 0-9-1 channel's is not."""
        name = PREFIX + self._tags[volatile_queue] + base64.urlsafe_b64encode(os.urandom(18)).decode()
        consumer = self._by_name[name] = ReplyConsumer(name, tag, channel, prefix, volatile_queue)
        return consumer

    def remove(self, consumer: ReplyConsumer) -> None:
        self._by_name.pop(consumer.name, None)

    def get(self, name: str) -> ReplyConsumer | None:
        return self._by_name.get(name)

    def route(self, routing_key: str, message: Message) -> "tuple[ReplyConsumer | NodeReply, ...]":
        """Where a default-exchange publish that found no queue goes: the reply consumer named (here or on
        another node), if it exists and is a volatile queue; a 0-9-1 one gets the message here, and it routes
        to no queue."""
        if not routing_key.startswith(PREFIX):
            return ()
        consumer = self._by_name.get(routing_key) or self._elsewhere(routing_key)
        if consumer is None:
            return ()
        if consumer.volatile_queue:
            return (consumer,)
        consumer.enqueue(message)
        return ()

    def deliver(self, name: str, message: Message) -> None:
        """A reply another node routed to this node's consumer ``name``: handed to it as one routed here is (to a
        consumer gone meanwhile, or a name made up: dropped)."""
        consumer = self._by_name.get(name)
        if consumer is not None:
            consumer.enqueue(message)

    def known(self, name: str) -> bool:
        """A consumer of this node's is named, or the name's tag is another node's, which answers for it."""
        return name.startswith(PREFIX) and (name in self._by_name or self._elsewhere(name) is not None)

    def found_elsewhere(self, name: str) -> "Coroutine[None, None, bool] | None":
        """Whether another node's consumer is named (a passive queue.declare, as rabbit_channel's
        declare_fast_reply_to asks the channel wherever it is); None if the name is no other node's."""
        consumer = self._elsewhere(name) if name.startswith(PREFIX) else None
        return None if consumer is None else consumer.node.has_reply_consumer(name)

    def _elsewhere(self, name: str) -> NodeReply | None:
        """The other node a reply name's tag names, as the destination of a reply to it."""
        nodes = self._nodes
        if nodes is None:
            return None
        tag, dot, _ = name[len(PREFIX):].partition(".")
        found = self._node_tags.get(tag) if dot else None
        if found is None and dot and self._tagged != nodes.keys():  # (a node joined or left since)
            self._tagged = set(nodes)
            self._node_tags = {_node_tag(node, volatile): (node, volatile)
                               for node in self._tagged for volatile in (False, True)}
            found = self._node_tags.get(tag)
        node = nodes.get(found[0]) if found is not None else None
        return None if node is None or found is None else NodeReply(name, node, found[1])


def is_reply(exchange: str, routing_key: str) -> bool:
    """A publish to a reply name: delivered (or dropped) as it is routed, whatever the definitions say (no queue
    is named so: a client may name none ``amq.*``, the server names its ``amq.gen-…``), so a view of them that may
    be behind the cluster's neither holds it nor routes it again."""
    return exchange == "" and routing_key.startswith(PREFIX)


def with_reply_to(message: Message, reply_to: str) -> Message:
    """The message with its reply_to property replaced on the bytes (every other property stays as sent)."""
    header = properties.replace(message.header, codec.FLAG_REPLY_TO, codec.shortstr(reply_to))
    return Message(message.exchange, message.routing_key, message.route, header, message.body)
