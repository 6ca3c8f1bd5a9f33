"""The node's federation links: one per (federated exchange or queue, upstream), as the policies that name
upstreams and the upstream parameters say.  A :class:`links.runner.Runner`: twice a second, and at once when a
parameter is set or cleared here, it starts the links that should run and stops the others — for good, deleting
what they made upstream, when their policy, upstream, exchange or queue went, or their upstream changed.  In a
cluster an exchange's link runs on one node (and moves when that node dies); a queue's runs where the queue is.
"""
from __future__ import annotations

import logging
from typing import Any, cast

from ..links.runner import Runner
from ..queues.policy import FEDERATION_KEYS
from .link import ExchangeLink, FederationLink, QueueLink
from .upstream import COMPONENTS, upstreams

log = logging.getLogger("warren.federation")


class Federation(Runner):
    what = "federation"

    def _wanted(self) -> dict[tuple[str, str, str, str], tuple[type[FederationLink], Any, str]]:
        """(vhost, kind, resource, upstream) -> (link class, upstream, policy name) of the links to run here."""
        records: dict[str, list[dict[str, Any]]] = {}
        for record in self.broker.access.parameters():
            if record["component"] in COMPONENTS:
                records.setdefault(record["vhost"], []).append(record)
        wanted: dict[tuple[str, str, str, str], tuple[type[FederationLink], Any, str]] = {}
        for vhost_name, vhost in list(self.broker.vhosts.items()):
            found = records.get(vhost_name)
            if not found:
                continue
            resources: list[tuple[type[FederationLink], str, Any]] = []
            resources += [(ExchangeLink, name, x.policy) for name, x in vhost.exchanges.items()]
            resources += [(QueueLink, name, q.policy) for name, q in vhost.queues.items()
                          if q.node == self.node and not q.exclusive]  # (a queue's link runs on its node)
            for cls, name, policy in resources:
                if policy is None or not any(key in policy.definition for key in FEDERATION_KEYS):
                    continue
                for upstream in upstreams(policy.definition, found):
                    wanted[(vhost_name, cls.kind, name, upstream.name)] = (cls, upstream, policy.name)
        return wanted

    def _runs_here(self, key: tuple[str, str, str, str]) -> bool:
        return key[1] == QueueLink.kind or self.owner(*key) == self.node

    async def reconcile(self) -> None:
        wanted = self._wanted()
        for key in list(self.links):
            if wanted.get(key) != self.links[key][1]:
                await self.drop(key)  # for good
            elif not self._runs_here(key):  # another node takes it over, from what it made
                link, _ = self.links.pop(key)
                await link.stop(cleanup=False)
        cluster_name = self.broker.access.cluster_name(self.node)
        for key, (cls, upstream, policy) in wanted.items():
            if key in self.links or not self._runs_here(key):
                continue
            vhost, _, name, _ = key
            link = cls(self.broker, vhost, name, upstream, policy, self.resolver(upstream.setter), cluster_name)
            self.links[key] = (link, (cls, upstream, policy))
            link.start()

    def status(self) -> list[dict[str, Any]]:
        """This node's links as RabbitMQ's /api/federation-links lists them."""
        return [{"node": self.node, **cast(FederationLink, link).status()} for link, _ in self.links.values()]

    async def restart(self, vhost: str, link_id: str) -> bool:
        """Stop a link of this node and start it again (without undoing what it made); False: none such here."""
        for key, (link, _) in list(self.links.items()):
            if key[0] == vhost and cast(FederationLink, link).id == link_id:
                del self.links[key]
                await link.stop(cleanup=False)
                self.changed()
                return True
        return False
