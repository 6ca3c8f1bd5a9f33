"""Federation (RabbitMQ's rabbitmq_federation): exchanges and queues of this node that receive messages from
the same-named ones (or those an upstream names) of other brokers.  ``upstream`` validates and reads the
``federation-upstream`` and ``federation-upstream-set`` runtime parameters and what a policy names; ``link``
runs one exchange or queue link; ``manager`` keeps the links the policies ask for.  The ``x-federation-upstream``
exchange a link declares upstream is ``exchanges.federation_upstream``."""
from __future__ import annotations

from .manager import Federation
from .upstream import COMPONENTS, validate

__all__ = ["COMPONENTS", "Federation", "validate"]
