"""One running dynamic shovel (RabbitMQ's ``rabbit_shovel_worker`` with ``rabbit_amqp091_shovel`` on both sides).

It connects to a source and a destination URI (each list tried in turn, starting after the one that failed last),
declares what RabbitMQ's shovel declares (the named queues if missing, durable; for ``src-exchange`` an exclusive
server-named queue bound with ``src-exchange-key``), consumes with ``src-prefetch-count`` and publishes each message
on.  ``on-confirm`` acks a message upstream only once the destination confirmed it, so nothing is lost whatever
fails; ``on-publish`` acks once it is written, ``no-ack`` consumes without acks.  Any failure ends both connections:
the shovel reports ``terminated`` with the reason, waits ``reconnect-delay`` seconds and starts again (anything
but a whole number above 0 — 0, 0.5 — leaves it terminated, as in RabbitMQ).  Unacked messages go back to the
source queue when its connection goes.

``src-delete-after`` (``queue-length``: the source's length when the shovel started, or a number) stops it after so
many messages, confirmed under ``on-confirm``; it then clears its own parameter, as RabbitMQ's does.
"""
from __future__ import annotations

import logging
import struct
import time
from typing import Any, Awaitable, Callable

from pamqp import commands

from ..framing import header_table
from ..framing.header_table import Field
from ..links.amqp_client import ChannelClosed, Client, ClientError
from ..links.link import CHANNEL, Finished, Link, Resolve, Transfer, status_time
from ..logs import untrusted
from .definition import Definition

log = logging.getLogger("warren.shovel")


class Worker(Link):
    PRODUCT = "Warren shovel"

    def __init__(self, vhost: str, name: str, definition: Definition, resolve: Resolve, cluster_name: str,
                 on_finished: Callable[[], Awaitable[None]]) -> None:
        super().__init__(f"shovel {untrusted(name)} in vhost {untrusted(vhost)}", f"Shovel {name}", resolve,
                         definition.restart_delay)
        self.vhost = vhost
        self.name = name
        self.definition = definition
        self._cluster_name = cluster_name
        self._on_finished = on_finished
        self.src_uri = self.dest_uri = ""

    async def _finished(self) -> None:
        await self._on_finished()

    def status(self) -> dict[str, Any]:
        """RabbitMQ's fields (rabbit_shovel_mgmt:format/2), with this node's name added by the caller."""
        fields: dict[str, Any] = {"timestamp": status_time(self.timestamp), "name": self.name,
                                  "vhost": self.vhost, "type": "dynamic", "state": self.state}
        if self.state == "running":
            fields.update(src_uri=self.src_uri, src_protocol="amqp091", dest_protocol="amqp091",
                          dest_uri=self.dest_uri, **self.definition.endpoints())
        elif self.state == "terminated":
            fields["reason"] = self.reason
        return fields

    # -- connecting ---------------------------------------------------------------------------

    @staticmethod
    async def _ensure_queue(client: Client, queue: str, arguments: dict[str, Any]) -> int:
        """The queue's length, declared durable with ``arguments`` if it is missing (RabbitMQ's ensure_queue)."""
        try:
            ok = await client.disposable_call(commands.Queue.Declare(queue=queue, passive=True))
        except ChannelClosed as exc:
            if exc.code != 404:
                raise ClientError(f"{{shutdown,{exc}}}") from None
            try:
                ok = await client.disposable_call(commands.Queue.Declare(queue=queue, durable=True,
                                                                         arguments=arguments))
            except ChannelClosed as refused:
                raise ClientError(f"{{shutdown,{refused}}}") from None
        return ok.message_count

    async def _session(self) -> None:
        definition = self.definition
        src, self.src_uri = await self._connect(0, definition.src_uris)
        dest, self.dest_uri = await self._connect(1, definition.dest_uris)
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
            if definition.delete_after == "queue-length":  # (RabbitMQ's remaining/2: the new queue's length, 0)
                remaining = ok.message_count
            await src.call(CHANNEL, commands.Queue.Bind(queue=queue, exchange=definition.src_exchange or "",
                                                        routing_key=definition.src_exchange_key))
        if remaining is not None and remaining <= 0:
            raise Finished
        no_ack = definition.ack_mode == "no-ack"
        if not no_ack:
            await src.call(CHANNEL, commands.Basic.Qos(prefetch_count=definition.prefetch))
        transfer = Transfer(self, src, dest, definition.ack_mode, self._forward, remaining)
        await src.call(CHANNEL, commands.Basic.Consume(queue=queue, no_ack=no_ack))
        self._running(f"{self.src_uri} -> {self.dest_uri}")
        await self._until_closed(transfer.finished)
        raise Finished

    def _forward(self, redelivered: bool, exchange: str, routing_key: str, header: bytes,
                 size: int) -> tuple[str, str, bytes]:
        """Where RabbitMQ's shovel publishes a message (its PubFun), with the properties it changes."""
        definition = self.definition
        exchange, routing_key = definition.destination(exchange, routing_key)
        if definition.changes_properties:
            header = self._changed(header, size)
        return exchange, routing_key, header

    def _changed(self, header: bytes, size: int) -> bytes:
        """RabbitMQ's props_fun: the publish-properties set, then x-shovelled prepended and x-shovelled-timestamp
        (a long) set in the message's own typed table (rabbit_shovel_util), whose other headers keep their types
        and values."""
        definition = self.definition
        header = definition.set_properties(header)
        if not (definition.add_forward_headers or definition.add_timestamp_header):
            return header
        flags = header[12] << 8 | header[13]
        try:
            fields = header_table.headers(header, flags)
        except (header_table.NotInTable, ValueError, IndexError, struct.error):
            log.warning("%s: a message's headers cannot be read: it goes on without the shovel's", self.what)
            return header
        if definition.add_forward_headers:
            fields = header_table.prepend_table(fields, "x-shovelled", self.forward_headers())
        if definition.add_timestamp_header:
            fields = header_table.set_value(fields, "x-shovelled-timestamp", Field("l", int(time.time())))
        return header_table.with_headers(header, flags, fields)

    # -- forward headers ----------------------------------------------------------------------

    def forward_headers(self) -> dict[str, Field]:
        """The table RabbitMQ's shovel prepends to ``x-shovelled`` (rabbit_shovel_util:update_headers): longstrs."""
        definition = self.definition
        table: dict[str, str] = {"shovelled-by": self._cluster_name, "shovel-type": "dynamic",
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
        return {key: Field("S", item) for key, item in table.items()}
