"""Message rates: a sampler reads the counters (amqp_server.stats) every few seconds and keeps the
previous sample, so a rate is (now - then) / interval.  Queues' contents are never scanned: the
depths sampled are counts the queues keep anyway.
"""
from __future__ import annotations

import asyncio
import time
import weakref
from datetime import datetime, timezone
from typing import Any, Iterator

from amqp_server.broker import Broker
from amqp_server.frontend.clients import Clients

from .node_info import disk_free, fd_used, memory_used

DEFAULT_INTERVAL = 5.0  # RabbitMQ's collect_statistics_interval

# The message_stats keys each kind of object reports, as RabbitMQ's
QUEUE_STATS = ("publish", "deliver", "deliver_no_ack", "get", "get_no_ack", "get_empty", "ack", "redeliver",
               "deliver_get")
CHANNEL_STATS = ("publish", "confirm", "return_unroutable", "drop_unroutable", "deliver", "deliver_no_ack", "get",
                 "get_no_ack", "get_empty", "ack", "redeliver", "deliver_get")
QUEUE_SIDE = QUEUE_STATS[1:]  # a vhost's (or the node's) sums over its queues
DOOR_SIDE = ("publish", "confirm", "return_unroutable", "drop_unroutable")  # counted by the vhost as they happen
VHOST_STATS = DOOR_SIDE + QUEUE_SIDE
EXCHANGE_STATS = ("publish_in", "publish_out")
DISK_STATS = ("disk_reads", "disk_writes")
GAUGE_STATS = ("mem_used", "fd_used", "sockets_used", "disk_free")  # the node's, with rates of change
CHURN_STATS = ("connection_created", "connection_closed", "channel_created", "channel_closed", "queue_declared",
               "queue_created", "queue_deleted")


def disk_counters(broker: Broker) -> dict[str, int]:
    """Message records written to and read back from disk, and the bytes those reads took: the persistent
    store's and the pager's."""
    stores = (broker.persistence.store, broker.pager.store)
    return {"disk_reads": sum(store.reads for store in stores), "disk_writes": sum(store.writes for store in stores),
            "io_read_bytes": sum(store.read_bytes for store in stores)}


def node_gauges(broker: Broker, clients: Clients) -> dict[str, int]:
    return {"mem_used": memory_used(), "fd_used": fd_used(), "sockets_used": len(clients.connections),
            "disk_free": disk_free(broker.data_dir)}


def queue_depths(queues: Any) -> dict[str, int]:
    ready = unacked = 0
    for queue in queues:
        ready += queue.message_count
        unacked += queue.unacked
    return {"messages": ready + unacked, "messages_ready": ready, "messages_unacknowledged": unacked}


class _Series:
    """Two samples of one object's counters; rates are their difference over time."""

    __slots__ = ("at", "values", "rates", "moved_at")

    def __init__(self) -> None:
        self.at = 0.0
        self.values: dict[str, int] = {}
        self.rates: dict[str, float] = {}
        self.moved_at = time.monotonic()  # the last tick at which a counter had moved

    def add(self, now: float, values: dict[str, int], previous_tick: float | None) -> None:
        if not self.values and previous_tick is not None:
            # new since the last tick: then, its counters were all zero
            self.at, self.values = previous_tick, dict.fromkeys(values, 0)
        if self.values and now > self.at:
            elapsed = now - self.at
            previous = self.values
            # only counters that moved: most of 1,000 queues are idle, and a missing rate reads as 0.0
            self.rates = {key: round((value - previous.get(key, 0)) / elapsed, 1)
                          for key, value in values.items() if value != previous.get(key, 0)}
            if self.rates:
                self.moved_at = now
        self.at = now
        self.values = values


class Sampler:
    def __init__(self, broker: Broker, clients: Clients, interval: float = DEFAULT_INTERVAL) -> None:
        self.broker = broker
        self.clients = clients
        self.interval = interval
        self._objects: "weakref.WeakKeyDictionary[Any, _Series]" = weakref.WeakKeyDictionary()
        self._named: dict[str, _Series] = {}
        self._task: asyncio.Task | None = None
        self._last_tick: float | None = None
        self._live: dict[int, tuple[str, dict[str, int]]] = {}  # id(queue) -> (vhost, counters at the last tick)
        self._retired: dict[str, dict[str, int]] = {}  # per vhost: counters of queues deleted since
        self._exchanges: dict[tuple[str, str], _Series] = {}  # (vhost, name) -> series; exchanges have no weakrefs

    def vhost_counters(self, name: str) -> dict[str, int]:
        """A vhost's message_stats counters: publishes, confirms and unroutables as its channels and the API count
        them, the rest summed over its queues (those deleted included, as of the tick before they went)."""
        queues = list(self.broker.vhost(name).queues.values())
        return self._vhost_totals(name, [queue.stats.as_dict() for queue in queues])

    def _vhost_totals(self, name: str, queues: list[dict[str, int]]) -> dict[str, int]:
        totals = dict.fromkeys(VHOST_STATS, 0)
        for values in (self._retired.get(name, {}), *queues):
            for key in QUEUE_SIDE:
                totals[key] += values.get(key, 0)
        door = self.broker.vhost_stats(name)
        for key in DOOR_SIDE:
            totals[key] = getattr(door, key)
        return totals

    def _retire(self, live: dict[int, tuple[str, dict[str, int]]]) -> None:
        for key in self._live.keys() - live.keys():
            vhost, values = self._live[key]
            retired = self._retired.setdefault(vhost, {})
            for name in QUEUE_SIDE:
                retired[name] = retired.get(name, 0) + values.get(name, 0)
        self._live = live

    def _series(self, owner: Any) -> _Series:
        series = self._objects.get(owner)
        if series is None:
            series = self._objects[owner] = _Series()
        return series

    def _named_series(self, name: str) -> _Series:
        series = self._named.get(name)
        if series is None:
            series = self._named[name] = _Series()
        return series

    def _channels(self) -> Iterator[Any]:
        for connection in list(self.clients.connections):
            yield from list(connection.channels.values())

    def sample(self) -> None:
        now = time.monotonic()
        tick, self._last_tick = self._last_tick, now
        broker = self.broker
        live: dict[int, tuple[str, dict[str, int]]] = {}
        per_vhost: dict[str, list[dict[str, int]]] = {}
        for vhost in list(broker.vhosts.values()):
            counters = per_vhost[vhost.name] = []
            for queue in list(vhost.queues.values()):
                values = queue.stats.as_dict()
                live[id(queue)] = (vhost.name, values)
                counters.append(values)
                self._series(queue).add(now, dict(values, **queue_depths((queue,))), tick)
        self._retire(live)
        node: dict[str, int] = {}
        for vhost in list(broker.vhosts.values()):
            values = self._vhost_totals(vhost.name, per_vhost.get(vhost.name, []))
            for key, value in values.items():
                node[key] = node.get(key, 0) + value
            values.update(queue_depths(vhost.queues.values()))
            self._named_series("vhost:" + vhost.name).add(now, values, tick)
        exchanges: dict[tuple[str, str], _Series] = {}
        for vhost in list(broker.vhosts.values()):
            for exchange in list(vhost.exchanges.values()):
                named = (vhost.name, exchange.name)
                series = exchanges[named] = self._exchanges.get(named) or _Series()
                series.add(now, {"publish_in": exchange.publish_in, "publish_out": exchange.publish_out}, tick)
        self._exchanges = exchanges
        for channel in self._channels():
            self._series(channel).add(now, channel.stats.as_dict(), tick)
        for connection in list(self.clients.connections):
            self._series(connection).add(now, {"recv_oct": connection.recv_oct, "send_oct": connection.send_oct},
                                         tick)
        node.update(queue_depths(broker.all_queues()))
        node.update(disk_counters(broker))
        self._named_series("node").add(now, node, tick)
        self._named_series("churn").add(now, broker.churn.as_dict(), tick)
        self._named_series("gauges").add(now, node_gauges(broker, self.clients), tick)

    def rates(self, owner: Any) -> dict[str, float]:
        series = self._named.get(owner) if isinstance(owner, str) else self._objects.get(owner)
        return series.rates if series is not None else {}

    def idle_since(self, owner: Any) -> str | None:
        """When a queue or channel last did anything, if nothing within the last interval: RabbitMQ's
        ``idle_since`` (which its idle processes report), in its format; None while it is busy."""
        series = self._objects.get(owner)
        if series is None or series.rates:
            return None
        moved = time.time() - (time.monotonic() - series.moved_at)
        return datetime.fromtimestamp(moved, timezone.utc).isoformat(timespec="milliseconds")

    def exchange_rates(self, vhost: str, name: str) -> dict[str, float]:
        series = self._exchanges.get((vhost, name))
        return series.rates if series is not None else {}

    def vhost_rates(self, name: str) -> dict[str, float]:
        return self.rates("vhost:" + name)

    def node_rates(self) -> dict[str, float]:
        return self.rates("node")

    async def run(self) -> None:
        while True:
            self.sample()
            await asyncio.sleep(self.interval)

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self.run())

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            try:
                await self._task
            except asyncio.CancelledError:
                pass


_DETAILS = {key: key + "_details" for key in CHANNEL_STATS + EXCHANGE_STATS + CHURN_STATS + DISK_STATS + GAUGE_STATS}
_IDLE = {"rate": 0.0}  # shared by every idle counter of a listing: fewer objects, fewer GC passes; never mutated


def _details(rate: float) -> dict[str, float]:
    return {"rate": rate} if rate else _IDLE


def message_stats(counters: Any, rates: dict[str, float], keys: tuple[str, ...]) -> dict[str, Any]:
    """RabbitMQ's ``message_stats``: each of ``keys``' counters (a dict's items, or an object's attributes,
    e.g. MessageStats') plus ``<counter>_details: {rate}``."""
    value = counters.__getitem__ if isinstance(counters, dict) else counters.__getattribute__
    rate = rates.get
    result: dict[str, Any] = {}
    for key in keys:
        result[key] = value(key)
        result[_DETAILS[key]] = _details(rate(key, 0.0))
    return result


def depth_fields(depths: dict[str, int], rates: dict[str, float]) -> dict[str, Any]:
    """messages / messages_ready / messages_unacknowledged with their ``_details`` rates."""
    rate = rates.get
    return {"messages": depths["messages"], "messages_details": _details(rate("messages", 0.0)),
            "messages_ready": depths["messages_ready"],
            "messages_ready_details": _details(rate("messages_ready", 0.0)),
            "messages_unacknowledged": depths["messages_unacknowledged"],
            "messages_unacknowledged_details": _details(rate("messages_unacknowledged", 0.0))}
