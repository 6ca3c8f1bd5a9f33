"""What every resource needs from the application: the broker, the rate sampler, the node's config."""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

from amqp_server.broker import Broker
from amqp_server.frontend.clients import Clients
from amqp_server.broker.vhost import VHost
from amqp_server.publisher_flow import PublisherFlow

from .http import not_found
from .rates import Sampler

@dataclass
class Context:
    broker: Broker
    config: Any
    sampler: Sampler
    clients: Clients  # the node's AMQP connections
    flow: PublisherFlow = field(default_factory=PublisherFlow)  # the node's: its alarms are shown
    started: float = field(default_factory=time.time)

    @property
    def node(self) -> str:
        return self.broker.node_name

    def node_running(self, name: str) -> bool:
        """This node, or a cluster member our link to is up."""
        cluster = self.broker.cluster
        return name == self.node or (cluster is not None and dict(cluster.nodes()).get(name, False))

    def idle_since(self, owner: Any) -> str | None:
        """When a queue or channel last did anything, if it has been idle since (the sampler's)."""
        return self.sampler.idle_since(owner)

    def vhost(self, name: str) -> VHost:
        if not self.broker.access.vhost_exists(name):
            raise not_found()
        return self.broker.vhost(name)


KEY = web.AppKey("warren", Context)


def ctx(request: web.Request) -> Context:
    return request.app[KEY]
