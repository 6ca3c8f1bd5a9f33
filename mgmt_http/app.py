"""The aiohttp application: error and auth middlewares, every resource's routes, the static UI."""
from __future__ import annotations

import logging
import os
from typing import Any, Awaitable, Callable, Iterable

from aiohttp import web

from amqp_server import tls
from amqp_server.broker import Broker
from amqp_server.frontend.clients import Clients
from amqp_server.publisher_flow import PublisherFlow
from amqp_server.errors import AMQPError
from amqp_server.logs import untrusted
from amqp_server.frontend.front_end import Unauthenticated

from . import bindings, connections, definitions, exchanges, global_parameters, health, limits, metrics, overview
from . import federation, parameters, permissions, policies, queues, quorum_members, rebalance, shovels, streams, users
from . import expect, forward, node_memory, offsets, vhosts
from .auth import auth_middleware
from .csrf import csrf_middleware
from .context import KEY, Context
from .gate import GatedSite, ServerLog, let_next_head
from .http import HTTPError, error_response, from_amqp
from .rates import DEFAULT_INTERVAL, Sampler

log = logging.getLogger("warren.mgmt")
STATIC_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "static")
STATIC_DIR_KEY = web.AppKey("static_dir", str)  # the directory served, where it exists
SHADOWS_KEY = web.AppKey("shadows", dict)  # literal API paths a pattern fits too: their own methods
RESOURCES = (overview, health, users, vhosts, permissions, limits, global_parameters, policies, connections, exchanges,
             bindings, queues, quorum_members, definitions, metrics, parameters, shovels, federation, streams,
             rebalance, node_memory)
HEADLESS = (limits,)  # rabbit_mgmt_wm_limits and _user_limits allow GET and OPTIONS only: HEAD is 405 there


@web.middleware
async def error_middleware(request: web.Request,
                           handler: Callable[[web.Request], Awaitable[web.StreamResponse]]) -> web.StreamResponse:
    """Every error leaves as RabbitMQ's ``{"error", "reason"}`` JSON; nothing escapes as a bare 500."""
    if request.path.startswith("/api/") and request.method != "OPTIONS":
        refused = await _refused_method(request)
        if refused is not None:
            let_next_head(request)  # (answered without a login)
            return refused
    try:
        response = await handler(request)
        if response.status >= 400 and request.path.startswith("/api/") and response.content_type != "application/json":
            return _as_json_error(request, response)  # e.g. fell through to the static files
        return response
    except HTTPError as exc:
        return exc.response()
    except AMQPError as exc:
        return from_amqp(exc).response()
    except web.HTTPException as exc:
        if exc.status >= 400:
            return _as_json_error(request, exc)
        raise
    except ConnectionError:  # the client went away mid-answer: nothing to answer, aiohttp lets it go
        raise
    except Exception:  # noqa: BLE001 - the API answers, logs, and keeps serving
        log.exception("management API error on %s %s", untrusted(request.method), untrusted(request.path))
        return error_response(500, "internal_server_error", "internal error; see the node's log")


# The web UI loads nothing from elsewhere and may not be framed (clickjacking).
SECURITY_HEADERS = {
    "Content-Security-Policy": "default-src 'self'; img-src 'self' data:; style-src 'self' 'unsafe-inline'; "
                               "object-src 'none'; base-uri 'self'; frame-ancestors 'none'",
    "X-Frame-Options": "DENY",
    "X-Content-Type-Options": "nosniff",
}
METHOD_ORDER = ("HEAD", "GET", "PUT", "POST", "DELETE", "OPTIONS")  # as RabbitMQ's allowed_methods list them


@web.middleware
async def security_headers(request: web.Request,
                           handler: Callable[[web.Request], Awaitable[web.StreamResponse]]) -> web.StreamResponse:
    response = await handler(request)
    if not response.prepared:
        response.headers.update(SECURITY_HEADERS)
    return response


@web.middleware
async def options_middleware(request: web.Request,
                             handler: Callable[[web.Request], Awaitable[web.StreamResponse]]) -> web.StreamResponse:
    """OPTIONS on the API, without a login: cowboy_rest's 200 with the resource's allowed methods (a path no
    resource has is the UI's files: GET, HEAD)."""
    if request.method != "OPTIONS" or not request.path.startswith("/api/"):
        return await handler(request)
    return web.Response(headers={"Allow": _allow(await _allowed_methods(request) or UI_FILES)})


UI_FILES = frozenset({"GET", "HEAD"})  # what a path no API resource has allows: the UI's files (cowboy_static)


def _allow(methods: Iterable[str]) -> str:
    """An ``Allow`` header as cowboy_rest writes a resource's allowed_methods: OPTIONS among them."""
    allowed = {*methods, "OPTIONS"}
    return ", ".join(m for m in METHOD_ORDER if m in allowed)


async def _refused_method(request: web.Request) -> web.Response | None:
    """What cowboy_rest answers before it asks who is asking (is_authorized): 405 for a method the path's resource
    does not allow (a literal path's own, not the pattern's it also fits: ``_shadows``), 404 for a GET or HEAD of
    a path no API resource has that fell through to the UI's files; None for a request to serve."""
    match = request.match_info
    shadowing = request.app[SHADOWS_KEY].get(request.path)
    if shadowing is not None:
        if request.method in shadowing:
            return None
        allowed: set[str] | frozenset[str] = shadowing
    elif isinstance(match.route.resource, web.StaticResource):
        allowed = await _allowed_methods(request)
        if not allowed:
            return error_response(404, "Object Not Found", "Not Found")
    elif match.http_exception is not None and match.http_exception.status == 405:
        allowed = await _allowed_methods(request) or UI_FILES
    else:
        return None
    return web.Response(status=405, headers={"Allow": _allow(allowed)})


async def _allowed_methods(request: web.Request) -> set[str]:
    """The methods the API resources matching the request's path allow: a literal path's own, where a pattern
    fits it too."""
    shadowing = request.app[SHADOWS_KEY].get(request.path)
    if shadowing is not None:
        return set(shadowing)
    allowed: set[str] = set()
    for resource in request.app.router.resources():
        if not isinstance(resource, web.StaticResource):
            allowed |= (await resource.resolve(request))[1]
    return allowed


def _as_json_error(request: web.Request, response: web.StreamResponse) -> web.Response:
    if response.status == 404:
        return error_response(404, "Object Not Found", "Not Found")
    if response.status == 405:  # a bare 405, as RabbitMQ's
        return web.Response(status=405, headers={"Allow": response.headers.get("Allow", "")})
    return error_response(response.status, response.reason or "error", response.reason or "error")


def _shadows(router: web.UrlDispatcher) -> dict[str, frozenset[str]]:
    """The API's literal paths that a pattern fits too, with their methods.  RabbitMQ's dispatcher (cowboy_router)
    lists each before the pattern (``/users/bulk-delete``, ``/users/without-permissions`` before ``/users/:user``),
    so a method it does not allow is its 405; aiohttp would try the pattern's routes next (PUT
    /api/users/bulk-delete made a user of that name)."""
    patterns = [info["pattern"] for resource in router.resources()
                if isinstance(resource, web.DynamicResource) and "pattern" in (info := resource.get_info())]
    return {resource.canonical: frozenset(route.method for route in resource)
            for resource in router.resources()
            if isinstance(resource, web.PlainResource) and resource.canonical.startswith("/api/")
            and any(pattern.fullmatch(resource.canonical) for pattern in patterns)}


async def _index(request: web.Request) -> web.FileResponse:
    return web.FileResponse(os.path.join(request.app[STATIC_DIR_KEY], "index.html"))


def create_app(broker: Broker, config: Any, sample_interval: float = DEFAULT_INTERVAL,
               static_dir: str | None = STATIC_DIR, flow: PublisherFlow | None = None,
               clients: Clients | None = None) -> web.Application:
    """The management application for ``broker``; ``config`` is the node's Config, ``flow`` its alarms,
    ``clients`` its AMQP connections."""
    app = web.Application(middlewares=[security_headers, error_middleware,
                                       auth_middleware(broker, config.loopback_users_only, config.metrics_auth),
                                       options_middleware, csrf_middleware],
                          client_max_size=config.mgmt_max_body_size)
    clients = clients or Clients()
    sampler = Sampler(broker, clients, sample_interval)
    app[KEY] = Context(broker, config, sampler, clients, flow or PublisherFlow())
    for module in RESOURCES:
        head = module not in HEADLESS
        for route in module.routes:  # RabbitMQ serves /api/queues/ as /api/queues (clients' recovery code asks so)
            if not isinstance(route, web.RouteDef):
                continue
            paths = [route.path]
            if route.path.startswith("/api/") and not route.path.endswith("/"):
                paths.append(route.path + "/")
            # a resource that answers GET answers HEAD (cowboy_rest's): the same status and headers, no body
            methods = [route.method, "HEAD"] if route.method == "GET" and head else [route.method]
            for path in paths:
                for method in methods:
                    app.router.add_route(method, path, route.handler, expect_handler=expect.defer, **route.kwargs)
    forward.setup(app)
    offsets.add_routes(app)  # the Spark bridge: queue contents by offset as Arrow (mgmt_http/offsets.py)
    app[SHADOWS_KEY] = _shadows(app.router)
    if static_dir and os.path.isdir(static_dir):
        app[STATIC_DIR_KEY] = static_dir
        if os.path.exists(os.path.join(static_dir, "index.html")):
            app.router.add_get("/", _index, expect_handler=expect.defer)
        app.router.add_static("/", static_dir, expect_handler=expect.defer)

    async def on_startup(_app: web.Application) -> None:
        sampler.start()

    async def on_cleanup(_app: web.Application) -> None:
        await sampler.stop()

    app.on_startup.append(on_startup)
    app.on_cleanup.append(on_cleanup)
    return app


async def start(broker: Broker, config: Any, flow: PublisherFlow | None = None, clients: Clients | None = None,
                sample_interval: float = DEFAULT_INTERVAL) -> web.AppRunner:
    """Serve the API on ``config.bind:config.mgmt_port`` (and HTTPS on ``mgmt_tls_port`` with ``mgmt_tls``)
    on the running loop; ``await runner.cleanup()`` stops it."""
    handshakes = clients.handshakes if clients is not None else Unauthenticated(  # the node's: its client ports'
        "HTTP", config.handshakes_max, config.handshake_timeout / 1000, log)
    # a connection idle, or trickling a request's head, that long is closed (aiohttp's keep-alive timer)
    runner = web.AppRunner(create_app(broker, config, sample_interval, flow=flow, clients=clients), access_log=None,
                           keepalive_timeout=config.mgmt_idle_timeout, logger=ServerLog(handshakes))
    await runner.setup()
    await GatedSite(runner, config.bind, config.mgmt_port, handshakes).start()
    context = tls.mgmt_context(config)
    if context is not None:
        await GatedSite(runner, config.bind, config.mgmt_tls_port, handshakes, context).start()
        log.info("management HTTPS API on %s:%d", config.bind, config.mgmt_tls_port)
    return runner
