"""/api/global-parameters and /api/cluster-name: RabbitMQ's global runtime parameters, ``cluster_name`` among
them (shown by the overview and in connection.start)."""
from __future__ import annotations

from aiohttp import web

from . import auth
from .context import ctx
from .http import created_or_updated, get_str, json_response, key_missing, no_content, not_found, read_json
from .listing import respond, respond_one

routes = web.RouteTableDef()


@routes.get("/api/global-parameters")
async def list_all(request: web.Request) -> web.Response:
    auth.require_policymaker(request)  # rabbit_mgmt_wm_global_parameter(s): is_authorized_global_parameters
    return respond(request, ctx(request).broker.access.global_parameters(), ("name",))


@routes.get("/api/global-parameters/{name}")
async def show(request: web.Request) -> web.Response:
    auth.require_policymaker(request)  # rabbit_mgmt_wm_global_parameter(s): is_authorized_global_parameters
    record = ctx(request).broker.access.global_parameter(request.match_info["name"])
    if record is None:
        raise not_found()
    return respond_one(request, record)


@routes.put("/api/global-parameters/{name}")
async def put(request: web.Request) -> web.Response:
    auth.require_policymaker(request)  # rabbit_mgmt_wm_global_parameter(s): is_authorized_global_parameters
    body = await read_json(request)
    if "value" not in body:
        raise key_missing("value")
    access = ctx(request).broker.access
    name = request.match_info["name"]
    existed = access.global_parameter(name) is not None
    access.set_global_parameter(name, body["value"])
    return created_or_updated(not existed)


@routes.delete("/api/global-parameters/{name}")
async def delete(request: web.Request) -> web.Response:
    auth.require_policymaker(request)  # rabbit_mgmt_wm_global_parameter(s): is_authorized_global_parameters
    if not ctx(request).broker.access.clear_global_parameter(request.match_info["name"]):
        raise not_found()
    return no_content()


@routes.get("/api/cluster-name")
async def cluster_name(request: web.Request) -> web.Response:
    context = ctx(request)
    return json_response({"name": context.broker.access.cluster_name(context.node)})


@routes.put("/api/cluster-name")
async def set_cluster_name(request: web.Request) -> web.Response:
    auth.require_admin(request)
    body = await read_json(request)
    if "name" not in body:
        raise key_missing("name")
    ctx(request).broker.access.set_global_parameter("cluster_name", get_str(body, "name"))
    return no_content()
