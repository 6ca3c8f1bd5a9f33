"""Bindings (RabbitMQ's rabbit_binding): bind and unbind with their permission checks, their definitions, and
the bindings a queue or exchange that is gone leaves behind.

An auto-delete exchange goes with its last binding, and an exchange that goes takes its bindings with it: both
ends of that are here (``remove_exchange``), so that exchanges depend on bindings and not the other way too.
"""
from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any, Iterable, cast

from exchanges import Exchange

from .. import errors
from ..access_control import Principal
from ..queues.queue import AnyQueue, Queue
from ..records import BindingRecord
from .vhost import VHost
from ..records import ExchangeRecord
from .definitions import Definitions, check_exclusive, storable

if TYPE_CHECKING:
    from ..ports import ExclusiveOwner


def _binding(vhost: VHost, source: str, destination: AnyQueue | Exchange, routing_key: str,
             arguments: dict[str, Any] | None, created: int = 0) -> BindingRecord:
    kind = "exchange" if isinstance(destination, Exchange) else "queue"
    return BindingRecord(vhost.name, source, destination.name, kind, routing_key, dict(arguments or {}), created)


def _exclusive(destination: AnyQueue | Exchange) -> bool:
    """An exclusive queue's bindings are never kept (they go with its connection); they are the cluster's in
    cluster mode, as the queue is (other nodes route to it)."""
    return not isinstance(destination, Exchange) and destination.exclusive


class Bindings:
    """The broker's binding operations, and the bindings' side of an exchange's or queue's going."""

    def __init__(self, definitions: Definitions) -> None:
        self.definitions = definitions

    def bind(self, vhost: VHost, source: str, kind: str, destination: str, routing_key: str,
             arguments: dict[str, Any] | None = None, owner: "ExclusiveOwner[Queue] | None" = None,
             who: Principal | None = None) -> None:
        """queue.bind / exchange.bind (``kind`` queue or exchange) for ``who``: write on the destination and
        read on the source first, then both must exist, the source told first (rabbit_channel:binding_action's
        order)."""
        self._check_binding(vhost, source, kind, destination, routing_key, who)
        vhost.exchange(source)  # a missing source is told first, as in RabbitMQ
        target: AnyQueue | Exchange
        if kind == "queue":
            target = queue = vhost.queue(destination)
            check_exclusive(queue, owner)
        else:
            target = vhost.exchange(destination)
        self.add_binding(vhost, source, target, routing_key, arguments, who)

    def unbind(self, vhost: VHost, source: str, kind: str, destination: str, routing_key: str,
               arguments: dict[str, Any] | None = None, owner: "ExclusiveOwner[Queue] | None" = None,
               who: Principal | None = None) -> None:
        """queue.unbind / exchange.unbind for ``who``: what is gone (an auto-deleted queue, a missing source or
        destination) unbinds without error, as in RabbitMQ."""
        self._check_binding(vhost, source, kind, destination, routing_key, who)
        target: AnyQueue | Exchange | None
        if kind == "queue":
            target = queue = vhost.queues.get(destination)
            if queue is not None:
                check_exclusive(queue, owner)
        else:
            target = vhost.exchanges.get(destination)
        if target is not None:
            self.remove_binding(vhost, source, target, routing_key, arguments)

    @staticmethod
    def _check_binding(vhost: VHost, source: str, kind: str, destination: str, routing_key: str,
                       who: Principal | None) -> None:
        """Write on the destination, neither end the default exchange, read on the source and, if the source is a
        topic exchange, the user's topic permission to read ``routing_key`` there (rabbit_channel:binding_action's
        checks, in its order)."""
        if who is not None:
            who.check("write", kind, vhost.name, destination)
        if source == "" or (kind == "exchange" and destination == ""):
            raise errors.access_refused("operation not permitted on the default exchange")
        if who is None:
            return
        who.check("read", "exchange", vhost.name, source)
        exchange = vhost.exchanges.get(source)
        if exchange is not None and exchange.type_name == "topic":
            who.check_topic("read", vhost.name, source, routing_key)

    def add_binding(self, vhost: VHost, source: str, destination: AnyQueue | Exchange, routing_key: str,
                    arguments: dict[str, Any] | None = None, who: Principal | None = None) -> None:
        """Bind (no permission check; ``who`` for the store's room): bind, definitions import and the cluster's
        definitions come here.  A binding whose definition cannot be kept is undone."""
        exchange = self._bindable(vhost, source)
        storable(arguments, "binding")
        try:
            added = exchange.bind(destination, routing_key, arguments or {})
        except ValueError as exc:
            raise errors.precondition_failed(str(exc)) from None
        if not added:
            return
        exclusive = _exclusive(destination)
        if not exclusive or self.definitions.cluster is not None:
            durable = exchange.durable and destination.durable and not exclusive
            try:
                if durable:
                    self.definitions.check_room("binding", arguments, who)
                record = _binding(vhost, source, destination, routing_key, arguments, time.time_ns())
                self.definitions.define(record, durable)
            except Exception:
                exchange.unbind(destination, routing_key, arguments or {})
                raise
        vhost.bound(exchange, destination)

    def remove_binding(self, vhost: VHost, source: str, destination: AnyQueue | Exchange, routing_key: str,
                       arguments: dict[str, Any] | None = None) -> None:
        """Unbind (no permission check); an exchange or binding that is not there is no error."""
        if source == "":
            raise errors.access_refused("operation not permitted on the default exchange")
        exchange = vhost.exchanges.get(source)
        if exchange is None or not exchange.unbind(destination, routing_key, arguments or {}):
            return  # nothing to unbind is no error, as in RabbitMQ
        vhost.unbound(exchange, destination)
        self._forget_binding(vhost, source, destination, routing_key, arguments)
        self._auto_delete(vhost, exchange)

    @staticmethod
    def _bindable(vhost: VHost, source: str) -> Exchange:
        if source == "":
            raise errors.access_refused("operation not permitted on the default exchange")
        return vhost.exchange(source)

    def _forget_binding(self, vhost: VHost, source: str, destination: AnyQueue | Exchange, routing_key: str,
                        arguments: dict[str, Any] | None) -> None:
        exclusive = _exclusive(destination)
        if not exclusive or self.definitions.cluster is not None:
            record = _binding(vhost, source, destination, routing_key, arguments)
            self.definitions.undefine(record, destination.durable and not exclusive)

    def drop_destination(self, vhost: VHost, destination: AnyQueue | Exchange) -> None:
        """A queue or exchange is gone: remove every binding to it, at the cost of those bindings."""
        for exchange in list(vhost.sources.get(destination, ())):
            self._unbind_all(vhost, exchange, destination)
            self._auto_delete(vhost, exchange)

    def remove_exchange(self, vhost: VHost, exchange: Exchange) -> None:
        """An exchange goes (deleted, auto-deleted, its vhost deleted), with its bindings and its definition."""
        del vhost.exchanges[exchange.name]
        for destination in cast("list[AnyQueue | Exchange]", exchange.destinations()):  # (what the broker binds)
            self._unbind_all(vhost, exchange, destination)
        self.drop_destination(vhost, exchange)
        self.definitions.undefine(ExchangeRecord(vhost.name, exchange.name, exchange.type_name), exchange.durable)

    def _unbind_all(self, vhost: VHost, exchange: Exchange, destination: AnyQueue | Exchange) -> None:
        removed = exchange.remove_destination(destination)
        vhost.unbound(exchange, destination, len(removed))
        for binding in removed:
            self._forget_binding(vhost, exchange.name, destination, binding.routing_key, binding.args_dict())

    def _auto_delete(self, vhost: VHost, exchange: Exchange) -> None:
        """An auto-delete exchange goes once it has no binding left."""
        if exchange.auto_delete and not exchange.has_bindings and vhost.exchanges.get(exchange.name) is exchange:
            self.remove_exchange(vhost, exchange)

    def all(self, vhost: VHost) -> Iterable[tuple[str, AnyQueue | Exchange, str, dict]]:
        """(source, destination, routing key, arguments) of every binding, the default exchange's included."""
        for queue in vhost.queues.values():
            yield "", queue, queue.name, {}
        for exchange in vhost.exchanges.values():
            for binding in exchange.bindings():
                yield (exchange.name, cast("AnyQueue | Exchange", binding.destination),  # (what the broker binds)
                       binding.routing_key, binding.args_dict())
