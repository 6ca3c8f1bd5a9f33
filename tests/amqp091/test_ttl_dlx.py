"""Message TTL, queue expiry, length limits and dead-lettering, driven through pika as RabbitMQ 3.10 behaves."""
from __future__ import annotations

import datetime
import time

import pika
import pytest
from pika.exceptions import ChannelClosedByBroker, NackError

pytestmark = pytest.mark.timeout(60)

X_DEATH_KEYS = {"count", "reason", "queue", "time", "exchange", "routing-keys"}




def count(conn, queue: str) -> int:
    ch = conn.channel()
    try:
        return ch.queue_declare(queue, passive=True).method.message_count
    finally:
        if ch.is_open:
            ch.close()


def wait_until(predicate, timeout: float = 5.0, interval: float = 0.01, conn=None):
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError("condition not met in time")
        if conn is not None:
            conn.process_data_events(time_limit=interval)
        else:
            time.sleep(interval)


class Collector:
    """Consumes a queue (auto-ack) and records each delivery with its arrival time."""

    def __init__(self, conn, queue: str, auto_ack: bool = True) -> None:
        self.conn = conn
        self.ch = conn.channel()
        self.got: list[tuple[float, object, pika.BasicProperties, bytes]] = []
        self.ch.basic_consume(queue, self._on, auto_ack=auto_ack)

    def _on(self, ch, method, props, body) -> None:
        self.got.append((time.monotonic(), method, props, body))

    def wait(self, n: int, timeout: float = 5.0) -> list:
        deadline = time.monotonic() + timeout
        while len(self.got) < n and time.monotonic() < deadline:
            self.conn.process_data_events(time_limit=0.005)
        assert len(self.got) >= n, f"got {len(self.got)} of {n} deliveries"
        return self.got

    def quiet(self, seconds: float) -> None:
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            self.conn.process_data_events(time_limit=0.01)


def dlx_setup(ch, uid: str, dlx_type: str = "fanout") -> tuple[str, str]:
    dlx, dlq = f"{uid}.dlx", f"{uid}.dlq"
    ch.exchange_declare(dlx, dlx_type, auto_delete=False)
    ch.queue_declare(dlq)
    ch.queue_bind(dlq, dlx, "#" if dlx_type == "topic" else "")
    return dlx, dlq


def death_table(props) -> list[dict]:
    deaths = props.headers["x-death"]
    assert isinstance(deaths, list)
    return deaths


# -- TTL ----------------------------------------------------------------------------------------------------------


def test_queue_ttl_expires_and_not_counted(conn, uid):
    ch = conn.channel()
    ch.queue_declare(uid, arguments={"x-message-ttl": 150})
    for i in range(5):
        ch.basic_publish("", uid, b"m%d" % i)
    assert count(conn, uid) == 5
    wait_until(lambda: count(conn, uid) == 0, timeout=3)
    assert ch.basic_get(uid, auto_ack=True) == (None, None, None)
    ch.queue_delete(uid)


def test_per_message_expiration_never_delivered(conn, uid):
    ch = conn.channel()
    ch.queue_declare(uid)
    ch.basic_publish("", uid, b"short", pika.BasicProperties(expiration="50"))
    ch.basic_publish("", uid, b"keep")
    time.sleep(0.15)
    assert count(conn, uid) == 1
    method, _, body = ch.basic_get(uid, auto_ack=True)
    assert body == b"keep"
    assert ch.basic_get(uid, auto_ack=True) == (None, None, None)
    # a consumer attached later never sees the expired one either
    ch.basic_publish("", uid, b"gone", pika.BasicProperties(expiration="30"))
    time.sleep(0.1)
    coll = Collector(conn, uid)
    coll.quiet(0.2)
    assert coll.got == []
    ch.queue_delete(uid)


@pytest.mark.parametrize("queue_ttl,msg_ttl", [(300, "5000"), (5000, "300")])
def test_effective_ttl_is_the_smaller(conn, uid, queue_ttl, msg_ttl):
    ch = conn.channel()
    dlx, dlq = dlx_setup(ch, uid)
    ch.queue_declare(uid, arguments={"x-message-ttl": queue_ttl, "x-dead-letter-exchange": dlx})
    coll = Collector(conn, dlq)
    t0 = time.monotonic()
    ch.basic_publish("", uid, b"x", pika.BasicProperties(expiration=msg_ttl))
    (arrived, _, props, body), = coll.wait(1, timeout=3)
    assert 0.28 <= arrived - t0 <= 0.45, arrived - t0
    assert body == b"x" and props.expiration is None
    for q in (uid, dlq):
        ch.queue_delete(q)
    ch.exchange_delete(dlx)


@pytest.mark.parametrize("with_consumer", [False, True])
@pytest.mark.warren_only("TTL expires a message wherever it sits; RabbitMQ only at the head")
def test_short_ttl_behind_long_ttl_expires_on_time(conn, uid, with_consumer):
    ch = conn.channel()
    dlx, dlq = dlx_setup(ch, uid)
    ch.queue_declare(uid, arguments={"x-dead-letter-exchange": dlx})
    coll = Collector(conn, dlq)
    if with_consumer:
        # a consumer with prefetch 1 holds an unacked message, so the later ones wait in the queue
        cch = conn.channel()
        cch.basic_qos(prefetch_count=1)
        held = []
        cch.basic_consume(uid, lambda c, m, p, b: held.append((m, b)))
        ch.basic_publish("", uid, b"held")
        wait_until(lambda: held, conn=conn)
    ch.basic_publish("", uid, b"long", pika.BasicProperties(expiration="20000"))
    t0 = time.monotonic()
    ch.basic_publish("", uid, b"short", pika.BasicProperties(expiration="300"))
    (arrived, _, props, body), = coll.wait(1, timeout=3)
    assert body == b"short"
    assert 0.28 <= arrived - t0 <= 0.4, arrived - t0
    assert death_table(props)[0]["reason"] == "expired"
    assert count(conn, uid) == 1  # "long" still there
    if with_consumer:
        assert [b for _, b in held] == [b"held"]
        cch.basic_ack(held[0][0].delivery_tag)
        wait_until(lambda: len(held) == 2, conn=conn)
        assert held[1][1] == b"long"
        cch.close()
    for q in (uid, dlq):
        ch.queue_delete(q)
    ch.exchange_delete(dlx)


def test_ttl_zero_delivered_to_waiting_consumer_else_expired(conn, uid):
    ch = conn.channel()
    dlx, dlq = dlx_setup(ch, uid)
    ch.queue_declare(uid, arguments={"x-message-ttl": 0, "x-dead-letter-exchange": dlx})
    # nobody waiting: expired at once (dead-lettered)
    ch.basic_publish("", uid, b"nobody")
    assert count(conn, uid) == 0
    wait_until(lambda: count(conn, dlq) == 1)
    method, props, body = ch.basic_get(dlq, auto_ack=True)
    assert body == b"nobody" and props.headers["x-death"][0]["reason"] == "expired"
    # a consumer waiting: delivered
    coll = Collector(conn, uid)
    ch.basic_publish("", uid, b"waiting")
    (_, _, _, body), = coll.wait(1, timeout=3)
    assert body == b"waiting"
    # per-message expiration "0" likewise
    coll.ch.close()
    ch.basic_publish("", uid, b"m0", pika.BasicProperties(expiration="0"))
    assert count(conn, uid) == 0
    for q in (uid, dlq):
        ch.queue_delete(q)
    ch.exchange_delete(dlx)


@pytest.mark.parametrize("expiration, error", [
    ("abc", "no_integer"), ("", "no_integer"), (" 5", "no_integer"), ("-1", "{value_negative,-1}"),
    ("1.5", '{leftover_string,".5"}'), ("5abc", '{leftover_string,"abc"}'),
    ("315360000001", "{value_too_large,315360000001}")])
def test_invalid_expiration_closes_channel_406(conn, uid, expiration, error):
    ch = conn.channel()
    ch.queue_declare(uid)
    ch.basic_publish("", uid, b"x", pika.BasicProperties(expiration=expiration))
    with pytest.raises(ChannelClosedByBroker) as closed:
        ch.queue_declare(uid, passive=True)
    assert closed.value.reply_code == 406
    assert closed.value.reply_text == f"PRECONDITION_FAILED - invalid expiration '{expiration}': {error}"
    assert count(conn, uid) == 0
    conn.channel().queue_delete(uid)


def exists(conn, queue: str) -> bool:
    """Passive declare: like any redeclare it renews the x-expires lease, so call it only to end a wait."""
    try:
        count(conn, queue)
        return True
    except ChannelClosedByBroker as exc:
        assert exc.reply_code == 404
        return False


def idle(conn, seconds: float) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        conn.process_data_events(time_limit=0.05)


def test_x_expires_deletes_unused_queue(conn, uid):
    conn.channel().queue_declare(uid, arguments={"x-expires": 300})
    idle(conn, 0.15)
    assert exists(conn, uid)
    idle(conn, 0.75)
    assert not exists(conn, uid)


def test_x_expires_lease_renewed_by_redeclare_passive_or_not(conn, uid):
    ch = conn.channel()
    ch.queue_declare(uid, arguments={"x-expires": 400})
    for _ in range(3):
        idle(conn, 0.2)
        assert exists(conn, uid)
        idle(conn, 0.2)
        ch.queue_declare(uid, arguments={"x-expires": 400})
    idle(conn, 0.9)
    assert not exists(conn, uid)


def test_x_expires_consumer_keeps_queue_alive(conn, uid):
    ch = conn.channel()
    ch.queue_declare(uid, arguments={"x-expires": 250})
    cch = conn.channel()
    tag = cch.basic_consume(uid, lambda *a: None)
    idle(conn, 0.8)
    assert exists(conn, uid)
    cch.basic_cancel(tag)
    idle(conn, 0.8)
    assert not exists(conn, uid)


# -- dead-lettering -----------------------------------------------------------------------------------------------


def _check_death(death: dict, reason: str, queue: str, exchange: str, rks: list[str], count_: int = 1,
                 original_expiration: str | None = None) -> None:
    keys = set(X_DEATH_KEYS)
    if original_expiration is not None:
        keys.add("original-expiration")
        assert death["original-expiration"] == original_expiration
    assert set(death) == keys, death
    assert death["count"] == count_
    assert death["reason"] == reason
    assert death["queue"] == queue
    assert death["exchange"] == exchange
    assert death["routing-keys"] == rks
    stamp = death["time"]
    assert isinstance(stamp, datetime.datetime)
    stamp = stamp.replace(tzinfo=datetime.timezone.utc) if stamp.tzinfo is None else stamp
    assert abs(stamp.timestamp() - time.time()) < 30


@pytest.mark.parametrize("dlrk", [None, "dead-key"])
def test_dead_letter_expired_headers(conn, uid, dlrk):
    ch = conn.channel()
    src = f"{uid}.src"
    ch.exchange_declare(src, "direct")
    dlx, dlq = f"{uid}.dlx", f"{uid}.dlq"
    ch.exchange_declare(dlx, "direct")
    ch.queue_declare(dlq)
    ch.queue_bind(dlq, dlx, dlrk or "orig-key")
    args = {"x-dead-letter-exchange": dlx, "x-message-ttl": 60}
    if dlrk:
        args["x-dead-letter-routing-key"] = dlrk
    ch.queue_declare(uid, arguments=args)
    ch.queue_bind(uid, src, "orig-key")
    coll = Collector(conn, dlq)
    ch.basic_publish(src, "orig-key", b"q-ttl", pika.BasicProperties(headers={"app": "v"}, delivery_mode=2))
    ch.basic_publish(src, "orig-key", b"m-ttl", pika.BasicProperties(expiration="30", content_type="text/plain"))
    got = coll.wait(2, timeout=3)
    by_body = {body: (method, props) for _, method, props, body in got}
    for body, expiration in ((b"q-ttl", None), (b"m-ttl", "30")):
        method, props = by_body[body]
        assert method.exchange == dlx
        assert method.routing_key == (dlrk or "orig-key")
        assert props.expiration is None
        deaths = death_table(props)
        assert len(deaths) == 1
        _check_death(deaths[0], "expired", uid, src, ["orig-key"], original_expiration=expiration)
        assert props.headers["x-first-death-reason"] == "expired"
        assert props.headers["x-first-death-queue"] == uid
        assert props.headers["x-first-death-exchange"] == src
    assert by_body[b"q-ttl"][1].headers["app"] == "v"
    assert by_body[b"q-ttl"][1].delivery_mode == 2
    assert by_body[b"m-ttl"][1].content_type == "text/plain"
    for q in (uid, dlq):
        ch.queue_delete(q)
    for x in (src, dlx):
        ch.exchange_delete(x)


@pytest.mark.parametrize("how", ["reject", "nack", "nack-multiple"])
def test_dead_letter_rejected(conn, uid, how):
    ch = conn.channel()
    dlx, dlq = dlx_setup(ch, uid)
    ch.queue_declare(uid, arguments={"x-dead-letter-exchange": dlx})
    for i in range(3):
        ch.basic_publish("", uid, b"r%d" % i)
    tags = []
    for _ in range(3):
        method, _, _ = ch.basic_get(uid)
        tags.append(method.delivery_tag)
    if how == "reject":
        for tag in tags:
            ch.basic_reject(tag, requeue=False)
    elif how == "nack":
        for tag in tags:
            ch.basic_nack(tag, multiple=False, requeue=False)
    else:
        ch.basic_nack(tags[-1], multiple=True, requeue=False)
    coll = Collector(conn, dlq)
    got = coll.wait(3, timeout=3)
    assert [body for *_, body in got] == [b"r0", b"r1", b"r2"]
    for _, method, props, _ in got:
        assert method.routing_key == uid
        _check_death(death_table(props)[0], "rejected", uid, "", [uid])
        assert props.headers["x-first-death-reason"] == "rejected"
        assert props.headers["x-first-death-exchange"] == ""
    assert count(conn, uid) == 0
    for q in (uid, dlq):
        ch.queue_delete(q)
    ch.exchange_delete(dlx)


def test_requeue_true_does_not_dead_letter(conn, uid):
    ch = conn.channel()
    dlx, dlq = dlx_setup(ch, uid)
    ch.queue_declare(uid, arguments={"x-dead-letter-exchange": dlx})
    ch.basic_publish("", uid, b"x")
    method, _, _ = ch.basic_get(uid)
    ch.basic_reject(method.delivery_tag, requeue=True)
    method, _, body = ch.basic_get(uid, auto_ack=True)
    assert body == b"x" and method.redelivered
    assert count(conn, dlq) == 0
    for q in (uid, dlq):
        ch.queue_delete(q)
    ch.exchange_delete(dlx)


def test_rejection_cycle_goes_around_and_count_increments(conn, uid):
    """A queue whose DLX (the default exchange) routes back to itself: rejections cycle, count grows,
    x-first-death-* and the entry's first time/exchange stay as they were."""
    ch = conn.channel()
    ch.queue_declare(uid, arguments={"x-dead-letter-exchange": "", "x-dead-letter-routing-key": uid})
    ch.basic_publish("", uid, b"loop", pika.BasicProperties(expiration="60000"))
    first_time = None
    for n in range(1, 4):
        method, props, body = wait_until(lambda: (lambda r: r if r[0] else None)(ch.basic_get(uid)), timeout=3)
        assert body == b"loop"
        if n > 1:
            deaths = death_table(props)
            assert len(deaths) == 1
            _check_death(deaths[0], "rejected", uid, "", [uid], count_=n - 1, original_expiration="60000")
            if first_time is None:
                first_time = deaths[0]["time"]
            else:
                assert deaths[0]["time"] == first_time  # RabbitMQ only increments count
            assert props.headers["x-first-death-queue"] == uid
            assert props.expiration is None
        ch.basic_reject(method.delivery_tag, requeue=False)
        if n == 1:
            time.sleep(1.05)  # so a rewritten time would differ
    ch.queue_delete(uid)


def test_expiry_cycle_is_dropped(conn, uid):
    """TTL + DLX back to the same queue: the message dies once and is dropped, not looped."""
    ch = conn.channel()
    ch.queue_declare(uid, arguments={"x-dead-letter-exchange": "", "x-dead-letter-routing-key": uid,
                                     "x-message-ttl": 30})
    ch.basic_publish("", uid, b"x")
    deadline = time.monotonic() + 0.6
    seen = 0
    while time.monotonic() < deadline:
        seen += count(conn, uid)
        time.sleep(0.02)
    assert count(conn, uid) == 0
    assert seen <= 2  # present only before the first expiry
    ch.queue_delete(uid)


def test_cycle_after_earlier_rejection_elsewhere_is_dropped(conn, uid):
    """Rejected in A (DLX -> B), then expiring in B whose DLX routes back to B: the automatic cycle B -> B
    has no rejection in it, so RabbitMQ drops it even though an older x-death entry says 'rejected'."""
    ch = conn.channel()
    qa, qb = f"{uid}.a", f"{uid}.b"
    ch.queue_declare(qb, arguments={"x-dead-letter-exchange": "", "x-dead-letter-routing-key": qb,
                                    "x-message-ttl": 30})
    ch.queue_declare(qa, arguments={"x-dead-letter-exchange": "", "x-dead-letter-routing-key": qb})
    ch.basic_publish("", qa, b"x")
    method, _, _ = ch.basic_get(qa)
    ch.basic_reject(method.delivery_tag, requeue=False)
    time.sleep(0.15)
    samples = []
    deadline = time.monotonic() + 0.5
    while time.monotonic() < deadline:
        samples.append(count(conn, qb))
        time.sleep(0.01)
    assert sum(samples) == 0, samples
    for q in (qa, qb):
        ch.queue_delete(q)


def test_cycle_with_rejection_in_it_goes_around(conn, uid):
    """A rejects into B, B expires back into A: a client rejection is in the cycle, so it keeps going."""
    ch = conn.channel()
    qa, qb = f"{uid}.a", f"{uid}.b"
    ch.queue_declare(qb, arguments={"x-dead-letter-exchange": "", "x-dead-letter-routing-key": qa,
                                    "x-message-ttl": 20})
    ch.queue_declare(qa, arguments={"x-dead-letter-exchange": "", "x-dead-letter-routing-key": qb})
    ch.basic_publish("", qa, b"x")
    for n in range(1, 4):
        method, props, body = wait_until(lambda: (lambda r: r if r[0] else None)(ch.basic_get(qa)), timeout=3)
        if n > 1:
            deaths = {(d["queue"], d["reason"]): d["count"] for d in death_table(props)}
            assert deaths == {(qa, "rejected"): n - 1, (qb, "expired"): n - 1}
            assert death_table(props)[0]["queue"] == qb  # newest first
            assert props.headers["x-first-death-queue"] == qa
            assert props.headers["x-first-death-reason"] == "rejected"
        ch.basic_reject(method.delivery_tag, requeue=False)
    for q in (qa, qb):
        ch.queue_delete(q)


def test_dead_letter_to_missing_exchange_drops(conn, uid):
    ch = conn.channel()
    ch.queue_declare(uid, arguments={"x-dead-letter-exchange": f"{uid}.nowhere", "x-message-ttl": 20})
    ch.basic_publish("", uid, b"x")
    wait_until(lambda: count(conn, uid) == 0, timeout=2)
    ch.queue_delete(uid)


# -- length limits ------------------------------------------------------------------------------------------------


def _bodies(ch, queue: str) -> list[bytes]:
    out: list[bytes] = []
    while True:
        method, _, body = ch.basic_get(queue, auto_ack=True)
        if method is None:
            return out
        out.append(body)


@pytest.mark.parametrize("limit", [{"x-max-length": 2}, {"x-max-length-bytes": 10}])
def test_drop_head_dead_letters_oldest_as_maxlen(conn, uid, limit):
    ch = conn.channel()
    dlx, dlq = dlx_setup(ch, uid)
    ch.queue_declare(uid, arguments={"x-dead-letter-exchange": dlx, **limit})
    for i in range(5):
        ch.basic_publish("", uid, b"m%03d" % i)  # 4 bytes each
    assert count(conn, uid) == 2
    wait_until(lambda: count(conn, dlq) == 3)
    coll = Collector(conn, dlq)
    got = coll.wait(3)
    assert [b for *_, b in got] == [b"m000", b"m001", b"m002"]
    for _, _, props, _ in got:
        _check_death(death_table(props)[0], "maxlen", uid, "", [uid])
        assert props.headers["x-first-death-reason"] == "maxlen"
    assert _bodies(ch, uid) == [b"m003", b"m004"]
    for q in (uid, dlq):
        ch.queue_delete(q)
    ch.exchange_delete(dlx)


@pytest.mark.parametrize("overflow", ["reject-publish", "reject-publish-dlx"])
def test_reject_publish_nacks_publisher(conn, uid, overflow):
    ch = conn.channel()
    dlx, dlq = dlx_setup(ch, uid)
    ch.queue_declare(uid, arguments={"x-max-length": 2, "x-overflow": overflow, "x-dead-letter-exchange": dlx})
    pub = conn.channel()
    pub.confirm_delivery()
    pub.basic_publish("", uid, b"m1")
    pub.basic_publish("", uid, b"m2")
    with pytest.raises(NackError):
        pub.basic_publish("", uid, b"m3")
    with pytest.raises(NackError):
        pub.basic_publish("", uid, b"m4")
    assert pub.is_open
    method, _, body = ch.basic_get(uid, auto_ack=True)
    assert body == b"m1"
    pub.basic_publish("", uid, b"m5")  # room again: acked
    assert _bodies(ch, uid) == [b"m2", b"m5"]
    if overflow == "reject-publish-dlx":
        wait_until(lambda: count(conn, dlq) == 2)
        got = Collector(conn, dlq).wait(2)
        assert [b for *_, b in got] == [b"m3", b"m4"]
        for _, _, props, _ in got:
            _check_death(death_table(props)[0], "maxlen", uid, "", [uid])
    else:
        time.sleep(0.1)
        assert count(conn, dlq) == 0
    for q in (uid, dlq):
        ch.queue_delete(q)
    ch.exchange_delete(dlx)


# -- argument validation ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("args, detail", [
    ({"x-message-ttl": -1}, "{value_negative,-1}"),
    ({"x-message-ttl": "abc"}, '"expected integer, got longstr"'),
    ({"x-message-ttl": True}, '"expected integer, got bool"'),
    ({"x-expires": 0}, "{value_zero,0}"),
    ({"x-expires": -5}, "{value_negative,-5}"),
    ({"x-expires": 315360000001}, "{value_too_large,315360000001}"),
    ({"x-message-ttl": 315360000001}, "{value_too_large,315360000001}"),
    ({"x-max-length": -1}, "{value_negative,-1}"),
    ({"x-max-length-bytes": -1}, "{value_negative,-1}"),
    ({"x-overflow": "bogus"}, "invalid_overflow"),
    ({"x-overflow": 1}, "{unacceptable_type,signedint}"),
    ({"x-dead-letter-routing-key": "k"}, "routing_key_but_no_dlx_defined"),
    ({"x-queue-mode": "bogus"}, "\"unsupported queue mode 'bogus'\""),
    ({"x-queue-type": "bogus"}, "\"unsupported queue type 'bogus'\""),
])
def test_invalid_queue_args_406(conn, uid, args, detail):
    ch = conn.channel()
    with pytest.raises(ChannelClosedByBroker) as closed:
        ch.queue_declare(uid, arguments=args)
    assert closed.value.reply_code == 406
    assert closed.value.reply_text == (
        f"PRECONDITION_FAILED - invalid arg '{next(iter(args))}' for queue '{uid}' in vhost '/': {detail}")
    ch = conn.channel()
    with pytest.raises(ChannelClosedByBroker) as closed:
        ch.queue_declare(uid, passive=True)
    assert closed.value.reply_code == 404


@pytest.mark.parametrize("arg, value", [("x-delivery-limit", 5), ("x-max-in-memory-length", 1), ("x-max-age", "1D")])
def test_quorum_or_stream_arg_on_classic_queue_406(conn, uid, arg, value):
    with pytest.raises(ChannelClosedByBroker) as closed:
        conn.channel().queue_declare(uid, arguments={arg: value})
    assert closed.value.reply_code == 406
    assert closed.value.reply_text == (
        f"PRECONDITION_FAILED - invalid arg '{arg}' for queue '{uid}' in vhost '/' of queue type rabbit_classic_queue")


def test_dead_letter_exchange_of_wrong_type_406(conn, uid):
    with pytest.raises(ChannelClosedByBroker) as closed:
        conn.channel().queue_declare(uid, arguments={"x-dead-letter-exchange": 1})
    assert closed.value.reply_code == 406
    assert closed.value.reply_text == (
        "PRECONDITION_FAILED - invalid type 'signedint' for arg 'x-dead-letter-exchange' "
        f"in queue '{uid}' in vhost '/'")
