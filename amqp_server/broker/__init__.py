"""The broker: vhosts with their exchanges, queues and bindings, and the operations on them.

Every front end — AMQP channels, the HTTP plugin, the forwarder — calls these
operations; none keeps its own copy.  Operations raise :class:`ChannelError`
(or :class:`ConnectionError`) with RabbitMQ's reply code and text.

:class:`Broker` is the one object they call; each concern's operations are in a module of this package named for
it, as RabbitMQ splits them: ``vhosts`` (rabbit_vhost), ``exchanges`` (rabbit_exchange), ``bindings``
(rabbit_binding), ``queues`` (rabbit_amqqueue), ``routing`` (rabbit_router), ``dead_letters`` (rabbit_dead_letter),
``messages`` (publish, get, settle, move) and ``recovery`` (start-up); ``core`` holds the state they share and what
they call on one another.  The Spark bridge's commit is in the bridge's package (``spark_bridge.commit``).
"""
from __future__ import annotations

import base64
import os
from typing import TYPE_CHECKING

from msg_store import DEFAULT_SEGMENT_SIZE

from ..auth import AccessControl, AuthAttempts
from ..definitions import DEFAULT_MAX_SIZE, DefinitionStore
from ..delayed import DelayedMessages
from ..direct_reply import ReplyConsumers
from ..limits import Limits
from ..paging import Pager
from ..persistence import Persistence
from ..policy import Policies
from ..spark_bridge.commit import Offsets
from ..stats import ChurnStats, MessageStats
from ..vhost import VHost
from .bindings import Bindings
from .core import ClusterHooks
from .dead_letters import DeadLetters
from .exchanges import Exchanges
from .messages import Messages
from .queues import Queues
from .recovery import Recovery
from .routing import Router
from .vhosts import VHosts

if TYPE_CHECKING:
    from ..ports import ClientRegistry, FederationRunner, ShovelRunner


def server_name(prefix: str) -> str:
    """``amq.gen-…`` / ``amq.ctag-…``: 16 random bytes, URL-safe base64, as RabbitMQ makes them."""
    return prefix + base64.urlsafe_b64encode(os.urandom(16)).decode().rstrip("=")


class Broker(VHosts, Exchanges, Queues, Bindings, Router, DeadLetters, Messages, Offsets, Recovery):
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
        self._vhost_stats: dict[str, MessageStats] = {}
        self.cluster: ClusterHooks | None = None  # set by the forwarder in cluster mode
        self.shovels: ShovelRunner | None = None  # the node's dynamic shovels, set by the node once it listens
        self.federation: FederationRunner | None = None  # and its federation links
        self.delayed = DelayedMessages(self, data_dir)  # before recovery: it claims its stored messages
        self._recover_definitions()
        self.delayed.start()

    def links_changed(self) -> None:
        """A runtime parameter was set or cleared here: the shovels and federation links look again now."""
        for runner in (self.shovels, self.federation):
            if runner is not None:
                runner.changed()

    def close(self) -> None:
        for queue in self.all_queues():
            if queue.persistence is not None:
                self._save_offsets(queue)
        self.pager.close()
        self.persistence.close()
        self.delayed.close()
        self.store.close()
