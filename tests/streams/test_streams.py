"""Streams (x-queue-type: stream) through AMQP 0-9-1, as RabbitMQ 3.10 serves them to AMQP clients.

Each test passes against RabbitMQ 3.10 too (parity mode, see conftest), except those marked warren_only.
"""
from __future__ import annotations

import datetime
import time
from typing import Any

import pytest
from pika.exceptions import ChannelClosedByBroker, ConnectionClosedByBroker
from pika.spec import Basic

from conftest import connect
from support import call, channel_on, publish as publish_on, publish_to as publish, q

pytestmark = pytest.mark.timeout(60)

STREAM = {"x-queue-type": "stream"}


def declare(channel, name: str, **arguments) -> int:
    return channel.queue_declare(name, durable=True, arguments={**STREAM, **arguments}).method.message_count


def read(connection, channel, name: str, count: int, offset=None, prefetch: int = 100, ack: bool = True,
         timeout: float = 5.0, quiet: float = 0.0) -> list[tuple[int, bytes, bool]]:
    """(x-stream-offset, body, redelivered) of up to ``count`` deliveries from ``offset``; ``quiet``: then wait that
    long for any more.  Without ``quiet`` the broker is given credit for ``count`` deliveries at most (a prefetch of
    no more, acks only for those it makes room for): pika rejects what it holds undispatched as its connection
    closes, and a stream queue answers a reject by closing the connection (540), as RabbitMQ's does."""
    window = prefetch if quiet else min(prefetch, count)
    channel.basic_qos(prefetch_count=window)
    got: list[tuple[int, bytes, bool]] = []

    def on_message(ch, method, properties, body):
        got.append((properties.headers["x-stream-offset"], body, method.redelivered))
        if ack and (quiet or len(got) <= count - window):
            ch.basic_ack(method.delivery_tag)

    arguments = {"x-stream-offset": offset} if offset is not None else None
    channel.basic_consume(name, on_message, arguments=arguments)
    deadline = time.monotonic() + timeout
    while len(got) < count and time.monotonic() < deadline:
        connection.process_data_events(0.05)
    if quiet:
        connection.process_data_events(quiet)
    return got


def consume_from(broker, name: str, offset, count: int, **kwargs) -> list[tuple[int, bytes, bool]]:
    with connect(broker) as connection:
        return read(connection, connection.channel(), name, count, offset, **kwargs)


def publish_stored(broker, name: str, bodies: list[bytes]) -> None:
    """Publish ``bodies`` with one confirm, for the last: it stored, so did those before it on the channel (a
    confirm waited for each is an fsync each: a minute under load for thousands)."""
    with channel_on(broker) as channel:
        publish_on(channel, name, bodies[:-1])
        channel.confirm_delivery()
        publish_on(channel, name, bodies[-1:])


def refused(broker, name: str, **kwargs) -> tuple[int, str]:
    with connect(broker) as connection:
        arguments = {**STREAM, **kwargs.pop("arguments", {})}
        with pytest.raises(ChannelClosedByBroker) as caught:
            connection.channel().queue_declare(name, arguments=arguments, **kwargs)
        return caught.value.reply_code, caught.value.reply_text


@pytest.mark.parametrize("kwargs, text", [
    (dict(durable=True, exclusive=True), "invalid property 'exclusive-owner' for queue '{q}' in vhost '/'"),
    (dict(durable=False), "invalid property 'non-durable' for queue '{q}' in vhost '/'"),
    (dict(durable=True, auto_delete=True), "invalid property 'auto-delete' for queue '{q}' in vhost '/'"),
    (dict(durable=False, exclusive=True, auto_delete=True),
     "invalid property 'auto-delete' for queue '{q}' in vhost '/'"),
    *[(dict(durable=True, arguments={name: value}),
       f"invalid arg '{name}' for queue '{{q}}' in vhost '/' of queue type rabbit_stream_queue")
      for name, value in [("x-max-length", 10), ("x-message-ttl", 1000), ("x-max-priority", 5),
                          ("x-overflow", "drop-head"), ("x-dead-letter-exchange", "dlx"), ("x-expires", 10000),
                          ("x-single-active-consumer", True), ("x-queue-mode", "lazy"), ("x-delivery-limit", 5),
                          ("x-quorum-initial-group-size", 3), ("x-dead-letter-routing-key", "k"),
                          ("x-max-in-memory-length", 3), ("x-queue-version", 2)]],
    (dict(durable=True, arguments={"x-expires": 1, "x-max-length": 1, "x-message-ttl": 1, "x-max-priority": 1}),
     "invalid arg 'x-expires' for queue '{q}' in vhost '/' of queue type rabbit_stream_queue"),
    (dict(durable=True, arguments={"x-max-length-bytes": -1}),
     "invalid arg 'x-max-length-bytes' for queue '{q}' in vhost '/': {{value_negative,-1}}"),
    (dict(durable=True, arguments={"x-stream-max-segment-size-bytes": -5}),
     "invalid arg 'x-stream-max-segment-size-bytes' for queue '{q}' in vhost '/': {{value_negative,-5}}"),
    (dict(durable=True, arguments={"x-max-age": 5}),
     "invalid arg 'x-max-age' for queue '{q}' in vhost '/': {{unacceptable_type,signedint}}"),
    (dict(durable=True, arguments={"x-max-age": "0s"}),
     "invalid arg 'x-max-age' for queue '{q}' in vhost '/': invalid_max_age"),
])
def test_what_a_stream_refuses(broker, uid, kwargs, text):
    assert refused(broker, uid, **kwargs) == (406, "PRECONDITION_FAILED - " + text.format(q=uid))


def test_what_a_stream_takes(broker, uid):
    with connect(broker) as connection:
        channel = connection.channel()
        taken: list[dict[str, Any]] = [
            {"x-max-age": "1h"}, {"x-max-age": "10Y"}, {"x-max-length-bytes": 1000},
            {"x-stream-max-segment-size-bytes": 1_000_000}, {"x-initial-cluster-size": 3},
            {"x-queue-leader-locator": "balanced"}, {"x-unknown": 1}]
        for i, arguments in enumerate(taken):
            assert declare(channel, f"{uid}-{i}", **arguments) == 0
            channel.queue_delete(f"{uid}-{i}")


@pytest.mark.parametrize("first, again, text", [
    ({"x-max-age": "1h"}, {"x-max-age": "2h"}, "received '2h' but current is '1h'"),
    ({"x-max-age": "1h"}, {}, "received none but current is the value '1h' of type 'longstr'"),
    ({"x-stream-max-segment-size-bytes": 2_000_000}, {"x-stream-max-segment-size-bytes": 3_000_000},
     "received '3000000' but current is '2000000'"),
    ({"x-initial-cluster-size": 1}, {"x-initial-cluster-size": 2}, "received '2' but current is '1'"),
    ({"x-queue-leader-locator": "client-local"}, {"x-queue-leader-locator": "balanced"},
     "received 'balanced' but current is 'client-local'"),
])
def test_a_stream_declared_again_with_other_retention_is_inequivalent(broker, uid, first, again, text):
    """rabbit_amqqueue:assert_args_equivalence checks the existing queue's type's queue_arguments: a stream's
    retention, segment size, cluster size and leader locator among them (the stream would keep its old ones)."""
    with connect(broker) as connection:
        declare(connection.channel(), uid, **first)
    try:
        arguments = next(iter(again), None)
        assert refused(broker, uid, durable=True, arguments=again) == (
            406, f"PRECONDITION_FAILED - inequivalent arg '{arguments or next(iter(first))}' for queue '{uid}' in "
                 f"vhost '/': {text}")
        with connect(broker) as connection:
            assert declare(connection.channel(), uid, **first) == 0  # the same again is the same stream
    finally:
        with connect(broker) as connection:
            connection.channel().queue_delete(uid)


def test_basic_get_is_not_implemented(broker, uid):
    with connect(broker) as connection:
        declare(connection.channel(), uid)
        with pytest.raises(ConnectionClosedByBroker) as caught:
            connection.channel().basic_get(uid)
    assert (caught.value.reply_code, caught.value.reply_text) == (
        540, f"NOT_IMPLEMENTED - basic.get not supported by stream queues queue '{uid}' in vhost '/'")


@pytest.mark.parametrize("qos, no_ack, error", [
    (None, False, (406, "PRECONDITION_FAILED - consumer prefetch count is not set for 'queue '{q}' in vhost '/''")),
    (None, True, (406, "PRECONDITION_FAILED - consumer prefetch count is not set for 'queue '{q}' in vhost '/''")),
    ((10, False), True,
     (540, "NOT_IMPLEMENTED - automatic acknowledgement not supported by stream queues queue '{q}' in vhost '/'")),
    ((10, True), False,
     (406, "PRECONDITION_FAILED - consumer prefetch count is not set for 'queue '{q}' in vhost '/''")),
])
def test_a_consumer_needs_a_prefetch_and_manual_acks(broker, uid, qos, no_ack, error):
    with connect(broker) as connection:
        declare(connection.channel(), uid)
        channel = connection.channel()
        if qos is not None:
            channel.basic_qos(prefetch_count=qos[0], global_qos=qos[1])
        with pytest.raises((ChannelClosedByBroker, ConnectionClosedByBroker)) as caught:
            channel.basic_consume(uid, lambda *_: None, auto_ack=no_ack)
            connection.process_data_events(1)
    closed = caught.value
    assert isinstance(closed, (ChannelClosedByBroker, ConnectionClosedByBroker))  # (what pytest.raises took)
    assert (closed.reply_code, closed.reply_text) == (error[0], error[1].format(q=uid))


def test_a_consumer_with_a_prefetch_on_a_channel_with_a_shared_one_is_refused(broker, uid):
    """rabbit_stream_queue refuses a consumer on a channel whose limiter is active (basic.qos global) after its
    prefetch and ack checks: 540, the channel's "does not support global qos"."""
    with connect(broker) as connection:
        declare(connection.channel(), uid)
        channel = connection.channel()
        channel.basic_qos(prefetch_count=10)
        channel.basic_qos(prefetch_count=5, global_qos=True)
        with pytest.raises((ChannelClosedByBroker, ConnectionClosedByBroker)) as caught:
            channel.basic_consume(uid, lambda *_: None)
            connection.process_data_events(1)
    closed = caught.value
    assert isinstance(closed, (ChannelClosedByBroker, ConnectionClosedByBroker))  # (what pytest.raises took)
    assert (closed.reply_code, closed.reply_text) == (
        540, f"NOT_IMPLEMENTED - queue '{uid}' in vhost '/' does not support global qos")


def test_offsets_first_a_number_next_and_last(broker, uid):
    with connect(broker) as connection:
        declare(connection.channel(), uid)
    bodies = [b"m%d" % i for i in range(10)]
    publish(broker, uid, bodies)
    everything = [(i, body, False) for i, body in enumerate(bodies)]
    assert consume_from(broker, uid, "first", 10) == everything
    assert consume_from(broker, uid, 4, 6) == everything[4:]
    assert consume_from(broker, uid, -5, 10) == everything  # below the first: the first
    assert consume_from(broker, uid, 1000, 1, timeout=0.5) == []  # past the end: what comes next
    assert consume_from(broker, uid, "next", 1, timeout=0.5) == []
    time.sleep(1.1)  # a chunk of its own
    publish(broker, uid, [b"tail"])
    assert consume_from(broker, uid, "last", 1, quiet=0.3) == [(10, b"tail", False)]
    assert len(consume_from(broker, uid, "first", 11)) == 11  # the messages stay: reading takes nothing


def consume_refused(broker: Any, uid: str, offset: object) -> ChannelClosedByBroker:
    """How a consume of a new stream from ``offset`` is refused."""
    with connect(broker) as connection:
        declare(connection.channel(), uid)
        channel = connection.channel()
        channel.basic_qos(prefetch_count=1)
        with pytest.raises(ChannelClosedByBroker) as caught:
            channel.basic_consume(uid, lambda *_: None, arguments={"x-stream-offset": offset})
    return caught.value


@pytest.mark.parametrize("offset", ["foo", True])
@pytest.mark.warren_only("RabbitMQ 3.10 fails such a consume with 541 INTERNAL_ERROR")
def test_an_offset_that_is_none_is_refused(broker, uid, offset):
    assert consume_refused(broker, uid, offset).reply_text == (
        f"PRECONDITION_FAILED - invalid arg 'x-stream-offset' for queue '{uid}' in vhost '/': {offset!r}")


@pytest.mark.parametrize("offset", ["10", "1x", "0s", "5 h"])
def test_an_interval_rabbitmq_reads_but_refuses_is_invalid_stream_offset_arg(broker, uid, offset):
    """rabbit_amqqueue:check_stream_offset_arg: a string of digits and a unit that rabbit_amqqueue:check_max_age
    refuses (no unit, another one, a zero) is 406 with the value as Erlang prints it."""
    refused = consume_refused(broker, uid, offset)
    assert (refused.reply_code, refused.reply_text) == (
        406, f"PRECONDITION_FAILED - invalid arg 'x-stream-offset' for queue '{uid}' in vhost '/': "
             f'{{invalid_stream_offset_arg,{{longstr,<<"{offset}">>}}}}')


def test_first_last_and_next_as_byte_arrays_are_taken(broker, uid):
    """rabbit_stream_queue:parse_offset_arg matches first, last and next whatever their field type: pika sends
    bytes as a byte array."""
    with connect(broker) as connection:
        declare(connection.channel(), uid)
    publish_stored(broker, uid, [b"a", b"b"])
    assert [body for _, body, _ in consume_from(broker, uid, b"first", 2)] == [b"a", b"b"]
    assert [body for _, body, _ in consume_from(broker, uid, b"last", 1)] == [b"b"]
    assert consume_from(broker, uid, b"next", 1, timeout=0.5) == []


def test_a_consumer_priority_is_refused(broker, uid):
    with connect(broker) as connection:
        declare(connection.channel(), uid)
        channel = connection.channel()
        channel.basic_qos(prefetch_count=1)
        with pytest.raises(ChannelClosedByBroker) as caught:
            channel.basic_consume(uid, lambda *_: None, arguments={"x-priority": 3})
    assert caught.value.reply_text == (f"PRECONDITION_FAILED - invalid arg 'x-priority' for queue '{uid}' in vhost '/' "
                                       "of queue type rabbit_stream_queue")


def test_offsets_by_time(broker, uid):
    with connect(broker) as connection:
        declare(connection.channel(), uid)
    publish(broker, uid, [b"old"])
    assert consume_from(broker, uid, datetime.datetime.now() - datetime.timedelta(minutes=1), 1) == [(0, b"old", False)]
    assert consume_from(broker, uid, "10m", 1) == [(0, b"old", False)]
    with connect(broker) as connection:  # from a time to come: what is published from then on
        channel = connection.channel()
        channel.basic_qos(prefetch_count=10)
        got = []
        channel.basic_consume(uid, lambda ch, method, properties, body: got.append(body),
                              arguments={"x-stream-offset": datetime.datetime.now() + datetime.timedelta(minutes=1)})
        connection.process_data_events(0.5)
        assert got == []
        publish(broker, uid, [b"new"])
        deadline = time.monotonic() + 5
        while not got and time.monotonic() < deadline:
            connection.process_data_events(0.05)
        assert got == [b"new"]


def test_consumers_read_on_their_own_and_acks_only_give_credit(broker, uid):
    with connect(broker) as connection:
        declare(connection.channel(), uid)
    publish(broker, uid, [b"m%d" % i for i in range(20)], headers={"kept": 1}, delivery_mode=1)
    with connect(broker) as connection:
        first, second = connection.channel(), connection.channel()
        assert [o for o, _, _ in read(connection, first, uid, 20, "first")] == list(range(20))
        assert [o for o, _, _ in read(connection, second, uid, 10, 10)] == list(range(10, 20))
        held = read(connection, connection.channel(), uid, 20, "first", prefetch=3, ack=False, timeout=1.0, quiet=0.3)
        assert [o for o, _, _ in held] == [0, 1, 2]  # no more until acked
    assert len(consume_from(broker, uid, "first", 20)) == 20


@pytest.mark.parametrize("nack", [lambda ch, tag: ch.basic_nack(tag, requeue=True),
                                  lambda ch, tag: ch.basic_reject(tag, requeue=False)], ids=["nack", "reject"])
def test_nack_and_reject_are_not_implemented(broker, uid, nack):
    with connect(broker) as connection:
        declare(connection.channel(), uid)
    publish(broker, uid, [b"a"])
    connection = connect(broker)
    channel = connection.channel()
    channel.basic_qos(prefetch_count=10)
    channel.basic_consume(uid, lambda ch, method, properties, body: nack(ch, method.delivery_tag),
                          arguments={"x-stream-offset": "first"})
    with pytest.raises(ConnectionClosedByBroker) as caught:
        for _ in range(40):
            connection.process_data_events(0.05)
    assert (caught.value.reply_code, caught.value.reply_text) == (
        540, f"NOT_IMPLEMENTED - basic.nack and basic.reject not supported by stream queues queue '{uid}' in vhost '/'")
    assert consume_from(broker, uid, "first", 1) == [(0, b"a", False)]


def test_closing_with_unacked_messages_leaves_the_stream_as_it_was(broker, uid):
    with connect(broker) as connection:
        declare(connection.channel(), uid)
    publish(broker, uid, [b"a", b"b"])
    assert [body for _, body, _ in consume_from(broker, uid, "first", 2, ack=False)] == [b"a", b"b"]
    assert consume_from(broker, uid, "first", 2) == [(0, b"a", False), (1, b"b", False)]


@pytest.mark.parametrize("conditions", [{}, {"if_empty": True}, {"if_unused": True}])
def test_a_delete_takes_a_stream_whatever_its_conditions_and_counts_no_messages(broker, uid, conditions):
    """rabbit_stream_queue:delete ignores if-unused and if-empty, and the stream coordinator's answer counts no
    messages."""
    with connect(broker) as connection:
        declare(connection.channel(), uid)
    publish_stored(broker, uid, [b"a", b"b"])
    with connect(broker) as connection:
        consuming = connection.channel()
        consuming.basic_qos(prefetch_count=1)
        consuming.basic_consume(uid, lambda *_: None)
        connection.process_data_events(0.2)
        assert connection.channel().queue_delete(uid, **conditions).method.message_count == 0
    with connect(broker) as connection, pytest.raises(ChannelClosedByBroker) as caught:
        connection.channel().queue_declare(uid, passive=True)
    assert caught.value.reply_code == 404


def test_a_purge_is_not_implemented(broker, uid):
    with connect(broker) as connection:
        declare(connection.channel(), uid)
        publish(broker, uid, [b"x", b"y"])
        with pytest.raises(ConnectionClosedByBroker) as caught:
            connection.channel().queue_purge(uid)
    assert (caught.value.reply_code, caught.value.reply_text) == (
        540, f"NOT_IMPLEMENTED - queue.purge not supported by stream queues queue '{uid}' in vhost '/'")
    assert [body for _, body, _ in consume_from(broker, uid, "first", 2)] == [b"x", b"y"]


def test_a_deep_stream_is_read_from_disk_in_order(broker, uid):
    with connect(broker) as connection:
        declare(connection.channel(), uid)
    publish_stored(broker, uid, [b"%d" % i for i in range(10_000)])
    got = consume_from(broker, uid, 2, 9_998, prefetch=500, timeout=30)
    assert [(o, body) for o, body, _ in got] == [(i, b"%d" % i) for i in range(2, 10_000)]


def test_the_http_api_shows_a_stream(broker, uid):
    if not broker.mgmt_port:
        pytest.skip("needs the HTTP API")
    with connect(broker) as connection:
        declare(connection.channel(), uid, **{"x-max-age": "7D"})
    info = call(broker, "GET", f"/api/queues/%2F/{q(uid)}").json
    assert (info["type"], info["durable"], info["arguments"]) == ("stream", True, {**STREAM, "x-max-age": "7D"})


@pytest.mark.warren_only("retention runs as a segment fills; RabbitMQ's is asynchronous")
def test_retention_drops_whole_segments_by_bytes(broker, uid):
    with connect(broker) as connection:
        declare(connection.channel(), uid, **{"x-max-length-bytes": 3_000_000,
                                              "x-stream-max-segment-size-bytes": 1_000_000})
    publish(broker, uid, [b"%099000d" % i for i in range(100)])  # a segment fills at its 11th message
    got = consume_from(broker, uid, "first", 100, timeout=1.0)
    count = len(got)
    assert 3_000_000 - 2 * 11 * 99_000 < count * 99_000 <= 3_000_000  # whole segments go (never the one written)
    assert [o for o, _, _ in got] == list(range(100 - count, 100)) and got[0][0] % 11 == 0
    assert call(broker, "GET", f"/api/queues/%2F/{q(uid)}").json["messages"] == count
    assert consume_from(broker, uid, 0, 1)[0][0] == 100 - count  # an offset gone: the first there is


@pytest.mark.warren_only("retention runs as a segment fills; RabbitMQ's is asynchronous")
def test_retention_drops_segments_older_than_max_age(broker, uid):
    with connect(broker) as connection:
        declare(connection.channel(), uid, **{"x-max-age": "1s", "x-stream-max-segment-size-bytes": 1_000_000})
    publish(broker, uid, [b"%0198000d" % i for i in range(10)])  # a segment of 6, and 4 in the next
    time.sleep(2.1)
    publish(broker, uid, [b"%0198000d" % i for i in range(10, 16)])  # the second fills: retention runs
    got = consume_from(broker, uid, "first", 16, timeout=1.0)
    assert [o for o, _, _ in got] == list(range(6, 16))  # the first is old; the second has new messages


@pytest.mark.warren_only("restarts a node of its own")
@pytest.mark.parametrize("how", ["stop", "kill -9"])
def test_a_stream_survives_a_restart(start_broker, how):
    node = start_broker()
    with connect(node) as connection:
        declare(connection.channel(), "s", **{"x-max-length-bytes": 2_000_000,
                                              "x-stream-max-segment-size-bytes": 1_000_000})
    publish(node, "s", [b"%099000d" % i for i in range(50)], delivery_mode=1)
    time.sleep(1.1)
    before = datetime.datetime.now()
    publish(node, "s", [b"late"])
    first = consume_from(node, "s", "first", 100, quiet=0.3)
    assert first[-1] == (50, b"late", False) and first[0][0] > 0
    assert consume_from(node, "s", before, 1, quiet=0.3) == [(50, b"late", False)]
    if how == "stop":
        node.stop()
    else:
        node.kill()
    node.start()
    assert consume_from(node, "s", "first", 100, quiet=0.3) == first
    assert consume_from(node, "s", before, 1, quiet=0.3) == [(50, b"late", False)]
    publish(node, "s", [b"%099000d" % i for i in range(30)])  # retention goes on from where it was
    got = consume_from(node, "s", "first", 100, quiet=0.3)
    assert got[-1][0] == 80 and got[0][0] > first[0][0]


def test_a_policy_with_a_max_age_that_is_none_is_refused(broker, uid):
    if not broker.mgmt_port:
        pytest.skip("needs the HTTP API")
    response = call(broker, "PUT", f"/api/policies/%2F/{q(uid)}",
                    {"pattern": f"^{uid}$", "definition": {"max-age": "0s"}, "apply-to": "queues"})
    assert (response.status, response.json["reason"]) == (
        400, 'Validation failed\n\n&lt;&lt;"0s"&gt;&gt; is not a valid max age\n')


@pytest.mark.warren_only("retention runs as a segment fills; RabbitMQ's is asynchronous")
def test_a_policy_sets_a_streams_retention(broker, uid):
    if not broker.mgmt_port:
        pytest.skip("needs the HTTP API")
    response = call(broker, "PUT", f"/api/policies/%2F/{q(uid)}", {
        "pattern": f"^{uid}$", "apply-to": "streams",
        "definition": {"max-length-bytes": 2_000_000, "stream-max-segment-size-bytes": 1_000_000}})
    assert response.status == 201, response.raw
    try:
        with connect(broker) as connection:
            declare(connection.channel(), uid)
        publish(broker, uid, [b"%099000d" % i for i in range(100)])
        got = consume_from(broker, uid, "first", 100, timeout=1.0)
        assert 0 < len(got) * 99_000 <= 2_000_000 and got[-1][0] == 99
        info = call(broker, "GET", f"/api/queues/%2F/{q(uid)}").json
        assert info["policy"] == uid
    finally:
        call(broker, "DELETE", f"/api/policies/%2F/{q(uid)}")


@pytest.mark.warren_only("Warren's offsets API (the Spark bridge)")
def test_the_spark_bridge_reads_a_stream_by_its_offsets_and_cannot_drain_it(broker, uid):
    import pyarrow as pa

    with connect(broker) as connection:
        declare(connection.channel(), uid)
    publish_stored(broker, uid, [b"%d" % i for i in range(6000)])  # deeper than the tail kept in memory
    assert call(broker, "GET", f"/api/queues/%2F/{q(uid)}/offsets").json == {
        "head": 0, "tail": 6000, "committed": 0, "messages": 6000, "bytes": sum(len(b"%d" % i) for i in range(6000))}
    response = call(broker, "GET", f"/api/queues/%2F/{q(uid)}/records?start=100&limit=5000")
    batches = list(pa.ipc.open_stream(response.raw))
    rows = [(o, bytes(b)) for batch in batches
            for o, b in zip(batch.column("offset").to_pylist(), batch.column("body").to_pylist())]
    assert rows == [(i, b"%d" % i) for i in range(100, 5100)]
    refused = call(broker, "POST", f"/api/queues/%2F/{q(uid)}/commit", {"offset": 10})
    assert refused.status == 400 and "is a stream: its messages leave by retention only" in refused.json["reason"]
    assert len(consume_from(broker, uid, "first", 6000, prefetch=1000, timeout=20)) == 6000


def test_a_nack_that_names_a_stream_message_loses_nothing_of_a_classic_queue(broker, uid):
    with connect(broker) as connection:
        channel = connection.channel()
        declare(channel, uid)
        channel.queue_declare(f"{uid}-classic")
    publish(broker, uid, [b"s"])
    publish(broker, f"{uid}-classic", [b"c"])
    connection = connect(broker)
    channel = connection.channel()
    channel.basic_qos(prefetch_count=10)
    tags: list[int] = []

    def keep_tag(_channel, method: Basic.Deliver, _properties, _body) -> None:
        assert method.delivery_tag is not None  # (a delivery always has one)
        tags.append(method.delivery_tag)

    channel.basic_consume(f"{uid}-classic", keep_tag)
    channel.basic_consume(uid, keep_tag, arguments={"x-stream-offset": "first"})
    while len(tags) < 2:
        connection.process_data_events(0.05)
    channel.basic_nack(max(tags), multiple=True, requeue=False)
    with pytest.raises(ConnectionClosedByBroker) as caught:
        for _ in range(40):
            connection.process_data_events(0.05)
    assert caught.value.reply_code == 540
    with connect(broker) as connection:
        channel = connection.channel()
        method, _, body = channel.basic_get(f"{uid}-classic", auto_ack=True)
        assert body == b"c"
        channel.queue_delete(f"{uid}-classic")
