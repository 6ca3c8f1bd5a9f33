"""Warren's management plugin: RabbitMQ 3.10's management HTTP API on aiohttp.

Offers ``create_app(broker, config)`` (an aiohttp Application) and ``start(broker, config, flow, clients)``
(serve it on ``config.bind:config.mgmt_port`` on the running loop; returns the AppRunner,
``await runner.cleanup()`` stops it).  The node starts it unless ``--mgmt-enabled false``.

Paths, methods, status codes and JSON shapes follow RabbitMQ's API (see README); Warren adds
``GET /api/queues/{vhost}/{name}/peek`` and ``POST /api/queues/{vhost}/{name}/move``, and
``/metrics`` in Prometheus text format.  One module per concern: ``auth`` (basic auth, tags),
``listing`` (columns/sort/paging), ``rates`` (the sampler), and one per resource area.  Handlers
call the broker's own operations (the ones AMQP channels call); the static UI in ``static/``
is served at ``/`` when present.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .app import create_app, start

__all__ = ["create_app", "start"]


def __getattr__(name: str) -> Any:
    """``create_app`` and ``start``, imported at first use: ``warrenctl``, an HTTP client in this package, does
    not import the broker and the server (over a second of every command's start)."""
    if name not in __all__:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    from .app import create_app, start
    return {"create_app": create_app, "start": start}[name]
