"""The broker operations the stream protocol needs (RabbitMQ's rabbit_stream_manager): create and delete a stream,
find one to publish to or read from, super-stream routes and partitions, and each stream's tracking (consumer
offsets stored by reference, publishers' last publishing ids: both in the stream's log).  Permission checks are
inside each operation, as in every broker operation; a refusal is a :class:`StreamError` with the protocol's
response code.
"""
from __future__ import annotations

import logging
import re
from typing import TYPE_CHECKING, Any, TypeGuard

from exchanges import Exchange

from .. import errors
from ..access_control import Principal
from ..errors import AMQPError
from ..framing import field_types
from ..message import Message, make_message
from ..queues.queue import AnyQueue
from ..queues.policy import LEADER_LOCATORS
from ..queues.queue_type import LOG
from ..queues.stream_queue import StreamQueue
from . import wire as core

if TYPE_CHECKING:
    from ..broker import Broker
    from ..broker.vhost import VHost

from pamqp import commands

log = logging.getLogger("warren.stream")

# create's arguments, as rabbit_stream_manager turns them into queue arguments (the others are ignored)
_INTEGER_ARGUMENTS = {"max-length-bytes": "x-max-length-bytes",
                      "stream-max-segment-size-bytes": "x-stream-max-segment-size-bytes",
                      "initial-cluster-size": "x-initial-cluster-size"}
_STRING_ARGUMENTS = {"max-age": "x-max-age", "queue-leader-locator": "x-queue-leader-locator"}
_CODES = {errors.ACCESS_REFUSED: core.ACCESS_REFUSED, errors.NOT_FOUND: core.STREAM_DOES_NOT_EXIST,
          errors.PRECONDITION_FAILED: core.PRECONDITION_FAILED, errors.RESOURCE_LOCKED: core.PRECONDITION_FAILED}
TRACKING = "stream_tracking"  # where an earlier version kept a stream's tracking (definitions, by index id)


class StreamError(Exception):
    def __init__(self, code: int) -> None:
        super().__init__(code)
        self.code = code


def code_of(error: AMQPError) -> int:
    return _CODES.get(error.code, core.INTERNAL_ERROR)


def served_here(queue: AnyQueue | Any) -> TypeGuard[StreamQueue]:
    """Whether ``queue`` is a stream of this node, which the stream protocol serves here (a client finds another
    node's by ``metadata``; a super stream's partitions are those of this node)."""
    return (queue is not None and not isinstance(queue, Exchange)  # (a binding's destination may be an exchange)
            and LOG in queue.type.capabilities and not queue.remote)

class StreamManager:
    def __init__(self, broker: "Broker") -> None:
        self.broker = broker
        self._migrated: set[int] = set()  # streams whose tracking an earlier version kept in the definitions

    # -- streams ------------------------------------------------------------------------------

    async def create(self, vhost_name: str, name: str, arguments: dict[str, str], who: Principal) -> None:
        """create: the checks of ``_check_new``.  In cluster mode the cluster agrees on the stream (and the node it
        lives on) first, and the answer waits until the nodes this one reaches have it (``Broker.declaring``): a
        publisher through another node right after finds it."""
        vhost = self._vhost(vhost_name)
        try:
            converted = self._check_new(vhost, name, arguments, who)
            async with self.broker.declaring(vhost, name, durable=True, arguments=converted, who=who):
                self.broker.declare_queue(vhost, name, durable=True, arguments=converted, who=who)
        except AMQPError as exc:
            raise StreamError(code_of(exc)) from None

    def _check_new(self, vhost: VHost, name: str, arguments: dict[str, str], who: Principal) -> dict[str, Any]:
        """create's checks in rabbit_stream_reader's order: the name, configure permission, the arguments; a queue
        of that name is STREAM_ALREADY_EXISTS if declaring it again with these arguments would be equivalent, as
        rabbit_stream_manager:create_stream asserts it (another type, other retention: PRECONDITION_FAILED).  The
        arguments as queue arguments."""
        if not name or len(name.encode()) > 255 or name.startswith("amq."):
            raise StreamError(core.PRECONDITION_FAILED)
        self.broker.check_queue_declare(vhost, name, None, who)  # (create's arguments name no dead-letter exchange)
        converted = _queue_arguments(arguments)
        if name in vhost.queues:
            self.broker.declare_queue(vhost, name, durable=True, arguments=converted, who=who)
            raise StreamError(core.STREAM_ALREADY_EXISTS)
        return converted

    def delete(self, vhost_name: str, name: str, who: Principal) -> None:
        """delete: configure permission; only a stream (another queue type is STREAM_DOES_NOT_EXIST), here or on
        the node it lives on."""
        vhost = self._vhost(vhost_name)
        try:
            who.check("configure", "queue", vhost_name, name)
        except AMQPError as exc:
            raise StreamError(code_of(exc)) from None
        queue = vhost.queues.get(name)
        if queue is None or LOG not in queue.type.capabilities:
            raise StreamError(core.STREAM_DOES_NOT_EXIST)
        local = queue.local()
        index_id = local.index_id if local is not None else 0  # (another node's tracks its own)
        try:
            self.broker.delete_queue(vhost, name, who=who)
        except AMQPError as exc:
            raise StreamError(code_of(exc)) from None
        if index_id:
            self._migrated.discard(index_id)
            self.broker.store.delete(TRACKING, str(index_id))

    def stream(self, vhost_name: str, name: str) -> StreamQueue | None:
        """The stream of that name on this node, if there is one."""
        vhost = self.broker.vhosts.get(vhost_name)
        queue = vhost.queues.get(name) if vhost is not None else None
        return queue if served_here(queue) and not queue.deleted else None

    def locate(self, vhost_name: str, name: str) -> str | None:
        """Where the stream lives: "" here, else the name of its node (cluster mode); None if there is none."""
        vhost = self.broker.vhosts.get(vhost_name)
        queue = vhost.queues.get(name) if vhost is not None else None
        if queue is None or LOG not in queue.type.capabilities or queue.deleted:
            return None
        return "" if served_here(queue) else queue.node

    def for_(self, kind: str, vhost_name: str, name: str, who: Principal) -> StreamQueue:
        """The stream ``who`` may use for ``kind`` (write: declare a publisher, store an offset; read: subscribe,
        query an offset or a publisher's sequence), permission first as RabbitMQ checks it.  A stream of another
        node is STREAM_NOT_AVAILABLE here: clients find its node by metadata."""
        self.permit(kind, vhost_name, name, who)
        return self.find(vhost_name, name)

    @staticmethod
    def permit(kind: str, vhost_name: str, name: str, who: Principal) -> None:
        """``for_``'s permission check alone (declare_publisher checks its ids between it and the lookup)."""
        try:
            who.check(kind, "queue", vhost_name, name)
        except AMQPError as exc:
            raise StreamError(code_of(exc)) from None

    def find(self, vhost_name: str, name: str) -> StreamQueue:
        """``for_``'s lookup alone."""
        queue = self.stream(vhost_name, name)
        if queue is None:
            where = self.locate(vhost_name, name)
            raise StreamError(core.STREAM_DOES_NOT_EXIST if where is None else core.STREAM_NOT_AVAILABLE)
        return queue

    def _vhost(self, name: str) -> VHost:
        try:
            return self.broker.vhost(name)
        except AMQPError:
            raise StreamError(core.VHOST_ACCESS_FAILURE) from None

    # -- super streams ------------------------------------------------------------------------

    def route(self, vhost_name: str, super_stream: str, routing_key: str, who: Principal) -> list[str]:
        """The streams a message with ``routing_key`` goes to from the super stream's exchange (read on it)."""
        exchange = self._exchange(vhost_name, super_stream, who)
        probe = _probe(super_stream, routing_key)
        return [queue.name for queue in exchange.route(routing_key, probe) if served_here(queue)]

    def partitions(self, vhost_name: str, super_stream: str, who: Principal) -> list[str]:
        """The super stream's streams, a binding each, as rabbit_stream_manager lists them: in Mnesia's order (by
        routing key, then stream), those with an x-stream-partition-order first, by it
        (rabbit_stream_utils:sort_partitions; a string of digits counts as its integer)."""
        exchange = self._exchange(vhost_name, super_stream, who)
        bound = sorted(((binding.routing_key.encode(), binding.destination.name.encode(), binding)
                        for binding in exchange.bindings() if served_here(binding.destination)),
                       key=lambda row: row[:2])
        return [binding.destination.name for _, _, binding in sorted(bound, key=lambda row: _order(row[2]))]

    def _exchange(self, vhost_name: str, name: str, who: Principal) -> Any:
        try:
            who.check("read", "exchange", vhost_name, name)
        except AMQPError as exc:
            raise StreamError(code_of(exc)) from None
        exchange = self._vhost(vhost_name).exchanges.get(name)
        if exchange is None or not name:
            raise StreamError(core.STREAM_DOES_NOT_EXIST)
        return exchange

    # -- tracking -----------------------------------------------------------------------------

    def _migrate(self, queue: StreamQueue) -> None:
        """Tracking an earlier version kept in the definitions store goes to the stream's log, once."""
        if queue.index_id in self._migrated:
            return
        self._migrated.add(queue.index_id)
        saved = self.broker.store.get(TRACKING, str(queue.index_id))
        if not saved:
            return
        stream_log = queue.log
        for reference, offset in saved.get("offsets", {}).items():
            if stream_log.offsets.get(reference) is None:
                stream_log.store_offset(reference, offset)
        if saved.get("writers") and not stream_log.writers:
            for reference, sequence in saved["writers"].items():
                stream_log.wrote(reference, sequence)
        self.broker.store.delete(TRACKING, str(queue.index_id))

    def writers(self, queue: StreamQueue) -> dict[str, int]:
        """The stream's named publishers' last publishing ids."""
        self._migrate(queue)
        return queue.log.writers

    def offset(self, queue: StreamQueue, reference: str) -> int | None:
        """The offset stored for ``reference``, if any."""
        self._migrate(queue)
        return queue.log.offsets.get(reference)

    def store_offset(self, queue: StreamQueue, reference: str, offset: int) -> None:
        """Kept per reference, durable at the next group commit (no write of its own)."""
        self._migrate(queue)
        queue.log.store_offset(reference, offset)


def _queue_arguments(arguments: dict[str, str]) -> dict[str, Any]:
    """create's arguments as queue arguments, as rabbit_stream_manager turns them (others are ignored), a cluster
    size below 1 or an unknown leader locator refused as it refuses them."""
    converted: dict[str, Any] = {"x-queue-type": "stream"}
    for key, value in arguments.items():
        if key in _INTEGER_ARGUMENTS:
            try:
                converted[_INTEGER_ARGUMENTS[key]] = field_types.Long(int(value))  # (a long, as RabbitMQ's)
            except ValueError:
                raise StreamError(core.PRECONDITION_FAILED) from None
        elif key in _STRING_ARGUMENTS:
            converted[_STRING_ARGUMENTS[key]] = value
    if converted.get("x-initial-cluster-size", 1) <= 0 or \
            converted.get("x-queue-leader-locator", LEADER_LOCATORS[0]) not in LEADER_LOCATORS:
        raise StreamError(core.PRECONDITION_FAILED)  # (validate_stream_queue_arguments)
    return converted


def _order(binding: Any) -> tuple[int, int]:
    """A binding's place by its x-stream-partition-order: those with one (an integer, or a string of one) first."""
    order = binding.args_dict().get("x-stream-partition-order")
    if isinstance(order, bytes):
        order = order.decode(errors="replace")
    if isinstance(order, str) and re.fullmatch(r"[+-]?[0-9]+", order):  # (rabbit_data_coercion:to_integer)
        order = int(order)
    return (0, order) if isinstance(order, int) and not isinstance(order, bool) else (1, 0)


def _probe(exchange: str, routing_key: str) -> Message:
    """A message with no properties, for asking an exchange where a routing key goes."""
    return make_message(exchange, routing_key, commands.Basic.Properties(), b"")
