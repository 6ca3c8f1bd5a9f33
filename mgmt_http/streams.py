"""/api/stream/connections: the stream protocol's connections, as rabbitmq_stream_management lists them (the
connections /api/connections shows whose protocol is ``stream``), and their closing."""
from __future__ import annotations

from aiohttp import web

from amqp_server.frontend.front_end import ClientConnection

from . import auth
from .connections import FORCED_REASON, NOT_YOURS, connection_info, visible_connections
from .context import ctx
from .http import no_content, not_authorised, not_found
from .listing import respond, respond_one

routes = web.RouteTableDef()
STREAM = "stream"  # the protocol rabbit_stream_reader reports (its i(protocol, ...))


def _streams(connections: list[ClientConnection]) -> list[ClientConnection]:
    return [c for c in connections if c.protocol == STREAM]


@routes.get("/api/stream/connections")
async def list_all(request: web.Request) -> web.Response:
    """rabbit_stream_connections_mgmt: any management user; monitoring users see every one, others their own."""
    context = ctx(request)
    return respond(request, [connection_info(context, c) for c in _streams(visible_connections(request))])


@routes.get("/api/stream/connections/{vhost}")
async def list_vhost(request: web.Request) -> web.Response:
    """rabbit_stream_connections_vhost_mgmt: a vhost the user may see (is_authorized_vhost_visible_for_monitoring)."""
    context = ctx(request)
    vhost = auth.require_vhost(request, visible=True)
    return respond(request, [connection_info(context, c) for c in _streams(visible_connections(request, vhost))])


def _connection(request: web.Request) -> ClientConnection:
    """The path's stream connection in the path's vhost (404 otherwise), if the user may act on it as
    rabbit_mgmt_util:is_authorized_user has it: its owner, or a monitoring user (GET) or administrator (DELETE)."""
    name, vhost = request.match_info["name"], request.match_info["vhost"]
    for connection in _streams(list(ctx(request).clients.connections)):
        if connection.name == name and connection.vhost_name == vhost and connection.user is not None:
            user = auth.login(request)
            privileged = user.is_admin if request.method == "DELETE" else user.is_monitor
            if not privileged and connection.user.name != user.name:
                raise not_authorised(NOT_YOURS)
            return connection
    raise not_found()


@routes.get("/api/stream/connections/{vhost}/{name}")
async def show(request: web.Request) -> web.Response:
    return respond_one(request, connection_info(ctx(request), _connection(request)))


@routes.delete("/api/stream/connections/{vhost}/{name}")
async def close(request: web.Request) -> web.Response:
    """Closes it as DELETE /api/connections/{name} does; the reason may come in an X-Reason header."""
    _connection(request).force_close(request.headers.get("X-Reason", FORCED_REASON))
    return no_content()


__all__ = ["routes"]
