"""/api/federation-links: the federation links' status as RabbitMQ's rabbitmq_federation_management reports it
(the exchange or queue and its upstream one, type, vhost, upstream, id, status — starting, running with its
local connection, or error with the reason —, the upstream URI without credentials, node, timestamp), those not
running (``state/down``), and a link's restart on its node.  Monitoring or administrator users, limited to the
vhosts they may see, as in RabbitMQ; in a cluster each node reports the links it runs.
"""
from __future__ import annotations

from typing import Any

from aiohttp import web

from . import auth
from .context import ctx
from .http import no_content, not_found
from .link_status import LOCAL, gather, on_node
from .listing import respond

routes = web.RouteTableDef()
SORT = ("vhost", "exchange", "queue", "upstream")


async def _status(request: web.Request, down: bool = False) -> list[dict[str, Any]]:
    federation = ctx(request).broker.federation
    items = await gather(request, federation.status() if federation is not None else [], "/api/federation-links")
    return [item for item in items if not down or item.get("status") not in ("running", "starting")]


@routes.get("/api/federation-links")
async def list_all(request: web.Request) -> web.Response:
    auth.require_monitor(request)
    return respond(request, await _status(request), SORT)


@routes.get("/api/federation-links/state/down")
async def list_down(request: web.Request) -> web.Response:
    auth.require_monitor(request)
    return respond(request, await _status(request, down=True), SORT)


@routes.get("/api/federation-links/{vhost}")
async def list_vhost(request: web.Request) -> web.Response:
    auth.require_monitor(request)
    vhost = auth.require_vhost(request, visible=True)
    return respond(request, [i for i in await _status(request) if i["vhost"] == vhost], SORT)


@routes.get("/api/federation-links/{vhost}/state/down")
async def list_vhost_down(request: web.Request) -> web.Response:
    auth.require_monitor(request)
    vhost = auth.require_vhost(request, visible=True)
    return respond(request, [i for i in await _status(request, down=True) if i["vhost"] == vhost], SORT)


@routes.delete("/api/federation-links/vhost/{vhost}/{id}/{node}/restart")
async def restart(request: web.Request) -> web.StreamResponse:
    """Restart a link on its node (asked by its management API in a cluster, as RabbitMQ asks by RPC)."""
    auth.require_monitor(request)
    vhost = auth.require_vhost(request, visible=True)
    node = request.match_info["node"]
    context = ctx(request)
    federation = context.broker.federation
    if node == context.node:
        if federation is not None and await federation.restart(vhost, request.match_info["id"]):
            return no_content()
        raise not_found()
    if context.broker.cluster is not None and LOCAL not in request.query and node in context.broker.cluster.peers:
        return await on_node(request, node)
    raise not_found()
