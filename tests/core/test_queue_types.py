"""The queue types (amqp_server/queues/types/) in-process: each declares what the rest of the node asks of it, and a
proxy of another node's queue answers with the same type as the queue it stands for.

What the types refuse and accept is driven through real clients in test_quorum_queues.py, test_streams.py,
test_priorities.py, test_policies.py and test_mgmt_api.py; these pin the interface itself.
"""
from __future__ import annotations

import pytest

from amqp_server.queues import policy, types as queue_types
from amqp_server.errors import AMQPError
from amqp_server.queues.queue import AnyQueue, Queue
from amqp_server.queues.queue_type import GLOBAL_QOS, NACK, REPLICATED, TRANSIENT
from amqp_server.queues.quorum_queue import QuorumQueue
from amqp_server.queues.stream_queue import StreamQueue
from forwarder.peers.remote_queue import RemoteQueue


@pytest.mark.parametrize("arguments, name, cls", [
    ({}, "classic", Queue),
    ({"x-queue-type": "classic"}, "classic", Queue),
    ({"x-max-priority": 5}, "classic", Queue),  # (its ready list is the priority one)
    ({"x-queue-type": "quorum"}, "quorum", QuorumQueue),
    ({"x-queue-type": b"stream"}, "stream", StreamQueue),
])
def test_a_declaration_picks_its_type_and_the_class_that_holds_its_messages(arguments, name, cls):
    kind, _ = queue_types.declared(arguments, "q", "/")
    assert kind.name == name and kind.queue_class is cls


def test_a_type_no_module_declares_is_refused_with_rabbitmqs_text():
    with pytest.raises(AMQPError) as refused:
        queue_types.declared({"x-queue-type": "lazy"}, "q", "/")
    assert refused.value.code == 406
    assert refused.value.text == ("PRECONDITION_FAILED - invalid arg 'x-queue-type' for queue 'q' in vhost '/': "
                                  "\"unsupported queue type 'lazy'\"")


def test_every_type_is_a_policy_target_and_a_default_queue_type():
    assert {kind.apply_to for kind in queue_types.TYPES} <= set(policy.APPLY_TO)
    assert set(queue_types.NAMES) == {"classic", "quorum", "stream"}


def test_each_type_refuses_what_its_capabilities_lack():
    classic, quorum, stream = (queue_types.of({"x-queue-type": name}) for name in ("classic", "quorum", "stream"))
    assert {TRANSIENT, GLOBAL_QOS, NACK} <= classic.capabilities
    classic.check_properties("q", "/", durable=False, exclusive=True, auto_delete=True)
    with pytest.raises(AMQPError, match="invalid property 'auto-delete'"):
        quorum.check_properties("q", "/", durable=True, exclusive=False, auto_delete=True)
    with pytest.raises(AMQPError, match="does not support global qos"):
        quorum.check_consumer("q", "/", False, 10, 5, {})
    with pytest.raises(AMQPError, match="basic.nack and basic.reject not supported by stream queues"):
        stream.check_nack("q", "/")
    with pytest.raises(AMQPError, match="invalid arg 'x-priority' .* of queue type rabbit_stream_queue"):
        stream.check_consumer("q", "/", False, 10, 0, {"x-priority": 1})
    assert quorum.check_consumer("q", "/", False, 10, 0, {"x-priority": 3}) == 3


def test_a_proxy_holds_the_type_of_the_queue_it_stands_for():
    arguments = {"x-queue-type": "quorum"}
    kind, args = queue_types.declared(arguments, "q", "/")
    proxy = RemoteQueue("q", "/", True, False, arguments, kind, args, peer=None)  # type: ignore[arg-type]  # a proxy never asked of its peer here
    assert proxy.type is queue_types.of(arguments) and REPLICATED in proxy.type.capabilities
    assert proxy.remote


def members(protocol: type) -> set[str]:
    """What a protocol says its implementers have: its attributes, properties and methods."""
    return {name for name in vars(protocol) if not name.startswith("_")} | set(protocol.__annotations__)


def test_a_proxy_is_a_queue_as_the_node_uses_one_but_not_a_queue_of_this_node():
    """The rest of the node calls only ``AnyQueue`` (mypy checks both kinds against it; this checks it at run
    time too); what only a queue of this node holds is asked through ``local()``, which a proxy answers None."""
    arguments = {"x-queue-type": "quorum"}
    kind, args = queue_types.declared(arguments, "q", "/")
    proxy = RemoteQueue("q", "/", True, False, arguments, kind, args, peer=None)  # type: ignore[arg-type]  # (as above)
    assert not isinstance(proxy, Queue) and Queue not in type(proxy).__mro__
    as_any: AnyQueue = proxy
    assert as_any.local() is None and proxy.remote and not proxy.exclusive and proxy.exclusive_owner is None
    assert not proxy.counts_deliveries  # its owner adds the deliveries' headers
    kind, args = queue_types.declared({}, "q", "/")
    local = kind.new("q", "/", False, None, False, {}, args, None)
    assert local.local() is local and not local.remote and local.available
    for queue in (proxy, local):
        assert {name for name in members(AnyQueue) if not hasattr(type(queue), name) and name not in vars(queue)} \
            == set(), queue
    assert members(AnyQueue) >= {"enqueue", "add_consumer", "remove_consumer", "settle", "reject", "requeue",
                                 "fetch", "purged", "drop_all", "local", "type", "message_count"}
