"""/metrics in Prometheus text format (no auth, as RabbitMQ's prometheus plugin): queue depths and rates,
connections, channels, consumers, process memory, the message store's disk use, dead fraction and
compactions, and RabbitMQ's global message counters by protocol (amqp091, amqp10, stream), which never go down
as connections close."""
from __future__ import annotations

from typing import Callable, Iterable

from aiohttp import web

from amqp_server.publisher_flow import DISK, MEMORY
from amqp_server.stats import MessageStats

from .context import ctx
from .node_info import fd_used, memory_used

routes = web.RouteTableDef()
CONTENT_TYPE = "text/plain"  # ; version=0.0.4 is added as a charset-free parameter below
RATE_KEYS = ("publish", "deliver_get", "ack", "redeliver")
# RabbitMQ's protocol label of each front end (the HTTP API's protocol name), every one listed even before use
PROTOCOL_LABELS = {"AMQP 0-9-1": "amqp091", "AMQP 1.0": "amqp10", "stream": "stream"}
# rabbitmq_global_messages_*_total: what each counts, from MessageStats
GLOBAL_COUNTERS: tuple[tuple[str, str, Callable[[MessageStats], int]], ...] = (
    ("received", "Total number of messages received from publishers", lambda s: s.publish),
    ("routed", "Total number of messages routed to queues or streams",
     lambda s: s.publish - s.drop_unroutable - s.return_unroutable),
    ("unroutable_dropped", "Total number of messages published as non-mandatory into an exchange and dropped as "
     "unroutable", lambda s: s.drop_unroutable),
    ("unroutable_returned", "Total number of messages published as mandatory into an exchange and returned to the "
     "publisher as unroutable", lambda s: s.return_unroutable),
    ("confirmed", "Total number of messages confirmed to publishers", lambda s: s.confirm),
    ("delivered", "Total number of messages delivered to consumers", lambda s: s.deliver_get),
    ("delivered_consume_auto_ack", "Total number of messages delivered to consumers using basic.consume with "
     "automatic acknowledgment", lambda s: s.deliver_no_ack),
    ("delivered_consume_manual_ack", "Total number of messages delivered to consumers using basic.consume with "
     "manual acknowledgment", lambda s: s.deliver),
    ("delivered_get_auto_ack", "Total number of messages delivered to consumers using basic.get with automatic "
     "acknowledgment", lambda s: s.get_no_ack),
    ("delivered_get_manual_ack", "Total number of messages delivered to consumers using basic.get with manual "
     "acknowledgment", lambda s: s.get),
    ("get_empty", "Total number of times basic.get operations fetched no message", lambda s: s.get_empty),
    ("redelivered", "Total number of messages redelivered to consumers", lambda s: s.redeliver),
    ("acknowledged", "Total number of messages acknowledged by consumers", lambda s: s.ack),
)


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


class Exposition:
    def __init__(self) -> None:
        self.lines: list[str] = []

    def family(self, name: str, kind: str, help_text: str,
               samples: Iterable[tuple[dict[str, str], float]]) -> None:
        self.lines.append(f"# HELP {name} {help_text}")
        self.lines.append(f"# TYPE {name} {kind}")
        for labels, value in samples:
            if labels:
                rendered = ",".join(f'{k}="{_escape(v)}"' for k, v in labels.items())
                self.lines.append(f"{name}{{{rendered}}} {value}")
            else:
                self.lines.append(f"{name} {value}")

    def text(self) -> str:
        return "\n".join(self.lines) + "\n"


def render(request: web.Request) -> str:
    context = ctx(request)
    broker = context.broker
    sampler = context.sampler
    queues = list(broker.all_queues())
    labels = [{"vhost": q.vhost, "queue": q.name} for q in queues]
    out = Exposition()
    out.family("rabbitmq_queue_messages", "gauge", "Messages ready and unacknowledged",
               ((lab, q.message_count + q.unacked) for lab, q in zip(labels, queues)))
    out.family("rabbitmq_queue_messages_ready", "gauge", "Messages ready to be delivered",
               ((lab, q.message_count) for lab, q in zip(labels, queues)))
    out.family("rabbitmq_queue_messages_unacked", "gauge", "Messages delivered and not yet acknowledged",
               ((lab, q.unacked) for lab, q in zip(labels, queues)))
    out.family("rabbitmq_queue_messages_ready_bytes", "gauge", "Bytes of ready message bodies",
               ((lab, q.ready_bytes) for lab, q in zip(labels, queues)))
    out.family("rabbitmq_queue_consumers", "gauge", "Consumers on the queue",
               ((lab, len(q.consumers)) for lab, q in zip(labels, queues)))
    out.family("rabbitmq_queue_messages_published_total", "counter", "Messages published to the queue",
               ((lab, q.stats.publish) for lab, q in zip(labels, queues)))
    out.family("rabbitmq_queue_messages_delivered_total", "counter", "Messages delivered or got from the queue",
               ((lab, q.stats.as_dict()["deliver_get"]) for lab, q in zip(labels, queues)))
    out.family("rabbitmq_queue_messages_acked_total", "counter", "Messages acknowledged",
               ((lab, q.stats.ack) for lab, q in zip(labels, queues)))
    for key in RATE_KEYS:
        out.family(f"warren_queue_{key}_rate", "gauge", f"{key} messages per second over the last sample interval",
                   ((lab, sampler.rates(q).get(key, 0.0)) for lab, q in zip(labels, queues)))
    connections = [c for c in list(context.clients.connections) if c.user is not None]
    out.family("rabbitmq_connections", "gauge", "Open AMQP connections", [({}, len(connections))])
    out.family("rabbitmq_channels", "gauge", "Open AMQP channels",
               [({}, sum(len(c.channels) for c in connections))])
    out.family("rabbitmq_consumers", "gauge", "Consumers", [({}, sum(len(q.consumers) for q in queues))])
    out.family("rabbitmq_queues", "gauge", "Queues", [({}, len(queues))])
    out.family("rabbitmq_process_resident_memory_bytes", "gauge",
               "Resident memory the node process holds (its own pages, not the page cache's)", [({}, memory_used())])
    out.family("rabbitmq_resident_memory_limit_bytes", "gauge", "Memory high watermark",
               [({}, context.config.memory_limit)])
    out.family("rabbitmq_alarms_memory_used_watermark", "gauge", "1 while the memory alarm blocks publishers",
               [({}, int(context.flow.alarmed(MEMORY)))])
    out.family("rabbitmq_alarms_free_disk_space_watermark", "gauge", "1 while the disk alarm blocks publishers",
               [({}, int(context.flow.alarmed(DISK)))])
    out.family("rabbitmq_process_open_fds", "gauge", "Open file descriptors", [({}, fd_used())])
    stats = broker.persistence.store.stats()
    out.family("warren_message_store_messages", "gauge", "Messages in the persistent message store",
               [({}, stats.messages)])
    out.family("warren_message_store_segments", "gauge", "Segment files of the message store",
               [({}, stats.segments)])
    out.family("warren_message_store_disk_bytes", "gauge", "Bytes the message store's segments use on disk",
               [({}, stats.disk_bytes)])
    out.family("warren_message_store_dead_bytes", "gauge", "Bytes of removed messages not yet compacted away",
               [({}, stats.dead_bytes)])
    out.family("warren_message_store_dead_fraction", "gauge", "Dead bytes / disk bytes",
               [({}, round(stats.dead_fraction, 6))])
    out.family("warren_message_store_compactions_total", "counter", "Segment compactions run",
               [({}, stats.compactions)])
    out.family("warren_message_store_writes_total", "counter", "Message records appended to the store",
               [({}, stats.writes)])
    out.family("warren_message_store_reads_total", "counter", "Message records read back from segment files",
               [({}, stats.reads)])
    by_protocol = context.clients.stats_by_protocol()
    counted = [(label, by_protocol.get(protocol) or MessageStats()) for protocol, label in PROTOCOL_LABELS.items()]
    for key, help_text, value in GLOBAL_COUNTERS:
        out.family(f"rabbitmq_global_messages_{key}_total", "counter", help_text,
                   (({"protocol": label}, value(stats)) for label, stats in counted))
    if broker.cluster is not None:
        lag = broker.cluster.quorum.lag()
        out.family("warren_quorum_follower_lag", "gauge",
                   "Log entries a follower of a quorum queue led here has yet to make durable",
                   ((dict(zip(("vhost", "queue"), key.split("\0", 1)), follower=follower), behind)
                    for key, followers in lag.items() for follower, behind in followers.items()))
    return out.text()


@routes.get("/metrics")
async def metrics(request: web.Request) -> web.Response:
    response = web.Response(text=render(request), content_type=CONTENT_TYPE)
    response.headers["Content-Type"] = "text/plain; version=0.0.4; charset=utf-8"
    return response
