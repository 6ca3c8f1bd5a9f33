"""The broker: vhosts with their exchanges, queues and bindings, and the operations on them.

Every front end — AMQP channels, the HTTP plugin, the forwarder — calls these
operations; none keeps its own copy.  Operations raise :class:`ChannelError`
(or :class:`ConnectionError`) with RabbitMQ's reply code and text.
"""
from __future__ import annotations

import base64
import logging
import os
import time
from typing import TYPE_CHECKING, Any, Collection, Iterable, Iterator, Mapping, Protocol, TypeVar

from exchanges import DEFERRED, Exchange, exchange_class
from msg_store import DEFAULT_SEGMENT_SIZE

from .. import codec, errors, field_types, queue_args, sender_selected
from ..dead_letter import cycle_detected, dead_letter_message
from ..auth import AccessControl, AuthAttempts, Principal
from ..limits import Limits
from ..definitions import DefinitionStore
from ..delayed import DelayedMessages, Publisher
from ..direct_reply import ReplyConsumers
from ..errors import AMQPError, ChannelError, ConnectionError, resource_name
from ..logs import untrusted
from ..message import Message, expiration_error
from ..paging import Pager, paced
from ..policy import Policies, Policy
from ..persistence import Persistence
from ..queue_type import queue_class
from ..quorum_queue import QuorumQueue
from ..queue import Consumer, Entry, Queue
from ..records import BindingRecord, ExchangeRecord, QueueRecord, Record, name_key
from ..stats import ChurnStats, MessageStats
from ..vhost import VHost, home_node_down

if TYPE_CHECKING:
    from ..ports import ClientRegistry, ConfirmSink, DeliveryTarget, ExclusiveOwner

log = logging.getLogger("warren.broker")
R = TypeVar("R", bound=Record)


class QuorumHooks(Protocol):
    """The replicated queues' groups (``forwarder.quorum.QuorumGroups``), as the forwarder's links and the HTTP API
    reach them through the broker."""

    def peer_up(self, name: str) -> None: ...

    def peer_down(self, name: str) -> None: ...

    def replicate(self, session: Any, payload: bytes) -> None:
        """A leader's ops arrived on ``session`` (a ``forwarder.session.Session``, which the core cannot name)."""

    def replicated(self, peer_name: str, payload: bytes) -> None: ...

    def lag(self) -> dict[str, dict[str, int]]: ...

    def change_members(self, vhost: str, name: str, add: str = "", remove: str = "") -> None: ...

    def grow(self, node: str, strategy: str, vhost_pattern: str = ".*", queue_pattern: str = ".*") -> int: ...


class PeerHooks(Protocol):
    """Another node (``forwarder.peer.Peer``), as the HTTP API reaches it."""

    @property
    def http(self) -> tuple[str, int] | None:
        """Its management API, if it serves one."""


class ClusterHooks(Protocol):
    """What the broker tells the cluster (``forwarder``): definition changes made on this node; and what the
    front ends and the forwarder's own parts reach through the broker (``quorum``, ``peers``)."""

    @property
    def quorum(self) -> QuorumHooks: ...

    @property
    def peers(self) -> Mapping[str, PeerHooks]: ...

    def defined(self, kind: str, key: str, record: dict[str, Any]) -> None: ...

    def undefined(self, kind: str, key: str) -> None: ...

    def nodes(self) -> list[tuple[str, bool]]: ...

    async def forget(self, name: str) -> None: ...

    async def agree(self, record: Record) -> None: ...

    async def look_up(self, kind: str, key: str) -> None: ...

    def stream_address(self, node: str) -> tuple[str, int] | None:
        """Where another node serves the stream protocol (host, port), if it does and is up."""

# Queue arguments whose values must match on redeclaration, as RabbitMQ checks them.
EQUIVALENT_QUEUE_ARGS = (
    "x-message-ttl", "x-expires", "x-max-length", "x-max-length-bytes", "x-dead-letter-exchange",
    "x-dead-letter-routing-key", "x-max-priority", "x-overflow", "x-queue-type", "x-single-active-consumer",
)


def _flag(value: bool) -> str:
    return "true" if value else "false"


def server_name(prefix: str) -> str:
    """``amq.gen-…`` / ``amq.ctag-…``: 16 random bytes, URL-safe base64, as RabbitMQ makes them."""
    return prefix + base64.urlsafe_b64encode(os.urandom(16)).decode().rstrip("=")


class Broker:
    def __init__(self, data_dir: str, node_name: str = "warren@localhost",
                 persistence: Persistence | None = None, segment_size: int = DEFAULT_SEGMENT_SIZE,
                 clients: "ClientRegistry | None" = None, queue_window: int = 2048) -> None:
        self.data_dir = data_dir
        self.node_name = node_name
        self.queue_window = queue_window
        self.persistence = persistence or Persistence(data_dir)
        self.pager = Pager(data_dir, segment_size, self.persistence)
        self.store = DefinitionStore(data_dir)
        self.access = AccessControl(self.store)
        self.access.bootstrap()
        self.limits = Limits(self.access)
        self.auth_attempts = AuthAttempts()
        self.policies = Policies(self.store)
        self.replies = ReplyConsumers()  # amq.rabbitmq.reply-to consumers
        self.vhosts: dict[str, VHost] = {}
        self.clients = clients  # the node's connections (none in a broker used in-process)
        self.churn = ChurnStats()
        self._vhost_stats: dict[str, MessageStats] = {}
        self.cluster: ClusterHooks | None = None  # set by the forwarder in cluster mode
        self.delayed = DelayedMessages(self, data_dir)  # before recovery: it claims its stored messages
        self._recover_definitions()
        self.delayed.start()

    def close(self) -> None:
        for queue in self.all_queues():
            if queue.persistence is not None:
                self._save_offsets(queue)
        self.pager.close()
        self.persistence.close()
        self.delayed.close()
        self.store.close()

    def vhost_stats(self, name: str) -> MessageStats:
        """Counters of one vhost (kept across vhost objects being recreated)."""
        stats = self._vhost_stats.get(name)
        if stats is None:
            stats = self._vhost_stats[name] = MessageStats()
        return stats

    # -- vhosts -------------------------------------------------------------------------------

    def vhost(self, name: str) -> VHost:
        """The vhost, created in memory on first use if the definition store has it."""
        vhost = self.vhosts.get(name)
        if vhost is None:
            if not self.access.vhost_exists(name):
                raise ConnectionError(errors.NOT_ALLOWED, f"vhost {name} not found")
            vhost = self.vhosts[name] = VHost(name)
            self.policies.apply_to_vhost(vhost)
        return vhost

    def set_policy(self, kind: str, policy: Policy, who: Principal | None = None) -> None:
        """Set a policy or operator policy for ``who``: one that sends dead letters or unroutable messages to
        an exchange needs write permission on it, as declaring such a queue or exchange does."""
        if who is not None:
            for key in ("dead-letter-exchange", "alternate-exchange"):
                target = policy.definition.get(key)
                if isinstance(target, str):
                    who.check("write", "exchange", policy.vhost, target)
        self.policies.put(kind, policy, self.vhost(policy.vhost))

    def add_vhost(self, name: str, **metadata: Any) -> VHost:
        """Create a vhost or change its metadata (see ``AccessControl.add_vhost``)."""
        self.access.add_vhost(name, **metadata)
        return self.vhost(name)

    def _define(self, record: Record, durable: bool) -> None:
        """A definition made here: kept in LMDB if durable, and (cluster mode) made the cluster's."""
        raw = record.to_json()
        if durable:
            self.store.put(record.kind, record.key, raw)
        if self.cluster is not None:
            self.cluster.defined(record.kind, record.key, raw)

    def _undefine(self, record: Record, durable: bool) -> None:
        if durable:
            self.store.delete(record.kind, record.key)
        if self.cluster is not None:
            self.cluster.undefined(record.kind, record.key)

    def delete_vhost(self, name: str) -> None:
        vhost = self.vhosts.pop(name, None)
        if vhost is not None:
            for queue in list(vhost.queues.values()):
                self._remove_queue(vhost, queue)
            for exchange in list(vhost.exchanges.values()):  # one by one: a cluster forgets them too
                if exchange.name and not exchange.name.startswith("amq.") and exchange.name in vhost.exchanges:
                    self._remove_exchange(vhost, exchange)
            if self.clients is not None:
                self.clients.close_vhost(name, f"vhost '{name}' is deleted")
        for kind in ("exchange", "queue", "binding"):
            for key, record in list(self.store.items(kind)):
                if record["vhost"] == name:
                    self.store.delete(kind, key)
        self.policies.drop_vhost(name)
        self.access.delete_vhost(name)

    # -- exchanges ----------------------------------------------------------------------------

    @staticmethod
    def check_exchange_declare(vhost: VHost, name: str, arguments: dict[str, Any] | None,
                               who: Principal | None) -> None:
        """configure on the exchange; with an alternate exchange also read on it and write on that one."""
        if who is None:
            return
        who.check("configure", "exchange", vhost.name, name)
        alternate = (arguments or {}).get("alternate-exchange")
        if alternate and isinstance(alternate, (str, bytes)):  # another type is declare's 406
            who.check("read", "exchange", vhost.name, name)
            who.check("write", "exchange", vhost.name, codec.text(alternate))

    def declare_exchange(self, vhost: VHost, name: str, type_name: str, passive: bool = False,
                         durable: bool = False, auto_delete: bool = False, internal: bool = False,
                         arguments: dict[str, Any] | None = None, who: Principal | None = None) -> Exchange:
        """exchange.declare for ``who`` (None: the node itself, e.g. a definitions import by an administrator)."""
        if not passive:
            self.check_exchange_declare(vhost, name, arguments, who)
        existing = vhost.exchanges.get(name)
        if passive:
            if name == "":
                raise errors.access_refused("operation not permitted on the default exchange")
            if existing is None:
                raise errors.not_found(f"no exchange '{name}' in vhost '{vhost.name}'")
            return existing
        # RabbitMQ's order: type, default exchange, then (only for a new exchange) the amq. prefix
        cls = exchange_class(type_name)
        if cls is None:
            raise ConnectionError(errors.COMMAND_INVALID, f"unknown exchange type '{type_name}'")
        if name == "":
            raise errors.access_refused("operation not permitted on the default exchange")
        if existing is None and name.startswith("amq."):
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
                        f"inequivalent arg '{arg}' for {what}: received '{_show(new)}' but current is '{_show(old)}'")
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
        vhost.exchanges[name] = exchange
        self.policies.apply_to_exchange(vhost.name, exchange)
        self._define(ExchangeRecord(vhost.name, name, type_name, durable, auto_delete, internal, arguments or {}),
                     durable)
        return exchange

    async def agree_exchange(self, vhost: VHost, name: str, type_name: str, durable: bool = False,
                             auto_delete: bool = False, internal: bool = False,
                             arguments: dict[str, Any] | None = None, who: Principal | None = None) -> None:
        """Cluster mode, before declaring a new exchange: the first declaration agreed on wins (see agree_queue)."""
        self.check_exchange_declare(vhost, name, arguments, who)
        if (self.cluster is not None and name and name not in vhost.exchanges and not name.startswith("amq.")
                and exchange_class(type_name) is not None):
            storable(arguments, resource_name("exchange", name, vhost.name))
            await self.cluster.agree(ExchangeRecord(vhost.name, name, type_name, durable, auto_delete, internal,
                                                    dict(arguments or {})))

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
        self._remove_exchange(vhost, exchange)

    def _remove_exchange(self, vhost: VHost, exchange: Exchange) -> None:
        del vhost.exchanges[exchange.name]
        for destination in exchange.destinations():
            removed = exchange.remove_destination(destination)
            vhost.unbound(exchange, destination, len(removed))
            for binding in removed:
                self._forget_binding(vhost, exchange.name, destination, binding.routing_key, binding.args_dict())
        self._drop_destination(vhost, exchange)
        self._undefine(ExchangeRecord(vhost.name, exchange.name, exchange.type_name), exchange.durable)

    # -- queues -------------------------------------------------------------------------------

    @staticmethod
    def check_queue_declare(vhost: VHost, name: str, arguments: dict[str, Any] | None,
                            who: Principal | None) -> None:
        """configure on the queue; with a dead-letter exchange also read on the queue and write on that
        exchange, as rabbit_channel checks them: dead letters may only go where their publisher could send."""
        if who is None:
            return
        who.check("configure", "queue", vhost.name, name)
        dlx = (arguments or {}).get("x-dead-letter-exchange")
        if isinstance(dlx, (str, bytes)):
            who.check("read", "queue", vhost.name, name)
            who.check("write", "exchange", vhost.name, codec.text(dlx))

    def declare_queue(self, vhost: VHost, name: str, passive: bool = False, durable: bool = False,
                      exclusive: bool = False, auto_delete: bool = False,
                      arguments: dict[str, Any] | None = None,
                      owner: "ExclusiveOwner[Queue] | None" = None, server_named: bool = False,
                      who: Principal | None = None) -> Queue:
        """queue.declare for ``who`` (None: the node itself); ``owner`` is the connection of an exclusive queue."""
        if not passive:
            self.check_queue_declare(vhost, name, arguments, who)
        existing = vhost.queues.get(name)
        if existing is not None and not existing.available:
            raise home_node_down(existing)
        self.churn.queue_declared += 1
        if passive:
            if existing is None:
                raise errors.not_found(f"no queue '{name}' in vhost '{vhost.name}'")
            self.check_exclusive(existing, owner)
            existing.touch()  # any redeclare, passive too, renews the x-expires lease (rabbit_amqqueue_process stat)
            return existing
        if name.startswith("amq.") and not server_named:
            raise errors.access_refused(f"queue name '{name}' contains reserved prefix 'amq.*'")
        arguments = self._typed(vhost, arguments, durable, exclusive, auto_delete)
        if existing is not None:
            self.check_exclusive(existing, owner)
            if exclusive != existing.exclusive:
                raise _exclusive_locked(existing)
            what = resource_name("queue", name, vhost.name)
            for arg, new, old in (("durable", durable, existing.durable),
                                  ("auto_delete", auto_delete, existing.auto_delete)):
                if new != old:
                    raise errors.precondition_failed(
                        f"inequivalent arg '{arg}' for {what}: received '{_show(new)}' but current is '{_show(old)}'")
            for arg in EQUIVALENT_QUEUE_ARGS:
                new, old = arguments.get(arg), existing.arguments.get(arg)
                if new != old:
                    if new is not None and old is not None:  # rabbit_misc: both set -> bare values
                        shown_new, shown_old = f"'{_show(new)}'", f"'{_show(old)}'"
                    else:
                        shown_new, shown_old = _show_arg(new), _show_arg(old)
                    raise errors.precondition_failed(
                        f"inequivalent arg '{arg}' for {what}: received {shown_new} but current is {shown_old}")
            existing.touch()
            return existing
        if who is not None:  # (rabbit_channel's check: imported and cluster definitions are not limited)
            self.limits.new_queue(vhost.name, len(vhost.queues), name)
        storable(arguments, resource_name("queue", name, vhost.name))
        args = queue_args.parse(arguments, name, vhost.name)
        queue_args.check_properties(args, name, vhost.name, durable, exclusive, auto_delete)
        queue = queue_class(args)(name, vhost.name, durable, owner if exclusive else None, auto_delete, arguments, args,
                                  self)
        vhost.queues[name] = queue
        self.churn.queue_created += 1
        self.policies.apply_to_queue(queue)
        if owner is not None and exclusive:
            owner.exclusive_queues.add(queue)
        if durable and not exclusive:
            queue.index_id = self.next_index_id()
        self.attach(queue, durable and not exclusive)
        if not exclusive:
            self._define(QueueRecord(vhost.name, name, durable, auto_delete, arguments, queue.index_id), durable)
        return queue

    def attach(self, queue: Queue, durable: bool) -> None:
        """A queue of this node gets its storage: the pager, and for a durable one the persistent store and a
        bounded window in memory (a transient queue pages only when memory runs short)."""
        queue.pager = self.pager
        if isinstance(queue, QuorumQueue):
            queue.members = [self.node_name]  # a group of one until the cluster replicates it
        if durable:
            queue.persistence = self.persistence
            if queue.pageable:
                queue.window = self.queue_window

    def add_remote_queue(self, vhost: VHost, queue: Queue) -> None:
        """A queue of another node joins the vhost as its proxy; the policies shown here are this vhost's
        (the owner enforces its own)."""
        vhost.queues[queue.name] = queue
        self.policies.apply_to_queue(queue)

    async def agree_queue(self, vhost: VHost, name: str, durable: bool = False, exclusive: bool = False,
                          auto_delete: bool = False, arguments: dict[str, Any] | None = None,
                          who: Principal | None = None) -> None:
        """Cluster mode, before declaring a new queue: the first declaration the cluster agrees on wins.

        Afterwards the queue (or its proxy) exists here, and ``declare_queue`` checks equivalence as usual.
        """
        self.check_queue_declare(vhost, name, arguments, who)
        if who is not None and name not in vhost.queues:
            self.limits.new_queue(vhost.name, len(vhost.queues), name)
        if self.cluster is not None and not exclusive and name not in vhost.queues:
            storable(arguments, resource_name("queue", name, vhost.name))
            await self.cluster.agree(QueueRecord(vhost.name, name, durable, auto_delete,
                                                 self._typed(vhost, arguments, durable, exclusive, auto_delete)))

    def _typed(self, vhost: VHost, arguments: dict[str, Any] | None, durable: bool, exclusive: bool,
               auto_delete: bool) -> dict[str, Any]:
        """A declaration's arguments with the vhost's ``default_queue_type`` written in where it applies: a
        durable, shared, kept queue that names no type (RabbitMQ 3.10)."""
        arguments = dict(arguments or {})
        if durable and not exclusive and not auto_delete and "x-queue-type" not in arguments:
            default = self.access.vhost_metadata(vhost.name).get("default_queue_type")
            if default not in (None, "classic"):
                arguments["x-queue-type"] = default
        return arguments

    async def find_queue(self, vhost: VHost, name: str) -> None:
        """Cluster mode: a queue unknown here may have just been declared elsewhere; if so, it is here after."""
        if self.cluster is not None and name not in vhost.queues:
            await self.cluster.look_up(QueueRecord.kind, name_key(vhost.name, name))

    def next_index_id(self) -> int:
        """Queue index ids are never reused, so a deleted queue's leftovers can't join a new one."""
        record = self.store.get("meta", "queue_index") or {"next": 1}
        self.store.put("meta", "queue_index", {"next": record["next"] + 1})
        return record["next"]

    def consumable(self, vhost: VHost, name: str, owner: "ExclusiveOwner[Queue] | None" = None,
                   who: Principal | None = None) -> Queue:
        """basic.consume for ``who`` (read): the queue, unless it is another connection's exclusive queue.
        The consumer's own exclusivity is checked by check_consumer_exclusivity once its arguments are read."""
        if who is not None:
            who.check("read", "queue", vhost.name, name)
        queue = vhost.queue(name)
        self.check_exclusive(queue, owner)
        return queue

    def consume(self, queue: Queue, target: "DeliveryTarget[Consumer, Entry]", tag: str, no_ack: bool, exclusive: bool,
                arguments: dict[str, Any], prefetch: int, global_prefetch: int = 0) -> Consumer:
        """basic.consume on a queue ``consumable`` found, for a channel or a consumer on another node: what the
        queue's type refuses, its x-priority, every exclusivity rule checked, the consumer added.  The caller
        answers, then lets the queue deliver (``deliver_ready``)."""
        priority = queue_args.check_consumer(queue.args, queue.name, queue.vhost, no_ack, prefetch, global_prefetch,
                                             arguments)
        self.check_consumer_exclusivity(queue, exclusive)
        consumer = Consumer(tag, target, queue, no_ack, exclusive, arguments, prefetch, codec.deliver_prefix(tag),
                            priority)
        queue.add_consumer(consumer)
        return consumer

    @staticmethod
    def check_consumer_exclusivity(queue: Queue, exclusive: bool) -> None:
        """An exclusive consumer wants the queue alone (none there, no single active consumer); nobody joins
        an exclusive consumer.  AMQP channels and remote consumers (cluster mode) both ask here."""
        if (exclusive and (queue.consumers or queue.args.single_active_consumer)
                or any(c.exclusive for c in queue.consumers)):
            raise errors.access_refused(f"{resource_name('queue', queue.name, queue.vhost)} in exclusive use")

    @staticmethod
    def check_exclusive(queue: Queue, connection: "ExclusiveOwner[Queue] | None") -> None:
        if queue.exclusive_owner is not None and queue.exclusive_owner is not connection:
            raise _exclusive_locked(queue)

    def delete_queue(self, vhost: VHost, name: str, if_unused: bool = False, if_empty: bool = False,
                     owner: "ExclusiveOwner[Queue] | None" = None, who: Principal | None = None) -> int:
        """queue.delete for ``who`` (configure); the count of ready messages it had."""
        if who is not None:
            who.check("configure", "queue", vhost.name, name)
        queue = vhost.queues.get(name)
        if queue is None:
            return 0  # idempotent, as RabbitMQ
        self.check_exclusive(queue, owner)
        what = resource_name("queue", name, vhost.name)
        if if_unused and queue.consumers:
            raise errors.precondition_failed(f"{what} in use")
        if if_empty and queue.message_count:
            raise errors.precondition_failed(f"{what} not empty")
        count = queue.message_count
        self._remove_queue(vhost, queue)
        return count

    def _remove_queue(self, vhost: VHost, queue: Queue) -> None:
        if vhost.queues.get(queue.name) is not queue:
            return
        del vhost.queues[queue.name]
        self.churn.queue_deleted += 1
        queue.deleted = True
        self._drop_destination(vhost, queue)
        for consumer in list(queue.consumers):
            consumer.channel.cancelled_by_broker(consumer)
        queue.consumers.clear()
        queue.drop_all()
        if queue.exclusive_owner is not None:
            queue.exclusive_owner.exclusive_queues.discard(queue)
        else:
            self._undefine(QueueRecord(vhost.name, queue.name), queue.durable)
        if queue.durable:
            self.store.delete("queue_offsets", str(queue.index_id))

    def dead_letter(self, queue: Queue, entries: list[Entry], reason: str) -> list[Entry]:
        """Republish entries that left ``queue`` for good to its dead-letter exchange; returns those no queue
        took (no such exchange, routed nowhere, refused), which at-most-once dead-lettering drops as
        RabbitMQ does and at-least-once keeps for a retry."""
        vhost = self.vhosts.get(queue.vhost)
        exchange = vhost.exchanges.get(queue.args.dead_letter_exchange) if vhost else None
        if exchange is None:
            return entries
        untaken = []
        for entry in entries:
            try:
                message = dead_letter_message(entry.message, queue.name, reason, exchange.name,
                                              queue.args.dead_letter_routing_key)
            except ValueError as exc:  # a definition stored before its arguments were checked at declare
                log.error("dead letter from queue %s in vhost %s dropped: %s", untrusted(queue.name),
                          untrusted(queue.vhost), untrusted(exc))
                continue
            routed = self.route(vhost, exchange, message)
            if routed is DEFERRED:  # a delayed exchange holds it
                continue
            targets = [target for target in routed if not cycle_detected(message, target.name)]
            accepted = [bool(target.enqueue(message)) for target in targets]
            if not any(accepted) and (targets or not routed):  # (routed only into a cycle: dropped)
                untaken.append(entry)
        return untaken

    def load_body(self, message: Message) -> None:
        """Bring back the body of a message that was recovered or paged out."""
        self.pager.load_body(message)

    def all_queues(self) -> Iterable[Queue]:
        for vhost in self.vhosts.values():
            yield from vhost.queues.values()

    def expire_queue(self, queue: Queue) -> None:
        """x-expires: the queue went unused for its whole lifetime setting."""
        vhost = self.vhosts.get(queue.vhost)
        if vhost is not None:
            log.info("queue %s in vhost %s expired (unused for %d ms)", untrusted(queue.name), untrusted(vhost.name),
                     queue.args.expires)
            self._remove_queue(vhost, queue)

    async def commit_offset(self, queue: Queue, offset: int) -> int:
        """Remove the queue's ready entries below ``offset`` (idempotent, monotonic): the Spark bridge's commit.

        A durable queue's offset high-water mark and commit cursor are saved (here and at shutdown), so
        after a restart offsets carry on above every offset a reader has seen, even when the entries
        at the tail were transient or removed.  The entries on disk leave once counted (at once when
        every one is below ``offset``, else a batch per loop turn: ``Queue.count_committed``); their index rows
        go in the background, named meanwhile by a drop mark in the queue index, which a restart drops first.
        Answers with how many were removed.
        """
        counted = queue.committed_drops
        removed = queue.remove_upto(offset)
        if queue.persistence is not None:
            self._save_offsets(queue)
        await paced(queue.count_committed)
        return removed + queue.committed_drops - counted

    def _save_offsets(self, queue: Queue) -> None:
        self.store.put("queue_offsets", str(queue.index_id), {"next_seq": queue.next_seq, "committed": queue.committed})

    def purge_local(self, vhost: VHost, name: str, owner: "ExclusiveOwner[Queue] | None" = None,
                    who: Principal | None = None) -> int:
        """queue.purge of a queue of this node for ``who`` (read); see purge_anywhere."""
        if who is not None:
            who.check("read", "queue", vhost.name, name)
        queue = vhost.queue(name)
        self.check_exclusive(queue, owner)
        return queue.purge()

    def remove_consumer(self, consumer: Consumer) -> None:
        """A consumer leaves its queue (cancelled, channel or link closed); auto-delete queues go with the last."""
        queue = consumer.queue
        queue.remove_consumer(consumer)
        if queue.unused_auto_delete and not queue.deleted:
            self._remove_queue(self.vhosts[queue.vhost], queue)

    def connection_closed(self, connection: "ExclusiveOwner[Queue]") -> None:
        """Its exclusive queues go with it."""
        self.churn.connection_closed += 1
        for queue in list(connection.exclusive_queues):
            self._remove_queue(self.vhosts[queue.vhost], queue)

    # -- bindings -----------------------------------------------------------------------------

    def bind(self, vhost: VHost, source: str, kind: str, destination: str, routing_key: str,
             arguments: dict[str, Any] | None = None, owner: "ExclusiveOwner[Queue] | None" = None,
             who: Principal | None = None) -> None:
        """queue.bind / exchange.bind (``kind`` queue or exchange) for ``who``: write on the destination and
        read on the source first, then both must exist, the source told first (rabbit_channel:binding_action's
        order)."""
        self._check_binding(vhost, source, kind, destination, routing_key, who)
        vhost.exchange(source)  # a missing source is told first, as in RabbitMQ
        if kind == "queue":
            target: Queue | Exchange = vhost.queue(destination)
            self.check_exclusive(target, owner)
        else:
            target = vhost.exchange(destination)
        self.add_binding(vhost, source, target, routing_key, arguments)

    def unbind(self, vhost: VHost, source: str, kind: str, destination: str, routing_key: str,
               arguments: dict[str, Any] | None = None, owner: "ExclusiveOwner[Queue] | None" = None,
               who: Principal | None = None) -> None:
        """queue.unbind / exchange.unbind for ``who``: what is gone (an auto-deleted queue, a missing source or
        destination) unbinds without error, as in RabbitMQ."""
        self._check_binding(vhost, source, kind, destination, routing_key, who)
        target = (vhost.queues if kind == "queue" else vhost.exchanges).get(destination)
        if target is None:
            return
        if kind == "queue":
            self.check_exclusive(target, owner)
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

    def add_binding(self, vhost: VHost, source: str, destination: Queue | Exchange, routing_key: str,
                    arguments: dict[str, Any] | None = None) -> None:
        """Bind (no permission check): bind, definitions import and the cluster's definitions come here."""
        exchange = self._bindable(vhost, source)
        storable(arguments, "binding")
        try:
            added = exchange.bind(destination, routing_key, arguments or {})
        except ValueError as exc:
            raise errors.precondition_failed(str(exc)) from None
        if not added:
            return
        vhost.bound(exchange, destination)
        if not _exclusive(destination):
            self._define(_binding(vhost, source, destination, routing_key, arguments, time.time_ns()),
                         exchange.durable and destination.durable)

    def remove_binding(self, vhost: VHost, source: str, destination: Queue | Exchange, routing_key: str,
                       arguments: dict[str, Any] | None = None) -> None:
        """Unbind (no permission check); an exchange or binding that is not there is no error."""
        if source == "":
            raise errors.access_refused("operation not permitted on the default exchange")
        exchange = vhost.exchanges.get(source)
        if exchange is None or not exchange.unbind(destination, routing_key, arguments or {}):
            return  # nothing to unbind is no error, as in RabbitMQ
        vhost.unbound(exchange, destination)
        self._forget_binding(vhost, source, destination, routing_key, arguments)
        self._auto_delete_exchange(vhost, exchange)

    @staticmethod
    def _bindable(vhost: VHost, source: str) -> Exchange:
        if source == "":
            raise errors.access_refused("operation not permitted on the default exchange")
        return vhost.exchange(source)

    def _forget_binding(self, vhost: VHost, source: str, destination: Queue | Exchange, routing_key: str,
                        arguments: dict[str, Any] | None) -> None:
        if not _exclusive(destination):
            self._undefine(_binding(vhost, source, destination, routing_key, arguments), destination.durable)

    def replace_queue(self, vhost: VHost, old: Queue, new: Queue) -> None:
        """Another object stands for the same queue from now on (a replicated queue's leader moved): its
        bindings move to it, and the consumers of the old one are cancelled, as RabbitMQ's are."""
        for exchange in list(vhost.sources.pop(old, ())):
            for binding in exchange.remove_destination(old):
                exchange.bind(new, binding.routing_key, binding.args_dict())
            vhost.bound(exchange, new)
        vhost.queues[new.name] = new
        for consumer in list(old.consumers):
            consumer.channel.cancelled_by_broker(consumer)
        old.consumers.clear()
        self.policies.apply_to_queue(new)

    def _drop_destination(self, vhost: VHost, destination: Queue | Exchange) -> None:
        """A queue or exchange is gone: remove every binding to it, at the cost of those bindings."""
        for exchange in list(vhost.sources.get(destination, ())):
            removed = exchange.remove_destination(destination)
            vhost.unbound(exchange, destination, len(removed))
            for binding in removed:
                self._forget_binding(vhost, exchange.name, destination, binding.routing_key, binding.args_dict())
            self._auto_delete_exchange(vhost, exchange)

    def _auto_delete_exchange(self, vhost: VHost, exchange: Exchange) -> None:
        if exchange.auto_delete and not exchange.has_bindings and vhost.exchanges.get(exchange.name) is exchange:
            self._remove_exchange(vhost, exchange)

    def bindings(self, vhost: VHost) -> Iterable[tuple[str, Queue | Exchange, str, dict]]:
        """(source, destination, routing key, arguments) of every binding, the default exchange's included."""
        for queue in vhost.queues.values():
            yield "", queue, queue.name, {}
        for exchange in vhost.exchanges.values():
            for binding in exchange.bindings():
                yield exchange.name, binding.destination, binding.routing_key, binding.args_dict()

    # -- publishing, getting, settling -------------------------------------------------------
    # basic.publish / basic.get / ack on an AMQP channel and the HTTP API's publish, get and
    # move all come through these.

    def publish(self, vhost: VHost, exchange: Exchange, message: Message,
                publisher: Publisher | None = None, confirm: "ConfirmSink | None" = None) -> tuple[bool, bool]:
        """Route and enqueue: (routed to some queue or held by a delayed exchange, a queue's length limit
        rejected it).  ``publisher`` is the channel of a mandatory publish, for a delayed message's return;
        ``confirm`` the confirm-mode channel that copies forwarded to other nodes confirm to.

        A queue whose home node is down takes nothing (enqueue answers None): routed only to such
        queues, the message is unroutable.
        """
        queues = self.route(vhost, exchange, message, publisher)
        exchange.publish_in += 1
        if queues:
            exchange.publish_out += 1
        rejected = False
        unavailable = 0
        for queue in queues:
            accepted = queue.enqueue(message, confirm)
            if not accepted:
                if accepted is None:
                    unavailable += 1
                else:
                    rejected = True
        return len(queues) > unavailable or queues is DEFERRED, rejected

    @staticmethod
    def check_publish(vhost: VHost, exchange: Exchange, who: Principal | None, routing_key: str) -> None:
        """May ``who`` publish to the exchange with ``routing_key``: write on it, it is not internal, and
        ``check_topic_write``.  A channel may skip this for an exchange it checked, but for the latter."""
        if who is not None:
            who.check("write", "exchange", vhost.name, exchange.name)
        if exchange.internal:
            raise errors.access_refused(
                f"cannot publish to internal {resource_name('exchange', exchange.name, vhost.name)}")
        Broker.check_topic_write(vhost, exchange, who, routing_key)

    @staticmethod
    def check_topic_write(vhost: VHost, exchange: Exchange, who: Principal | None, routing_key: str) -> None:
        """On a topic exchange, the user's topic permission there (if it has one now) must let it publish with
        ``routing_key``.  Topic permissions may change while a channel is open: checked for every message."""
        if who is not None and who.topics and exchange.type_name == "topic":
            who.check_topic("write", vhost.name, exchange.name, routing_key)

    @staticmethod
    def check_message(vhost: VHost, exchange: Exchange, who: Principal | None, message: Message,
                      user_name: str) -> None:
        """A published message's user_id must be the publisher's, its expiration an integer, CC/BCC arrays of keys
        that ``check_topic_write`` allows as it allows the routing key (RabbitMQ 3.10 let them past the topic
        permission; later versions check every key, as here)."""
        user_id = message.property_str(codec.FLAG_USER_ID)
        if user_id is not None and user_id != user_name:
            raise errors.precondition_failed(
                f"user_id property set to '{user_id}' but authenticated user was '{user_name}'")
        expiration = message.property_str(codec.FLAG_EXPIRATION)
        if expiration is not None:
            error = expiration_error(expiration)
            if error is not None:
                raise errors.precondition_failed(f"invalid expiration '{expiration}': {error}")
        if message.has_headers:
            for key in sender_selected.check(message):
                Broker.check_topic_write(vhost, exchange, who, key)

    def get_local(self, vhost: VHost, name: str, no_ack: bool, owner: "ExclusiveOwner[Queue] | None" = None,
                  who: Principal | None = None) -> tuple[Queue, Entry | None]:
        """basic.get of a queue of this node for ``who`` (read): the queue and its head entry (None if empty);
        with no_ack=False the caller settles it.  See get_anywhere for any node's queue."""
        if who is not None:
            who.check("read", "queue", vhost.name, name)
        queue = vhost.queue(name)
        self.check_exclusive(queue, owner)
        return queue, queue.get(no_ack)

    async def get_anywhere(self, vhost: VHost, name: str, no_ack: bool, owner: "ExclusiveOwner[Queue] | None" = None,
                    who: Principal | None = None) -> tuple[Queue, Entry | None]:
        """basic.get on any queue, one owned by another node (cluster mode) included."""
        if who is not None:
            who.check("read", "queue", vhost.name, name)
        queue = vhost.queue(name)
        if not queue.remote:
            return self.get_local(vhost, name, no_ack, owner)
        self.check_exclusive(queue, owner)
        return queue, await queue.fetch(no_ack)

    def peek(self, queue: Queue, offset: int, count: int, who: Principal | None = None) -> list[Entry]:
        """Ready entries from ``offset`` without taking them (management API) for ``who`` (read); another
        connection's exclusive queue is locked, as it is to basic.get."""
        if who is not None:
            who.check("read", "queue", queue.vhost, queue.name)
        self.check_exclusive(queue, None)
        return queue.peek(offset, count)

    async def purge_anywhere(self, vhost: VHost, name: str, owner: "ExclusiveOwner[Queue] | None" = None,
                             who: Principal | None = None) -> int:
        """queue.purge on any queue, one owned by another node (cluster mode) included."""
        if who is not None:
            who.check("read", "queue", vhost.name, name)
        queue = vhost.queue(name)
        if not queue.remote:
            return self.purge_local(vhost, name, owner)
        self.check_exclusive(queue, owner)
        return await queue.purge_remote()

    @staticmethod
    def settle(queue: Queue, entries: list[Entry], requeue: bool, reject: bool = False) -> None:
        """Entries taken with manual ack were acked (reject=False), rejected/nacked, or are requeued."""
        if queue.deleted:
            queue.settle(entries)
        elif requeue:
            queue.requeue(entries)
        else:
            if reject:
                queue.reject(entries)
            else:
                queue.settle(entries)
            queue.deliver_ready()

    def nack_taken(self, taken: list[tuple[Entry, Queue, Consumer | None]], requeue: bool) -> None:
        """basic.nack or basic.reject of what a client held: requeued or rejected (dead-lettered), unless a queue
        refuses them (a stream: the connection closes, and what the frame named is requeued first, as the rest
        of what the connection held is as it closes)."""
        try:
            for queue in {queue for _, queue, _ in taken}:
                queue_args.check_nack(queue.args, queue.name, queue.vhost)
        except AMQPError:
            self.settle_taken(taken, True)
            raise
        self.settle_taken(taken, requeue, reject=not requeue)

    def settle_taken(self, taken: Iterable[tuple[Entry, Queue, Consumer | None]], requeue: bool,
                     reject: bool = False) -> None:
        """Settle what a client held (by a consumer, or None: by basic.get), each queue's entries in one call;
        the consumers get their credit back."""
        by_queue: dict[Queue, list[Entry]] = {}
        for entry, queue, consumer in taken:
            if consumer is not None:
                consumer.unacked -= 1
            entries = by_queue.get(queue)
            if entries is None:
                by_queue[queue] = [entry]
            else:
                entries.append(entry)
        settle = self.settle
        for queue, entries in by_queue.items():
            settle(queue, entries, requeue, reject)

    def move_messages(self, source: Queue, destination: Queue, count: int | None = None,
                      who: Principal | None = None) -> int:
        """Move up to ``count`` (default all) ready messages from one queue to the tail of another, in order,
        for ``who`` (read on the source, write on the destination); neither may be another connection's
        exclusive queue.

        Each message keeps its properties, exchange and routing key (replaying a dead-letter queue).
        A destination that refuses a message (reject-publish) stops the move; that message stays.
        """
        if who is not None:
            who.check("read", "queue", source.vhost, source.name)
            who.check("write", "queue", destination.vhost, destination.name)
        self.check_exclusive(source, None)
        self.check_exclusive(destination, None)
        if source is destination:
            raise errors.precondition_failed("source and destination are the same queue")
        moved = 0
        while count is None or moved < count:
            entry = source.get(no_ack=False)
            if entry is None:
                break
            message = entry.message
            if message.msg_id and not message.persistent:  # a quorum queue's stored copy: transient elsewhere
                message = message.copy()
            if destination.deleted or not destination.enqueue(message):
                self.settle(source, [entry], requeue=True)
                break
            self.settle(source, [entry], requeue=False)
            moved += 1
        return moved

    # -- routing ------------------------------------------------------------------------------

    def route(self, vhost: VHost, exchange: Exchange, message: Message,
              publisher: Publisher | None = None) -> Collection[Queue]:
        """The queues a message goes to, through exchange-to-exchange bindings and alternate exchanges.

        A delayed exchange on the way that defers the message hands it to ``delayed``; if nothing else
        took it, the answer is ``DEFERRED`` (empty, but not unroutable).
        """
        if message.has_headers:
            extra = sender_selected.routing_keys(message)
            if extra:
                return self._route_keys(vhost, exchange, message, (message.routing_key, *extra), publisher)
        if exchange.name == "":
            queue = vhost.queues.get(message.routing_key)
            return (queue,) if queue is not None else self.replies.route(message.routing_key)
        destinations = exchange.route(message.routing_key, message)
        if not vhost.e2e_bindings and (destinations or exchange.alternate is None):
            if destinations is DEFERRED:
                self.delayed.defer(vhost, exchange, message, publisher)
            return destinations
        return self._route_keys(vhost, exchange, message, (message.routing_key,), publisher)

    def _route_keys(self, vhost: VHost, exchange: Exchange, message: Message,
                    keys: tuple[str, ...], publisher: Publisher | None = None) -> Collection[Queue]:
        """Route by several keys (CC/BCC) at once: each queue once, an alternate exchange only for an
        exchange none of the keys routes through."""
        queues: dict[Queue, None] = {}
        if exchange.name == "":
            for key in keys:
                queue = vhost.queues.get(key)
                queues.update(dict.fromkeys((queue,) if queue is not None else self.replies.route(key)))
            return queues.keys()
        seen: set[Exchange] = set()
        pending = [exchange]
        deferred = False
        while pending:
            current = pending.pop()
            if current in seen:
                continue
            seen.add(current)
            routed = current.route(keys[0], message)
            if routed is DEFERRED:  # whatever the key: the delay is the message's
                self.delayed.defer(vhost, current, message, publisher)
                deferred = True
                continue
            if len(keys) > 1:
                routed = [destination for key in keys for destination in current.route(key, message)]
            for destination in routed:
                if isinstance(destination, Queue):
                    queues[destination] = None
                else:
                    pending.append(destination)
            if not routed:
                alternate = vhost.exchanges.get(current.alternate or "")
                if alternate is not None and alternate.name:
                    pending.append(alternate)
        return DEFERRED if deferred and not queues else queues.keys()

    # -- recovery -----------------------------------------------------------------------------

    def _stored(self, cls: type[R]) -> Iterator[R]:
        for _, raw in self.store.items(cls.kind):
            yield cls.from_json(raw)

    def _recover_definitions(self) -> None:
        for name in self.access.vhosts():
            self.vhost(name)
        for exchange_record in self._stored(ExchangeRecord):
            vhost = self.vhosts.get(exchange_record.vhost)
            cls = exchange_class(exchange_record.type)
            if vhost is None or cls is None:
                continue
            vhost.exchanges[exchange_record.name] = cls(
                exchange_record.name, durable=True, auto_delete=exchange_record.auto_delete,
                internal=exchange_record.internal, arguments=exchange_record.arguments)
        durable: list[Queue] = []
        for record in self._stored(QueueRecord):
            vhost = self.vhosts.get(record.vhost)
            if vhost is None:
                continue
            arguments = record.arguments
            try:
                args = queue_args.parse(arguments, record.name, vhost.name)
            except ChannelError as exc:  # stored before today's checks: recover, without its arguments
                log.error("queue %s in vhost %s: stored arguments refused (%s); recovered without them",
                          untrusted(record.name), untrusted(vhost.name), untrusted(exc.text))
                arguments = {}
                args = queue_args.parse(arguments, record.name, vhost.name)
            queue = vhost.queues[record.name] = queue_class(args)(
                record.name, vhost.name, True, None, record.auto_delete, arguments, args, self)
            queue.index_id = record.index_id
            self.attach(queue, True)
            durable.append(queue)
        # a cluster's replicated queues keep copies here too (forwarder.quorum): not orphans
        self.persistence.recover(durable, {saved["index_id"] for _, saved in self.store.items("replica")})
        for queue in durable:  # offsets never go back across restarts (see commit_offset)
            saved = self.store.get("queue_offsets", str(queue.index_id))
            if saved is not None:
                queue.next_seq = max(queue.next_seq, saved["next_seq"])
                queue.committed = min(saved["committed"], queue.next_seq)  # one saved past the tail: at the tail
        # in the order they were made: a consistent-hash ring is laid out in binding order
        for binding in sorted(self._stored(BindingRecord), key=lambda r: r.created):
            vhost = self.vhosts.get(binding.vhost)
            if vhost is None:
                continue
            source, destination = vhost.binding_ends(binding)
            if source is not None and destination is not None:
                source.bind(destination, binding.routing_key, binding.arguments)
                vhost.bound(source, destination)
        for vhost in self.vhosts.values():
            self.policies.apply_to_vhost(vhost)
        log.info("recovered definitions: %d vhosts, %d exchanges, %d queues",
                 len(self.vhosts), sum(len(v.exchanges) for v in self.vhosts.values()),
                 sum(len(v.queues) for v in self.vhosts.values()))


def _binding(vhost: VHost, source: str, destination: Queue | Exchange, routing_key: str,
             arguments: dict[str, Any] | None, created: int = 0) -> BindingRecord:
    kind = "queue" if isinstance(destination, Queue) else "exchange"
    return BindingRecord(vhost.name, source, destination.name, kind, routing_key, dict(arguments or {}), created)


def storable(arguments: dict[str, Any] | None, what: str) -> None:
    """Arguments Warren could not keep (in LMDB, etcd, an export) are refused before anything is made: tables nested
    deeper than ``field_types.MAX_DEPTH`` (406, RabbitMQ's code for arguments it refuses)."""
    try:
        field_types.to_json(arguments or {})
    except (TypeError, ValueError) as exc:
        raise errors.precondition_failed(f"invalid arguments for {what}: {exc}") from None


def _exclusive(destination: Queue | Exchange) -> bool:
    """Exclusive queues live on their connection's node only: their bindings are not the cluster's."""
    return isinstance(destination, Queue) and destination.exclusive


def _exclusive_locked(queue: Queue) -> ChannelError:
    return errors.resource_locked(
        f"cannot obtain exclusive access to locked {resource_name('queue', queue.name, queue.vhost)}. "
        "It could be originally declared on another connection or the exclusive property value does not "
        "match that of the original declaration.")


def _show(value: Any) -> str:
    return _flag(value) if isinstance(value, bool) else str(value)


def _show_arg(value: Any) -> str:
    """rabbit_misc:val/1 for a table entry: its value and AMQP field type (``none`` when absent)."""
    if value is None:
        return "none"
    return f"the value '{_show(value)}' of type '{field_types.name(value)}'"
