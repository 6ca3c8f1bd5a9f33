"""/api/connections, /api/channels, /api/consumers: what clients are connected and doing."""
from __future__ import annotations

from typing import Any, Iterator

from aiohttp import web

from amqp_server import tls
from amqp_server.frontend.front_end import ClientConnection, ListedChannel, ListedLink, ListedSession
from amqp_server.queues.queue import Consumer

from . import auth
from .context import Context, ctx
from .http import bad_request, not_authorised, jsonable, no_content, not_found
from .listing import respond, respond_one
from .rates import CHANNEL_STATS, message_stats

routes = web.RouteTableDef()
FORCED_REASON = "Closed via management plugin"
NOT_YOURS = "User not authorised to access object"  # RabbitMQ's is_authorized_user refusal


def _opened(context: Context) -> list[ClientConnection]:
    return [c for c in list(context.clients.connections) if c.user is not None and c.vhost is not None]


def _user(connection: ClientConnection) -> str:
    """The name of the user of a connection ``_opened`` lists (it has one)."""
    return connection.user.name if connection.user is not None else ""


def visible_connections(request: web.Request, vhost: str | None = None) -> list[ClientConnection]:
    """Monitoring users see every connection; others see their own."""
    user = auth.login(request)
    return [c for c in _opened(ctx(request))
            if (user.is_monitor or _user(c) == user.name) and (vhost is None or c.vhost_name == vhost)]


def connection_info(context: Context, connection: ClientConnection) -> dict[str, Any]:
    sock = connection.transport.get_extra_info("sockname") if connection.transport else None
    host, port = (sock[0], sock[1]) if sock else ("?", 0)
    props = jsonable(connection.client_properties)
    info: dict[str, Any] = {
        "name": connection.name, "node": context.node, "type": "network",
        "state": connection.flow_state, "protocol": connection.protocol,
        "user": _user(connection), "user_who_performed_action": _user(connection),
        "vhost": connection.vhost_name, "auth_mechanism": connection.auth_mechanism,
        **tls.connection_info(connection.ssl_object),
        "host": host, "port": port, "peer_host": connection.peer[0], "peer_port": connection.peer[1],
        "channels": len(connection.channels), "channel_max": connection.channel_max,
        "frame_max": connection.frame_max, "timeout": connection.heartbeat,
        "client_properties": props,
        "connected_at": int(connection.connected_at * 1000),
        "recv_cnt": connection.recv_cnt, "send_cnt": connection.send_cnt,
        "send_pend": connection.transport.get_write_buffer_size() if connection.transport else 0,
        **octets(context, [connection]),
    }
    if "connection_name" in props:  # RabbitMQ shows it only for a client that names its connection
        info["user_provided_name"] = props["connection_name"]
    return info


def octets(context: Context, connections: list[ClientConnection]) -> dict[str, Any]:
    """Bytes read and written by connections (counted per socket read and write) with their rates, as RabbitMQ
    shows them for a connection, or a vhost's."""
    totals: dict[str, Any] = {}
    for key in ("recv_oct", "send_oct"):
        totals[key] = sum(getattr(connection, key) for connection in connections)
        totals[f"{key}_details"] = {"rate": sum(context.sampler.rates(connection).get(key, 0.0)
                                                for connection in connections)}
    return totals


def channel_name(channel: ListedChannel) -> str:
    return _channel_name(channel.connection.name, channel.number)


def _channel_name(connection: str, number: int) -> str:
    return f"{connection} ({number})"


def channel_info(context: Context, channel: ListedChannel) -> dict[str, Any]:
    connection = channel.connection
    info: dict[str, Any] = {
        "name": channel_name(channel), "number": channel.number, "node": context.node,
        "connection_details": {"name": connection.name, "peer_host": connection.peer[0],
                               "peer_port": connection.peer[1]},
        "vhost": connection.vhost_name, "user": channel.user.name, "user_who_performed_action": channel.user.name,
        "state": "running" if channel.flow_active else "flow",
        "consumer_count": len(channel.consumers), "messages_unacknowledged": len(channel.unacked),
        "messages_unconfirmed": channel.publish_seq - channel.confirmed if channel.confirm_mode else 0,
        "messages_uncommitted": len(channel.tx) if channel.tx is not None else 0, "acks_uncommitted": 0,
        "prefetch_count": channel.prefetch, "global_prefetch_count": channel.global_prefetch,
        "confirm": channel.confirm_mode, "transactional": channel.tx is not None,
        "message_stats": message_stats(channel.stats, context.sampler.rates(channel), CHANNEL_STATS),
        "pending_raft_commands": 0,
    }
    idle = context.sampler.idle_since(channel)
    if idle is not None:
        info["idle_since"] = idle
    return info


def activity(consumer: Consumer) -> tuple[bool, str]:
    """(active, activity_status) as RabbitMQ reports them: with a single active consumer, the others wait."""
    queue = consumer.queue
    if not queue.args.single_active_consumer:
        return True, "up"
    return (True, "single_active") if consumer is queue.active_consumer else (False, "waiting")


def consumer_info(consumer: Consumer) -> dict[str, Any]:
    """A consumer, its client's channel wherever it is (on another node, as that node describes it)."""
    client = consumer.channel.client()
    active, status = activity(consumer)
    return {
        "consumer_tag": consumer.tag, "ack_required": not consumer.no_ack, "exclusive": consumer.exclusive,
        "prefetch_count": consumer.prefetch, "arguments": jsonable(consumer.arguments), "active": active,
        "activity_status": status, "consumer_timeout": None,
        "queue": {"name": consumer.queue.name, "vhost": consumer.queue.vhost},
        "channel_details": {"name": _channel_name(client.connection, client.number), "number": client.number,
                            "connection_name": client.connection, "peer_host": client.peer[0],
                            "peer_port": client.peer[1], "node": client.node, "user": client.user},
    }


def _channels(connections: list[ClientConnection]) -> Iterator[ListedChannel]:
    for connection in connections:
        yield from list(connection.channels.values())


def find_connection(request: web.Request) -> ClientConnection:
    name = request.match_info["name"]
    for connection in visible_connections(request):
        if connection.name == name:
            return connection
    raise not_found()


@routes.get("/api/connections")
async def list_connections(request: web.Request) -> web.Response:
    context = ctx(request)
    return respond(request, [connection_info(context, c) for c in visible_connections(request)], ("name",))


@routes.get("/api/vhosts/{vhost}/connections")
async def list_vhost_connections(request: web.Request) -> web.Response:
    context = ctx(request)
    vhost = auth.require_vhost(request)
    return respond(request, [connection_info(context, c) for c in visible_connections(request, vhost)], ("name",))


@routes.get("/api/connections/{name}")
async def show_connection(request: web.Request) -> web.Response:
    return respond_one(request, connection_info(ctx(request), find_connection(request)))


@routes.delete("/api/connections/{name}")
async def close_connection(request: web.Request) -> web.Response:
    """Closes the connection with 320 CONNECTION_FORCED; the reason may come in an X-Reason header."""
    connection = find_connection(request)
    user = auth.login(request)
    if not user.is_admin and _user(connection) != user.name:
        raise not_authorised("Not administrator user")
    connection.force_close(request.headers.get("X-Reason", FORCED_REASON))
    return no_content()


@routes.get("/api/connections/username/{username}")
async def list_user_connections(request: web.Request) -> web.Response:
    """RabbitMQ's tracked connections of one user, as four fields; monitoring users only (its
    ``is_authorized_user`` over the list, which names no single owner)."""
    if not auth.login(request).is_monitor:
        raise not_authorised(NOT_YOURS)
    context = ctx(request)
    return respond(request, [{"name": c.name, "vhost": c.vhost_name, "user": _user(c), "node": context.node}
                             for c in _of_user(context, request.match_info["username"])])


@routes.delete("/api/connections/username/{username}")
async def close_user_connections(request: web.Request) -> web.Response:
    """Closes every connection of the user (administrators only), as DELETE /api/connections/{name} does one."""
    if not auth.login(request).is_admin:
        raise not_authorised(NOT_YOURS)
    reason = request.headers.get("X-Reason", FORCED_REASON)
    for connection in _of_user(ctx(request), request.match_info["username"]):
        connection.force_close(reason)
    return no_content()


def _of_user(context: Context, username: str) -> list[ClientConnection]:
    return [c for c in _opened(context) if _user(c) == username]


@routes.get("/api/connections/{name}/channels")
async def list_connection_channels(request: web.Request) -> web.Response:
    context = ctx(request)
    items = [channel_info(context, ch) for ch in _channels([find_connection(request)])]
    return respond(request, items, ("name",))


@routes.get("/api/connections/{name}/sessions")
async def list_connection_sessions(request: web.Request) -> web.Response:
    """An AMQP 1.0 connection's sessions and their links, as RabbitMQ 4.x lists them; 400 for another protocol."""
    sessions = find_connection(request).listed_sessions()
    if sessions is None:
        raise bad_request("connection does not use AMQP 1.0")
    max_size = ctx(request).config.max_message_size
    return respond(request, [session_info(session, max_size) for session in sessions], ("channel_number",))


SETTLE_MODES = ("unsettled", "settled", "mixed")  # snd-settle-mode's values, as RabbitMQ names them


def session_info(session: ListedSession, max_message_size: int) -> dict[str, Any]:
    def incoming(link: ListedLink) -> dict[str, Any]:
        return {"handle": link.handle, "link_name": link.name, "target_address": link.address,
                "delivery_count": link.delivery_count, "credit": link.credit,
                "snd_settle_mode": SETTLE_MODES[min(link.settle_mode, 2)],
                "max_message_size": max_message_size, "unconfirmed_messages": link.unconfirmed}

    def outgoing(link: ListedLink) -> dict[str, Any]:
        return {"handle": link.handle, "link_name": link.name, "source_address": link.address,
                "queue_name": link.queue, "delivery_count": link.delivery_count, "credit": link.credit,
                "max_message_size": "unlimited", "send_settled": link.settle_mode == 1}

    return {
        "channel_number": session.channel, "handle_max": session.handle_max,
        "next_incoming_id": session.next_incoming_id, "incoming_window": session.incoming_window,
        "next_outgoing_id": session.next_outgoing_id, "remote_incoming_window": session.remote_incoming_window,
        "remote_outgoing_window": session.remote_outgoing_window,
        "outgoing_unsettled_deliveries": session.outgoing_unsettled,
        "incoming_links": [incoming(link) for link in session.incoming],
        "outgoing_links": [outgoing(link) for link in session.outgoing],
    }


@routes.get("/api/channels")
async def list_channels(request: web.Request) -> web.Response:
    context = ctx(request)
    items = [channel_info(context, ch) for ch in _channels(visible_connections(request))]
    return respond(request, items, ("name",))


@routes.get("/api/vhosts/{vhost}/channels")
async def list_vhost_channels(request: web.Request) -> web.Response:
    context = ctx(request)
    vhost = auth.require_vhost(request)
    items = [channel_info(context, ch) for ch in _channels(visible_connections(request, vhost))]
    return respond(request, items, ("name",))


@routes.get("/api/channels/{name}")
async def show_channel(request: web.Request) -> web.Response:
    """One channel also lists its consumers (rabbit_mgmt_db's detail_channel_stats), found on its vhost's queues."""
    context = ctx(request)
    name = request.match_info["name"]
    for channel in _channels(visible_connections(request)):
        if channel_name(channel) == name:
            queues = list(context.vhost(channel.connection.vhost_name).queues.values())
            consumers = [info for queue in queues for consumer in list(queue.consumers)
                         if (info := consumer_info(consumer))["channel_details"]["name"] == name]
            # per-queue and per-exchange figures are empty, as RabbitMQ's in its (and Warren's) basic rates mode
            return respond_one(request, dict(channel_info(context, channel), consumer_details=consumers,
                                             publishes=[], deliveries=[]))
    raise not_found()


def _consumers(request: web.Request, vhost: str | None) -> list[dict[str, Any]]:
    """Every consumer (of ``vhost``) for a monitoring user, else those on the user's own channels, as RabbitMQ
    3.10's rabbit_mgmt_wm_consumers (filter_user; no vhost access asked)."""
    context = ctx(request)
    user = auth.login(request)
    names = [vhost] if vhost is not None else context.broker.access.vhosts()
    found = [consumer_info(consumer) for name in names
             for queue in list(context.vhost(name).queues.values()) for consumer in list(queue.consumers)]
    return found if user.is_monitor else [c for c in found if c["channel_details"]["user"] == user.name]


@routes.get("/api/consumers")
async def list_consumers(request: web.Request) -> web.Response:
    return respond(request, _consumers(request, None), ("queue.vhost", "queue.name", "consumer_tag"))


@routes.get("/api/consumers/{vhost}")
async def list_vhost_consumers(request: web.Request) -> web.Response:
    vhost = request.match_info["vhost"]
    if not ctx(request).broker.access.vhost_exists(vhost):
        raise not_found()
    return respond(request, _consumers(request, vhost), ("queue.vhost", "queue.name", "consumer_tag"))
