"""Cluster mode, a node whose definitions may be behind etcd's (before its first full read, or while its watch
is broken): a publish it routes nowhere is not confirmed and dropped on that view.  It waits until the view is
current and is routed again, or is nacked if the view stays stale (a queue declared a moment ago through another
node is missing here until then).  One node in-process, driven by aio-pika; the cluster's view is a stand-in
whose currency the test sets, and a definition made elsewhere is applied to the broker as the forwarder does."""
from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any, AsyncIterator

import aio_pika
import pytest
from pamqp import commands

from amqp_server.config import Config
from amqp_server.node.server import Node as Server
from conftest import free_port

pytestmark = pytest.mark.timeout(30)


class View:
    """The cluster as the broker asks it about its definitions' currency (``ClusterHooks.current``)."""

    def __init__(self, wait: float = 10.0) -> None:
        self.event = asyncio.Event()
        self.wait = wait
        self.waiting = 0

    @property
    def current(self) -> bool:
        return self.event.is_set()

    async def caught_up(self) -> bool:
        self.waiting += 1
        try:
            await asyncio.wait_for(self.event.wait(), self.wait)
        except asyncio.TimeoutError:
            return False
        return True

    def defined(self, kind: str, key: str, record: dict[str, Any]) -> None:
        pass  # (definitions are made here as the forwarder applies them: not echoed back)

    def undefined(self, kind: str, key: str) -> None:
        pass


@pytest.fixture
async def node(tmp_path: Path) -> AsyncIterator[tuple[Server, View]]:
    server = Server(Config(amqp_port=free_port(), mgmt_enabled=False, bind="127.0.0.1", data_dir=str(tmp_path)))
    await server.start()
    view = View()
    server.broker.cluster = view  # type: ignore[assignment]  # the stand-in answers what publishing asks
    try:
        yield server, view
    finally:
        server.stop()
        await server.run_until_stopped()


async def confirming(server: Server) -> tuple[aio_pika.abc.AbstractConnection, aio_pika.abc.AbstractChannel]:
    connection = await aio_pika.connect(host="127.0.0.1", port=server.config.amqp_port)
    return connection, await connection.channel(publisher_confirms=True)


async def test_a_publish_for_a_queue_missing_from_a_stale_view_waits_and_reaches_it(node):
    server, view = node
    connection, channel = await confirming(server)
    async with connection:
        publish = asyncio.ensure_future(channel.default_exchange.publish(
            aio_pika.Message(b"after declare-ok"), routing_key="declared-elsewhere", mandatory=False, timeout=10))
        await asyncio.sleep(0.3)
        assert not publish.done()  # neither confirmed nor dropped on the stale view
        assert view.waiting == 1
        vhost = server.broker.vhosts["/"]
        server.broker.declare_queue(vhost, "declared-elsewhere", durable=True)  # the watch brings it
        view.event.set()
        assert isinstance(await publish, commands.Basic.Ack)
        queue = await channel.get_queue("declared-elsewhere")
        message = await queue.get(no_ack=True, timeout=5)
        assert message.body == b"after declare-ok"
        # the connection goes on: a publish right after is routed and confirmed as usual
        await channel.default_exchange.publish(aio_pika.Message(b"next"), routing_key="declared-elsewhere",
                                               timeout=5)
        assert (await queue.get(no_ack=True, timeout=5)).body == b"next"


async def test_a_publish_routed_nowhere_while_the_view_stays_stale_is_nacked(node):
    server, view = node
    view.wait = 0.3
    connection, channel = await confirming(server)
    async with connection:
        with pytest.raises(aio_pika.exceptions.DeliveryError):
            await channel.default_exchange.publish(aio_pika.Message(b"x"), routing_key="unknown", mandatory=False,
                                                   timeout=10)
        view.event.set()  # current: routed nowhere is trusted, the publish confirmed (and dropped) at once
        await channel.default_exchange.publish(aio_pika.Message(b"y"), routing_key="unknown", mandatory=False,
                                               timeout=5)
        assert view.waiting == 1


async def test_a_publish_to_an_exchange_missing_from_a_stale_view_waits_for_it_and_its_binding(node):
    server, view = node
    connection, channel = await confirming(server)
    async with connection:
        underlay = await channel.get_underlay_channel()
        publish = asyncio.ensure_future(underlay.basic_publish(
            b"to a new exchange", exchange="made-elsewhere", routing_key="k", mandatory=False, timeout=10))
        await asyncio.sleep(0.3)
        assert not publish.done()  # no 404 on the stale view: the exchange may have been made elsewhere
        broker, vhost = server.broker, server.broker.vhosts["/"]
        broker.declare_exchange(vhost, "made-elsewhere", "direct", durable=True)
        broker.declare_queue(vhost, "bound-elsewhere", durable=True)
        broker.bind(vhost, "made-elsewhere", "queue", "bound-elsewhere", "k", {})
        view.event.set()
        await publish
        queue = await channel.get_queue("bound-elsewhere")
        assert (await queue.get(no_ack=True, timeout=5)).body == b"to a new exchange"


async def test_a_direct_reply_on_a_stale_view_is_delivered_once_and_confirmed_at_once(node):
    """A reply to a direct reply-to name is delivered as it is routed and routes to no queue: no definition can
    route it otherwise (no queue is named so), so a stale view does not hold it, route it again
    (a second delivery) or nack it; it is confirmed at once, as RabbitMQ confirms a publish routed to no queue."""
    server, view = node
    view.wait = 0.3
    connection, channel = await confirming(server)
    async with connection:
        requester = await connection.channel()
        replies: asyncio.Queue[bytes] = asyncio.Queue()
        reply_queue = await requester.get_queue("amq.rabbitmq.reply-to", ensure=False)

        async def on_reply(message: aio_pika.abc.AbstractIncomingMessage) -> None:
            replies.put_nowait(message.body)

        await reply_queue.consume(on_reply, no_ack=True)
        server.broker.declare_queue(server.broker.vhosts["/"], "requests")
        await requester.default_exchange.publish(aio_pika.Message(b"request", reply_to="amq.rabbitmq.reply-to"),
                                                 routing_key="requests")
        request = await (await channel.get_queue("requests")).get(no_ack=True, timeout=5)
        name = request.reply_to
        assert name is not None and name.startswith("amq.rabbitmq.reply-to.")
        confirm = await channel.default_exchange.publish(aio_pika.Message(b"reply"), routing_key=name,
                                                         mandatory=False, timeout=5)
        assert isinstance(confirm, commands.Basic.Ack)
        assert await asyncio.wait_for(replies.get(), 5) == b"reply"
        await asyncio.sleep(0.5)  # (a second delivery would come after the view's wait)
        assert replies.empty() and view.waiting == 0
