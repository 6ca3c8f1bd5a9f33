"""/api/parameters: RabbitMQ's per-vhost runtime parameters (rabbit_mgmt_wm_parameter(s)).

Of RabbitMQ's components Warren serves ``shovel`` (dynamic shovels), ``federation-upstream`` and
``federation-upstream-set`` (federation), and lists ``vhost-limits`` (set through
/api/vhost-limits); any other is refused in RabbitMQ's words for a component no enabled plugin registers.
Listing and managing them takes the policymaker tag (or administrator) and access to the vhost, as in RabbitMQ
(is_authorized_policies); URIs are shown with their
credentials to administrators only.
"""
from __future__ import annotations

from typing import Any

from aiohttp import web

from amqp_server import runtime_parameters

from . import auth
from .context import ctx
from .http import bad_request, created_or_updated, key_missing, no_content, not_found, read_json
from .limits import COMPONENT as LIMITS, limits_parameter
from .listing import respond, respond_one

routes = web.RouteTableDef()


def _records(request: web.Request, vhosts: list[str], component: str | None = None) -> list[dict[str, Any]]:
    context = ctx(request)
    access = context.broker.access
    full = auth.login(request).is_admin
    wanted = set(vhosts)
    records = [runtime_parameters.shown(r, full) for r in access.parameters()
               if r["vhost"] in wanted and component in (None, r["component"])]
    if component in (None, LIMITS):
        records += [limits_parameter(r["vhost"], r["value"]) for r in access.all_limits("vhost_limits")
                    if r["vhost"] in wanted]
    return records


@routes.get("/api/parameters")
async def list_all(request: web.Request) -> web.Response:
    auth.require_policymaker(request)  # rabbit_mgmt_wm_parameters: is_authorized_policies, for every listing
    return respond(request, _records(request, auth.login_vhosts(request)), ("vhost", "component", "name"))


@routes.get("/api/parameters/{component}")
async def list_component(request: web.Request) -> web.Response:
    auth.require_policymaker(request)
    records = _records(request, auth.login_vhosts(request), request.match_info["component"])
    return respond(request, records, ("vhost", "name"))


@routes.get("/api/parameters/{component}/{vhost}")
async def list_vhost(request: web.Request) -> web.Response:
    auth.require_policymaker(request)
    records = _records(request, [auth.require_vhost(request)], request.match_info["component"])
    return respond(request, records, ("name",))


@routes.get("/api/parameters/{component}/{vhost}/{name}")
async def show(request: web.Request) -> web.Response:
    auth.require_policymaker(request)
    vhost = auth.require_vhost(request)
    record = ctx(request).broker.access.parameter(vhost, request.match_info["component"], request.match_info["name"])
    if record is None:
        raise not_found()
    return respond_one(request, runtime_parameters.shown(record, auth.login(request).is_admin))


@routes.put("/api/parameters/{component}/{vhost}/{name}")
async def put(request: web.Request) -> web.Response:
    login = auth.require_policymaker(request)
    vhost = auth.require_vhost(request, creating=True)
    component, name = request.match_info["component"], request.match_info["name"]
    body = await read_json(request)
    if "value" not in body:
        raise key_missing("value")
    context = ctx(request)
    access = context.broker.access
    try:
        runtime_parameters.validate(access, component, name, body["value"], login.user)
    except runtime_parameters.ParameterError as exc:
        raise bad_request(str(exc)) from None
    existed = access.parameter(vhost, component, name) is not None
    access.set_parameter(vhost, component, name, body["value"], login.name)
    await context.broker.agreed()
    context.broker.links_changed()
    return created_or_updated(not existed)


@routes.delete("/api/parameters/{component}/{vhost}/{name}")
async def delete(request: web.Request) -> web.Response:
    auth.require_policymaker(request)
    vhost = auth.require_vhost(request)
    context = ctx(request)
    if not context.broker.access.clear_parameter(vhost, request.match_info["component"], request.match_info["name"]):
        raise not_found()
    await context.broker.agreed()
    context.broker.links_changed()
    return no_content()


__all__ = ["routes"]
