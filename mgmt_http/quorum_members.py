"""Quorum queue membership, as RabbitMQ's API has it: add or remove a member, grow every queue onto a node.

``POST /api/queues/quorum/{vhost}/{name}/replicas/add`` and ``DELETE .../replicas/delete`` take
``{"node": ...}``; ``POST /api/queues/quorum/replicas/on/{node}/grow`` takes ``strategy`` (all, even)
and ``vhost_pattern`` / ``queue_pattern``.  Administrators only; cluster mode only (a single node's
quorum queue is a group of one).
"""
from __future__ import annotations

from aiohttp import web

from . import auth
from .context import ctx
from .http import bad_request, get_str, no_content, not_found, read_json

routes = web.RouteTableDef()
STRATEGIES = ("all", "even")


def _groups(request: web.Request):
    auth.require_admin(request)
    cluster = ctx(request).broker.cluster
    if cluster is None:
        raise bad_request("quorum queue members change in cluster mode only: this node is a group of one")
    return cluster.quorum


async def _change(request: web.Request, add: bool) -> web.Response:
    groups = _groups(request)
    vhost = auth.require_vhost(request)
    node = get_str(await read_json(request), "node")
    try:
        if add:
            await groups.change_members(vhost, request.match_info["name"], add=node)
        else:
            await groups.change_members(vhost, request.match_info["name"], remove=node)
    except LookupError as exc:
        raise not_found(str(exc)) from None
    except ValueError as exc:
        raise bad_request(str(exc)) from None
    return no_content()


@routes.post("/api/queues/quorum/{vhost}/{name}/replicas/add")
async def add_member(request: web.Request) -> web.Response:
    return await _change(request, add=True)


@routes.delete("/api/queues/quorum/{vhost}/{name}/replicas/delete")
async def delete_member(request: web.Request) -> web.Response:
    return await _change(request, add=False)


@routes.post("/api/queues/quorum/replicas/on/{node}/grow")
async def grow(request: web.Request) -> web.Response:
    groups = _groups(request)
    body = await read_json(request)
    strategy = get_str(body, "strategy", "all")
    if strategy not in STRATEGIES:
        raise bad_request(f"strategy must be one of {', '.join(STRATEGIES)}")
    node = request.match_info["node"]
    try:
        await groups.grow(node, strategy, get_str(body, "vhost_pattern", ".*"), get_str(body, "queue_pattern", ".*"))
    except ValueError as exc:
        raise bad_request(str(exc)) from None
    return no_content()
