"""Virtual hosts (RabbitMQ's rabbit_vhost): found or made on first use, deleted with everything in them, and the
policies set on them.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .. import errors
from ..access_control import AccessControl, Principal
from ..definition_store import DefinitionStore
from ..errors import ConnectionError
from ..queues.policy import Policies, Policy
from ..stats import MessageStats
from .vhost import VHost
from .bindings import Bindings
from .definitions import Definitions
from .queues import Queues

if TYPE_CHECKING:
    from ..ports import ClientRegistry


class VHosts:
    """The broker's vhost operations, on the vhosts in memory (``vhosts``, which every service shares)."""

    def __init__(self, vhosts: dict[str, VHost], access: AccessControl, policies: Policies,
                 definitions: Definitions, bindings: Bindings, queues: Queues,
                 clients: ClientRegistry | None) -> None:
        self.vhosts = vhosts
        self.access = access
        self.policies = policies
        self.definitions = definitions
        self.store: DefinitionStore = definitions.store
        self.bindings = bindings
        self.queues = queues
        self.clients = clients  # the node's connections (none in a broker used in-process)
        self._stats: dict[str, MessageStats] = {}

    def vhost_stats(self, name: str) -> MessageStats:
        """Counters of one vhost (kept across vhost objects being recreated)."""
        stats = self._stats.get(name)
        if stats is None:
            stats = self._stats[name] = MessageStats()
        return stats

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
        self.definitions.check_room(f"policy '{policy.name}' in vhost '{policy.vhost}'", policy.definition, who)
        self.policies.put(kind, policy, self.vhost(policy.vhost))

    def add_vhost(self, name: str, **metadata: Any) -> VHost:
        """Create a vhost or change its metadata (see ``AccessControl.add_vhost``)."""
        self.access.add_vhost(name, **metadata)
        return self.vhost(name)

    def delete_vhost(self, name: str) -> None:
        vhost = self.vhosts.pop(name, None)
        if vhost is not None:
            for queue in list(vhost.queues.values()):
                self.queues.remove(vhost, queue)
            for exchange in list(vhost.exchanges.values()):  # one by one: a cluster forgets them too
                if exchange.name and not exchange.name.startswith("amq.") and exchange.name in vhost.exchanges:
                    self.bindings.remove_exchange(vhost, exchange)
            if self.clients is not None:
                self.clients.close_vhost(name, f"vhost '{name}' is deleted")
        forget_vhost(self.store, self.access, self.policies, name)


def forget_vhost(store: DefinitionStore, access: AccessControl, policies: Policies, name: str) -> bool:
    """Every durable definition of the vhost goes, as rabbit_vhost:delete/2 takes everything the vhost had: its
    exchanges, queues (their offsets with them; their messages are orphans the next start drops), bindings,
    policies and operator policies, then what access control keeps (permissions, limits, parameters) and its
    record.  ``VHosts.delete_vhost`` calls it once the vhost is gone from memory, ``warren-admin delete-vhost`` on
    a node's data directory.  Whether the vhost was there."""
    for kind in ("exchange", "queue", "binding"):
        for key, record in list(store.items(kind)):
            if record["vhost"] == name:
                store.delete(kind, key)
                if kind == "queue" and record.get("index_id"):
                    store.delete("queue_offsets", str(record["index_id"]))
    policies.drop_vhost(name)
    return access.delete_vhost(name)
