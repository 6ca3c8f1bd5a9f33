"""POST /api/rebalance/queues: RabbitMQ's rabbit_mgmt_wm_rebalance_queues, which spawns
rabbit_amqqueue:rebalance(all, ".*", ".*") and answers 204 whatever it then moves.

RabbitMQ moves the leaders of replicated queues (quorum queues, mirrored classic queues) from nodes leading more
than their share to other members, with each queue type's ``transfer_leadership``.  Warren's classic queues have
one copy (nothing to move, as RabbitMQ skips unmirrored ones), and its quorum queues elect their leader through
etcd (``forwarder/quorum/groups.py``) with no transfer to a chosen member: on one node there is nothing to move
(every queue's share is there, as RabbitMQ finds), and in a cluster each leader stays where it is, which the
node's log says rather than the answer, as RabbitMQ's answer says nothing of what moved."""
from __future__ import annotations

import logging

from aiohttp import web

from amqp_server.logs import untrusted

from . import auth
from .context import ctx
from .http import no_content

routes = web.RouteTableDef()
log = logging.getLogger("warren.mgmt")


@routes.post("/api/rebalance/queues")
async def rebalance(request: web.Request) -> web.Response:
    """Administrators only; the body, of any type, is not read."""
    user = auth.require_admin(request)
    log.info("User %s has initiated a queue rebalance", untrusted(user.name))
    cluster = ctx(request).broker.cluster
    if cluster is not None and any(up for _name, up in cluster.nodes()):
        log.warning("queue rebalance: Warren transfers no quorum queue's leadership to a chosen member; "
                    "every leader stays on its node")
    else:
        log.info("queue rebalance: this node alone runs, and leads every queue: nothing to move")
    return no_content()


__all__ = ["routes"]
