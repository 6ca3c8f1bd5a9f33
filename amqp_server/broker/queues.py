"""Queues as the broker holds them (RabbitMQ's rabbit_amqqueue): declare, with its permission checks and
equivalence, find, consume from, delete; exclusive and auto-delete queues going with their owner or last
consumer; and what a queue asks of the broker that holds it (``queue.QueueHost``).  One queue's messages are
``queues/queue.py``'s.
"""
from __future__ import annotations

import contextlib
import logging
from typing import TYPE_CHECKING, Any, AsyncIterator, Callable, Iterable

from ..framing import codec
from .. import errors
from ..queues import types as queue_types
from ..access_control import AccessControl, Principal
from ..definition_store import DefinitionStore
from ..errors import resource_name
from .limits import Limits
from ..logs import untrusted
from ..message import Message
from ..queues.paging import Pager
from ..queues.persistence import Persistence
from ..queues.policy import Policies
from ..queues.priority_queue import RankedRows
from ..queues.queue import AnyQueue, Consumer, Entry, LocalQueue, Queue
from ..queues.replica_store import ReplicaStore
from ..queues.queue_type import EXCLUSIVE_CONSUME, LOG
from ..records import QueueRecord, name_key
from ..stats import ChurnStats
from .vhost import VHost, home_node_down
from .bindings import Bindings
from .definitions import Definitions, check_exclusive, exclusive_locked, shown, shown_arg, storable
from .dead_letters import DeadLetters

if TYPE_CHECKING:
    from ..ports import DeliveryTarget, ExclusiveOwner, QueueTarget, SharedLimit
    from stream_log.log import StreamLogs

log = logging.getLogger("warren.broker")


OFFSET_BLOCK = 4096  # offsets reserved for readers at once (``Queues.reserve_offsets``): a write each, at most


class Storage:
    """Where this node's queues keep their messages: the pager, the persistent store for durable queues and what
    their types keep apart (``queue_type.NodeStorage``), and how much of a durable queue stays in memory."""

    def __init__(self, node_name: str, pager: Pager, persistence: Persistence, queue_window: int,
                 ranked_rows: RankedRows, replicas: ReplicaStore, stream_logs: StreamLogs) -> None:
        self.node_name = node_name
        self.pager = pager
        self.persistence = persistence
        self.queue_window = queue_window
        self.ranked_rows = ranked_rows
        self.replicas = replicas
        self.stream_logs = stream_logs

    def attach(self, queue: LocalQueue, durable: bool) -> None:
        """A queue of this node gets its storage, as its type hands it out (``QueueType.attached``)."""
        queue.type.attached(queue, self, durable)


class Queues:
    """The broker's queue operations, and the host of the queues it makes (``queue.QueueHost``): their dead
    letters, their expiry, the bodies they page back in."""

    def __init__(self, vhosts: dict[str, VHost], storage: Storage, definitions: Definitions, bindings: Bindings,
                 dead_letters: DeadLetters, policies: Policies, access: AccessControl, limits: Limits,
                 churn: ChurnStats) -> None:
        self.vhosts = vhosts
        self.storage = storage
        self.definitions = definitions
        self.store: DefinitionStore = definitions.store
        self.bindings = bindings
        self.policies = policies
        self.access = access
        self.limits = limits
        self.churn = churn
        self.node_name = storage.node_name
        self.dead_letter = dead_letters.dead_letter
        self.load_body: Callable[[Message], None] = storage.pager.load_body
        # publishers whose target names a queue, by vhost and queue name: told when it is deleted
        self.targets: dict[tuple[str, str], dict[QueueTarget[AnyQueue], None]] = {}
        # (vhost, name) of exclusive queues the cluster agreed on for a declaration not made yet (``unclaimed``)
        self.agreed_exclusive: set[tuple[str, str]] = set()
        # a durable queue's offsets readers may be shown, by index id: below the ceiling saved (``reserve_offsets``)
        self.reserved: dict[int, int] = {}

    @staticmethod
    def check_queue_declare(vhost: VHost, name: str, arguments: dict[str, Any] | None,
                            who: Principal | None) -> None:
        """configure on the queue; for a new one with a dead-letter exchange also read on the queue and write on
        that exchange, as rabbit_channel checks them (a queue declared again needs neither): dead letters may only
        go where their publisher could send."""
        if who is None:
            return
        who.check("configure", "queue", vhost.name, name)
        dlx = (arguments or {}).get("x-dead-letter-exchange")
        if name not in vhost.queues and isinstance(dlx, (str, bytes)):
            who.check("read", "queue", vhost.name, name)
            who.check("write", "exchange", vhost.name, codec.text(dlx))

    def declare_queue(self, vhost: VHost, name: str, passive: bool = False, durable: bool = False,
                      exclusive: bool = False, auto_delete: bool = False,
                      arguments: dict[str, Any] | None = None,
                      owner: "ExclusiveOwner[Queue] | None" = None, server_named: bool = False,
                      who: Principal | None = None) -> AnyQueue:
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
            check_exclusive(existing, owner)
            existing.touch()  # any redeclare, passive too, renews the x-expires lease (rabbit_amqqueue_process stat)
            return existing
        if name.startswith("amq.") and not server_named:
            raise errors.access_refused(f"queue name '{name}' contains reserved prefix 'amq.*'")
        arguments = self._typed(vhost, arguments, durable, exclusive, auto_delete)
        if existing is not None:
            check_exclusive(existing, owner)
            if exclusive != existing.exclusive:
                raise exclusive_locked(existing)
            what = resource_name("queue", name, vhost.name)
            for arg, asked, was in (("durable", durable, existing.durable),
                                    ("auto_delete", auto_delete, existing.auto_delete)):
                if asked != was:
                    raise errors.precondition_failed(
                        f"inequivalent arg '{arg}' for {what}: received '{shown(asked)}' but current is '{shown(was)}'")
            for arg in existing.type.equivalent_arguments:
                new, old = arguments.get(arg), existing.arguments.get(arg)
                if new != old:
                    if new is not None and old is not None:  # rabbit_misc: both set -> bare values
                        shown_new, shown_old = f"'{shown(new)}'", f"'{shown(old)}'"
                    else:
                        shown_new, shown_old = shown_arg(new), shown_arg(old)
                    raise errors.precondition_failed(
                        f"inequivalent arg '{arg}' for {what}: received {shown_new} but current is {shown_old}")
            existing.touch()
            return existing
        if who is not None:  # (rabbit_channel's check: imported and cluster definitions are not limited)
            self.limits.new_queue(vhost.name, len(vhost.queues), name)
        what = resource_name("queue", name, vhost.name)
        storable(arguments, what, queue=True)
        if durable and not exclusive:
            self.definitions.check_room(what, arguments, who)
        kind, args = queue_types.declared(arguments, name, vhost.name)
        kind.check_properties(name, vhost.name, durable, exclusive, auto_delete)
        queue = kind.new(name, vhost.name, durable, owner if exclusive else None, auto_delete, arguments, args, self)
        if durable and not exclusive:
            queue.index_id = self.next_index_id()
        if not exclusive:  # kept first: a write that fails leaves nothing behind
            record = QueueRecord(vhost.name, name, durable, auto_delete, arguments, queue.index_id)
            self.definitions.define(record, durable)
        elif self.definitions.cluster is not None and (vhost.name, name) not in self.agreed_exclusive:
            # (cluster mode: the cluster's, agreed on before unless etcd was unreachable then)
            self.definitions.define(QueueRecord(vhost.name, name, durable, auto_delete, arguments, exclusive=True),
                                    False)
        vhost.queues[name] = queue
        self.churn.queue_created += 1
        self.policies.apply_to_queue(queue)
        if owner is not None and exclusive:
            owner.exclusive_queues.add(queue)
        self.storage.attach(queue, durable and not exclusive)
        return queue

    def add_remote_queue(self, vhost: VHost, queue: AnyQueue) -> None:
        """A queue of another node joins the vhost as its proxy; the policies shown here are this vhost's
        (the owner enforces its own)."""
        vhost.queues[queue.name] = queue
        self.policies.apply_to_queue(queue)

    async def agree_queue(self, vhost: VHost, name: str, durable: bool = False, exclusive: bool = False,
                          auto_delete: bool = False, arguments: dict[str, Any] | None = None,
                          who: Principal | None = None) -> bool:
        """Cluster mode, before declaring a new queue: the first declaration the cluster agrees on wins.

        Afterwards the queue (or its proxy) exists here, and ``declare_queue`` checks equivalence as usual; an
        exclusive one agreed on for this declaration does once that declaration makes it.  Whether the cluster
        agreed on it now (not a queue known here, nor one made while etcd is unreachable).
        """
        self.check_queue_declare(vhost, name, arguments, who)
        if who is not None and name not in vhost.queues:
            self.limits.new_queue(vhost.name, len(vhost.queues), name)
        cluster = self.definitions.cluster
        if cluster is not None and name not in vhost.queues:
            what = resource_name("queue", name, vhost.name)
            storable(arguments, what, queue=True)
            typed = self._typed(vhost, arguments, durable, exclusive, auto_delete)
            if exclusive:  # (its connection's declaration makes it: what it would refuse is refused before)
                queue_types.declared(typed, name, vhost.name)[0].check_properties(name, vhost.name, durable,
                                                                                   exclusive, auto_delete)
                if not cluster.current:  # (etcd unreachable: made here, its record written through later)
                    return False
            elif durable:
                self.definitions.check_room(what, arguments, who)
            await cluster.agree(QueueRecord(vhost.name, name, durable, auto_delete, typed, exclusive=exclusive))
            if exclusive:
                self.agreed_exclusive.add((vhost.name, name))
            return True
        return False

    @contextlib.asynccontextmanager
    async def declaring(self, vhost: VHost, name: str, durable: bool = False, exclusive: bool = False,
                        auto_delete: bool = False, arguments: dict[str, Any] | None = None,
                        who: Principal | None = None) -> AsyncIterator[None]:
        """Around a front end's ``declare_queue`` (every front end's, so that none answers early).  In cluster mode
        the cluster agrees on a new queue first (``agree_queue``), and the block's end waits until the nodes this
        one reaches have it (``Definitions.agreed``), as RabbitMQ answers once every node's Mnesia has it: a publish
        through another node right after the answer is routed to the queue.  An exclusive queue agreed on but not
        declared (refused, or its connection gone meanwhile) loses its record (``unclaimed``)."""
        agreed = await self.agree_queue(vhost, name, durable, exclusive, auto_delete, arguments, who)
        try:
            yield
        finally:
            if agreed and exclusive:
                self.unclaimed(vhost, name)
        if agreed:
            await self.definitions.agreed()

    def unclaimed(self, vhost: VHost, name: str) -> None:
        """Cluster mode: an exclusive queue agreed on (``agree_queue``) that its connection did not declare after
        all (the declaration refused, the channel gone meanwhile): its record goes, unless another connection's
        queue of that name is there."""
        if (vhost.name, name) in self.agreed_exclusive:
            self.agreed_exclusive.discard((vhost.name, name))
            if name not in vhost.queues:
                self.definitions.undefine(QueueRecord(vhost.name, name), False)

    def _typed(self, vhost: VHost, arguments: dict[str, Any] | None, durable: bool, exclusive: bool,
               auto_delete: bool) -> dict[str, Any]:
        """A declaration's arguments with the vhost's ``default_queue_type`` written in where it applies: a
        durable, shared, kept queue that names no type (RabbitMQ 3.10)."""
        arguments = dict(arguments or {})
        if durable and not exclusive and not auto_delete:
            queue_types.with_default(arguments, self.access.vhost_metadata(vhost.name).get("default_queue_type"))
        return arguments

    async def find_queue(self, vhost: VHost, name: str) -> None:
        """Cluster mode: a queue unknown here may have just been declared elsewhere; if so, it is here after."""
        cluster = self.definitions.cluster
        if cluster is not None and name not in vhost.queues:
            await cluster.look_up(QueueRecord.kind, name_key(vhost.name, name))

    def next_index_id(self) -> int:
        """Queue index ids are never reused, so a deleted queue's leftovers can't join a new one."""
        record = self.store.get("meta", "queue_index") or {"next": 1}
        self.store.put("meta", "queue_index", {"next": record["next"] + 1})
        return record["next"]

    def consumable(self, vhost: VHost, name: str, owner: "ExclusiveOwner[Queue] | None" = None,
                   who: Principal | None = None) -> AnyQueue:
        """basic.consume for ``who`` (read): the queue, unless it is another connection's exclusive queue.
        The consumer's own exclusivity is checked by check_consumer_exclusivity once its arguments are read."""
        if who is not None:
            who.check("read", "queue", vhost.name, name)
        queue = vhost.queue(name)
        check_exclusive(queue, owner)
        return queue

    def consume(self, queue: AnyQueue, target: "DeliveryTarget[Consumer, Entry]", tag: str, no_ack: bool,
                exclusive: bool, arguments: dict[str, Any], prefetch: int, global_prefetch: int = 0,
                filter_set: bytes | None = None, limiter: "SharedLimit[Consumer] | None" = None) -> Consumer:
        """basic.consume on a queue ``consumable`` found, for a channel or a consumer on another node: what the
        queue's type refuses, its x-priority, every exclusivity rule checked, the consumer added.  The caller
        answers, then lets the queue deliver (``deliver_ready``).  ``filter_set``: an AMQP 1.0 consumer's filters
        (encoded), told to the owner of a queue of another node with the consumer; ``limiter``: the channel's
        shared prefetch, which bounds what such a queue sends the consumer (``ports.SharedLimit``)."""
        priority = queue.type.check_consumer(queue.name, queue.vhost, no_ack, prefetch, global_prefetch, arguments)
        self.check_consumer_exclusivity(queue, exclusive)
        consumer = Consumer(tag, target, queue, no_ack, exclusive, arguments, prefetch, codec.deliver_prefix(tag),
                            priority)
        consumer.filter_set = filter_set
        consumer.limiter = limiter
        queue.add_consumer(consumer)
        return consumer

    @staticmethod
    def check_consumer_exclusivity(queue: AnyQueue, exclusive: bool) -> None:
        """An exclusive consumer wants the queue alone (none there, no single active consumer); nobody joins
        an exclusive consumer, where the type has them (``EXCLUSIVE_CONSUME``).  AMQP channels and remote consumers
        (cluster mode) both ask here."""
        if EXCLUSIVE_CONSUME not in queue.type.capabilities:
            return
        if (exclusive and (queue.consumers or queue.args.single_active_consumer)
                or any(c.exclusive for c in queue.consumers)):
            raise errors.access_refused(f"{resource_name('queue', queue.name, queue.vhost)} in exclusive use")

    def delete_queue(self, vhost: VHost, name: str, if_unused: bool = False, if_empty: bool = False,
                     owner: "ExclusiveOwner[Queue] | None" = None, who: Principal | None = None) -> int:
        """queue.delete for ``who`` (configure); the count of ready messages it had."""
        if who is not None:
            who.check("configure", "queue", vhost.name, name)
        queue = vhost.queues.get(name)
        if queue is None:
            return 0  # idempotent, as RabbitMQ
        check_exclusive(queue, owner)
        if not queue.type.delete_checks(name, vhost.name, if_unused, if_empty):
            self.remove(vhost, queue)
            return 0
        what = resource_name("queue", name, vhost.name)
        if if_empty and queue.message_count:  # (checked first, as rabbit_amqqueue_process does)
            raise errors.precondition_failed(f"{what} not empty")
        if if_unused and queue.consumers:
            raise errors.precondition_failed(f"{what} in use")
        count = queue.message_count
        self.remove(vhost, queue)
        return count

    async def delete_anywhere(self, vhost: VHost, name: str, if_unused: bool = False, if_empty: bool = False,
                              owner: "ExclusiveOwner[Queue] | None" = None, who: Principal | None = None) -> int:
        """queue.delete on any queue (``delete_queue``'s checks).  A classic queue of another node (cluster mode)
        is deleted by its node, which checks if-unused and if-empty against its queue as it is then (every
        node's consumers, the messages it holds) and counts them, as RabbitMQ's queue process answers
        ``{delete, IfUnused, IfEmpty, _}`` whichever node asks (rabbit_amqqueue_process): a proxy's own view,
        this node's consumers and the count last reported, is not the queue's.  That node answers once etcd
        has the deletion (``Broker.agreed``); the proxy here goes then, if the cluster's change has not taken it
        yet."""
        if who is not None:
            who.check("configure", "queue", vhost.name, name)
        queue = vhost.queues.get(name)
        if queue is not None:
            check_exclusive(queue, owner)
            queue.type.delete_checks(name, vhost.name, if_unused, if_empty)
            count = await queue.deleted_by_node(if_unused, if_empty)
            if count is not None:
                self.remove(vhost, queue, undefine=False)
                return count
        return self.delete_queue(vhost, name, if_unused, if_empty, owner)

    def remove(self, vhost: VHost, queue: AnyQueue, undefine: bool = True) -> None:
        """A queue goes (deleted, expired, its owner or last consumer gone, its vhost deleted), with its bindings
        and its definition (unless ``undefine`` is False: another node's queue its node deleted, and its
        definition with it)."""
        if vhost.queues.get(queue.name) is not queue:
            return
        del vhost.queues[queue.name]
        self.churn.queue_deleted += 1
        queue.deleted = True
        self.bindings.drop_destination(vhost, queue)
        for consumer in list(queue.consumers):
            consumer.channel.cancelled_by_broker(consumer)
        queue.consumers.clear()
        for target in list(self.targets.pop((vhost.name, queue.name), ())):
            target.target_deleted(queue)
        try:
            queue.drop_all()
        finally:  # (its definition goes whatever its storage does: gone here, it would come back at a restart)
            local = queue.local()
            exclusive = local is not None and local.exclusive_owner is not None
            if local is not None and local.exclusive_owner is not None:
                local.exclusive_owner.exclusive_queues.discard(local)
            if undefine and (not exclusive or self.definitions.cluster is not None):  # (exclusive: etcd's only)
                self.definitions.undefine(QueueRecord(vhost.name, queue.name), queue.durable and not exclusive)
            if local is not None and local.durable:  # (another node's keeps its offsets there)
                self.store.delete("queue_offsets", str(local.index_id))
                self.reserved.pop(local.index_id, None)

    def watch_target(self, vhost: str, name: str, target: QueueTarget[AnyQueue]) -> None:
        """``target`` publishes to the queue ``name``: it is told when the queue is deleted (once)."""
        self.targets.setdefault((vhost, name), {})[target] = None

    def unwatch_target(self, vhost: str, name: str, target: QueueTarget[AnyQueue]) -> None:
        watching = self.targets.get((vhost, name))
        if watching is not None:
            watching.pop(target, None)
            if not watching:
                del self.targets[(vhost, name)]

    def save_offsets(self, queue: LocalQueue, ceiling: int | None = None) -> None:
        """A durable queue's offsets, kept across restarts (see ``Recovery``): they never go back.  What is saved as
        its ``next_seq`` is ``ceiling`` (by default the highest of its ``next_seq`` and the offsets reserved for
        readers, ``reserve_offsets``): a restart, even after a ``kill -9``, carries on from there."""
        if ceiling is None:
            ceiling = max(queue.next_seq, self.reserved.get(queue.index_id, 0))
        self.store.put("queue_offsets", str(queue.index_id), {"next_seq": ceiling, "committed": queue.committed})

    def reserve_offsets(self, queue: LocalQueue) -> int | None:
        """A reader (the Spark bridge's ``/offsets`` and ``/records``) is about to be shown offsets up to the queue's
        ``next_seq``: the ceiling below which it may be shown any, saved first for a durable queue, whose offsets a
        restart rebuilds from its persistent entries alone (a ``kill -9`` saves nothing; transient messages at the
        tail, or those removed since, would give their offsets to new messages).  The ceiling is raised a block of
        ``OFFSET_BLOCK`` above ``next_seq`` when ``next_seq`` reaches it: one write per block at most, and only
        when a reader asks; nothing more on the publishing path.  None for a queue whose offsets need no ceiling:
        not durable (they do not outlive the node), or a stream (they are its log's, every record shown written to
        its segment file first, and a segment being written is never removed)."""
        if queue.persistence is None or LOG in queue.type.capabilities:
            return None
        ceiling = self.reserved.get(queue.index_id, 0)
        if queue.next_seq >= ceiling:
            ceiling = self.reserved[queue.index_id] = queue.next_seq + OFFSET_BLOCK
            self.save_offsets(queue)
        return ceiling

    def close(self) -> None:
        """The node stops: every durable queue's offsets are saved, and no queue's timer fires on the stores
        closed next.  Its ``next_seq`` is above every offset shown (the reservations beyond it are not needed)."""
        for queue in self.local_queues():
            if queue.persistence is not None:
                self.save_offsets(queue, queue.next_seq)
            queue.stop_timers()

    def all_queues(self) -> Iterable[AnyQueue]:
        for vhost in self.vhosts.values():
            yield from vhost.queues.values()

    def local_queues(self) -> Iterable[LocalQueue]:
        """The queues of this node (no proxy of another node's)."""
        for queue in self.all_queues():
            local = queue.local()
            if local is not None:
                yield local

    def expire_queue(self, queue: AnyQueue) -> None:
        """x-expires: the queue went unused for its whole lifetime setting."""
        vhost = self.vhosts.get(queue.vhost)
        if vhost is not None:
            log.info("queue %s in vhost %s expired (unused for %d ms)", untrusted(queue.name), untrusted(vhost.name),
                     queue.args.expires)
            self.remove(vhost, queue)

    def remove_consumer(self, consumer: Consumer) -> None:
        """A consumer leaves its queue (cancelled, channel or link closed); auto-delete queues go with the last."""
        queue = consumer.queue
        queue.remove_consumer(consumer)
        if queue.unused_auto_delete and not queue.deleted:
            self.remove(self.vhosts[queue.vhost], queue)

    def connection_closed(self, connection: "ExclusiveOwner[Queue]") -> None:
        """Its exclusive queues go with it."""
        self.churn.connection_closed += 1
        for queue in list(connection.exclusive_queues):
            self.remove(self.vhosts[queue.vhost], queue)

    def replace_queue(self, vhost: VHost, old: AnyQueue, new: AnyQueue) -> None:
        """Another object stands for the same queue from now on (a replicated queue's leader moved): its
        bindings move to it, and so do the consumers of the old one, with what they hold, as RabbitMQ's quorum
        queues' consumers outlive a change of leader."""
        for exchange in list(vhost.sources.pop(old, ())):
            for binding in exchange.remove_destination(old):
                exchange.bind(new, binding.routing_key, binding.args_dict())
            vhost.bound(exchange, new)
        vhost.queues[new.name] = new
        for consumer in list(old.consumers):
            consumer.channel.handed_over(consumer, old, new)
        old.consumers.clear()
        self.policies.apply_to_queue(new)
        new.deliver_ready()
