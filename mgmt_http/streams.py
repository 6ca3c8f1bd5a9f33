"""/api/stream/connections: the stream protocol's connections, as rabbitmq_stream_management lists them (the
connections /api/connections shows whose protocol is ``stream``), and their closing; /api/stream/publishers and
/api/stream/consumers, and those of one connection: what each connection says of its publishers and subscriptions
(``ClientConnection.listed_publishers``, ``listed_subscriptions``), live where RabbitMQ's are as of its last stats
emission."""
from __future__ import annotations

from typing import Any, Callable

from aiohttp import web

from amqp_server.frontend.front_end import ClientConnection, ListedPublisher, ListedSubscription

from . import auth
from .connections import FORCED_REASON, NOT_YOURS, connection_info, visible_connections
from .context import Context, ctx
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


def _conn(request: web.Request) -> ClientConnection:
    """rabbit_mgmt_wm_connection:conn, which the publishers and consumers of one connection ask: the connection of
    the path's name whatever its vhost or protocol (an AMQP one has none of either), 404 if there is none; for
    its owner or a monitoring user (is_authorized_user)."""
    name = request.match_info["name"]
    for connection in list(ctx(request).clients.connections):
        if connection.name == name and connection.user is not None:
            user = auth.login(request)
            if not user.is_monitor and connection.user.name != user.name:
                raise not_authorised(NOT_YOURS)
            return connection
    raise not_found()


def _details(context: Context, connection: ClientConnection) -> dict[str, Any]:
    """rabbit_stream_mgmt_db's connection_details."""
    return {"name": connection.name, "user": connection.user.name if connection.user is not None else "",
            "node": context.node, "peer_host": connection.peer[0], "peer_port": connection.peer[1]}


def publisher_info(context: Context, connection: ClientConnection, publisher: ListedPublisher) -> dict[str, Any]:
    """rabbit_stream_metrics' publisher row, as rabbit_stream_mgmt_db augments it."""
    return {"publisher_id": publisher.id, "reference": publisher.reference, "published": publisher.published,
            "confirmed": publisher.confirmed, "errored": publisher.errored,
            "queue": {"name": publisher.stream, "vhost": connection.vhost_name},
            "connection_details": _details(context, connection)}


def consumer_info(context: Context, connection: ClientConnection, consumer: ListedSubscription) -> dict[str, Any]:
    """rabbit_stream_metrics' consumer row, as rabbit_stream_mgmt_db augments it."""
    return {"subscription_id": consumer.id, "credits": consumer.credits, "consumed": consumer.consumed,
            "offset": consumer.offset, "offset_lag": consumer.offset_lag, "properties": consumer.properties,
            "queue": {"name": consumer.stream, "vhost": connection.vhost_name},
            "connection_details": _details(context, connection)}


def _publishers(context: Context, connection: ClientConnection) -> list[dict[str, Any]]:
    return [publisher_info(context, connection, p) for p in connection.listed_publishers()]


def _consumers(context: Context, connection: ClientConnection) -> list[dict[str, Any]]:
    return [consumer_info(context, connection, c) for c in connection.listed_subscriptions()]


@routes.get("/api/stream/connections/{vhost}/{name}/publishers")
async def connection_publishers(request: web.Request) -> web.Response:
    """rabbit_stream_connection_publishers_mgmt."""
    return respond(request, _publishers(ctx(request), _conn(request)))


@routes.get("/api/stream/connections/{vhost}/{name}/consumers")
async def connection_consumers(request: web.Request) -> web.Response:
    """rabbit_stream_connection_consumers_mgmt."""
    return respond(request, _consumers(ctx(request), _conn(request)))


def _everyone(request: web.Request, vhost: str | None,
              rows: Callable[[Context, ClientConnection], list[dict[str, Any]]]) -> web.Response:
    """The rows of the node's stream connections (of ``vhost``), for any management user and without asking its
    access to the vhost (rabbit_mgmt_util:is_authorized), filter_user'd: a monitoring user's all, another's those
    of their own connections; in no order of their own, as RabbitMQ's (reply_list with no default sort)."""
    context = ctx(request)
    user = auth.login(request)
    found = [row for connection in _streams(list(context.clients.connections))
             if connection.user is not None and (vhost is None or connection.vhost_name == vhost)
             and (user.is_monitor or connection.user.name == user.name) for row in rows(context, connection)]
    return respond(request, found, ())


def _vhost(request: web.Request) -> str:
    """The path's vhost; 404 if there is none (rabbit_mgmt_util:vhost)."""
    vhost = request.match_info["vhost"]
    if not ctx(request).broker.access.vhost_exists(vhost):
        raise not_found()
    return vhost


@routes.get("/api/stream/publishers")
async def publishers(request: web.Request) -> web.Response:
    """rabbit_stream_publishers_mgmt."""
    return _everyone(request, None, _publishers)


@routes.get("/api/stream/publishers/{vhost}")
async def vhost_publishers(request: web.Request) -> web.Response:
    return _everyone(request, _vhost(request), _publishers)


@routes.get("/api/stream/publishers/{vhost}/{stream}")
async def stream_publishers(request: web.Request) -> web.Response:
    """Those of one stream; 404 unless the vhost has a queue of that name (rabbit_mgmt_wm_queue:queue, of any
    type: another's list is empty)."""
    context, name = ctx(request), request.match_info["stream"]
    vhost = _vhost(request)
    if name not in context.broker.vhost(vhost).queues:
        raise not_found()
    return _everyone(request, vhost, lambda context, connection: [
        row for row in _publishers(context, connection) if row["queue"]["name"] == name])


@routes.get("/api/stream/consumers")
async def consumers(request: web.Request) -> web.Response:
    """rabbit_stream_consumers_mgmt."""
    return _everyone(request, None, _consumers)


@routes.get("/api/stream/consumers/{vhost}")
async def vhost_consumers(request: web.Request) -> web.Response:
    return _everyone(request, _vhost(request), _consumers)


__all__ = ["routes"]
