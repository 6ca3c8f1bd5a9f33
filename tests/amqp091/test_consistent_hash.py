"""x-consistent-hash through pika: weights, stability, hash-header / hash-property, RabbitMQ's errors."""
from __future__ import annotations

import uuid
from collections import Counter

import pika
import pytest

from conftest import connect
from pika.exceptions import ChannelClosedByBroker

from exchanges import ConsistentHashExchange
from exchanges.consistent_hash import jump_hash
from support import drain



def setup(ch, uid: str, weights: dict[str, int], **arguments) -> dict[str, str]:
    exchange = f"{uid}-chx"
    ch.exchange_declare(exchange, "x-consistent-hash", auto_delete=True, arguments=arguments or None)
    queues = {}
    for name, weight in weights.items():
        queue = queues[name] = f"{uid}-{name}"
        ch.queue_declare(queue, auto_delete=True)
        ch.queue_bind(queue, exchange, str(weight))
    return queues


def counts(ch, queues: dict[str, str]) -> dict[str, int]:
    return {name: ch.queue_declare(queue, passive=True).method.message_count for name, queue in queues.items()}


def test_distribution_follows_weights(broker, uid):
    with connect(broker) as conn:
        ch = conn.channel()
        queues = setup(ch, uid, {"a": 1, "b": 3, "c": 6})
        total = 6000
        for i in range(total):
            ch.basic_publish(f"{uid}-chx", f"key-{i}", b"")
        got = counts(ch, queues)
        assert sum(got.values()) == total  # every message goes to exactly one queue
        for name, weight in {"a": 1, "b": 3, "c": 6}.items():
            expected = total * weight / 10
            assert abs(got[name] - expected) < expected * 0.15, got


def test_same_key_same_queue_and_adding_a_queue_moves_keys_only_to_it(broker, uid):
    with connect(broker) as conn:
        ch = conn.channel()
        queues = setup(ch, uid, {"a": 2, "b": 2, "c": 2})
        keys = [f"user-{i}" for i in range(300)]

        def placement() -> dict[str, str]:
            where: dict[str, str] = {}
            for key in keys:
                for _ in range(3):
                    ch.basic_publish(f"{uid}-chx", key, key.encode())
            for name, queue in queues.items():
                for body in drain(ch, queue):
                    assert where.setdefault(body.decode(), name) == name  # all copies of a key in one queue
            assert len(where) == len(keys)
            return where

        before = placement()
        assert placement() == before
        queues["d"] = f"{uid}-d"
        ch.queue_declare(queues["d"], auto_delete=True)
        ch.queue_bind(queues["d"], f"{uid}-chx", "2")
        after = placement()
        moved = [k for k in keys if after[k] != before[k]]
        assert all(after[k] == "d" for k in moved)
        assert 0.1 < len(moved) / len(keys) < 0.4  # about a quarter
        ch.queue_unbind(queues["d"], f"{uid}-chx", "2")
        assert placement() == before


def test_hash_header_and_hash_property(broker, uid):
    with connect(broker) as conn:
        ch = conn.channel()
        by_header = setup(ch, f"{uid}-h", {"a": 1, "b": 1}, **{"hash-header": "tenant"})
        by_id = setup(ch, f"{uid}-p", {"a": 1, "b": 1}, **{"hash-property": "message_id"})
        for i in range(200):
            tenant = f"t{i % 10}"
            props = pika.BasicProperties(headers={"tenant": tenant}, message_id=tenant)
            ch.basic_publish(f"{uid}-h-chx", f"random-{i}", tenant.encode(), props)
            ch.basic_publish(f"{uid}-p-chx", f"random-{i}", tenant.encode(), props)
        for queues in (by_header, by_id):
            seen: dict[bytes, str] = {}
            for name, queue in queues.items():
                for body in drain(ch, queue):
                    assert seen.setdefault(body, name) == name  # routing key ignored, the value decides
            assert len(seen) == 10 and set(seen.values()) == {"a", "b"}


@pytest.mark.parametrize("key, text", [
    ("abc", 'PRECONDITION_FAILED - The binding key must be an integer: <<"abc">>'),
    ("0", "PRECONDITION_FAILED - The binding key must be greater than 0"),
])
def test_binding_key_must_be_a_positive_integer(broker, uid, key, text):
    with connect(broker) as conn:
        ch = conn.channel()
        ch.exchange_declare(f"{uid}-chx", "x-consistent-hash", auto_delete=True)
        ch.queue_declare(f"{uid}-q", auto_delete=True)
        with pytest.raises(ChannelClosedByBroker) as exc:
            ch.queue_bind(f"{uid}-q", f"{uid}-chx", key)
        assert (exc.value.reply_code, exc.value.reply_text) == (406, text)


@pytest.mark.parametrize("arguments, text", [
    ({"hash-header": "h", "hash-property": "message_id"},
     "PRECONDITION_FAILED - hash-header and hash-property are mutually exclusive"),
    ({"hash-property": "app_id"}, "PRECONDITION_FAILED - Unsupported property: app_id"),
])
def test_invalid_exchange_arguments(broker, uid, arguments, text):
    with connect(broker) as conn:
        ch = conn.channel()
        with pytest.raises(ChannelClosedByBroker) as exc:
            ch.exchange_declare(f"{uid}-chx", "x-consistent-hash", arguments=arguments)
        assert (exc.value.reply_code, exc.value.reply_text) == (406, text)


def test_ring_survives_restart(start_broker, uid):
    node = start_broker()
    with connect(node) as conn:
        ch = conn.channel()
        ch.exchange_declare("chx", "x-consistent-hash", durable=True)
        for name in ("c", "a", "b", "d"):  # ring order is binding order, not names' or the store's
            ch.queue_declare(name, durable=True)
            ch.queue_bind(name, "chx", "5")
        for i in range(100):
            ch.basic_publish("chx", f"k{i}", f"k{i}".encode())
        before = {name: set(drain(ch, name)) for name in ("a", "b", "c", "d")}
    node.stop()
    node.start()
    with connect(node) as conn:
        ch = conn.channel()
        for i in range(100):
            ch.basic_publish("chx", f"k{i}", f"k{i}".encode())
        after = {name: set(drain(ch, name)) for name in ("a", "b", "c", "d")}
    assert after == before and all(before.values())


def test_jump_hash_is_balanced_and_monotone():
    keys = [uuid.uuid4().int & ((1 << 64) - 1) for _ in range(5000)]
    previous = [0] * len(keys)
    for buckets in range(1, 12):
        current = [jump_hash(k, buckets) for k in keys]
        assert all(c == p or c == buckets - 1 for c, p in zip(current, previous))
        previous = current
    spread = Counter(previous)
    assert all(abs(spread[b] - 5000 / 11) < 120 for b in range(11))


def test_a_destination_is_on_the_ring_once():
    x = ConsistentHashExchange("x")
    x.bind("q1", "1")
    x.bind("q2", "1")
    x.bind("q2", "5")  # the plugin keeps the first weight
    hits = Counter(next(iter(x.route(f"k{i}", None))) for i in range(2000))
    assert abs(hits["q1"] - hits["q2"]) < 200
    x.unbind("q2", "1")  # remove_binding/1 drops every bucket of q2: its "5" binding stays, off the ring
    hits = Counter(next(iter(x.route(f"k{i}", None))) for i in range(2000))
    assert set(hits) == {"q1"}
