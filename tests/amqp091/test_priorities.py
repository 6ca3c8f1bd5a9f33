"""Priority queues (``x-max-priority``) through pika and the HTTP API, as RabbitMQ's classic queues behave.

Higher priority first, FIFO within a priority; no priority is 0, above the maximum is the maximum.
"""
from __future__ import annotations

import base64
import json
import time
import urllib.request

import pika
import pytest

from conftest import connect
from pika.exceptions import ChannelClosedByBroker
from support import publish

pytestmark = pytest.mark.timeout(60)

V = "vhost '/'"
PRIORITY = {"x-max-priority": 10}




def publish_prioritised(ch, queue: str, items: list[tuple[str, int | None]], **props) -> None:
    """Each (body, priority) in turn."""
    for body, priority in items:
        publish(ch, queue, [body], priority=priority, **props)


def get_all(ch, queue: str, auto_ack: bool = True) -> list[tuple[str, bool, int]]:
    """(body, redelivered, delivery tag) of every message basic.get returns."""
    got: list[tuple[str, bool, int]] = []
    while True:
        method, _, body = ch.basic_get(queue, auto_ack=auto_ack)
        if method is None:
            return got
        got.append((body.decode(), method.redelivered, method.delivery_tag))


def bodies(got) -> list[str]:
    return [item[0] for item in got]


def api(node, path: str, method: str = "GET", body: dict | None = None):
    request = urllib.request.Request(f"http://127.0.0.1:{node.mgmt_port}{path}", method=method,
                                     data=json.dumps(body).encode() if body is not None else None)
    request.add_header("Authorization", "Basic " + base64.b64encode(b"guest:guest").decode())
    request.add_header("Content-Type", "application/json")
    with urllib.request.urlopen(request, timeout=10) as response:
        raw = response.read()
        return raw if response.headers["Content-Type"].startswith("application/vnd.apache") else json.loads(raw)


MIXED = [("a0", None), ("b5", 5), ("c0", 0), ("d10", 10), ("e5", 5), ("f200", 200), ("g1", 1), ("h10", 10)]
MIXED_ORDER = ["d10", "f200", "h10", "b5", "e5", "g1", "a0", "c0"]


def test_basic_get_highest_priority_first_fifo_within(conn, uid):
    ch = conn.channel()
    ch.confirm_delivery()  # RabbitMQ may answer the passive declare before it has queued unconfirmed publishes
    ch.queue_declare(uid, arguments=PRIORITY)
    publish_prioritised(ch, uid, MIXED)
    assert ch.queue_declare(uid, passive=True).method.message_count == len(MIXED)
    assert bodies(get_all(ch, uid)) == MIXED_ORDER
    ch.queue_delete(uid)


def test_consumer_gets_priority_order(conn, uid):
    ch = conn.channel()
    ch.queue_declare(uid, arguments=PRIORITY)
    publish_prioritised(ch, uid, MIXED)
    got: list[str] = []
    ch.basic_qos(prefetch_count=1)

    def on_message(channel, method, _props, body):
        got.append(body.decode())
        channel.basic_ack(method.delivery_tag)
        if body == b"d10":  # published while the consumer works: overtakes everything of lower priority
            publish_prioritised(channel, uid, [("late7", 7)])

    ch.basic_consume(uid, on_message)
    deadline = time.monotonic() + 5
    while len(got) < len(MIXED) + 1 and time.monotonic() < deadline:
        conn.process_data_events(0.05)
    assert got == ["d10", "f200", "h10", "late7", "b5", "e5", "g1", "a0", "c0"]
    ch.queue_delete(uid)


def test_plain_queue_ignores_priority(conn, uid):
    ch = conn.channel()
    ch.queue_declare(uid)
    publish_prioritised(ch, uid, MIXED)
    assert bodies(get_all(ch, uid)) == [body for body, _ in MIXED]
    ch.queue_delete(uid)


def test_requeued_messages_keep_priority_and_place(conn, uid):
    ch = conn.channel()
    ch.queue_declare(uid, arguments=PRIORITY)
    publish_prioritised(ch, uid, MIXED)
    taken = get_all(ch, uid, auto_ack=False)
    assert bodies(taken) == MIXED_ORDER
    for body, _, tag in taken:
        if body in ("f200", "e5", "c0"):
            ch.basic_nack(tag, requeue=True)
        else:
            ch.basic_ack(tag)
    publish_prioritised(ch, uid, [("i5", 5), ("j0", None)])
    again = get_all(ch, uid)
    assert [(body, redelivered) for body, redelivered, _ in again] == [
        ("f200", True), ("e5", True), ("i5", False), ("c0", True), ("j0", False)]
    ch.queue_delete(uid)


def test_channel_close_requeues_into_priority_order(broker, conn, uid):
    ch = conn.channel()
    ch.queue_declare(uid, arguments=PRIORITY)
    publish_prioritised(ch, uid, [("low", 1), ("high", 9)])
    other = connect(broker)
    taker = other.channel()
    assert taker.basic_get(uid)[2] == b"high"
    publish_prioritised(ch, uid, [("mid", 5)])
    other.close()
    assert [(body, redelivered) for body, redelivered, _ in get_all(ch, uid)] == [
        ("high", True), ("mid", False), ("low", False)]
    ch.queue_delete(uid)


@pytest.mark.parametrize("value, detail", [
    (256, "{max_value_exceeded,256}"),
    (100000, "{max_value_exceeded,100000}"),
    (-1, "{value_negative,-1}"),
    ("10", '"expected integer, got longstr"'),
    (True, '"expected integer, got bool"'),
])
def test_invalid_max_priority_406(conn, uid, value, detail):
    ch = conn.channel()
    with pytest.raises(ChannelClosedByBroker) as exc:
        ch.queue_declare(uid, arguments={"x-max-priority": value})
    assert exc.value.reply_code == 406
    assert exc.value.reply_text == \
        f"PRECONDITION_FAILED - invalid arg 'x-max-priority' for queue '{uid}' in {V}: {detail}"


@pytest.mark.parametrize("maximum", [0, 1, 255])
def test_max_priority_bounds_accepted(conn, uid, maximum):
    ch = conn.channel()
    ch.queue_declare(uid, arguments={"x-max-priority": maximum})
    publish_prioritised(ch, uid, [("a", None), ("b", 255), ("c", 1), ("d", 0)])
    expected = {0: ["a", "b", "c", "d"], 1: ["b", "c", "a", "d"], 255: ["b", "c", "a", "d"]}[maximum]
    assert bodies(get_all(ch, uid)) == expected
    with pytest.raises(ChannelClosedByBroker) as exc:
        ch = conn.channel()
        ch.queue_declare(uid, arguments={"x-max-priority": maximum + 1})
    assert exc.value.reply_code == 406 and "inequivalent arg 'x-max-priority'" in exc.value.reply_text
    conn.channel().queue_delete(uid)


@pytest.mark.warren_only("TTL expires a message wherever it sits; RabbitMQ only at the head")
def test_per_message_ttl_expires_behind_higher_priorities(conn, uid):
    """Unlike RabbitMQ (expiry from the head only), an expired low-priority message goes on time."""
    ch = conn.channel()
    dlq = f"{uid}-dlq"
    ch.queue_declare(dlq)
    ch.queue_declare(uid, arguments={**PRIORITY, "x-dead-letter-exchange": "", "x-dead-letter-routing-key": dlq})
    publish_prioritised(ch, uid, [("h1", 9), ("h2", 9)])
    ch.basic_publish("", uid, b"short", pika.BasicProperties(priority=1, expiration="50"))
    publish_prioritised(ch, uid, [("low", 0)])
    deadline = time.monotonic() + 5
    while ch.queue_declare(dlq, passive=True).method.message_count < 1 and time.monotonic() < deadline:
        conn.process_data_events(0.05)
    assert ch.queue_declare(uid, passive=True).method.message_count == 3
    method, props, body = ch.basic_get(dlq, auto_ack=True)
    assert body == b"short" and props.priority == 1
    assert props.headers["x-death"][0]["reason"] == "expired"
    assert bodies(get_all(ch, uid)) == ["h1", "h2", "low"]
    ch.queue_delete(uid)
    ch.queue_delete(dlq)


def test_queue_ttl_with_priorities(conn, uid):
    ch = conn.channel()
    ch.confirm_delivery()  # RabbitMQ may answer the passive declare before it has queued unconfirmed publishes
    ch.queue_declare(uid, arguments={**PRIORITY, "x-message-ttl": 100})
    publish_prioritised(ch, uid, [("a", 1), ("b", 7)])
    assert ch.queue_declare(uid, passive=True).method.message_count == 2
    time.sleep(0.3)
    assert ch.queue_declare(uid, passive=True).method.message_count == 0
    assert ch.basic_get(uid)[0] is None
    ch.queue_delete(uid)


def test_reject_dead_letters_keeping_priority(conn, uid):
    ch = conn.channel()
    dlq = f"{uid}-dlq"
    ch.queue_declare(dlq, arguments=PRIORITY)
    ch.queue_declare(uid, arguments={**PRIORITY, "x-dead-letter-exchange": "", "x-dead-letter-routing-key": dlq})
    publish_prioritised(ch, uid, [("a", 2), ("b", 8), ("c", 5)])
    for _, _, tag in get_all(ch, uid, auto_ack=False):
        ch.basic_reject(tag, requeue=False)
    deadline = time.monotonic() + 5  # RabbitMQ dead-letters asynchronously
    while ch.queue_declare(dlq, passive=True).method.message_count < 3 and time.monotonic() < deadline:
        conn.process_data_events(0.05)
    assert bodies(get_all(ch, dlq)) == ["b", "c", "a"]  # dead letters keep their priority in the target
    ch.queue_delete(uid)
    ch.queue_delete(dlq)


def test_max_length_drops_from_the_head(conn, uid):
    """RabbitMQ: max-length drops from the head as usual, so the highest priority messages go first --
    a high-priority message published into a full queue is dropped itself."""
    ch = conn.channel()
    dlq = f"{uid}-dlq"
    ch.queue_declare(dlq)
    ch.queue_declare(uid, arguments={**PRIORITY, "x-max-length": 3, "x-dead-letter-exchange": "",
                                     "x-dead-letter-routing-key": dlq})
    publish_prioritised(ch, uid, [("a1", 1), ("b9", 9), ("c5", 5), ("d0", 0), ("e9", 9)])
    assert bodies(get_all(ch, uid)) == ["c5", "a1", "d0"]
    dropped = []
    while True:
        method, props, body = ch.basic_get(dlq, auto_ack=True)
        if method is None:
            break
        dropped.append((body.decode(), props.headers["x-death"][0]["reason"]))
    assert dropped == [("b9", "maxlen"), ("e9", "maxlen")]
    ch.queue_delete(uid)
    ch.queue_delete(dlq)


def test_reject_publish_overflow_on_priority_queue(conn, uid):
    ch = conn.channel()
    ch.queue_declare(uid, arguments={**PRIORITY, "x-max-length": 2, "x-overflow": "reject-publish"})
    publish_prioritised(ch, uid, [("a", 1), ("b", 9), ("c", 9)])
    assert bodies(get_all(ch, uid)) == ["b", "a"]
    ch.queue_delete(uid)


@pytest.mark.warren_only("peek/offsets/records/commit are Warren HTTP endpoints (Spark bridge)")
def test_peek_in_delivery_order_offsets_in_publish_order(broker, conn, uid):
    import pyarrow as pa

    ch = conn.channel()
    ch.queue_declare(uid, arguments=PRIORITY)
    publish_prioritised(ch, uid, MIXED)
    peeked = api(broker, f"/api/queues/%2F/{uid}/peek?count=100")
    assert [m["payload"] for m in peeked] == MIXED_ORDER
    assert [m["position"] for m in peeked] == list(range(len(MIXED)))
    assert api(broker, f"/api/queues/%2F/{uid}/offsets") == {"head": 0, "tail": 8, "committed": 0, "messages": 8,
                                                              "bytes": sum(len(body) for body, _ in MIXED)}
    table = pa.ipc.open_stream(api(broker, f"/api/queues/%2F/{uid}/records?start=2&end=7")).read_all()
    assert table.column("offset").to_pylist() == [2, 3, 4, 5, 6]
    assert [bytes(b).decode() for b in table.column("body").to_pylist()] == ["c0", "d10", "e5", "f200", "g1"]
    assert table.column("priority").to_pylist() == [0, 10, 5, 200, 1]
    assert api(broker, f"/api/queues/%2F/{uid}/commit", "POST", {"offset": 4}) == {"removed": 4, "committed": 4}
    assert api(broker, f"/api/queues/%2F/{uid}/offsets")["head"] == 4
    assert bodies(get_all(ch, uid)) == ["f200", "h10", "e5", "g1"]  # seq 0..3 (a0 b5 c0 d10) are gone
    ch.queue_delete(uid)


def test_restart_keeps_priority_order(start_broker):
    node = start_broker()
    conn = connect(node)
    ch = conn.channel()
    ch.queue_declare("pq", durable=True, arguments=PRIORITY)
    publish_prioritised(ch, "pq", MIXED, delivery_mode=2)
    publish_prioritised(ch, "pq", [("transient9", 9)])  # not persistent: gone after the restart
    method, _, body = ch.basic_get("pq")
    assert body == b"d10"  # delivered, never acked: back after the restart, redelivered
    conn.close()
    node.stop()
    node.start()
    conn = connect(node)
    ch = conn.channel()
    assert ch.queue_declare("pq", durable=True, arguments=PRIORITY).method.message_count == len(MIXED)
    publish_prioritised(ch, "pq", [("new5", 5), ("new10", 10)], delivery_mode=2)
    got = get_all(ch, "pq")
    assert [(body, redelivered) for body, redelivered, _ in got] == [
        ("d10", True), ("f200", False), ("h10", False), ("new10", False), ("b5", False), ("e5", False),
        ("new5", False), ("g1", False), ("a0", False), ("c0", False)]
    conn.close()


def test_restart_after_kill_keeps_priority_order(start_broker):
    node = start_broker()
    conn = connect(node)
    ch = conn.channel()
    ch.confirm_delivery()
    ch.queue_declare("pq", durable=True, arguments={"x-max-priority": 3})
    publish_prioritised(ch, "pq", [(f"m{i}", i % 5) for i in range(200)], delivery_mode=2)
    conn.close()
    node.kill()
    node.start()
    conn = connect(node)
    ch = conn.channel()
    got = bodies(get_all(ch, "pq"))
    expected = sorted((f"m{i}" for i in range(200)), key=lambda b: (-min(int(b[1:]) % 5, 3), int(b[1:])))
    assert got == expected
    conn.close()


@pytest.mark.warren_only("TTL expires a message wherever it sits; RabbitMQ only at the head")
def test_many_expired_entries_compacted_out_of_every_level(conn, uid):
    """Over 1024 entries expired in place make the queue drop them from its levels; order stays."""
    ch = conn.channel()
    ch.queue_declare(uid, arguments=PRIORITY)
    for i in range(1500):
        ch.basic_publish("", uid, b"x", pika.BasicProperties(priority=i % 11, expiration="20"))
    publish_prioritised(ch, uid, [("keep3", 3), ("keep9", 9), ("keep0", None)])
    deadline = time.monotonic() + 10
    while ch.queue_declare(uid, passive=True).method.message_count > 3 and time.monotonic() < deadline:
        conn.process_data_events(0.05)
    assert ch.queue_declare(uid, passive=True).method.message_count == 3
    publish_prioritised(ch, uid, [("late9", 9)])
    assert bodies(get_all(ch, uid)) == ["keep9", "late9", "keep3", "keep0"]
    ch.queue_delete(uid)


async def test_aio_pika_priorities_and_consumer_priority(broker, uid):
    import aio_pika

    async with await aio_pika.connect_robust(broker.url, timeout=10) as connection:
        channel = await connection.channel(publisher_confirms=True)
        queue = await channel.declare_queue(uid, arguments={"x-max-priority": 5}, auto_delete=True)
        for body, priority in [("low", 1), ("top", 9), ("mid", 3), ("zero", 0), ("top2", 5)]:
            await channel.default_exchange.publish(aio_pika.Message(body.encode(), priority=priority),
                                                   routing_key=uid)
        got = []
        async with queue.iterator(arguments={"x-priority": 2}) as messages:
            async for message in messages:
                async with message.process():
                    got.append((message.body.decode(), message.priority))
                if len(got) == 5:
                    break
        assert got == [("top", 9), ("top2", 5), ("mid", 3), ("low", 1), ("zero", 0)]
