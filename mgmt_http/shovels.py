"""/api/shovels: the dynamic shovels' status as RabbitMQ's rabbitmq_shovel_management reports it (name, vhost,
type, state — starting, running, or terminated with a reason —, the URIs without credentials, node, timestamp),
and their restart.  Monitoring or administrator users, limited to the vhosts they may see, as in RabbitMQ.

In a cluster each node reports the shovels it runs; a node asked gathers the others' answers (their management
APIs, with the caller's credentials) as RabbitMQ gathers every node's by RPC.
"""
from __future__ import annotations

import asyncio
from typing import Any

import aiohttp
from aiohttp import web

from . import auth
from .context import Context, ctx
from .forward import KEY as FORWARDER, forward
from .http import no_content, not_found
from .listing import respond

routes = web.RouteTableDef()
LOCAL = "warren_local"  # query flag: this node's shovels only (what a node asks the others)
PEER_TIMEOUT = 5.0


def _local(context: Context) -> list[dict[str, Any]]:
    shovels = context.broker.shovels
    return shovels.status() if shovels is not None else []


async def _peer(request: web.Request, address: tuple[str, int]) -> list[dict[str, Any]]:
    session = request.app[FORWARDER].session()
    headers = {"Authorization": request.headers.get("Authorization", "")}
    url = f"http://{address[0]}:{address[1]}/api/shovels?{LOCAL}=true"
    try:
        async with session.get(url, headers=headers, timeout=aiohttp.ClientTimeout(total=PEER_TIMEOUT)) as answer:
            if answer.status != 200:
                return []
            items = await answer.json()
    except (aiohttp.ClientError, asyncio.TimeoutError, ValueError):
        return []  # a node that does not answer shows none (RabbitMQ: a badrpc shows none)
    return [item for item in items if isinstance(item, dict)] if isinstance(items, list) else []


async def _status(request: web.Request) -> list[dict[str, Any]]:
    context = ctx(request)
    items = _local(context)
    cluster = context.broker.cluster
    if cluster is not None and LOCAL not in request.query:
        addresses = [peer.http for name, peer in cluster.peers.items() if dict(cluster.nodes()).get(name)]
        for found in await asyncio.gather(*(_peer(request, a) for a in addresses if a is not None)):
            items += found
    visible = set(auth.visible_vhosts(request))
    return [item for item in items if item.get("vhost") in visible]


@routes.get("/api/shovels")
async def list_all(request: web.Request) -> web.Response:
    auth.require_monitor(request)
    return respond(request, await _status(request), ("vhost", "name"))


@routes.get("/api/shovels/{vhost}")
async def list_vhost(request: web.Request) -> web.Response:
    auth.require_monitor(request)
    vhost = auth.require_vhost(request)
    return respond(request, [i for i in await _status(request) if i["vhost"] == vhost], ("name",))


@routes.delete("/api/shovels/vhost/{vhost}/{name}/restart")
async def restart(request: web.Request) -> web.StreamResponse:
    """Restart a shovel here, or (cluster) ask the node running it, as RabbitMQ does by RPC."""
    auth.require_monitor(request)
    vhost = auth.require_vhost(request)
    name = request.match_info["name"]
    context = ctx(request)
    shovels = context.broker.shovels
    if shovels is not None and await shovels.restart(vhost, name):
        return no_content()
    if context.broker.cluster is not None and LOCAL not in request.query:
        for item in await _status(request):
            if item.get("vhost") == vhost and item.get("name") == name and item.get("node") != context.node:
                request = request.clone(rel_url=request.rel_url.update_query({LOCAL: "true"}))
                return await forward(request, item["node"])
    raise not_found()
