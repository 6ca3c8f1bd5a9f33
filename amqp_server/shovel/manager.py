"""The node's dynamic shovels: one :class:`worker.Worker` per ``shovel`` runtime parameter this node runs.

Parameters are durable definitions (LMDB, and etcd in a cluster), so a shovel comes back after a restart or a
``kill -9`` of its node.  The manager (a :class:`links.runner.Runner`) looks at them twice a second, and at once
when one is set or cleared here, and starts, restarts (value changed) or stops workers to match; in a cluster each
shovel runs on one node, and moves when that node dies.
"""
from __future__ import annotations

import logging
from typing import Any, cast

from ..links.runner import Runner
from ..logs import untrusted
from .definition import Definition
from .worker import Worker

log = logging.getLogger("warren.shovel")
COMPONENT = "shovel"


class Shovels(Runner):
    what = "shovels"

    async def reconcile(self) -> None:
        wanted = {(r["vhost"], r["name"]): r for r in self.broker.access.parameters() if r["component"] == COMPONENT}
        for key in list(self.links):
            record = wanted.get(key)
            worker, running = self.links[key]
            if record is None or record != running or self.owner(*key) != self.node:
                del self.links[key]
                await worker.stop()
        for key, record in wanted.items():
            if key in self.links or self.owner(*key) != self.node:
                continue
            try:
                definition = Definition.parse(record["value"])
            except (KeyError, TypeError, ValueError) as exc:  # (validated when set: a record from elsewhere)
                log.warning("shovel %s in vhost %s not started: %s", untrusted(key[1]), untrusted(key[0]), exc)
                continue
            worker = Worker(key[0], key[1], definition, self.resolver(record.get("user") or ""),
                            self.broker.access.cluster_name(self.node), self._finisher(key))
            self.links[key] = (worker, record)
            worker.start()

    def _finisher(self, key: tuple[str, str]):
        async def finished() -> None:
            self.links.pop(key, None)
            self.broker.access.clear_parameter(key[0], COMPONENT, key[1])
        return finished

    def status(self) -> list[dict[str, Any]]:
        """This node's shovels as RabbitMQ's /api/shovels lists them."""
        return [{"node": self.node, **cast(Worker, worker).status()} for worker, _ in self.links.values()]

    async def restart(self, vhost: str, name: str) -> bool:
        """Stop and start again (DELETE /api/shovels/vhost/{vhost}/{name}/restart); False if not running here."""
        entry = self.links.pop((vhost, name), None)
        if entry is None:
            return False
        await entry[0].stop()
        self.changed()
        return True
