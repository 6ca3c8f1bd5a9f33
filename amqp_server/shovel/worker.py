"""One running dynamic shovel (RabbitMQ's ``rabbit_shovel_worker`` with ``rabbit_amqp091_shovel`` on both sides).

It connects to a source and a destination URI (each list tried in turn, starting after the one that failed last),
declares what RabbitMQ's shovel declares (the named queues if missing, durable; for ``src-exchange`` an exclusive
server-named queue bound with ``src-exchange-key``), consumes with ``src-prefetch-count`` and publishes each message
on.  ``on-confirm`` acks a message upstream only once the destination confirmed it, so nothing is lost whatever
fails; ``on-publish`` acks once it is written, ``no-ack`` consumes without acks.  Any failure ends both connections:
the shovel reports ``terminated`` with the reason, waits ``reconnect-delay`` seconds and starts again (0: it stays
terminated, as in RabbitMQ).  Unacked messages go back to the source queue when its connection goes.

``src-delete-after`` (``queue-length``: the source's length when the shovel started, or a number) stops it after so
many messages, confirmed under ``on-confirm``; it then clears its own parameter, as RabbitMQ's does.
"""
from __future__ import annotations

import asyncio
import datetime
import logging
import time
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any, Awaitable, Callable

from pamqp import commands

from ..logs import untrusted
from . import uri as uri_module
from .client import ChannelClosed, Client, ClientError, header_payload, read_properties
from .definition import Definition

log = logging.getLogger("warren.shovel")
CHANNEL = 1  # the working channel on each side
DECLARE_CHANNEL = 2  # passive declares (a 404 closes it, not the working one)


@dataclass
class Endpoint:
    """Where and as whom a URI connects: a remote broker, or this node's own listener for ``amqp://``."""

    host: str
    port: int
    user: str
    password: str


Resolve = Callable[[uri_module.AMQPURI], Endpoint]


class Finished(Exception):
    """src-delete-after reached: the shovel is done."""


class Worker:
    def __init__(self, vhost: str, name: str, definition: Definition, resolve: Resolve, cluster_name: str,
                 on_finished: Callable[[], Awaitable[None]]) -> None:
        self.vhost = vhost
        self.name = name
        self.definition = definition
        self._resolve = resolve
        self._cluster_name = cluster_name
        self._on_finished = on_finished
        self.state = "starting"
        self.reason = ""
        self.timestamp = datetime.datetime.now()
        self.src_uri = self.dest_uri = ""
        self.moved = 0  # messages published on (for the status and tests)
        self._attempts = [0, 0]  # the next URI to try, per side
        self._task: asyncio.Task[None] | None = None
        self._src: Client | None = None
        self._dest: Client | None = None

    # -- life ---------------------------------------------------------------------------------

    def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name=f"shovel {self.vhost}/{self.name}")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            try:
                await self._task
            except (asyncio.CancelledError, Exception):
                pass
        self._close()

    def _report(self, state: str, reason: str = "") -> None:
        self.state, self.reason, self.timestamp = state, reason, datetime.datetime.now()

    def status(self) -> dict[str, Any]:
        """RabbitMQ's fields (rabbit_shovel_mgmt:format/2), with this node's name added by the caller."""
        t = self.timestamp  # as rabbit_shovel_mgmt prints it: the hour not padded
        fields: dict[str, Any] = {"timestamp": f"{t:%Y-%m-%d} {t.hour}:{t:%M:%S}", "name": self.name,
                                  "vhost": self.vhost, "type": "dynamic", "state": self.state}
        if self.state == "running":
            fields.update(src_uri=self.src_uri, src_protocol="amqp091", dest_protocol="amqp091",
                          dest_uri=self.dest_uri, **self.definition.endpoints())
        elif self.state == "terminated":
            fields["reason"] = self.reason
        return fields

    async def _run(self) -> None:
        while True:
            self._report("starting")
            try:
                await self._session()
            except Finished:
                self._close()
                log.info("shovel %s in vhost %s: done (src-delete-after)", untrusted(self.name),
                         untrusted(self.vhost))
                await self._on_finished()
                return
            except (ClientError, OSError) as exc:
                reason = str(exc)
            except Exception as exc:  # a bug must not end the shovel for good
                log.exception("shovel %s in vhost %s failed", untrusted(self.name), untrusted(self.vhost))
                reason = f"{{{type(exc).__name__},{exc}}}"
            self._close()
            self._report("terminated", reason)
            log.warning("shovel %s in vhost %s terminated: %s", untrusted(self.name), untrusted(self.vhost),
                        untrusted(reason))
            delay = self.definition.reconnect_delay
            if delay <= 0:  # (RabbitMQ: 0 leaves it terminated; so does a negative delay here, not a busy loop)
                return
            await asyncio.sleep(delay)

    def _close(self) -> None:
        for client in (self._src, self._dest):
            if client is not None:
                try:
                    client.close()
                except Exception:  # closing is best effort: the socket goes whatever happens
                    log.exception("shovel %s: closing a connection failed", untrusted(self.name))
        self._src = self._dest = None

    # -- connecting ---------------------------------------------------------------------------

    async def _connect(self, side: int, uris: list[str]) -> tuple[Client, str]:
        """The first URI of ``uris`` that connects, starting after the one that failed last."""
        error: ClientError | None = None
        for _ in range(len(uris)):
            text = uris[self._attempts[side] % len(uris)]
            parsed = uri_module.parse(text)
            endpoint = self._resolve(parsed)
            try:
                client = await Client.connect(parsed, endpoint.host, endpoint.port, endpoint.user, endpoint.password,
                                              f"Shovel {self.name}")
            except ClientError as exc:
                error = exc
                self._attempts[side] += 1
                continue
            return client, uri_module.redacted(text)
        assert error is not None
        raise error

    async def _ensure_queue(self, client: Client, queue: str, arguments: dict[str, Any]) -> int:
        """The queue's length, declared durable with ``arguments`` if it is missing (RabbitMQ's ensure_queue)."""
        await client.open_channel(DECLARE_CHANNEL, working=False)
        try:
            ok = await client.call(DECLARE_CHANNEL, commands.Queue.Declare(queue=queue, passive=True))
        except ChannelClosed as exc:
            if exc.code != 404:
                raise ClientError(f"{{shutdown,{exc}}}") from None
            await client.open_channel(DECLARE_CHANNEL, working=False)
            try:
                ok = await client.call(DECLARE_CHANNEL, commands.Queue.Declare(queue=queue, durable=True,
                                                                               arguments=arguments))
            except ChannelClosed as refused:
                raise ClientError(f"{{shutdown,{refused}}}") from None
        await client.close_channel(DECLARE_CHANNEL)
        return ok.message_count

    async def _session(self) -> None:
        definition = self.definition
        src, self.src_uri = await self._connect(0, definition.src_uris)
        self._src = src
        dest, self.dest_uri = await self._connect(1, definition.dest_uris)
        self._dest = dest
        if definition.dest_queue is not None:
            await self._ensure_queue(dest, definition.dest_queue, definition.dest_queue_args)
        await dest.open_channel(CHANNEL)
        on_confirm = definition.ack_mode == "on-confirm"
        if on_confirm:
            await dest.call(CHANNEL, commands.Confirm.Select())
        remaining: int | None = definition.delete_after if isinstance(definition.delete_after, int) else None
        if definition.src_queue is not None:
            length = await self._ensure_queue(src, definition.src_queue, definition.src_queue_args)
            if definition.delete_after == "queue-length":
                remaining = length
            queue = definition.src_queue
        await src.open_channel(CHANNEL)
        if definition.src_queue is None:
            ok = await src.call(CHANNEL, commands.Queue.Declare(exclusive=True))
            queue = ok.queue
            await src.call(CHANNEL, commands.Queue.Bind(queue=queue, exchange=definition.src_exchange or "",
                                                        routing_key=definition.src_exchange_key))
        if remaining is not None and remaining <= 0:
            raise Finished
        transfer = _Transfer(self, src, dest, remaining)
        no_ack = definition.ack_mode == "no-ack"
        if not no_ack:
            await src.call(CHANNEL, commands.Basic.Qos(prefetch_count=definition.prefetch))
        src.on_deliver[CHANNEL] = transfer.delivered
        dest.on_confirm[CHANNEL] = transfer.confirmed
        dest.on_writable = transfer.writable
        await src.call(CHANNEL, commands.Basic.Consume(queue=queue, no_ack=no_ack))
        self._report("running")
        log.info("shovel %s in vhost %s running: %s -> %s", untrusted(self.name), untrusted(self.vhost),
                 self.src_uri, self.dest_uri)
        await asyncio.wait([src.closed, dest.closed, transfer.finished],  # type: ignore[type-var]
                           return_when=asyncio.FIRST_COMPLETED)
        if transfer.finished.done():
            raise Finished
        raise (src.closed.result() if src.closed.done() else dest.closed.result())

    # -- forward headers ----------------------------------------------------------------------

    def forward_headers(self) -> dict[str, Any]:
        """The table RabbitMQ's shovel prepends to ``x-shovelled`` (rabbit_shovel_util:update_headers)."""
        definition = self.definition
        table: dict[str, Any] = {"shovelled-by": self._cluster_name, "shovel-type": "dynamic",
                                 "shovel-name": self.name, "shovel-vhost": self.vhost,
                                 "src-uri": self.src_uri, "dest-uri": self.dest_uri}
        if definition.src_queue is not None:
            table["src-queue"] = definition.src_queue
        else:
            table.update({"src-exchange": definition.src_exchange or "",
                          "src-exchange-key": definition.src_exchange_key})
        for key, item in (("dest-exchange", definition.dest_exchange),
                          ("dest-exchange-key", definition.dest_exchange_key), ("dest-queue", definition.dest_queue)):
            if item is not None:
                table[key] = item
        return table


class _Transfer:
    """One session's flow: deliveries in, publishes out, confirms back to acks."""

    def __init__(self, worker: Worker, src: Client, dest: Client, remaining: int | None) -> None:
        self.worker = worker
        self.definition = worker.definition
        self.src = src
        self.dest = dest
        self.mode = self.definition.ack_mode
        self.remaining = remaining  # messages still to publish (src-delete-after), None: no limit
        self.unconfirmed = remaining  # ... and to be confirmed (on-confirm) or published (other modes)
        self.pending: OrderedDict[int, int] = OrderedDict()  # destination publish seq -> source delivery tag
        self.seq = 0
        self.finished: asyncio.Future[None] = asyncio.get_running_loop().create_future()

    def writable(self, ok: bool) -> None:
        """The destination's socket is full (or drained again): stop (or resume) reading from the source."""
        transport = self.src.transport
        if transport is not None:
            (transport.resume_reading if ok else transport.pause_reading)()

    def delivered(self, tag: int, exchange: str, routing_key: str, header: bytes, body: bytes) -> None:
        if self.remaining is not None:
            if self.remaining <= 0:
                return  # past src-delete-after: left unacked, it goes back to the queue when we close
            self.remaining -= 1
        definition = self.definition
        exchange, routing_key = definition.destination(exchange, routing_key)
        if definition.changes_properties:
            header = self._changed(header, len(body))
        self.dest.publish(CHANNEL, exchange, routing_key, header, body)
        self.worker.moved += 1
        if self.mode == "on-confirm":
            self.seq += 1
            self.pending[self.seq] = tag
            return
        if self.mode == "on-publish":
            self.src.ack(CHANNEL, tag, False)
        self._count_done(1)

    def _changed(self, header: bytes, size: int) -> bytes:
        properties = read_properties(header)
        definition = self.definition
        definition.set_properties(properties)
        headers = dict(properties.headers or {})
        if definition.add_forward_headers:
            previous = headers.get("x-shovelled")
            headers["x-shovelled"] = [self.worker.forward_headers(), *(previous if isinstance(previous, list) else [])]
        if definition.add_timestamp_header:
            headers["x-shovelled-timestamp"] = int(time.time())
        if definition.add_forward_headers or definition.add_timestamp_header:
            properties.headers = headers
        return header_payload(properties, size)

    def confirmed(self, seq: int, multiple: bool, nack: bool) -> None:
        pending = self.pending
        if not multiple:
            tag = pending.pop(seq, None)
            if tag is not None:
                self.src.ack(CHANNEL, tag, False, nack)
                self._count_done(1)
            return
        tags: list[int] = []
        while pending:
            first = next(iter(pending))
            if first > seq:
                break
            tags.append(pending.pop(first))
        if tags:  # the source's tags grow with the destination's seqs: none below these is still pending
            self.src.ack(CHANNEL, tags[-1], True, nack)
            self._count_done(len(tags))

    def _count_done(self, count: int) -> None:
        if self.unconfirmed is None:
            return
        self.unconfirmed -= count
        if self.unconfirmed <= 0 and not self.finished.done():
            self.finished.set_result(None)
