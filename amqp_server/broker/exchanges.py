"""Exchanges (RabbitMQ's rabbit_exchange): declare, with its permission checks and equivalence, and delete; the
bindings an exchange takes with it are ``bindings.py``'s, as is an auto-delete exchange's going with its last
binding.  Routing is ``routing.py``'s.
"""
from __future__ import annotations

from typing import Any

from exchanges import Exchange, exchange_class

from ..framing import codec, field_types
from .. import errors
from ..access_control import Principal
from ..errors import ConnectionError, resource_name
from ..records import ExchangeRecord
from .vhost import VHost
from ..queues.policy import Policies
from .bindings import Bindings
from .definitions import Definitions, shown, storable


class Exchanges:
    """The broker's exchange operations."""

    def __init__(self, bindings: Bindings, definitions: Definitions, policies: Policies) -> None:
        self.bindings = bindings
        self.definitions = definitions
        self.policies = policies

    @staticmethod
    def check_exchange_declare(vhost: VHost, name: str, type_name: str, arguments: dict[str, Any] | None,
                               who: Principal | None) -> type[Exchange]:
        """The exchange type's class, checked in rabbit_channel's order: the type, the default exchange, configure
        on the exchange; for a new one with an alternate exchange, also read on it and write on that one (an
        exchange declared again needs neither)."""
        cls = exchange_class(type_name)
        if cls is None:
            raise ConnectionError(errors.COMMAND_INVALID, f"unknown exchange type '{type_name}'")
        if name == "":
            raise errors.access_refused("operation not permitted on the default exchange")
        if who is None:
            return cls
        who.check("configure", "exchange", vhost.name, name)
        alternate = (arguments or {}).get("alternate-exchange")
        if name not in vhost.exchanges and alternate and isinstance(alternate, (str, bytes)):  # (else declare's 406)
            who.check("read", "exchange", vhost.name, name)
            who.check("write", "exchange", vhost.name, codec.text(alternate))
        return cls

    def declare_exchange(self, vhost: VHost, name: str, type_name: str, passive: bool = False,
                         durable: bool = False, auto_delete: bool = False, internal: bool = False,
                         arguments: dict[str, Any] | None = None, who: Principal | None = None) -> Exchange:
        """exchange.declare for ``who`` (None: the node itself, e.g. a definitions import by an administrator)."""
        existing = vhost.exchanges.get(name)
        if passive:
            if name == "":
                raise errors.access_refused("operation not permitted on the default exchange")
            if existing is None:
                raise errors.not_found(f"no exchange '{name}' in vhost '{vhost.name}'")
            return existing
        cls = self.check_exchange_declare(vhost, name, type_name, arguments, who)
        if existing is None and name.startswith("amq."):  # (a new exchange's)
            raise errors.access_refused(f"exchange name '{name}' contains reserved prefix 'amq.*'")
        arguments = dict(arguments or {})
        what = resource_name("exchange", name, vhost.name)
        alternate = arguments.get("alternate-exchange")
        if existing is None and "alternate-exchange" in arguments and not isinstance(alternate, (str, bytes)):
            raise errors.precondition_failed(
                f"invalid type '{field_types.name(alternate)}' for arg 'alternate-exchange' in {what}")
        if existing is not None:
            for arg, new, old in (("type", type_name, existing.type_name),
                                  ("durable", durable, existing.durable),
                                  ("auto_delete", auto_delete, existing.auto_delete),
                                  ("internal", internal, existing.internal)):
                if new != old:
                    raise errors.precondition_failed(
                        f"inequivalent arg '{arg}' for {what}: received '{shown(new)}' but current is '{shown(old)}'")
            if arguments.get("alternate-exchange") != existing.arguments.get("alternate-exchange"):
                raise errors.precondition_failed(f"inequivalent arg 'alternate-exchange' for {what}")
            return existing
        storable(arguments, what)
        try:
            exchange = cls(name, durable=durable, auto_delete=auto_delete, internal=internal, arguments=arguments)
        except LookupError as exc:
            raise ConnectionError(errors.COMMAND_INVALID, f"unknown exchange type '{exc.args[0]}'") from None
        except ValueError as exc:
            raise errors.precondition_failed(str(exc)) from None
        if durable:
            self.definitions.check_room(what, arguments, who)
        record = ExchangeRecord(vhost.name, name, type_name, durable, auto_delete, internal, arguments or {})
        self.definitions.define(record, durable)  # kept first: a write that fails leaves nothing behind
        vhost.exchanges[name] = exchange
        self.policies.apply_to_exchange(vhost.name, exchange)
        return exchange

    async def agree_exchange(self, vhost: VHost, name: str, type_name: str, durable: bool = False,
                             auto_delete: bool = False, internal: bool = False,
                             arguments: dict[str, Any] | None = None, who: Principal | None = None) -> bool:
        """Cluster mode, before declaring a new exchange: the first declaration agreed on wins (see agree_queue).
        Whether the cluster agreed on one now."""
        self.check_exchange_declare(vhost, name, type_name, arguments, who)
        cluster = self.definitions.cluster
        if cluster is None or name in vhost.exchanges or name.startswith("amq."):
            return False
        what = resource_name("exchange", name, vhost.name)
        storable(arguments, what)
        if durable:
            self.definitions.check_room(what, arguments, who)
        await cluster.agree(ExchangeRecord(vhost.name, name, type_name, durable, auto_delete, internal,
                                           dict(arguments or {})))
        return True

    async def declare_agreed(self, vhost: VHost, name: str, type_name: str, durable: bool = False,
                             auto_delete: bool = False, internal: bool = False,
                             arguments: dict[str, Any] | None = None, who: Principal | None = None) -> Exchange:
        """exchange.declare (not passive) as every front end's answer needs it: in cluster mode a new exchange is
        agreed on first (``agree_exchange``) and declared once the nodes this one reaches have it
        (``Definitions.agreed``), as RabbitMQ answers once every node's Mnesia has it: a publish or a bind
        through another node right after the answer finds it."""
        agreed = await self.agree_exchange(vhost, name, type_name, durable, auto_delete, internal, arguments, who)
        exchange = self.declare_exchange(vhost, name, type_name, False, durable, auto_delete, internal, arguments,
                                         who)
        if agreed:
            await self.definitions.agreed()
        return exchange

    def delete_exchange(self, vhost: VHost, name: str, if_unused: bool = False, who: Principal | None = None) -> None:
        """exchange.delete for ``who``: the default and amq.* exchanges are refused first, then permission
        (rabbit_channel's order)."""
        if name == "" or name.startswith("amq."):
            raise errors.access_refused(
                "operation not permitted on the default exchange" if name == ""
                else f"deletion of system {resource_name('exchange', name, vhost.name)} not allowed")
        if who is not None:
            who.check("configure", "exchange", vhost.name, name)
        exchange = vhost.exchanges.get(name)
        if exchange is None:
            return  # idempotent, as RabbitMQ
        if if_unused and exchange.has_bindings:
            raise errors.precondition_failed(f"{resource_name('exchange', name, vhost.name)} in use")
        self.bindings.remove_exchange(vhost, exchange)
