"""/api/vhosts: list (those the user may see), create, delete."""
from __future__ import annotations

from typing import Any

from aiohttp import web

from amqp_server.auth import Permissions

from . import auth
from .context import Context, ctx
from .http import bad_request, created_or_updated, new_name, no_content, not_found, read_json
from .listing import respond, respond_one
from .rates import VHOST_STATS, depth_fields, message_stats, queue_depths

routes = web.RouteTableDef()


def vhost_info(context: Context, name: str) -> dict[str, Any]:
    vhost = context.vhost(name)
    rates = context.sampler.vhost_rates(name)
    info: dict[str, Any] = {
        "name": name, "description": "", "tags": [], "default_queue_type": "classic",
        "metadata": {"description": "", "tags": []}, "tracing": False,
        "cluster_state": {context.node: "running"},
        "message_stats": message_stats(context.sampler.vhost_counters(name), rates, VHOST_STATS),
    }
    info.update(depth_fields(queue_depths(list(vhost.queues.values())), rates))
    return info


@routes.get("/api/vhosts")
async def list_vhosts(request: web.Request) -> web.Response:
    context = ctx(request)
    return respond(request, [vhost_info(context, name) for name in auth.visible_vhosts(request)], ("name",))


@routes.get("/api/vhosts/{vhost}")
async def show(request: web.Request) -> web.Response:
    return respond_one(request, vhost_info(ctx(request), auth.require_vhost(request)))


@routes.put("/api/vhosts/{vhost}")
async def put(request: web.Request) -> web.Response:
    auth.require_admin(request)
    await read_json(request)  # description, tags, default_queue_type, tracing: accepted, not kept
    name = new_name(request, "vhost", "vhost")
    if not name:
        raise bad_request("vhost name must not be empty")
    broker = ctx(request).broker
    existed = broker.access.vhost_exists(name)
    broker.add_vhost(name)
    if not existed:  # as RabbitMQ: whoever creates a vhost over HTTP gets full permissions on it
        broker.access.set_permissions(name, auth.login(request).name, Permissions())
    return created_or_updated(not existed)


@routes.delete("/api/vhosts/{vhost}")
async def delete(request: web.Request) -> web.Response:
    auth.require_admin(request)
    name = request.match_info["vhost"]
    broker = ctx(request).broker
    if not broker.access.vhost_exists(name):
        raise not_found()
    broker.delete_vhost(name)
    return no_content()
