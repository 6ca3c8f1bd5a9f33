"""Recovery: at start-up, the durable definitions (vhosts, exchanges, queues and their contents' totals,
bindings in the order they were made) come back from LMDB.
"""
from __future__ import annotations

import logging
from typing import Iterator, TypeVar

from exchanges import exchange_class

from ..framing import field_types
from ..queues import types as queue_types
from ..access_control import AccessControl
from ..definition_store import DefinitionStore
from ..errors import ChannelError
from ..logs import untrusted
from ..queues.persistence import Persistence
from ..queues.policy import Policies
from ..queues.queue import Queue
from ..records import BindingRecord, ExchangeRecord, QueueRecord, Record
from .queues import Queues
from .vhosts import VHosts
from stream_log.log import StreamLogs

log = logging.getLogger("warren.broker")
R = TypeVar("R", bound=Record)


class Recovery:
    """The start-up of a broker on its data directory."""

    def __init__(self, store: DefinitionStore, access: AccessControl, virtual_hosts: VHosts, queues: Queues,
                 persistence: Persistence, stream_logs: StreamLogs, policies: Policies) -> None:
        self.store = store
        self.access = access
        self.virtual_hosts = virtual_hosts
        self.vhosts = virtual_hosts.vhosts
        self.queues = queues
        self.persistence = persistence
        self.stream_logs = stream_logs
        self.policies = policies

    def _stored(self, cls: type[R]) -> Iterator[R]:
        for _, raw in self.store.items(cls.kind):
            yield cls.from_json(raw)

    def run(self) -> None:
        for name in self.access.vhosts():
            self.virtual_hosts.vhost(name)
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
            unlisted = [name for name, value in arguments.items() if not field_types.in_range(value)]
            if unlisted:  # kept by a version that did not check: no client or listing could be given them
                log.error("queue %s in vhost %s: stored arguments %s outside the signed 64-bit range; recovered "
                          "without them", untrusted(record.name), untrusted(vhost.name), untrusted(unlisted))
                arguments = {name: value for name, value in arguments.items() if name not in unlisted}
            try:
                kind, args = queue_types.declared(arguments, record.name, vhost.name)
            except ChannelError as exc:  # stored before today's checks: recover, without its arguments
                log.error("queue %s in vhost %s: stored arguments refused (%s); recovered without them",
                          untrusted(record.name), untrusted(vhost.name), untrusted(exc.text))
                arguments = {}
                kind, args = queue_types.declared(arguments, record.name, vhost.name)
            queue: Queue = kind.new(record.name, vhost.name, True, None, record.auto_delete, arguments, args,
                                    self.queues)
            vhost.queues[record.name] = queue
            queue.index_id = record.index_id
            self.queues.storage.attach(queue, True)
            durable.append(queue)
        # a cluster's replicated queues keep copies here too, and their spares (forwarder.quorum.groups): not
        # orphans (a spare's rows, a snapshot's that was coming in, are counted, and go once its group knows)
        copies = {index_id for _, saved in self.store.items("replica")
                  for index_id in (saved["index_id"], saved.get("spare", 0)) if index_id}
        self.stream_logs.drop_orphans({queue.index_id for queue in durable} | copies)
        self.persistence.recover(durable, copies)
        for queue in durable:  # offsets never go back across restarts, above any a reader saw (Queues.save_offsets)
            saved = self.store.get("queue_offsets", str(queue.index_id))
            if saved is not None:
                queue.next_seq = max(queue.next_seq, saved["next_seq"])
                queue.committed = min(saved["committed"], queue.next_seq)  # one saved past the tail: at the tail
            queue.restarted()
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
