"""/api/vhosts: list (those the user may see), create, delete."""
from __future__ import annotations

from typing import Any

from aiohttp import web

from amqp_server.access_control import Permissions
from amqp_server.queues.types import NAMES as QUEUE_TYPES

from . import auth
from .connections import octets
from .limits import erlang_term
from .context import Context, ctx
from .http import bad_request, created_or_updated, get_bool, get_str, new_name, no_content, not_found, read_json
from .listing import respond, respond_one
from .rates import VHOST_STATS, depth_fields, message_stats, queue_depths
from .users import parse_tags

routes = web.RouteTableDef()


def vhost_info(context: Context, name: str) -> dict[str, Any]:
    vhost = context.vhost(name)
    rates = context.sampler.vhost_rates(name)
    metadata = context.broker.access.vhost_metadata(name)
    info: dict[str, Any] = {
        "name": name, "description": metadata["description"], "tags": metadata["tags"],
        "default_queue_type": metadata.get("default_queue_type", "undefined"),
        "metadata": metadata, "tracing": False,
        "cluster_state": {context.node: "running"},
        "message_stats": message_stats(context.sampler.vhost_counters(name), rates, VHOST_STATS),
    }
    info.update(depth_fields(queue_depths(list(vhost.queues.values())), rates))
    info.update(octets(context, [c for c in list(context.clients.connections) if c.vhost_name == name]))
    return info


def vhost_metadata(body: dict[str, Any]) -> dict[str, Any]:
    """``description``, ``tags`` and ``default_queue_type`` from a vhost's JSON (RabbitMQ 3.10's HTTP API names
    the last ``defaultqueuetype``; its definitions, ``metadata.default_queue_type``), as given."""
    metadata = body.get("metadata")
    nested = metadata if isinstance(metadata, dict) else {}
    found: dict[str, Any] = {}
    for key in ("description", "tags", "default_queue_type"):
        value = body.get(key, nested.get(key))
        if key == "default_queue_type" and value is None:
            value = body.get("defaultqueuetype")
        if value is not None:
            found[key] = value
    if "description" in found:
        found["description"] = get_str(found, "description")
    if "tags" in found:
        found["tags"] = parse_tags(found["tags"])
    if found.get("default_queue_type") not in (None, *QUEUE_TYPES):
        raise bad_request(f"default_queue_type must be one of {', '.join(QUEUE_TYPES)}")
    return found


@routes.get("/api/vhosts")
async def list_vhosts(request: web.Request) -> web.Response:
    context = ctx(request)
    return respond(request, [vhost_info(context, name) for name in auth.visible_vhosts(request)], ("name",))


@routes.get("/api/vhosts/{vhost}")
async def show(request: web.Request) -> web.Response:
    """An administrator's alone, as RabbitMQ 3.10's rabbit_mgmt_wm_vhost (is_authorized_admin); the listing is
    anyone's (of the vhosts they see)."""
    auth.require_admin(request)
    name = request.match_info["vhost"]
    if not ctx(request).broker.access.vhost_exists(name):
        raise not_found()
    return respond_one(request, vhost_info(ctx(request), name))


@routes.put("/api/vhosts/{vhost}")
async def put(request: web.Request) -> web.Response:
    auth.require_admin(request)
    body = await read_json(request)
    get_bool(body, "tracing")  # checked as RabbitMQ does, not kept
    metadata = vhost_metadata(body)
    name = new_name(request, "vhost", "vhost")
    if not name:
        raise bad_request("vhost name must not be empty")
    broker = ctx(request).broker
    existed = broker.access.vhost_exists(name)
    broker.add_vhost(name, **metadata)
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


@routes.post("/api/vhosts/{vhost}/start/{node}")
async def start(request: web.Request) -> web.Response:
    """RabbitMQ restarts a vhost whose supervisor stopped on a node; Warren's vhosts run on every running node from
    their creation, so on one of those this is rabbit_vhost_sup_sup's ``already_started`` (204).  Another node is
    its {badrpc, nodedown}; an unknown vhost its ``no_such_vhost`` (a POST goes on past resource_exists: 400)."""
    auth.require_admin(request)
    context = ctx(request)
    vhost, node = request.match_info["vhost"], request.match_info["node"]
    others = context.broker.cluster.nodes() if context.broker.cluster is not None else []
    if node != context.node and (node, True) not in others:
        raise bad_request(f"Request to node {node} failed with nodedown")
    if not context.broker.access.vhost_exists(vhost):
        raise bad_request(f"Request to node {node} failed with {{no_such_vhost,{erlang_term(vhost)}}}")
    return no_content()
