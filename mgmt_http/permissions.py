"""/api/permissions: configure/write/read regular expressions per (vhost, user)."""
from __future__ import annotations

import re
from typing import Any

from aiohttp import web

from amqp_server.auth import Permissions

from . import auth
from .context import ctx
from .http import HTTPError, bad_request, created_or_updated, get_str, no_content, not_found, read_json
from .listing import respond, respond_one

routes = web.RouteTableDef()


def permission_info(vhost: str, user: str, perms: Permissions) -> dict[str, Any]:
    return {"user": user, "vhost": vhost, "configure": perms.configure, "write": perms.write, "read": perms.read}


def permissions_from_json(body: dict[str, Any]) -> Permissions:
    values = {kind: get_str(body, kind) for kind in ("configure", "write", "read")}
    for kind, pattern in values.items():
        try:
            re.compile(pattern)
        except re.error as exc:
            raise bad_request(f"{kind}: invalid regular expression: {exc}") from None
    return Permissions(**values)


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
    perms = permissions_from_json(await read_json(request, required=True))
    existed = access.permissions(vhost, user) is not None
    access.set_permissions(vhost, user, perms)
    return created_or_updated(not existed)


@routes.delete("/api/permissions/{vhost}/{user}")
async def delete(request: web.Request) -> web.Response:
    vhost, user = _target(request)
    if not ctx(request).broker.access.clear_permissions(vhost, user):
        raise not_found()
    return no_content()
