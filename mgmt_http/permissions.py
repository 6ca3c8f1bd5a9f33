"""/api/permissions: configure/write/read regular expressions per (vhost, user); /api/topic-permissions: write
and read patterns for routing keys per (vhost, user, topic exchange)."""
from __future__ import annotations

from typing import Any

from aiohttp import web

from amqp_server import patterns
from amqp_server.access_control import Permissions, TopicPermission

from . import auth
from .context import ctx
from .http import HTTPError, bad_request, created_or_updated, exchange_param, get_str, no_content, not_found, read_json
from .listing import respond, respond_one

routes = web.RouteTableDef()


def permission_info(vhost: str, user: str, perms: Permissions) -> dict[str, Any]:
    return {"user": user, "vhost": vhost, "configure": perms.configure, "write": perms.write, "read": perms.read}


def _patterns(body: dict[str, Any], kinds: tuple[str, ...]) -> dict[str, str]:
    values = {kind: get_str(body, kind) for kind in kinds}
    for kind, pattern in values.items():
        try:
            patterns.compile(pattern)
        except patterns.Error as exc:
            raise bad_request(f"{kind}: invalid regular expression: {exc}") from None
    return values


def permissions_from_json(body: dict[str, Any]) -> Permissions:
    return Permissions(**_patterns(body, ("configure", "write", "read")))


def topic_permission_from_json(body: dict[str, Any]) -> TopicPermission:
    exchange = get_str(body, "exchange")
    return TopicPermission(exchange, **_patterns(body, ("write", "read")))


def all_permissions(request: web.Request, vhosts: list[str] | None = None) -> list[dict[str, Any]]:
    access = ctx(request).broker.access
    users = [u.name for u in access.users()]
    return [permission_info(vhost, user, perms) for vhost in (vhosts if vhosts is not None else access.vhosts())
            for user in users if (perms := access.permissions(vhost, user)) is not None]


@routes.get("/api/permissions")
async def list_all(request: web.Request) -> web.Response:
    auth.require_admin(request)
    return respond(request, all_permissions(request), ("vhost", "user"))


@routes.get("/api/vhosts/{vhost}/permissions")
async def list_vhost(request: web.Request) -> web.Response:
    auth.require_admin(request)
    return respond(request, all_permissions(request, [auth.require_vhost(request)]), ("vhost", "user"))


def _target(request: web.Request, missing: HTTPError | None = None) -> tuple[str, str]:
    """The path's (vhost, user); if either is unknown, ``missing`` (default 404) is raised."""
    auth.require_admin(request)
    access = ctx(request).broker.access
    vhost, user = request.match_info["vhost"], request.match_info["user"]
    if not access.vhost_exists(vhost) or access.user(user) is None:
        raise missing or not_found()
    return vhost, user


@routes.get("/api/permissions/{vhost}/{user}")
async def show(request: web.Request) -> web.Response:
    vhost, user = _target(request)
    perms = ctx(request).broker.access.permissions(vhost, user)
    if perms is None:
        raise not_found()
    return respond_one(request, permission_info(vhost, user, perms))


@routes.put("/api/permissions/{vhost}/{user}")
async def put(request: web.Request) -> web.Response:
    vhost, user = _target(request, bad_request("vhost_or_user_not_found"))  # RabbitMQ's answer: 400, not 404
    access = ctx(request).broker.access
    perms = permissions_from_json(await read_json(request))
    existed = access.permissions(vhost, user) is not None
    access.set_permissions(vhost, user, perms)
    return created_or_updated(not existed)


@routes.delete("/api/permissions/{vhost}/{user}")
async def delete(request: web.Request) -> web.Response:
    vhost, user = _target(request)
    if not ctx(request).broker.access.clear_permissions(vhost, user):
        raise not_found()
    return no_content()


def _topic_listing(request: web.Request, vhost: str | None = None, user: str | None = None) -> web.Response:
    records = [record for record in ctx(request).broker.access.all_topic_permissions()
               if (vhost is None or record["vhost"] == vhost) and (user is None or record["user"] == user)]
    return respond(request, records, ("vhost", "user", "exchange"))


@routes.get("/api/topic-permissions")
async def list_topic(request: web.Request) -> web.Response:
    auth.require_admin(request)
    return _topic_listing(request)


@routes.get("/api/vhosts/{vhost}/topic-permissions")
async def list_vhost_topic(request: web.Request) -> web.Response:
    auth.require_admin(request)
    return _topic_listing(request, vhost=auth.require_vhost(request))


@routes.get("/api/users/{user}/topic-permissions")
async def list_user_topic(request: web.Request) -> web.Response:
    auth.require_admin(request)
    user = request.match_info["user"]
    if ctx(request).broker.access.user(user) is None:
        raise not_found()
    return _topic_listing(request, user=user)


@routes.get("/api/topic-permissions/{vhost}/{user}/{exchange}")  # RabbitMQ's same resource: every exchange's
@routes.get("/api/topic-permissions/{vhost}/{user}")
async def show_topic(request: web.Request) -> web.Response:
    """The user's topic permissions in the vhost, one per exchange (404 if it has none)."""
    vhost, user = _target(request)
    if not ctx(request).broker.access.topic_permissions(vhost, user):
        raise not_found()
    return _topic_listing(request, vhost, user)


@routes.put("/api/topic-permissions/{vhost}/{user}/{exchange}")  # the body's exchange, as without it
@routes.put("/api/topic-permissions/{vhost}/{user}")
async def put_topic(request: web.Request) -> web.Response:
    """Set the topic permission for the body's exchange: 201 if the user had none in the vhost, as RabbitMQ."""
    vhost, user = _target(request, bad_request("vhost_or_user_not_found"))
    access = ctx(request).broker.access
    rule = topic_permission_from_json(await read_json(request))
    existed = bool(access.topic_permissions(vhost, user))
    access.set_topic_permission(vhost, user, rule)
    return created_or_updated(not existed)


@routes.delete("/api/topic-permissions/{vhost}/{user}")
async def delete_topic(request: web.Request) -> web.Response:
    """Every topic permission of the user in the vhost goes."""
    vhost, user = _target(request)
    if not ctx(request).broker.access.clear_topic_permissions(vhost, user):
        raise not_found()
    return no_content()


@routes.delete("/api/topic-permissions/{vhost}/{user}/{exchange}")
async def delete_exchange_topic(request: web.Request) -> web.Response:
    """Only the path's exchange's topic permission goes; as RabbitMQ's resource_exists, 404 only when the user has
    none in the vhost (204 for an exchange it had none on)."""
    vhost, user = _target(request)
    access = ctx(request).broker.access
    if not access.topic_permissions(vhost, user):
        raise not_found()
    access.clear_topic_permission(vhost, user, exchange_param(request.match_info["exchange"]))
    return no_content()
