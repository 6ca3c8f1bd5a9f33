"""/api/users and /api/whoami."""
from __future__ import annotations

from typing import Any

from aiohttp import web

from amqp_server.access_control import DEFAULT_HASHING, HASHING_ALGORITHMS, User, hash_password

from . import auth
from .context import ctx
from .http import (bad_request, created_or_updated, get_str, json_response, key_missing, new_name, no_content,
                   not_found, read_json)
from .listing import respond, respond_one
from .permissions import permission_info

routes = web.RouteTableDef()


def user_info(user: User, limits: dict[str, int]) -> dict[str, Any]:
    return {"name": user.name, "password_hash": user.password_hash, "hashing_algorithm": user.hashing_algorithm,
            "tags": list(user.tags), "limits": limits}


def parse_tags(value: Any) -> list[str]:
    """Tags as a list or RabbitMQ's comma-separated string."""
    if value is None:
        return []
    if isinstance(value, str):
        return [tag.strip() for tag in value.split(",") if tag.strip()]
    if isinstance(value, list) and all(isinstance(tag, str) for tag in value):
        return [tag.strip() for tag in value if tag.strip()]
    raise bad_request("tags must be a string or a list of strings")


def user_from_json(name: str, body: dict[str, Any]) -> User:
    """PUT body: ``password`` or ``password_hash`` (+ ``hashing_algorithm``, SHA-256 by default), and ``tags``.
    With neither, the user has no password, a user updated so too (as RabbitMQ: only other mechanisms, such as
    a client certificate, could authenticate it)."""
    if "tags" not in body:
        raise bad_request("tags_not_present")  # as RabbitMQ, updating a user too
    algorithm = DEFAULT_HASHING
    password, password_hash = body.get("password"), body.get("password_hash")
    if password is not None and password_hash is not None:
        raise bad_request("both_password_and_password_hash_are_provided")
    if password is not None:
        password_hash = hash_password(get_str(body, "password"))
    elif password_hash is not None:
        password_hash = get_str(body, "password_hash")
        algorithm = body.get("hashing_algorithm") or DEFAULT_HASHING
        if algorithm not in HASHING_ALGORITHMS:
            raise bad_request(f"unsupported hashing_algorithm '{algorithm}'; one of {', '.join(HASHING_ALGORITHMS)}")
    return User(name, password_hash or "", parse_tags(body["tags"]), algorithm)


@routes.get("/api/whoami")
async def whoami(request: web.Request) -> web.Response:
    login = auth.login(request)
    return json_response({"name": login.name, "tags": list(login.tags)})


@routes.get("/api/users")
async def list_users(request: web.Request) -> web.Response:
    auth.require_admin(request)
    access = ctx(request).broker.access
    return respond(request, [user_info(u, access.user_limits(u.name)) for u in access.users()], ("name",))


@routes.get("/api/users/without-permissions")
async def without_permissions(request: web.Request) -> web.Response:
    auth.require_admin(request)
    access = ctx(request).broker.access
    vhosts = access.vhosts()
    return respond(request, [user_info(u, access.user_limits(u.name)) for u in access.users()
                             if all(access.permissions(vhost, u.name) is None for vhost in vhosts)], ("name",))


@routes.get("/api/users/{name}")
async def show(request: web.Request) -> web.Response:
    auth.require_admin(request)
    user = ctx(request).broker.access.user(request.match_info["name"])
    if user is None:
        raise not_found()
    return respond_one(request, user_info(user, ctx(request).broker.access.user_limits(user.name)))


@routes.put("/api/users/{name}")
async def put(request: web.Request) -> web.Response:
    auth.require_admin(request)
    access = ctx(request).broker.access
    name = new_name(request, "name", "user")
    if not name:
        raise bad_request("user name must not be empty")
    existed = access.user(name) is not None
    access.put_user(user_from_json(name, await read_json(request)))
    return created_or_updated(not existed)


@routes.delete("/api/users/{name}")
async def delete(request: web.Request) -> web.Response:
    auth.require_admin(request)
    if not ctx(request).broker.access.delete_user(request.match_info["name"]):
        raise not_found()
    return no_content()


@routes.post("/api/users/bulk-delete")
async def bulk_delete(request: web.Request) -> web.Response:
    auth.require_admin(request)
    body = await read_json(request)
    if "users" not in body:
        raise key_missing("users")
    names = body["users"]
    if not isinstance(names, list) or not all(isinstance(n, str) for n in names):
        raise bad_request("users must be a list of user names")
    access = ctx(request).broker.access
    for name in names:  # all known, or none deleted
        if access.user(name) is None:
            raise bad_request(["no_such_user", name])
    for name in names:
        access.delete_user(name)
    return no_content()


@routes.get("/api/users/{name}/permissions")
async def user_permissions(request: web.Request) -> web.Response:
    auth.require_admin(request)
    access = ctx(request).broker.access
    name = request.match_info["name"]
    if access.user(name) is None:
        raise not_found()
    items = [permission_info(vhost, name, perms) for vhost in access.vhosts()
             if (perms := access.permissions(vhost, name)) is not None]
    return respond(request, items, ("vhost",))
