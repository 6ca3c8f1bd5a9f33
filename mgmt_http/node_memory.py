"""/api/nodes/{node}/memory[/relative]: the node's memory by use, in RabbitMQ's shape (rabbit_mgmt_wm_node_memory
over rabbit_vm:memory/0), with what Warren measures in it.

Measured: ``total`` (``rss``, as ``mem_used`` counts it: the process's own resident pages; Warren has no allocator
figure apart, so ``erlang`` and ``allocated`` are the same), ``connection_writers`` (output buffered for clients
that have not read it), ``queue_procs`` and ``quorum_queue_procs`` (message bodies classic and quorum queues hold
in memory: their ``message_bytes_ram``), ``msg_index`` (the message stores' location index), ``binary`` (bodies
the message stores hold in memory: read back and cached, or not flushed yet), and ``other_proc``, the rest of the
resident memory (the interpreter, its objects and code).  Every other category is 0: Warren has no such part
(streams hold their messages in their files), or does not measure it apart (it is then in ``other_proc``)."""
from __future__ import annotations

from typing import Any

from aiohttp import web

from amqp_server.broker import Broker

from . import auth
from .context import Context, ctx
from .http import json_response, not_found
from .node_info import memory_used

routes = web.RouteTableDef()
CATEGORIES = (  # rabbit_vm:memory/0's, in its order
    "connection_readers", "connection_writers", "connection_channels", "connection_other", "queue_procs",
    "queue_slave_procs", "quorum_queue_procs", "quorum_queue_dlx_procs", "stream_queue_procs",
    "stream_queue_replica_reader_procs", "stream_queue_coordinator_procs", "plugins", "other_proc", "metrics",
    "mgmt_db", "mnesia", "quorum_ets", "other_ets", "binary", "msg_index", "code", "atom", "other_system",
    "allocated_unused", "reserved_unallocated")


def breakdown(context: Context) -> dict[str, Any]:
    """rabbit_vm:memory/0's categories, those Warren measures filled in."""
    broker = context.broker
    rss = memory_used()
    measured = dict.fromkeys(CATEGORIES, 0)
    measured["connection_writers"] = sum(connection.transport.get_write_buffer_size()
                                         for connection in list(context.clients.connections)
                                         if connection.transport is not None)
    for queue in _queues(broker):
        measured[queue.type.memory_category] += queue.type.held_bytes(queue)
    stores = (broker.persistence.store, broker.pager.store)
    measured["msg_index"] = sum(store.index.memory() for store in stores)
    measured["binary"] = sum(store.buffered_bytes for store in stores)
    measured["other_proc"] = max(rss - sum(measured.values()), 0)
    return {**measured, "strategy": "rss", "total": {"erlang": rss, "rss": rss, "allocated": rss}}


def _queues(broker: Broker) -> list[Any]:
    return [queue for name in broker.access.vhosts() for queue in list(broker.vhost(name).queues.values())]


def relative(memory: dict[str, Any]) -> dict[str, Any]:
    """rabbit_mgmt_wm_node_memory:format(relative, ...): each category in percent of ``rss`` (rounded half up, and
    at least 1 where it is not 0), ``total`` 100, no ``strategy``."""
    total = max(memory["total"]["rss"], 1)

    def percentage(part: int) -> int:
        share = int(part / total * 100 + 0.5)
        return 1 if share == 0 and part else share

    return {"total": 100, **{key: percentage(memory[key]) for key in CATEGORIES}}


def _memory(request: web.Request, relative_to_rss: bool) -> web.Response:
    """Monitoring users; another node of the cluster is ``not_available`` (Warren cannot ask it for its figures,
    as RabbitMQ answers when its rpc fails), a node not in it 404."""
    auth.require_monitor(request)
    context = ctx(request)
    node = request.match_info["node"]
    if node == context.node:
        memory = breakdown(context)
        return json_response({"memory": relative(memory) if relative_to_rss else memory})
    cluster = context.broker.cluster
    if cluster is None or node not in dict(cluster.nodes()):
        raise not_found()
    return json_response({"memory": "not_available"})


@routes.get("/api/nodes/{node}/memory")
async def memory(request: web.Request) -> web.Response:
    return _memory(request, False)


@routes.get("/api/nodes/{node}/memory/relative")
async def memory_relative(request: web.Request) -> web.Response:
    return _memory(request, True)


__all__ = ["routes"]
