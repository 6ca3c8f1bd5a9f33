"""/api/overview, /api/nodes, /api/aliveness-test, and empty lists for
features Warren doesn't have (parameters, extensions) so RabbitMQ tools keep working."""
from __future__ import annotations

import os
import time
from typing import Any, Iterable

from aiohttp import web
from pamqp import commands

from amqp_server import __version__, tls
from amqp_server.message import make_message
from amqp_server.publisher_flow import DISK, MEMORY
from exchanges import EXCHANGE_TYPES

from . import auth, health
from .connections import visible_connections
from .context import Context, ctx
from .definitions import RABBIT_VERSION
from .http import bad_request, json_response, no_content, not_found
from .listing import respond
from .node_info import fd_total
from .rates import (CHURN_STATS, DISK_STATS, GAUGE_STATS, VHOST_STATS, depth_fields, disk_counters, message_stats,
                    node_gauges, queue_depths)

routes = web.RouteTableDef()
ALIVENESS_QUEUE = "aliveness-test"


def exchange_types() -> list[dict[str, Any]]:
    return [{"name": name, "description": f"AMQP {name} exchange", "enabled": True} for name in sorted(EXCHANGE_TYPES)]


def listeners(context: Context) -> list[dict[str, Any]]:
    """Every listener of the node (rabbit_networking:active_listeners/0), sorted by protocol then port as
    rabbit_mgmt_wm_overview sorts them; the AMQPS one shows its ssl_options, the management ones their
    listener's options (rabbit_mgmt_app)."""
    config = context.config
    web = {"cowboy_opts": {"sendfile": False}}
    options: dict[str, Any] = {"amqp/ssl": tls.amqp_options(config), "http": {**web, "port": config.mgmt_port},
                               "https": {**web, "port": config.mgmt_tls_port, "ssl": True,
                                         "ssl_opts": {**tls.mgmt_options(config), "port": config.mgmt_tls_port}}}
    return [{"node": context.node, "protocol": protocol, "ip_address": config.bind, "port": port,
             "socket_opts": options.get(protocol, [])} for protocol, port in sorted(health.listeners(context))]


def http_contexts(context: Context) -> list[dict[str, Any]]:
    """The management listeners (rabbit_web_dispatch_registry:list_all/0): HTTP, and HTTPS with its ssl_opts,
    every value a string as rabbit_mgmt_external_stats:format_context/1 makes it."""
    config = context.config
    found = [{"node": context.node, "description": "RabbitMQ Management", "path": "/", "port": str(config.mgmt_port),
              "ip": config.bind}]
    if config.mgmt_tls:
        found.append({"node": context.node, "description": "RabbitMQ Management", "path": "/",
                      "port": str(config.mgmt_tls_port), "ip": config.bind, "ssl": "true",
                      "ssl_opts": {"port": str(config.mgmt_tls_port), **tls.mgmt_options(config)}})
    return sorted(found, key=lambda entry: entry["port"])  # (rabbit_mgmt_wm_overview sorts them by port)


def churn_rates(context: Context) -> dict[str, Any]:
    """Connections, channels and queues created/closed/declared/deleted, with rates, as RabbitMQ's."""
    return message_stats(context.broker.churn, context.sampler.rates("churn"), CHURN_STATS)


def node_info(context: Context) -> dict[str, Any]:
    config = context.config
    broker = context.broker
    return {
        "name": context.node, "type": "disc", "running": True, "being_drained": False,
        **message_stats(node_gauges(broker, context.clients), context.sampler.rates("gauges"), GAUGE_STATS),
        "mem_limit": config.memory_limit, "mem_alarm": context.flow.alarmed(MEMORY),
        "disk_free_limit": config.disk_free_limit, "disk_free_alarm": context.flow.alarmed(DISK),
        "fd_total": fd_total(), "sockets_total": fd_total(),
        "proc_used": 1, "proc_total": 1, "run_queue": 0, "processors": os.cpu_count() or 1,
        "uptime": int((time.time() - context.started) * 1000), "os_pid": str(os.getpid()),
        "partitions": [], "net_ticktime": 60, "rates_mode": "basic", "db_dir": config.data_dir,
        "exchange_types": exchange_types(), "auth_mechanisms": [
            {"name": "PLAIN", "description": "SASL PLAIN authentication mechanism", "enabled": True},
            {"name": "AMQPLAIN", "description": "QPid AMQPLAIN mechanism", "enabled": True}],
        "applications": [{"name": "warren", "description": "Warren AMQP broker", "version": __version__}],
        "enabled_plugins": ["rabbitmq_management"], "contexts": http_contexts(context),
        "config_files": [], "log_files": [], "cluster_links": [], **churn_rates(context), **store_io(context),
    }


def store_io(context: Context) -> dict[str, Any]:
    """The node's msg_store_read_count / msg_store_write_count, and io_read_bytes (what the message stores read
    from their files into memory: a body sent by ``sendfile`` is not), with rates, as RabbitMQ's."""
    io, rates = disk_counters(context.broker), context.sampler.node_rates()
    return {"io_read_bytes": io["io_read_bytes"], "io_read_bytes_details": {"rate": rates.get("io_read_bytes", 0.0)},
            "msg_store_read_count": io["disk_reads"],
            "msg_store_read_count_details": {"rate": rates.get("disk_reads", 0.0)},
            "msg_store_write_count": io["disk_writes"],
            "msg_store_write_count_details": {"rate": rates.get("disk_writes", 0.0)}}


def _sum(counters: Iterable[dict[str, int]]) -> dict[str, int]:
    total: dict[str, int] = {}
    for values in counters:
        for key, value in values.items():
            total[key] = total.get(key, 0) + value
    return total


@routes.get("/api/overview")
async def overview(request: web.Request) -> web.Response:
    context = ctx(request)
    user = auth.login(request)
    names = auth.visible_vhosts(request)
    vhosts = [context.vhost(name) for name in names]
    queues = [q for vhost in vhosts for q in list(vhost.queues.values())]
    rates = context.sampler.node_rates() if user.is_monitor else {}
    channels = sum(len(c.channels) for c in visible_connections(request))
    body = {
        "management_version": RABBIT_VERSION, "rates_mode": "basic", "exchange_types": exchange_types(),
        "product_version": __version__, "product_name": "Warren", "rabbitmq_version": RABBIT_VERSION,
        "cluster_name": context.broker.access.cluster_name(context.node),
        "erlang_version": "n/a", "erlang_full_version": "n/a",
        "disable_stats": False, "enable_queue_totals": True,
        "message_stats": message_stats(_sum([*(context.sampler.vhost_counters(n) for n in names),
                                             disk_counters(context.broker)]), rates, VHOST_STATS + DISK_STATS),
        "churn_rates": churn_rates(context),
        "queue_totals": depth_fields(queue_depths(queues), rates),
        "object_totals": {"connections": len(visible_connections(request)), "channels": channels,
                          "exchanges": sum(len(v.exchanges) for v in vhosts), "queues": len(queues),
                          "consumers": sum(len(q.consumers) for q in queues)},
        "statistics_db_event_queue": 0, "node": context.node,
        "listeners": listeners(context), "contexts": http_contexts(context),
        "sample_retention_policies": {"global": [600, 3600, 28800, 86400], "basic": [600, 3600], "detailed": [600]},
        "release_series_support_status": "supported",
    }
    return json_response(body)


# RabbitMQ 3.10's feature flags: all stable and enabled, each standing for what Warren does as RabbitMQ does
FEATURE_FLAGS = (
    ("classic_mirrored_queue_version", "Support setting version for classic mirrored queues", "rabbit"),
    ("drop_unroutable_metric", "Count unroutable publishes to be dropped in stats", "rabbitmq_management_agent"),
    ("empty_basic_get_metric", "Count AMQP `basic.get` on empty queues in stats", "rabbitmq_management_agent"),
    ("implicit_default_bindings", "Default bindings are now implicit, instead of being stored in the database",
     "rabbit"),
    ("maintenance_mode_status", "Maintenance mode status", "rabbit"),
    ("quorum_queue", "Support queues of type `quorum`", "rabbit"),
    ("stream_queue", "Support queues of type `stream`", "rabbit"),
    ("user_limits", "Configure connection and channel limits for a user", "rabbit"),
    ("virtual_host_metadata", "Virtual host metadata (description, tags, etc)", "rabbit"),
)


@routes.get("/api/feature-flags")
async def feature_flags(request: web.Request) -> web.Response:
    auth.require_admin(request)
    return respond(request, [{"name": name, "desc": desc, "doc_url": "", "state": "enabled", "stability": "stable",
                              "provided_by": provider} for name, desc, provider in FEATURE_FLAGS], ("name",))


@routes.put("/api/feature-flags/{name}/enable")
async def enable_feature_flag(request: web.Request) -> web.Response:
    """Every flag Warren knows is enabled from the start, so enabling one changes nothing (RabbitMQ's
    rabbit_feature_flags:enable of an enabled flag is ``ok``); a flag it does not know is RabbitMQ's
    ``unsupported``."""
    auth.require_admin(request)
    if request.match_info["name"] not in {name for name, _desc, _provider in FEATURE_FLAGS}:
        raise bad_request("unsupported")
    return no_content()


@routes.get("/api/auth")
async def auth_settings(request: web.Request) -> web.Response:
    """What the UI's login page asks first (no login needed): OAuth 2 (UAA) is not in use."""
    return json_response({"enable_uaa": False, "uaa_client_id": "", "uaa_location": ""})


def _monitored_node(request: web.Request) -> Context:
    """A monitoring user's request about this node (``{node}``: another is not found)."""
    auth.require_monitor(request)
    context = ctx(request)
    if request.match_info["node"] != context.node:
        raise not_found()
    return context


@routes.get("/api/auth/attempts/{node}")
async def auth_attempts(request: web.Request) -> web.Response:
    counts = _monitored_node(request).broker.auth_attempts.counts
    return json_response([{"protocol": protocol, "auth_attempts": ok + failed, "auth_attempts_failed": failed,
                           "auth_attempts_succeeded": ok} for protocol, (ok, failed) in counts.items()])


@routes.delete("/api/auth/attempts/{node}")
@routes.delete("/api/auth/attempts/{node}/source")
async def reset_auth_attempts(request: web.Request) -> web.Response:
    """Both of RabbitMQ's paths reset every count of the node (monitoring users may)."""
    _monitored_node(request).broker.auth_attempts.reset()
    return no_content()


@routes.get("/api/auth/attempts/{node}/source")
async def auth_attempts_by_source(request: web.Request) -> web.Response:
    """Empty, as RabbitMQ's while it does not track sources (its default)."""
    auth.require_monitor(request)
    if request.match_info["node"] != ctx(request).node:
        raise not_found()
    return json_response([])


@routes.get("/api/nodes")
async def nodes(request: web.Request) -> web.Response:
    auth.require_monitor(request)
    context = ctx(request)
    others = context.broker.cluster.nodes() if context.broker.cluster is not None else []
    return respond(request, [node_info(context)] + [{"name": name, "running": up, "type": "disc"}
                                                    for name, up in others], ("name",))


@routes.get("/api/nodes/{name}")
async def node(request: web.Request) -> web.Response:
    auth.require_monitor(request)
    context = ctx(request)
    if request.match_info["name"] != context.node:
        raise not_found()
    return json_response(node_info(context))


@routes.delete("/api/nodes/{name}")
async def forget_node(request: web.Request) -> web.Response:
    """Warren: remove a stopped node from the cluster for good, with its queues (rabbitmqctl forget_cluster_node)."""
    auth.require_admin(request)
    cluster = ctx(request).broker.cluster
    name = request.match_info["name"]
    if cluster is None or name not in dict(cluster.nodes()):
        raise not_found()
    try:
        await cluster.forget(name)
    except ValueError as exc:
        raise bad_request(str(exc)) from None
    return no_content()


@routes.get("/api/aliveness-test/{vhost}")
async def aliveness(request: web.Request) -> web.Response:
    """Declare ``aliveness-test``, publish to it and get the message back, as RabbitMQ does."""
    context = ctx(request)
    broker = context.broker
    vhost = context.vhost(auth.require_vhost(request))
    who = auth.principal(request, vhost.name)  # as RabbitMQ's, through the user's own channel operations
    broker.declare_queue(vhost, ALIVENESS_QUEUE, durable=False, who=who)
    exchange = vhost.exchange("")
    broker.check_publish(vhost, exchange, who, ALIVENESS_QUEUE)
    broker.publish(vhost, exchange, make_message("", ALIVENESS_QUEUE, commands.Basic.Properties(), b"test_message"))
    _, entry = broker.get_local(vhost, ALIVENESS_QUEUE, no_ack=True, who=who)
    if entry is None or entry.message.body != b"test_message":
        return json_response({"status": "failed", "reason": "message not received"}, 503)
    return json_response({"status": "ok"})


@routes.get("/api/extensions")
async def empty_list(request: web.Request) -> web.Response:
    return json_response([])
