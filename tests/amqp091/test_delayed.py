"""x-delayed-message through pika: delays in due order, restart and kill -9 with stored delayed messages,
mandatory returns after the delay, confirms after storage, underlying types, e2e bindings, HTTP count."""
from __future__ import annotations

import json
import struct
import time
import urllib.request

import pika
import pytest

from conftest import connect
from pika.exceptions import ChannelClosedByBroker, ConnectionClosedByBroker

LATE_MS = 150  # allowed lateness (typically under 10 ms; the margin is for a loaded machine)



def delayed(ch, name: str, kind: str = "direct", durable: bool = False, **declare) -> None:
    ch.exchange_declare(name, "x-delayed-message", durable=durable, auto_delete=not durable,
                        arguments={"x-delayed-type": kind}, **declare)


def props(delay, persistent: bool = False, **headers) -> pika.BasicProperties:
    return pika.BasicProperties(headers={"x-delay": delay, **headers}, delivery_mode=2 if persistent else 1)


def receive(conn, ch, queue: str, count: int, timeout: float = 10.0) -> list[tuple[bytes, float, dict]]:
    """(body, arrival time, headers) of ``count`` messages consumed from ``queue``."""
    got: list[tuple[bytes, float, dict]] = []
    tag = ch.basic_consume(queue, lambda _c, _m, p, body: got.append((body, time.time(), p.headers)),
                           auto_ack=True)
    deadline = time.monotonic() + timeout
    while len(got) < count and time.monotonic() < deadline:
        conn.process_data_events(time_limit=0.01)
    ch.basic_cancel(tag)
    return got


def test_declare_needs_an_existing_delayed_type(broker, uid):
    with connect(broker) as conn:
        for arguments, text in (
                (None, "Invalid argument, 'x-delayed-type' must be an existing exchange type"),
                ({"x-delayed-type": "x-delayed-message"},
                 "Invalid argument, 'x-delayed-message' can't be used for 'x-delayed-type'")):
            ch = conn.channel()
            with pytest.raises(ChannelClosedByBroker) as exc:
                ch.exchange_declare(uid, "x-delayed-message", arguments=arguments)
            assert (exc.value.reply_code, exc.value.reply_text) == (406, f"PRECONDITION_FAILED - {text}")
    with connect(broker) as conn, pytest.raises(ConnectionClosedByBroker) as closed:
        conn.channel().exchange_declare(uid, "x-delayed-message", arguments={"x-delayed-type": "nope"})
    assert closed.value.reply_code == 503 and "unknown exchange type 'nope'" in closed.value.reply_text


def test_delays_are_honoured_in_due_order(broker, uid):
    with connect(broker) as conn:
        ch = conn.channel()
        delayed(ch, f"{uid}-x")
        ch.queue_declare(f"{uid}-q", auto_delete=True)
        ch.queue_bind(f"{uid}-q", f"{uid}-x", "k")
        delays = [900, 300, 600, 0, -50, 150, "450", 750]
        sent = {}
        for delay in delays:
            sent[str(delay).encode()] = time.time()
            ch.basic_publish(f"{uid}-x", "k", str(delay).encode(), props(delay))
        got = receive(conn, ch, f"{uid}-q", len(delays))
    assert [body for body, _, _ in got] == [b"0", b"-50", b"150", b"300", b"450", b"600", b"750", b"900"]
    for body, arrived, headers in got:
        delay = max(0, int(body))
        lateness = (arrived - sent[body]) * 1000 - delay
        assert -5 <= lateness < LATE_MS, (body, lateness)
        if delay > 0:
            assert headers["x-delay"] == -delay  # as the plugin marks a message it delayed


def test_mandatory_is_returned_only_when_due_and_unroutable(broker, uid):
    with connect(broker) as conn:
        ch = conn.channel()
        returned: list[tuple[bytes, float]] = []
        ch.add_on_return_callback(lambda _c, method, _p, body: returned.append((body, time.time())))
        delayed(ch, f"{uid}-x")
        ch.queue_declare(f"{uid}-q", auto_delete=True)
        ch.queue_bind(f"{uid}-q", f"{uid}-x", "bound")
        start = time.time()
        ch.basic_publish(f"{uid}-x", "nowhere", b"late", props(400), mandatory=True)
        ch.basic_publish(f"{uid}-x", "bound", b"routed", props(200), mandatory=True)
        ch.basic_publish(f"{uid}-x", "nowhere", b"now", props(0), mandatory=True)
        conn.process_data_events(time_limit=0.3)
        assert [body for body, _ in returned] == [b"now"]  # a deferred message is not unroutable yet
        deadline = time.monotonic() + 5
        while len(returned) < 2 and time.monotonic() < deadline:
            conn.process_data_events(time_limit=0.01)
        assert returned[1][0] == b"late" and 0.4 <= returned[1][1] - start < 0.4 + LATE_MS / 1000
        assert ch.basic_get(f"{uid}-q", auto_ack=True)[2] == b"routed"


def test_mandatory_return_after_the_channel_closed_is_dropped(broker, uid):
    with connect(broker) as conn:
        ch = conn.channel()
        delayed(ch, f"{uid}-x", durable=True)
        ch.basic_publish(f"{uid}-x", "nowhere", b"a", props(100, persistent=True), mandatory=True)
        ch.basic_publish(f"{uid}-x", "nowhere", b"b", props(100), mandatory=True)
        ch.close()
        time.sleep(0.3)
        other = conn.channel()  # the broker carried on; nothing arrives on a channel that did not publish
        other.exchange_delete(f"{uid}-x")
        conn.process_data_events(time_limit=0.1)
    dropped = f"mandatory delayed message for exchange '{uid}-x' in vhost '/' routed nowhere"
    assert broker.said().count(dropped) == 2


def test_underlying_headers_and_topic_types(broker, uid):
    with connect(broker) as conn:
        ch = conn.channel()
        delayed(ch, f"{uid}-h", "headers")
        delayed(ch, f"{uid}-t", "topic")
        ch.queue_declare(f"{uid}-q", exclusive=True)
        ch.queue_bind(f"{uid}-q", f"{uid}-h", "", {"x-match": "all", "colour": "red"})
        ch.queue_bind(f"{uid}-q", f"{uid}-t", "stock.*.nyse")
        ch.basic_publish(f"{uid}-h", "", b"red", props(200, colour="red"))
        ch.basic_publish(f"{uid}-h", "", b"blue", props(100, colour="blue"))
        ch.basic_publish(f"{uid}-t", "stock.ibm.nyse", b"ibm", props(100))
        ch.basic_publish(f"{uid}-t", "stock.ibm.lse", b"lse", props(50))
        got = receive(conn, ch, f"{uid}-q", 2)
        conn.process_data_events(time_limit=0.2)
        assert [body for body, _, _ in got] == [b"ibm", b"red"]
        assert ch.queue_declare(f"{uid}-q", passive=True).method.message_count == 0
        with pytest.raises(ChannelClosedByBroker) as exc:  # the headers type still validates bindings
            ch.queue_bind(f"{uid}-q", f"{uid}-h", "", {"x-match": "some"})
        assert exc.value.reply_code == 406


def test_exchange_to_exchange_bindings(broker, uid):
    """A delayed exchange as destination defers what reaches it; as source its delayed messages flow on."""
    with connect(broker) as conn:
        ch = conn.channel()
        ch.exchange_declare(f"{uid}-front", "fanout", auto_delete=True)
        delayed(ch, f"{uid}-x", "fanout")
        ch.exchange_declare(f"{uid}-back", "direct", auto_delete=True)
        ch.exchange_bind(f"{uid}-x", f"{uid}-front")
        ch.exchange_bind(f"{uid}-back", f"{uid}-x")
        ch.queue_declare(f"{uid}-now", auto_delete=True)
        ch.queue_declare(f"{uid}-later", auto_delete=True)
        ch.queue_bind(f"{uid}-now", f"{uid}-front")
        ch.queue_bind(f"{uid}-later", f"{uid}-back", "k")
        start = time.time()
        ch.basic_publish(f"{uid}-front", "k", b"m", props(300), mandatory=True)
        assert ch.basic_get(f"{uid}-now", auto_ack=True)[2] == b"m"
        got = receive(conn, ch, f"{uid}-later", 1)
        assert got[0][0] == b"m" and 0.3 <= got[0][1] - start < 0.3 + LATE_MS / 1000


def api(broker, path: str) -> dict:
    request = urllib.request.Request(f"http://127.0.0.1:{broker.mgmt_port}{path}")
    request.add_header("Authorization", "Basic Z3Vlc3Q6Z3Vlc3Q=")
    with urllib.request.urlopen(request, timeout=10) as response:
        return json.load(response)


def test_pending_count_in_the_http_api(broker, uid):
    with connect(broker) as conn:
        ch = conn.channel()
        delayed(ch, f"{uid}-x")
        for delay in (400, 400, 0):
            ch.basic_publish(f"{uid}-x", "k", b"", props(delay))
        time.sleep(0.1)
        assert api(broker, f"/api/exchanges/%2F/{uid}-x")["messages_delayed"] == 2
        time.sleep(0.5)
        assert api(broker, f"/api/exchanges/%2F/{uid}-x")["messages_delayed"] == 0


def _publish_confirmed(node, delays: dict[bytes, int], persistent: bool = True) -> dict[bytes, float]:
    """Publish with confirms; returns each message's due time (epoch s)."""
    due = {}
    with connect(node) as conn:
        ch = conn.channel()
        ch.confirm_delivery()
        delayed(ch, "dx", durable=True)
        ch.queue_declare("dq", durable=True)
        ch.queue_bind("dq", "dx", "k")
        for body, delay in delays.items():
            due[body] = time.time() + delay / 1000
            ch.basic_publish("dx", "k", body, props(delay, persistent=persistent))
    return due


@pytest.mark.parametrize("how", ["restart", "kill -9"])
def test_stored_delayed_messages_survive(start_broker, how):
    node = start_broker()
    due = _publish_confirmed(node, {b"soon": 300, b"later": 5000, b"last": 6000})  # later: after the restart
    if how == "restart":
        node.stop()
    else:
        node.kill()
    time.sleep(0.6)  # "soon" falls due while the node is down
    node.start()
    back = time.time()  # (a loaded machine's restart may outlast "later"'s delay: then it too is overdue)
    with connect(node) as conn:
        ch = conn.channel()
        got = receive(conn, ch, "dq", 3)
    assert [body for body, _, _ in got] == [b"soon", b"later", b"last"]
    arrived = {body: at for body, at, _ in got}
    assert arrived[b"soon"] - back < 5  # overdue: at once after the restart
    for body in (b"later", b"last"):
        assert -0.005 <= arrived[body] - due[body], body
        assert arrived[body] - max(due[body], back) < (LATE_MS / 1000 if due[body] > back else 5), body
    assert api(node, "/api/exchanges/%2F/dx")["messages_delayed"] == 0


def test_confirmed_means_stored(start_broker):
    """Every confirmed persistent publish survives a kill -9 right after its confirm. A transient one is stored
    too (as the plugin's disc_copies tables keep it) but its confirm does not wait for the fsync: it may be lost."""
    node = start_broker()
    bodies = {f"m{i}".encode(): 8000 + i for i in range(200)}
    _publish_confirmed(node, bodies)
    _publish_confirmed(node, {b"transient": 600_000}, persistent=False)  # (due long after this test)
    node.kill()
    node.start()
    kept = api(node, "/api/exchanges/%2F/dx")["messages_delayed"]
    assert kept in (200, 201)
    with connect(node) as conn:
        ch = conn.channel()
        got = receive(conn, ch, "dq", 200, timeout=20)
        conn.process_data_events(time_limit=0.3)
    assert [body for body, _, _ in got] == list(bodies)
    log = node.said()
    assert f"recovered {kept} delayed messages" in log


@pytest.mark.parametrize("encoded, value, in_place", [
    (b"b\x05", 5, True), (b"B\x05", 5, True), (b"B\xc8", 200, False), (b"u\x01\x2c", 300, True),
    (b"s\x01\x2c", 300, True), (b"I\x00\x00\x01\x2c", 300, True), (b"i\xff\xff\xff\xff", 2**32 - 1, False),
    (b"l" + (300).to_bytes(8, "big"), 300, True), (b"S\x00\x00\x00\x03450", "450", False),
])
def test_header_bytes_read_and_negated_in_place(encoded, value, in_place):
    """x-delay is read from (and negated in) the header bytes; what pamqp decodes afterwards agrees."""
    from pamqp.header import ContentHeader

    from amqp_server.framing import header_table
    from amqp_server.message import Message

    table = b"\x01aS\x00\x00\x00\x01x" + b"\x07x-delay" + encoded + b"\x01zb\x01"
    header = (struct.pack(">HHQH", 60, 0, 3, 0xA000) + b"\x0atext/plain" + struct.pack(">I", len(table))
              + table)
    message = Message("x", "k", b"\x01x\x01k", bytes(header), b"abc")
    assert message.header_value("x-delay") == value
    assert message.header_value("z") == 1 and message.header_value("nope") is None
    if in_place:
        assert len(header_table.with_int(header, 0xA000, "x-delay", -value)) == len(header)
    else:  # the signed type of that width cannot hold it, or not an integer: through pamqp
        with pytest.raises(header_table.NotInTable):
            header_table.with_int(header, 0xA000, "x-delay", -int(value))
    message.set_int_header("x-delay", -int(value))
    decoded = ContentHeader()
    decoded.unmarshal(message.header)
    assert decoded.properties.headers == {"a": "x", "x-delay": -int(value), "z": 1}
    assert decoded.properties.content_type == "text/plain"


def test_schedule_reads_in_order_in_chunks(tmp_path):
    """The window reads every entry once, in (due, seq) order, across ties, staged puts and deletes."""
    from queue_index import Schedule, ScheduledEntry

    schedule = Schedule(str(tmp_path / "s"))
    entries = [ScheduledEntry(due, seq, seq + 100, 10, b"t") for seq, due in enumerate([5, 5, 5, 5, 3, 9, 5, 7])]
    for entry in entries[:5]:
        schedule.put(entry)
    schedule.commit()
    for entry in entries[5:]:
        schedule.put(entry)  # staged, not committed
    schedule.delete(5, 1)  # a committed one
    schedule.delete(7, 7)  # a staged one
    after, seen = (0, 0), []
    while chunk := schedule.between(after, 8, 2):
        seen += [(e.due, e.seq) for e in chunk]
        after = seen[-1]
    assert seen == [(3, 4), (5, 0), (5, 2), (5, 3), (5, 6)]
    schedule.commit()
    assert [(e.due, e.seq, e.msg_id) for e in schedule.entries()] == [
        (3, 4, 104), (5, 0, 100), (5, 2, 102), (5, 3, 103), (5, 6, 106), (9, 5, 105)]
    schedule.close()


def test_delayed_messages_follow_the_exchange_name(broker, uid):
    """As with the plugin: when due, a message is routed by its exchange's name, or dropped if none is left."""
    with connect(broker) as conn:
        ch = conn.channel()
        ch.queue_declare(f"{uid}-q", durable=True)

        def declare() -> None:
            delayed(ch, f"{uid}-x", durable=True)
            ch.queue_bind(f"{uid}-q", f"{uid}-x", "k")

        declare()
        for persistent in (True, False):
            ch.basic_publish(f"{uid}-x", "k", b"gone", props(300, persistent=persistent))
        ch.exchange_delete(f"{uid}-x")
        time.sleep(0.5)
        assert ch.queue_declare(f"{uid}-q", passive=True).method.message_count == 0
        declare()
        for persistent in (True, False):
            ch.basic_publish(f"{uid}-x", "k", b"kept", props(300, persistent=persistent))
        ch.exchange_delete(f"{uid}-x")
        declare()
        time.sleep(0.5)
        assert ch.queue_declare(f"{uid}-q", passive=True).method.message_count == 2
        ch.queue_delete(f"{uid}-q")
