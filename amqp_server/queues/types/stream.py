"""The stream (RabbitMQ's rabbit_stream_queue): an append-only log on one node (``stream_queue.StreamQueue``), read
by AMQP 0-9-1 consumers from an offset of their choosing, and served by RabbitMQ's stream protocol
(``amqp_server.stream``)."""
from __future__ import annotations

import datetime
from typing import Any, ClassVar

from ... import errors
from ..queue_args import interval_ms
from ..queue_type import DELIVERY_HEADER, LOG, STORES_ALL, HttpView, NodeStorage, QueueType
from ..queue import LocalQueue
from ..stream_queue import StreamQueue


class Stream(QueueType):
    name = "stream"
    memory_category = "stream_queue_procs"
    apply_to = "streams"
    # Arguments RabbitMQ 3.10 refuses on a stream (rabbit_stream_queue's capabilities lack them).
    refused_arguments = ("x-expires", "x-message-ttl", "x-dead-letter-exchange", "x-dead-letter-routing-key",
                         "x-dead-letter-strategy", "x-max-length", "x-max-in-memory-length", "x-max-in-memory-bytes",
                         "x-max-priority", "x-overflow", "x-queue-mode", "x-queue-version", "x-single-active-consumer",
                         "x-quorum-initial-group-size", "x-delivery-limit")
    consumer_arguments = ("x-stream-offset",)
    # rabbit_stream_queue's queue_arguments: a stream declared again with other retention is inequivalent
    equivalent_arguments = ("x-max-length-bytes", "x-queue-type", "x-max-age", "x-stream-max-segment-size-bytes",
                            "x-initial-cluster-size", "x-queue-leader-locator")
    # What a stream takes of a policy (it refuses the other keys as arguments and ignores them here).
    policy_lower_wins = ("max-length-bytes",)
    policy_argument_wins = ("max-age", "stream-max-segment-size-bytes")
    unsupported_policies = frozenset({"expires", "message-ttl", "dead-letter-exchange", "dead-letter-routing-key",
                                      "max-length", "max-in-memory-length", "max-in-memory-bytes", "max-priority",
                                      "overflow", "queue-mode", "single-active-consumer", "delivery-limit",
                                      "ha-mode", "ha-params", "ha-sync-mode", "ha-promote-on-shutdown",
                                      "ha-promote-on-failure", "queue-master-locator", "dead-letter-strategy"})
    capabilities = frozenset({LOG, STORES_ALL, DELIVERY_HEADER})  # (x-stream-offset on deliveries)
    queue_class: ClassVar[type[LocalQueue]] = StreamQueue  # (mypy checks it provides the protocol)

    def delete_checks(self, name: str, vhost: str, if_unused: bool, if_empty: bool) -> bool:
        """rabbit_stream_queue:delete ignores both; the coordinator's answer counts nothing."""
        return False

    def attached(self, queue: Any, storage: NodeStorage, durable: bool) -> None:
        """Its messages in its log, among the node's streams' logs (a stream is durable, and pages nothing); the
        persistence, for a stream an earlier version kept there (``StreamQueue.recover``)."""
        queue.persistence = storage.persistence
        queue.logs = storage.stream_logs

    def refuse_consumer(self, what: str, no_ack: bool, prefetch: int, global_prefetch: int) -> None:
        """A per-consumer prefetch, manual acks, and no channel-wide prefetch, in rabbit_stream_queue's order
        (RabbitMQ would fail on no prefetch with 541)."""
        if not prefetch:
            raise errors.precondition_failed(f"consumer prefetch count is not set for '{what}'")
        if no_ack:
            raise errors.ConnectionError(errors.NOT_IMPLEMENTED,
                                         f"automatic acknowledgement not supported by stream queues {what}")
        self.refuse_global_qos(what, global_prefetch)

    def check_consumer_arguments(self, what: str, arguments: dict[str, Any]) -> None:
        """An x-stream-offset that is one.  A string of digits and what is not a unit (or a zero) is refused as
        rabbit_amqqueue:check_stream_offset_arg refuses it; RabbitMQ fails on the others with 541 (a string
        without digits: rabbit_amqqueue:check_max_age crashes), refused here with the value."""
        offset = arguments.get("x-stream-offset")
        if "x-stream-offset" not in arguments or stream_offset(offset):
            return
        if isinstance(offset, (str, bytes)) and (text := _text(offset))[:1].isdigit() and text[:1].isascii():
            raise errors.precondition_failed(
                f"invalid arg 'x-stream-offset' for {what}: {{invalid_stream_offset_arg,{{longstr,{_binary(text)}}}}}")
        raise errors.precondition_failed(f"invalid arg 'x-stream-offset' for {what}: {offset!r}")

    def describe(self, queue: Any, view: HttpView, info: dict[str, Any]) -> None:
        """One replica, where it lives (RabbitMQ's JSON has no RAM figures for streams)."""
        node = info["node"]
        info.update(members=[node], online=[node] if view.node_running(node) else [])


TYPE = Stream()


def stream_offset(value: Any) -> bool:
    """Whether ``value`` is an ``x-stream-offset``: first, last, next, an offset, a timestamp or an interval (of
    more than nothing: rabbit_amqqueue:check_max_age)."""
    if isinstance(value, (str, bytes)):
        text = _text(value)
        return text in ("first", "last", "next") or bool(interval_ms(text))
    if isinstance(value, bytearray):  # (a byte array: rabbit_stream_queue:parse_offset_arg matches these by value)
        return value in (b"first", b"last", b"next")
    return isinstance(value, (int, datetime.datetime)) and not isinstance(value, bool)


def _text(value: str | bytes) -> str:
    return value.decode(errors="replace") if isinstance(value, bytes) else value


def _binary(text: str) -> str:
    """A binary as Erlang's ~p prints it: quoted if its bytes are printable, else a list of them."""
    raw = text.encode()
    if all(32 <= byte < 127 for byte in raw):
        return '<<"' + text.replace("\\", "\\\\").replace('"', '\\"') + '">>'
    return "<<" + ",".join(map(str, raw)) + ">>"
