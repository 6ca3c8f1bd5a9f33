"""Federation links (rabbit_federation_exchange_link, rabbit_federation_queue_link): one per federated exchange or
queue and upstream, a :class:`links.link.Link` over two connections — to the upstream, with its URI's
credentials, and to this node, as the user who set the upstream — moving messages under the upstream's
``ack-mode`` (``on-confirm``: acked upstream once this node confirmed them).

Each message gets an ``x-received-from`` entry, first in the list: the upstream's URI without credentials, the
federated exchange's or queue's name, ``redelivered``, and the upstream's ``cluster-name`` and ``vhost`` (exchange
links) or ``visit-count`` (queue links).
"""
from __future__ import annotations

import asyncio
import hashlib
import logging
import struct
import urllib.parse
from typing import TYPE_CHECKING, Any, Callable

from pamqp import commands

from exchanges.base import freeze_arguments
from exchanges.federation_upstream import (DOWNSTREAM_NAME, DOWNSTREAM_VHOST, MAX_HOPS, ROUTING_HEADER,
                                           already_seen)

from ..framing import codec, header_table, properties
from ..framing.header_table import Field
from ..links import uri as uri_module
from ..links.amqp_client import ChannelClosed, Client, ClientError, typed_arguments
from ..links.link import CHANNEL, Link, Resolve, Transfer, status_time
from ..logs import untrusted
from .upstream import Upstream

if TYPE_CHECKING:
    from ..broker import Broker
    from ..queues.queue import AnyQueue

log = logging.getLogger("warren.federation")
COMMAND_CHANNEL = 2  # exchange links: binds and unbinds (a 404 there restarts the link, as in RabbitMQ)
FOLLOW_INTERVAL = 0.1  # seconds between looks at local bindings (exchange links) or consumers (queue links)
CHECK_INTERVAL = 10.0  # seconds between checks that the upstream exchange is there (RabbitMQ: 90 by default)
BINDING_HEADER = "x-bound-from"
INTERNAL_PURPOSE: dict[str, Any] = {"x-internal-purpose": "federation"}


def _text(value: str) -> Field:
    return Field("S", value)


def _plain(field: Field | None) -> Any:
    """A typed header value as plain values (tables as dicts, arrays as lists)."""
    if field is None:
        return None
    if field.kind == "F":
        return {key: _plain(item) for key, item in field.value.items()}
    if field.kind == "A":
        return [_plain(item) for item in field.value]
    return field.value


def _with_vhost(text: str, vhost: str) -> str:
    """An upstream URI without a vhost is for the federated resource's vhost (amqp_uri:parse/2's default)."""
    if urllib.parse.urlsplit(text).path:
        return text
    base, mark, query = text.partition("?")
    return f"{base}/{urllib.parse.quote(vhost, safe='')}{mark}{query}"


class FederationLink(Link):
    """What exchange and queue links share: connections, status, the ``x-received-from`` entry."""

    FAILED = "error"
    PRODUCT = "Warren federation"
    kind = ""  # "exchange" or "queue"

    def __init__(self, broker: "Broker", vhost: str, resource: str, upstream: Upstream, policy: str,
                 resolve: Resolve, cluster_name: str) -> None:
        super().__init__(f"federation link for {self.kind} {untrusted(resource)} in vhost {untrusted(vhost)} "
                         f"(upstream {untrusted(upstream.name)})",
                         f"Federation link (upstream: {upstream.name}, policy: {policy})", resolve,
                         upstream.reconnect_delay)
        self.broker = broker
        self.vhost = vhost
        self.resource = resource  # the federated exchange's or queue's name
        self.upstream = upstream
        self.cluster_name = cluster_name  # this node's (RabbitMQ: rabbit_nodes:cluster_name())
        self.upstream_vhost = "/"
        self.upstream_name: str | None = None  # the upstream's cluster_name, if its connection.start says it
        self.local_connection = ""
        # an upstream URI without a vhost is for the federated resource's vhost (amqp_uri:parse/2's default)
        self.uris = [_with_vhost(text, vhost) for text in upstream.uris]
        self._up: Client | None = None
        key = f"{vhost}\0{self.kind}\0{resource}\0{upstream.name}\0{self.upstream_resource}"
        self.id = hashlib.sha256(key.encode()).hexdigest()[:8]

    @property
    def upstream_resource(self) -> str:
        """The exchange or queue upstream (the upstream's ``exchange``/``queue``, else the same name)."""
        named = self.upstream.exchange if self.kind == "exchange" else self.upstream.queue
        return named if named is not None else self.resource

    def status(self) -> dict[str, Any]:
        """RabbitMQ's fields (rabbit_federation_status:format/1), with this node's name added by the caller."""
        fields: dict[str, Any] = {self.kind: self.resource, f"upstream_{self.kind}": self.upstream_resource}
        if self.kind == "queue":
            fields["consumer_tag"] = self.upstream.consumer_tag
        fields.update(type=self.kind, vhost=self.vhost, upstream=self.upstream.name, id=self.id, status=self.state)
        if self.state == "running":
            fields["local_connection"] = self.local_connection
        elif self.state == self.FAILED:
            fields["error"] = self.reason
        fields.update(uri=self.uri, timestamp=status_time(self.timestamp))
        return fields

    def _upstream_uri(self) -> str:
        """The upstream URI in use (or to try next), with its vhost."""
        return self.uris[self._attempts.get(0, 0) % len(self.uris)]

    @property
    def uri(self) -> str:
        """The upstream URI in use (or to try next) as written, without credentials (RabbitMQ's safe_uri)."""
        return uri_module.redacted(self.upstream.uris[self._attempts.get(0, 0) % len(self.uris)])

    async def _connect_both(self) -> tuple[Client, Client]:
        """The downstream connection (this node, the federated resource's vhost), then the upstream one."""
        down, _ = await self._connect(1, ["amqp:///" + urllib.parse.quote(self.vhost, safe="")])
        up, _ = await self._connect(0, self.uris)
        self._up = up
        self.upstream_vhost = uri_module.parse(self._upstream_uri()).vhost
        name = up.server_properties.get("cluster_name")
        self.upstream_name = name.decode(errors="replace") if isinstance(name, bytes) else name
        self.local_connection = self.connection_name
        await down.open_channel(CHANNEL)
        if self.upstream.ack_mode == "on-confirm":
            await down.call(CHANNEL, commands.Confirm.Select())
        await up.open_channel(CHANNEL)
        if self.upstream.ack_mode != "no-ack":
            await up.call(CHANNEL, commands.Basic.Qos(prefetch_count=self.upstream.prefetch))
        return up, down

    @staticmethod
    async def _ensure(up: Client, passive: Any, declaration: Callable[[], Any]) -> None:
        """What ``passive`` declares exists upstream, else is declared as ``declaration()`` says."""
        try:
            await up.disposable_call(passive)
        except ChannelClosed as exc:
            if exc.code != 404:
                raise ClientError(f"{{shutdown,{exc}}}", exc.code) from None
            await up.call(CHANNEL, declaration())

    def _entry(self, redelivered: bool) -> dict[str, Field]:
        """This hop's ``x-received-from`` entry (rabbit_federation_upstream's params_table, and the link's)."""
        return {"uri": _text(self.uri), self.kind: _text(self.resource), "redelivered": Field("t", int(redelivered))}

    def _headers(self, header: bytes) -> tuple[int, dict[str, Field]] | None:
        """The content header's flags and typed headers; None (the message is dropped) if they cannot be read,
        which an upstream that checks what it is published (RabbitMQ, Warren) never sends."""
        flags = header[12] << 8 | header[13]
        try:
            return flags, header_table.headers(header, flags)
        except (header_table.NotInTable, ValueError, IndexError, struct.error):
            log.warning("%s: dropped a message whose headers cannot be read", self.what)
            return None

    def _finish_header(self, header: bytes, flags: int, fields: dict[str, Field] | None) -> bytes:
        """The header with ``fields`` as its table (None: as it is), and user_id cleared unless trusted."""
        if fields is not None:
            header = header_table.with_headers(header, flags, fields)
        if not self.upstream.trust_user_id and (header[12] << 8 | header[13]) & codec.FLAG_USER_ID:
            header = properties.replace(header, codec.FLAG_USER_ID, None)  # (RabbitMQ: maybe_clear_user_id)
        return header


def upstream_queue_name(upstream_exchange: str, upstream_vhost: str, vhost: str, exchange: str,
                        cluster_name: str) -> str:
    """rabbit_federation_exchange_link:upstream_queue_name/3."""
    if vhost != upstream_vhost:
        down = f":{vhost}:{exchange}"
    else:
        down = "" if exchange == upstream_exchange else f":{exchange}"
    return f"federation: {upstream_exchange} -> {cluster_name}{down}"


class ExchangeLink(FederationLink):
    """Declares upstream a durable queue (``federation: X -> <this cluster>``, with ``x-expires`` and
    ``x-message-ttl`` from the upstream), an ``x-federation-upstream`` exchange (``<queue> A`` or ``... B``, in
    turn at each start, so that the previous one routes until the new one is bound; which one is in use is kept
    in the definition store, so this holds across restarts of the node and moves in a cluster) bound to it and to the
    upstream exchange with the bindings of the federated exchange here, which it follows; and publishes what the
    queue delivers to the federated exchange, unless it has made ``max-hops`` hops or came through this node."""

    kind = "exchange"

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.queue = ""
        self.internal_exchange = ""
        self.suffix = "A"  # of the upstream exchange in use (RabbitMQ's active suffix)
        self._first_hop: dict[bool, bytes] = {}  # x-received-from of a message that has none yet, by redelivered
        self._bound: dict[tuple[str, tuple], tuple[str, dict[str, Any]]] = {}
        self._serial = -1

    async def _session(self) -> None:
        up, down = await self._connect_both()
        self._first_hop = {redelivered: header_table.encode_value(Field("A", [Field("F", self._hop(redelivered))]))
                           for redelivered in (False, True)}
        await up.open_channel(COMMAND_CHANNEL)
        upstream = self.upstream
        self.queue = upstream_queue_name(self.upstream_resource, self.upstream_vhost, self.vhost, self.resource,
                                         self.cluster_name)
        arguments: dict[str, Any] = {}
        if upstream.expires is not None:
            arguments["x-expires"] = upstream.expires
        if upstream.message_ttl is not None:
            arguments["x-message-ttl"] = upstream.message_ttl
        await up.call(CHANNEL, commands.Queue.Declare(queue=self.queue, durable=True,
                                                      arguments={**arguments, **INTERNAL_PURPOSE}))
        await self._ensure_upstream_bindings(up)
        Transfer(self, up, down, upstream.ack_mode, self._forward)  # (it runs from the connections' callbacks)
        await up.call(CHANNEL, commands.Basic.Consume(queue=self.queue, no_ack=upstream.ack_mode == "no-ack"))
        self._running(f"{self.uri} (queue {self.queue})")
        check = asyncio.get_running_loop().time() + CHECK_INTERVAL
        while True:
            await self._until_closed(asyncio.ensure_future(asyncio.sleep(FOLLOW_INTERVAL)))
            await self._follow_bindings(up)
            if asyncio.get_running_loop().time() >= check:
                await self._check_internal_exchange(up)
                check += CHECK_INTERVAL

    async def _check_internal_exchange(self, up: Client) -> None:
        """The link's upstream exchange is still there, else the link starts again and makes it anew
        (rabbit_federation_exchange_link's check_internal_exchange)."""
        try:
            await up.disposable_call(commands.Exchange.Declare(exchange=self.internal_exchange, passive=True))
        except ChannelClosed as exc:
            if exc.code == 404:
                raise ClientError(f"{{upstream_exchange_gone,<<\"{self.internal_exchange}\">>}}") from None
            log.warning("%s: checking the upstream exchange failed: %s", self.what, untrusted(str(exc)))

    def _local_exchange(self) -> Any:
        vhost = self.broker.vhosts.get(self.vhost)
        return vhost.exchanges.get(self.resource) if vhost is not None else None

    def _active_suffix(self, suffix: str | None = None, forget: bool = False) -> str | None:
        """The suffix kept for this link, durably and cluster-wide as RabbitMQ keeps it with the federated exchange
        (rabbit_federation_db): set to ``suffix`` if given, forgotten if ``forget``."""
        key = (self.vhost, self.resource, self.upstream.name, self.upstream_resource)
        if suffix is not None or forget:
            self.broker.access.set_federation_suffix(*key, suffix)
            return suffix
        return self.broker.access.federation_suffix(*key)

    async def _ensure_upstream_bindings(self, up: Client) -> None:
        """rabbit_federation_exchange_link:ensure_upstream_bindings: the other upstream exchange than the one the
        link used last (after a restart of this node too) is made and bound before that one is deleted, so that the
        upstream exchange routes to the link's queue throughout."""
        old = self._active_suffix() or "A"
        new = "B" if old == "A" else "A"
        self.internal_exchange = f"{self.queue} {new}"
        await self._ensure_upstream_exchange(up)
        await self._ensure_internal_exchange(up)
        await up.call(CHANNEL, commands.Queue.Bind(queue=self.queue, exchange=self.internal_exchange))
        self.suffix = new
        self._active_suffix(new)
        self._bound.clear()
        self._serial = -1
        await self._follow_bindings(up)
        await self._delete_upstream(up, commands.Exchange.Delete(exchange=f"{self.queue} {old}"))

    async def _ensure_upstream_exchange(self, up: Client) -> None:
        """The upstream exchange, declared like the federated one if it is missing."""
        def declaration() -> commands.Exchange.Declare:
            local = self._local_exchange()
            if local is None:
                raise ClientError("{exchange_gone}")
            return commands.Exchange.Declare(
                exchange=self.upstream_resource, exchange_type=local.type_name, durable=local.durable,
                auto_delete=local.auto_delete, internal=local.internal, arguments=dict(local.arguments))

        await self._ensure(up, commands.Exchange.Declare(exchange=self.upstream_resource, passive=True), declaration)

    async def _ensure_internal_exchange(self, up: Client) -> None:
        """An ``x-federation-upstream`` exchange, declared on a connection of its own (an upstream without the
        type closes the connection with 503), else a fanout, as RabbitMQ's link does."""
        await self._delete_upstream(up, commands.Exchange.Delete(exchange=self.internal_exchange))
        def declare(kind: str, arguments: dict[str, Any] | None = None) -> commands.Exchange.Declare:
            return commands.Exchange.Declare(exchange=self.internal_exchange, exchange_type=kind, durable=True,
                                             internal=True, auto_delete=True, arguments=arguments)

        typed = {MAX_HOPS: Field("l", self.upstream.max_hops), DOWNSTREAM_NAME: _text(self.cluster_name),
                 DOWNSTREAM_VHOST: _text(self.vhost), "x-internal-purpose": _text("federation")}
        once = await self._open(self._upstream_uri())
        try:
            await once.open_channel(CHANNEL)
            await once.call(CHANNEL, typed_arguments(declare("x-federation-upstream"), CHANNEL, typed))
        except ClientError as exc:
            if exc.code != 503:
                raise
            await up.call(CHANNEL, declare("fanout", dict(INTERNAL_PURPOSE)))
        finally:
            once.close()

    @staticmethod
    async def _delete_upstream(up: Client, method: Any) -> None:
        try:
            await up.disposable_call(method)
        except ChannelClosed:
            pass  # (RabbitMQ's disposable_channel_call ignores the error)

    def _update_binding(self, arguments: dict[str, Any]) -> dict[str, Any] | None:
        """The binding's arguments with this node prepended to ``x-bound-from``, or None if it should propagate
        no further (rabbit_federation_exchange_link:update_binding/2: bindings obey max-hops as messages do)."""
        hops = self.upstream.max_hops
        seen = arguments.get(BINDING_HEADER)
        if isinstance(seen, list) and seen:
            first = seen[0] if isinstance(seen[0], dict) else {}
            previous = first.get("hops")
            previous = previous if isinstance(previous, int) and not isinstance(previous, bool) else 0
            if already_seen(self.upstream_name, self.upstream_vhost, seen):
                hops = 0
            else:
                hops = min(previous - 1, hops)
        if hops <= 0:
            return None
        info = {"cluster-name": self.cluster_name, "vhost": self.vhost,
                "exchange": f"{self.vhost}:{self.resource} {self.suffix}", "hops": hops}
        return {**arguments, BINDING_HEADER: [info, *(seen if isinstance(seen, list) else [])]}

    async def _follow_bindings(self, up: Client) -> None:
        """Bind the upstream exchange to this link's as the federated exchange is bound here, and unbind."""
        vhost = self.broker.vhosts.get(self.vhost)
        if vhost is None or vhost.binding_serial == self._serial:
            return
        self._serial = vhost.binding_serial
        local = vhost.exchanges.get(self.resource)
        wanted: dict[tuple[str, tuple], tuple[str, dict[str, Any]]] = {}
        for binding in (local.bindings() if local is not None else ()):
            arguments = self._update_binding(binding.args_dict())
            if arguments is not None:
                wanted[(binding.routing_key, freeze_arguments(arguments))] = (binding.routing_key, arguments)
        for key in [key for key in self._bound if key not in wanted]:
            routing_key, arguments = self._bound.pop(key)
            await up.call(COMMAND_CHANNEL, commands.Exchange.Unbind(
                destination=self.internal_exchange, source=self.upstream_resource, routing_key=routing_key,
                arguments=arguments))
        for key, (routing_key, arguments) in wanted.items():
            if key not in self._bound:
                await up.call(COMMAND_CHANNEL, commands.Exchange.Bind(
                    destination=self.internal_exchange, source=self.upstream_resource, routing_key=routing_key,
                    arguments=arguments))
                self._bound[key] = (routing_key, arguments)

    def _hop(self, redelivered: bool) -> dict[str, Field]:
        entry = self._entry(redelivered)
        if self.upstream_name is not None:
            entry["cluster-name"] = _text(self.upstream_name)
        entry["vhost"] = _text(self.upstream_vhost)
        return entry

    def _forward(self, redelivered: bool, exchange: str, routing_key: str, header: bytes,
                 size: int) -> tuple[str, str, bytes] | None:
        try:
            first = not header_table.has(header, ROUTING_HEADER)
        except header_table.NotInTable:
            first = False
        if first:  # the usual case: the entry's bytes added to the table's, nothing decoded
            header = header_table.with_field(header, ROUTING_HEADER, self._first_hop[redelivered])
            return self.resource, routing_key, self._finish_header(header, 0, None)
        read = self._headers(header)
        if read is None:
            return None
        flags, fields = read
        hops = _plain(fields.get(ROUTING_HEADER))
        if isinstance(hops, list) and (len(hops) >= self.upstream.max_hops
                                       or already_seen(self.cluster_name, self.vhost, hops)):
            return None  # (an upstream without the x-federation-upstream type does not drop it: this link does)
        fields = header_table.prepend_table(fields, ROUTING_HEADER, self._hop(redelivered))  # (update_routing_headers)
        return self.resource, routing_key, self._finish_header(header, flags, fields)

    async def _stopped(self) -> None:
        """The policy or upstream went: delete the upstream queue and exchange (resource-cleanup-mode default)."""
        up = self._up
        if self._local_exchange() is None:
            self._active_suffix(forget=True)  # (RabbitMQ's goes with the exchange, in its scratch space)
        if up is None or up.closed.done() or not self.upstream.cleanup or not self.queue:
            return
        await asyncio.wait_for(self._delete_upstream(up, commands.Queue.Delete(queue=self.queue)), 5)
        await asyncio.wait_for(self._delete_upstream(up, commands.Exchange.Delete(exchange=self.internal_exchange)),
                               5)
        self._active_suffix(forget=True)  # (the upstream exchange is gone: a link starting anew may take either)


class QueueLink(FederationLink):
    """Consumes from the upstream queue (declared like the federated one if it is missing), with priority -1 so
    that the upstream's own consumers come first, only while the federated queue is empty and has a consumer
    with room for a message (rabbit_federation_queue's run/pause); publishes what it gets to the queue."""

    kind = "queue"

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.consuming = False

    async def _session(self) -> None:
        up, down = await self._connect_both()
        capabilities = up.server_properties.get("capabilities")
        if not (isinstance(capabilities, dict) and capabilities.get("consumer_priorities") is True):
            raise ClientError("{error,upstream_lacks_consumer_priorities}")
        await self._ensure_upstream_queue(up)
        Transfer(self, up, down, self.upstream.ack_mode, self._forward)
        self.consuming = False
        self._running(f"{self.uri} (queue {self.upstream_resource})")
        while True:
            await self._until_closed(asyncio.ensure_future(asyncio.sleep(FOLLOW_INTERVAL)))
            wanted = self._demand()
            if wanted and not self.consuming:
                await up.call(CHANNEL, commands.Basic.Consume(
                    queue=self.upstream_resource, consumer_tag=self.upstream.consumer_tag,
                    no_ack=self.upstream.ack_mode == "no-ack", arguments={"x-priority": -1}))
            elif self.consuming and not wanted:
                await up.call(CHANNEL, commands.Basic.Cancel(consumer_tag=self.upstream.consumer_tag))
            self.consuming = wanted

    def _local_queue(self) -> AnyQueue | None:
        vhost = self.broker.vhosts.get(self.vhost)
        return vhost.queues.get(self.resource) if vhost is not None else None

    def _demand(self) -> bool:
        """The queue is empty and a consumer of priority 0 or more has room (rabbit_federation_queue's
        consumer_state_changed: IsEmpty andalso active_unfederated(MaxActivePriority))."""
        queue = self._local_queue()
        if queue is None or queue.message_count:
            return False
        return any(consumer.priority >= 0 and consumer.has_credit() for consumer in queue.consumers)

    async def _ensure_upstream_queue(self, up: Client) -> None:
        def declaration() -> commands.Queue.Declare:
            local = self._local_queue()
            if local is None:
                raise ClientError("{queue_gone}")
            return commands.Queue.Declare(queue=self.upstream_resource, durable=local.durable,
                                          auto_delete=local.auto_delete, arguments=dict(local.arguments))

        await self._ensure(up, commands.Queue.Declare(queue=self.upstream_resource, passive=True), declaration)

    def _forward(self, redelivered: bool, exchange: str, routing_key: str, header: bytes,
                 size: int) -> tuple[str, str, bytes] | None:
        """rabbit_federation_queue_link:update_headers/5: the first hop records where the message was published
        (``x-original-exchange``, ``x-original-routing-key``; ``CC`` becomes ``x-original-cc``); a hop through
        the same upstream again replaces its entry, counting the visits."""
        read = self._headers(header)
        if read is None:
            return None
        flags, fields = read
        entry = self._entry(redelivered)
        previous = fields.get(ROUTING_HEADER)
        visits = 0
        if previous is not None and previous.kind == "A":
            kept = []
            for hop in previous.value:
                plain = _plain(hop)
                if isinstance(plain, dict) and all(plain.get(k) == _plain(entry.get(k))
                                                   for k in ("uri", "virtual_host", "queue")):
                    count = plain.get("visit-count")
                    visits = count if isinstance(count, int) else 0
                else:
                    kept.append(hop)
            hops = kept
        else:
            fields["x-original-exchange"] = _text(exchange)
            fields["x-original-routing-key"] = _text(routing_key)
            hops = []
        if "CC" in fields:
            fields = {("x-original-cc" if key == "CC" else key): item for key, item in fields.items()}
        entry["visit-count"] = Field("l", visits + 1)
        fields[ROUTING_HEADER] = Field("A", [Field("F", entry), *hops])
        return "", self.resource, self._finish_header(header, flags, fields)
