"""/api/shovels: the dynamic shovels' status as RabbitMQ's rabbitmq_shovel_management reports it (name, vhost,
type, state — starting, running, or terminated with a reason —, the URIs without credentials, node, timestamp),
and their restart.  Monitoring or administrator users, limited to the vhosts they may see, as in RabbitMQ.

In a cluster each node reports the shovels it runs; a node asked gathers the others' answers (their management
APIs, with the caller's credentials) as RabbitMQ gathers every node's by RPC.
"""
from __future__ import annotations

from typing import Any

from aiohttp import web

from . import auth
from .context import Context, ctx
from .http import no_content, not_found
from .link_status import LOCAL, gather, on_node
from .listing import respond

routes = web.RouteTableDef()


def _local(context: Context) -> list[dict[str, Any]]:
    shovels = context.broker.shovels
    return shovels.status() if shovels is not None else []


async def _status(request: web.Request) -> list[dict[str, Any]]:
    return await gather(request, _local(ctx(request)), "/api/shovels")


@routes.get("/api/shovels")
async def list_all(request: web.Request) -> web.Response:
    auth.require_monitor(request)
    return respond(request, await _status(request), ("vhost", "name"))


@routes.get("/api/shovels/{vhost}")
async def list_vhost(request: web.Request) -> web.Response:
    auth.require_monitor(request)
    vhost = auth.require_vhost(request, visible=True)
    return respond(request, [i for i in await _status(request) if i["vhost"] == vhost], ("name",))


async def _named(request: web.Request) -> tuple[str, list[dict[str, Any]]]:
    """The path's vhost and its shovels; 404 unless the named one is among them (RabbitMQ's resource_exists)."""
    auth.require_monitor(request)
    vhost = auth.require_vhost(request, visible=True)
    shovels = [i for i in await _status(request) if i["vhost"] == vhost]
    if not any(i["name"] == request.match_info["name"] for i in shovels):
        raise not_found()
    return vhost, shovels


@routes.get("/api/shovels/vhost/{vhost}/{name}/restart")  # the same resource in rabbit_shovel_mgmt
@routes.get("/api/shovels/vhost/{vhost}/{name}")
async def show(request: web.Request) -> web.Response:
    """RabbitMQ answers with every shovel of the vhost here, the named one among them (its to_json filters by
    vhost only)."""
    return respond(request, (await _named(request))[1], ("vhost", "name"))


@routes.delete("/api/shovels/vhost/{vhost}/{name}")
async def delete(request: web.Request) -> web.Response:
    """Delete the shovel: its runtime parameter goes (rabbit_shovel_util:delete_shovel), and with it the shovel on
    whichever node runs it.  RabbitMQ lets monitoring users do this too."""
    vhost, _shovels = await _named(request)
    context = ctx(request)
    if not context.broker.access.clear_parameter(vhost, "shovel", request.match_info["name"]):
        raise not_found()
    await context.broker.agreed()
    context.broker.links_changed()
    return no_content()


@routes.delete("/api/shovels/vhost/{vhost}/{name}/restart")
async def restart(request: web.Request) -> web.StreamResponse:
    """Restart a shovel here, or (cluster) ask the node running it, as RabbitMQ does by RPC."""
    auth.require_monitor(request)
    vhost = auth.require_vhost(request, visible=True)
    name = request.match_info["name"]
    context = ctx(request)
    shovels = context.broker.shovels
    if shovels is not None and await shovels.restart(vhost, name):
        return no_content()
    if context.broker.cluster is not None and LOCAL not in request.query:
        for item in await _status(request):
            if item.get("vhost") == vhost and item.get("name") == name and item.get("node") != context.node:
                return await on_node(request, item["node"])
    raise not_found()
