"""RabbitMQ 3.x's v1 addresses that declare (rabbit_amqp_session's ``ensure_terminus``): ``/queue/:queue``, as a
source or a target, declares the queue it names; the sources ``/exchange/:exchange[/:key]`` and ``/topic/:key``
declare a server-named queue and bind it there.  As RabbitMQ 4.x does, a queue that exists is taken as it is (no
equivalence check), and a new one is a classic queue, durable if the terminus asks for configuration or
unsettled-state durability, neither exclusive nor auto-deleted.  Each step is the broker operation the 0-9-1 channel
calls, with its permission check; in cluster mode the cluster agrees on the queue first, and the link attaches once
etcd has the binding."""
from __future__ import annotations

from typing import TYPE_CHECKING

from .. import errors

if TYPE_CHECKING:
    from .host import SessionHost


async def declare(connection: SessionHost, queue: str, durable: bool, exchange: str | None = None,
                  binding_key: str = "") -> None:
    broker, vhost, who = connection.broker, connection.vhost, connection.principal
    assert vhost is not None
    if exchange is not None and exchange not in vhost.exchanges:
        raise errors.not_found(f"no exchange '{exchange}' in vhost '{vhost.name}'")
    if who is not None:
        who.check("configure", "queue", vhost.name, queue)
    await broker.find_queue(vhost, queue)
    if queue not in vhost.queues:
        async with broker.declaring(vhost, queue, durable, who=who):
            broker.declare_queue(vhost, queue, durable=durable, owner=connection, server_named=exchange is not None,
                                 who=who)
    if exchange is not None:
        broker.bind(vhost, exchange, "queue", queue, binding_key, None, connection, who)
        await broker.agreed()
