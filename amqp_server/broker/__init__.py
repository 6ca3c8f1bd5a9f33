"""The broker: vhosts with their exchanges, queues and bindings, and the operations on them.

Every front end — AMQP channels, the HTTP plugin, the forwarder — calls these
operations; none keeps its own copy.  Operations raise :class:`ChannelError`
(or :class:`ConnectionError`) with RabbitMQ's reply code and text.

:class:`Broker` is the one object they call, a facade over services built in one place, each handed what it depends
on: ``Definitions`` (kept in LMDB and made the cluster's), ``Bindings`` (rabbit_binding), ``Exchanges``
(rabbit_exchange), ``Router`` (rabbit_router), ``DeadLetters`` (rabbit_dead_letter), ``Messages`` (publish, get,
settle, move), ``Queues`` (rabbit_amqqueue), ``VHosts`` (rabbit_vhost) and ``Recovery`` (start-up), each in the module
of this package named for it.  The Spark bridge's commit is a service of the bridge on the broker
(``spark_bridge.commit``).
"""
from __future__ import annotations

import base64
import os
from typing import TYPE_CHECKING

from msg_store import DEFAULT_SEGMENT_SIZE

from ..access_control import AccessControl, AuthAttempts
from ..definition_store import DEFAULT_MAX_SIZE, DefinitionStore
from .delayed_messages import DelayedMessages
from .direct_reply import ReplyConsumers
from .limits import Limits
from ..queues.paging import Pager
from ..queues.persistence import Persistence
from ..queues.policy import Policies
from ..queues.priority_queue import RankedRows
from ..queues.replica_store import ReplicaStore
from ..stats import ChurnStats
from .vhost import VHost
from .bindings import Bindings
from .definitions import ClusterHooks, Definitions
from .dead_letters import DeadLetters
from .exchanges import Exchanges
from .messages import Messages
from .queues import Queues, Storage
from .recovery import Recovery
from .routing import Router
from .vhosts import VHosts
from stream_log.log import StreamLogs

if TYPE_CHECKING:
    from ..ports import ClientRegistry, FederationRunner, ShovelRunner


def server_name(prefix: str) -> str:
    """``amq.gen-…`` / ``amq.ctag-…``: 16 random bytes, URL-safe base64, as RabbitMQ makes them."""
    return prefix + base64.urlsafe_b64encode(os.urandom(16)).decode().rstrip("=")


class Broker:
    """The one object the front ends call: a facade over the services, which are built here, each handed what
    it depends on.  Its operations are the services' own methods, bound once (no call in between on the hot
    path)."""

    def __init__(self, data_dir: str, node_name: str = "warren@localhost",
                 persistence: Persistence | None = None, segment_size: int = DEFAULT_SEGMENT_SIZE,
                 clients: "ClientRegistry | None" = None, queue_window: int = 2048,
                 definitions_max_size: int = DEFAULT_MAX_SIZE) -> None:
        self.data_dir = data_dir
        self.node_name = node_name
        self.queue_window = queue_window
        self.persistence = persistence or Persistence(data_dir)
        self.pager = Pager(data_dir, segment_size, self.persistence)
        self.store = DefinitionStore(data_dir, definitions_max_size)
        self.access = AccessControl(self.store)
        self.access.bootstrap()
        self.limits = Limits(self.access)
        self.auth_attempts = AuthAttempts()
        self.policies = Policies(self.store)
        self.replies = ReplyConsumers()  # amq.rabbitmq.reply-to consumers
        self.vhosts: dict[str, VHost] = {}
        self.clients = clients  # the node's connections (none in a broker used in-process)
        self.churn = ChurnStats()
        self.shovels: ShovelRunner | None = None  # the node's dynamic shovels, set by the node once it listens
        self.federation: FederationRunner | None = None  # and its federation links
        self.delayed = DelayedMessages(self, data_dir)  # before recovery: it claims its stored messages
        # what the queue types keep apart, each handed to the queues of its type (Storage.attach)
        self.stream_logs = StreamLogs(os.path.join(data_dir, "streams"), self.persistence.stage)
        self.persistence.journals.append(self.stream_logs)  # (made durable with the index, after the schedule)
        self.replicas = ReplicaStore(self.persistence)  # the quorum queues' copies (forwarder.quorum too)

        self.definitions = definitions = Definitions(self.store)
        self.bindings = bindings = Bindings(definitions)
        self.exchanges = exchanges = Exchanges(bindings, definitions, self.policies)
        self.router = router = Router(self.replies, self.delayed)
        self.dead_letters = DeadLetters(self.vhosts, router, self.pager.load_body)
        self.messages = messages = Messages(router)
        storage = Storage(node_name, self.pager, self.persistence, queue_window, RankedRows(self.persistence),
                          self.replicas, self.stream_logs)
        self.queues = queues = Queues(self.vhosts, storage, definitions, bindings, self.dead_letters, self.policies,
                                      self.access, self.limits, self.churn)
        self.virtual_hosts = virtual_hosts = VHosts(self.vhosts, self.access, self.policies, definitions, bindings,
                                                    queues, clients)

        self.agreed = definitions.agreed
        self.vhost, self.vhost_stats = virtual_hosts.vhost, virtual_hosts.vhost_stats
        self.add_vhost, self.delete_vhost = virtual_hosts.add_vhost, virtual_hosts.delete_vhost
        self.set_policy = virtual_hosts.set_policy
        self.check_exchange_declare = exchanges.check_exchange_declare
        self.declare_exchange, self.declare_exchange_agreed = exchanges.declare_exchange, exchanges.declare_agreed
        self.delete_exchange = exchanges.delete_exchange
        self.bind, self.unbind = bindings.bind, bindings.unbind
        self.add_binding, self.remove_binding = bindings.add_binding, bindings.remove_binding
        self.all_bindings = bindings.all
        self.check_queue_declare = queues.check_queue_declare
        self.declare_queue, self.agree_queue = queues.declare_queue, queues.agree_queue
        self.find_queue, self.add_remote_queue = queues.find_queue, queues.add_remote_queue
        self.declaring = queues.declaring
        self.attach, self.next_index_id = storage.attach, queues.next_index_id
        self.consumable, self.consume = queues.consumable, queues.consume
        self.check_consumer_exclusivity = queues.check_consumer_exclusivity
        self.remove_consumer, self.connection_closed = queues.remove_consumer, queues.connection_closed
        self.delete_queue, self.replace_queue = queues.delete_queue, queues.replace_queue
        self.remove_queue = queues.remove
        self.delete_anywhere = queues.delete_anywhere
        self.watch_target, self.unwatch_target = queues.watch_target, queues.unwatch_target
        self.all_queues, self.local_queues = queues.all_queues, queues.local_queues
        self.route = router.route
        self.publish, self.check_publish = messages.publish, messages.check_publish
        self.publish_target = messages.publish_target
        self.deliver, self.still_routed = messages.deliver, messages.still_routed
        self.check_message, self.check_topic_write = messages.check_message, messages.check_topic_write
        self.get_local, self.get_anywhere, self.peek = messages.get_local, messages.get_anywhere, messages.peek
        self.purge_local, self.purge_anywhere = messages.purge_local, messages.purge_anywhere
        self.settle, self.settle_taken, self.nack_taken = messages.settle, messages.settle_taken, messages.nack_taken
        self.settle_as, self.hand_over = messages.settle_as, messages.hand_over
        self.move_messages = messages.move_messages
        # what a queue asks of its host (queue.QueueHost), for the queues made outside ``Queues``
        # (forwarder.quorum.groups)
        self.dead_letter, self.expire_queue, self.load_body = queues.dead_letter, queues.expire_queue, queues.load_body

        Recovery(self.store, self.access, virtual_hosts, queues, self.persistence, self.stream_logs,
                 self.policies).run()
        self.delayed.start()

    def links_changed(self) -> None:
        """A runtime parameter was set or cleared here: the shovels and federation links look again now."""
        for runner in (self.shovels, self.federation):
            if runner is not None:
                runner.changed()

    @property
    def cluster(self) -> ClusterHooks | None:
        """What the cluster (the forwarder) is to this node in cluster mode, which sets it; None otherwise."""
        return self.definitions.cluster

    @cluster.setter
    def cluster(self, cluster: ClusterHooks | None) -> None:
        self.definitions.cluster = cluster

    def close(self) -> None:
        self.queues.close()
        self.pager.close()
        self.persistence.close()  # (its last fsync, which may be syncing the logs, done: they commit once more, close)
        self.stream_logs.close()
        self.delayed.close()
        self.store.close()
