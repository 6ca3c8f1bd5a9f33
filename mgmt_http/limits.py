"""/api/vhost-limits and /api/user-limits: RabbitMQ's vhost limits (max-connections, max-queues) and user limits
(max-connections, max-channels)."""
from __future__ import annotations

import json
from typing import Any

from aiohttp import web

from amqp_server.broker.limits import USER_LIMITS, VHOST_LIMITS

from . import auth
from .context import ctx
from .http import HTTPError, bad_request, key_missing, no_content, not_found, read_json
from .listing import respond

routes = web.RouteTableDef()
COMPONENT = "vhost-limits"  # the runtime parameter component RabbitMQ keeps vhost limits in


def limits_parameter(vhost: str, value: dict[str, int]) -> dict[str, Any]:
    """A vhost's limits as RabbitMQ lists them among runtime parameters (and exports them)."""
    return {"value": value, "vhost": vhost, "component": COMPONENT, "name": "limits"}


def erlang_term(value: Any) -> str:
    """A JSON value as RabbitMQ's validation messages print it (a string is an Erlang binary)."""
    return f"<<{json.dumps(value)}>>" if isinstance(value, str) else json.dumps(value)


def limit_value(body: dict[str, Any], name: str, known: tuple[str, ...], component: str) -> int:
    """The body's ``value`` for limit ``name``, refused as RabbitMQ refuses it (``component`` names the kind in
    its words: ``limits`` or ``user-limits``)."""
    if "value" not in body:
        raise key_missing("value")
    value = body["value"]
    if name not in known:
        raise _invalid(f"Unrecognised terms [{{<<{json.dumps(name)}>>,{erlang_term(value)}}}] in {component}",
                       component)
    if not isinstance(value, int) or isinstance(value, bool):
        raise _invalid(f"{name} should be a number, actually was {erlang_term(value)}", component)
    return value


def _invalid(detail: str, component: str) -> HTTPError:
    return bad_request(f"Validation failed\n\n{detail}\n" if component == "limits" else detail)


def _user(request: web.Request, missing: HTTPError) -> str:
    name = request.match_info["user"]
    if ctx(request).broker.access.user(name) is None:
        raise missing
    return name


@routes.get("/api/vhost-limits")
async def list_vhost_limits(request: web.Request) -> web.Response:
    visible = set(auth.visible_vhosts(request))
    records = [r for r in ctx(request).broker.access.all_limits("vhost_limits") if r["vhost"] in visible]
    return respond(request, records, ("vhost",))


@routes.get("/api/vhost-limits/{vhost}")
async def show_vhost_limits(request: web.Request) -> web.Response:
    vhost = auth.require_vhost(request, visible=True)  # rabbit_mgmt_wm_limits: is_authorized_vhost_visible
    limits = ctx(request).broker.access.vhost_limits(vhost)
    return respond(request, [{"vhost": vhost, "value": limits}] if limits else [], ("vhost",))


@routes.put("/api/vhost-limits/{vhost}/{name}")
async def put_vhost_limit(request: web.Request) -> web.Response:
    auth.require_admin(request)
    vhost = auth.require_vhost(request, creating=True)
    name = request.match_info["name"]
    value = limit_value(await read_json(request), name, VHOST_LIMITS, "limits")
    access = ctx(request).broker.access
    access.set_limits("vhost_limits", vhost, {**access.vhost_limits(vhost), name: value})
    return no_content()


@routes.delete("/api/vhost-limits/{vhost}/{name}")
async def delete_vhost_limit(request: web.Request) -> web.Response:
    auth.require_admin(request)
    vhost = auth.require_vhost(request)
    access = ctx(request).broker.access
    access.set_limits("vhost_limits", vhost, {k: v for k, v in access.vhost_limits(vhost).items()
                                              if k != request.match_info["name"]})
    return no_content()


@routes.get("/api/user-limits")
async def list_user_limits(request: web.Request) -> web.Response:
    auth.login(request)
    return respond(request, ctx(request).broker.access.all_limits("user_limits"), ("user",))


@routes.get("/api/user-limits/{user}")
async def show_user_limits(request: web.Request) -> web.Response:
    """Any user's limits, to any user (rabbit_mgmt_wm_user_limits: is_authorized_vhost_visible, no vhost)."""
    name = _user(request, not_found())
    limits = ctx(request).broker.access.user_limits(name)
    return respond(request, [{"user": name, "value": limits}] if limits else [], ("user",))


@routes.put("/api/user-limits/{user}/{name}")
async def put_user_limit(request: web.Request) -> web.Response:
    auth.require_admin(request)
    user = _user(request, bad_request(["no_such_user", request.match_info["user"]]))
    name = request.match_info["name"]
    value = limit_value(await read_json(request), name, USER_LIMITS, "user-limits")
    access = ctx(request).broker.access
    access.set_limits("user_limits", user, {**access.user_limits(user), name: value})
    return no_content()


@routes.delete("/api/user-limits/{user}/{name}")
async def delete_user_limit(request: web.Request) -> web.Response:
    auth.require_admin(request)
    user = _user(request, not_found())
    access = ctx(request).broker.access
    access.set_limits("user_limits", user, {k: v for k, v in access.user_limits(user).items()
                                            if k != request.match_info["name"]})
    return no_content()
