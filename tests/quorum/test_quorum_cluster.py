"""Quorum queues replicated across three real Warren nodes and a real etcd: confirms, failover, catch-up,
and a leader cut off from etcd that must not confirm what the group does not have."""
from __future__ import annotations

import contextlib
import json
import shutil
import signal
import threading
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from types import SimpleNamespace
from typing import Any, Callable, Iterator, cast

import pika
import pytest
from pamqp import commands
from pika.exceptions import AMQPError

from conftest import CLUSTER, BrokerProcess, starts
from test_cluster import Cuttable, Etcd, api, connect, passive, pump, running_nodes, start_node, wait_for
from test_warrenctl import fails, ok
from amqp_server.broker import Broker
from amqp_server.message import make_message
from amqp_server.records import QueueRecord
from forwarder.quorum import groups as quorum
from forwarder.quorum.groups import Group, QuorumGroups
from support import Raw, delivery_tag, drain_from as drain, publish_frames, publish_to, wait_for_events

publish = partial(publish_to, mandatory=True, delivery_mode=2)  # persistent and confirmed: pika raises on a nack

pytestmark = pytest.mark.timeout(180)

QUORUM = {"x-queue-type": "quorum"}
NAMES = [f"warren{i}@localhost" for i in (1, 2, 3)]


@pytest.fixture
@starts(CLUSTER)
def nodes(tmp_path) -> Iterator[tuple[Etcd, list[BrokerProcess]]]:
    """Three nodes of a cluster of the test's own: tests here kill and restart them."""
    etcd = Etcd(tmp_path / "etcd")
    started = [start_node(tmp_path, etcd, i) for i in (1, 2, 3)]
    wait_for(lambda: all(len(running_nodes(n)) == 3 for n in started), "nodes see each other")
    yield etcd, started
    for node in started:
        node.stop()
    etcd.stop()


def leader_of(node: BrokerProcess, queue: str) -> str:
    return api(node, f"/queues/%2F/{queue}")["leader"]


def declare_led_by_n1(nodes: tuple[BrokerProcess, ...], queue: str) -> None:
    """A quorum queue declared through node 1, which leads it, once the other nodes know it does."""
    n1, n2, n3 = nodes
    with connect(n1) as connection:
        connection.channel().queue_declare(queue, durable=True, arguments=QUORUM)
    wait_for(lambda: leader_of(n2, queue) == NAMES[0] and leader_of(n3, queue) == NAMES[0], "leader known")


def publish_all_then_confirm(node: BrokerProcess, queue: str, bodies: list[bytes]) -> None:
    """Publish persistent messages, the last one in confirm mode: once it is confirmed the others are on a majority
    too (they are before it in the queue's log), with no round trip each (a loaded machine took minutes)."""
    with connect(node) as connection:
        channel = connection.channel()
        for body in bodies[:-1]:
            channel.basic_publish("", queue, body, pika.BasicProperties(delivery_mode=2))
        channel.confirm_delivery()
        channel.basic_publish("", queue, bodies[-1], pika.BasicProperties(delivery_mode=2), mandatory=True)


def test_a_quorum_queue_has_three_members_and_one_leader(nodes, uid):
    _, (n1, n2, n3) = nodes
    with connect(n1) as connection:
        connection.channel().queue_declare(uid, durable=True, arguments=QUORUM)
    for node in (n1, n2, n3):
        wait_for(lambda node=node: api(node, f"/queues/%2F/{uid}").get("leader") == NAMES[0], "the leader everywhere")
        info = api(node, f"/queues/%2F/{uid}")
        assert info["type"] == "quorum" and sorted(info["members"]) == NAMES and sorted(info["online"]) == NAMES
    bodies = [b"m%d" % i for i in range(200)]
    publish(n2, uid, bodies)  # through a follower's node
    assert drain(n3, uid) == bodies


def test_kill_the_leader_and_a_follower_leads_with_every_confirmed_message(nodes, uid):
    etcd, (n1, n2, n3) = nodes
    declare_led_by_n1((n1, n2, n3), uid)
    bodies = [b"m%d" % i for i in range(500)]
    publish(n2, uid, bodies[:250])
    publish(n1, uid, bodies[250:])
    with connect(n3) as connection:  # one message held unacked by a consumer on node 3 when the leader dies
        channel = connection.channel()
        method, _, body = channel.basic_get(uid)
        assert body == bodies[0]
        n1.kill()
        started = time.monotonic()
        wait_for(lambda: leader_of(n2, uid) in NAMES[1:] and leader_of(n3, uid) == leader_of(n2, uid),
                 "a new leader", timeout=20)
        failover = time.monotonic() - started
    wait_for(lambda: passive(n3, uid) == 500, "every message there", timeout=10)
    got = drain(n3, uid)
    assert got == bodies, (len(got), got[:3])
    assert failover < 10, failover
    n1.start()  # the old leader comes back as a follower and catches up
    wait_for(lambda: sorted(api(n2, f"/queues/%2F/{uid}")["online"]) == NAMES, "node 1 back", timeout=20)
    later = [b"later%d" % i for i in range(100)]
    publish(n1, uid, later)
    leader = leader_of(n2, uid)
    survivors = [n for n, name in zip((n1, n2, n3), NAMES) if name != leader]
    {NAMES[1]: n2, NAMES[2]: n3}[leader].kill()  # now node 1's copy must count: it is one of the two left
    wait_for(lambda: leader_of(survivors[0], uid) != leader and leader_of(survivors[1], uid) != leader,
             "another leader", timeout=20)
    assert drain(n1, uid) == later


@dataclass
class Proxied:
    """An etcd as one node sees it: through a proxy."""

    port: int


@pytest.mark.cluster
def test_a_leader_cut_off_from_etcd_confirms_nothing_the_group_loses(tmp_path, uid):
    etcd = Etcd(tmp_path / "etcd")
    proxy = Cuttable(etcd.port)
    n1 = start_node(tmp_path, Proxied(proxy.port), 1)
    n2, n3 = start_node(tmp_path, etcd, 2), start_node(tmp_path, etcd, 3)
    try:
        wait_for(lambda: all(len(running_nodes(n)) == 3 for n in (n1, n2, n3)), "nodes see each other")
        with connect(n1) as connection:
            connection.channel().queue_declare(uid, durable=True, arguments=QUORUM)
        wait_for(lambda: leader_of(n2, uid) == NAMES[0] and leader_of(n3, uid) == NAMES[0], "leader known")
        confirmed = [b"before%d" % i for i in range(100)]
        publish(n1, uid, confirmed)
        outcomes: list[tuple[bytes, str]] = []
        stop = threading.Event()

        def publisher() -> None:  # keeps publishing through node 1 while it is cut off
            i = 0
            while not stop.is_set():
                try:
                    with connect(n1) as connection:
                        channel = connection.channel()
                        channel.confirm_delivery()
                        while not stop.is_set():
                            body = b"during%d" % i
                            i += 1
                            try:
                                channel.basic_publish("", uid, body, pika.BasicProperties(delivery_mode=2))
                                outcomes.append((body, "confirmed"))
                            except pika.exceptions.NackError:
                                outcomes.append((body, "nacked"))
                            time.sleep(0.005)
                except AMQPError:
                    time.sleep(0.1)

        thread = threading.Thread(target=publisher, daemon=True)
        thread.start()
        time.sleep(0.5)
        proxy.cut()
        wait_for(lambda: leader_of(n2, uid) in NAMES[1:], "a leader elected without node 1", timeout=20)
        time.sleep(2)
        stop.set()
        thread.join(20)
        leader = {NAMES[1]: n2, NAMES[2]: n3}[leader_of(n2, uid)]
        got = drain(leader, uid)
        during = [body for body, outcome in outcomes if outcome == "confirmed"]
        missing = [body for body in confirmed + during if body not in got]
        assert not missing, (len(missing), missing[:5], len(outcomes))
        assert len(got) == len(set(got))
        # what node 1 took while cut off it confirmed not itself: it passed it on to the new leader, which did
        assert [body for body, outcome in outcomes if outcome == "nacked"] == []
        proxy.restore()  # node 1 back in touch: it follows the new leader
        wait_for(lambda: leader_of(n1, uid) == leader_of(n2, uid), "node 1 follows", timeout=20)
        publish(n1, uid, [b"after"])
        assert drain(n2, uid) == [b"after"]
    finally:
        for node in (n1, n2, n3):
            node.stop()
        proxy.close()
        etcd.stop()


@pytest.mark.cluster
def test_a_publish_through_a_node_that_missed_a_change_of_leader_goes_to_the_leader_the_old_one_names(tmp_path, uid):
    """Node 4 (no member of the queue's group) is cut off from etcd: it never hears that node 1 was deposed and
    sends its publishes to node 1 still, which answers that it does not lead and names the new leader (as Ra's
    ``not_leader`` reply does); node 4 follows it and sends them there, where each is confirmed once the new
    leader's group has it, not nacked (a nack per publish, at full speed, until node 4 learned)."""
    etcd = Etcd(tmp_path / "etcd")
    proxy = Cuttable(etcd.port)
    n1, n2, n3 = (start_node(tmp_path, etcd, i) for i in (1, 2, 3))
    n4 = start_node(tmp_path, Proxied(proxy.port), 4)
    try:
        wait_for(lambda: all(len(running_nodes(n)) == 4 for n in (n1, n2, n3, n4)), "nodes see each other")
        with connect(n1) as connection:
            connection.channel().queue_declare(uid, durable=True, arguments={
                **QUORUM, "x-quorum-initial-group-size": 3})
        wait_for(lambda: leader_of(n4, uid) == NAMES[0], "leader known on node 4")
        publish(n4, uid, [b"before"])
        proxy.cut()
        assert n1.proc is not None  # (started)
        n1.proc.send_signal(signal.SIGSTOP)
        try:
            wait_for(lambda: leader_of(n2, uid) in NAMES[1:], "a leader elected without node 1", timeout=20)
        finally:
            n1.proc.send_signal(signal.SIGCONT)
        wait_for(lambda: leader_of(n1, uid) == leader_of(n2, uid), "node 1 follows", timeout=20)
        assert leader_of(n4, uid) == NAMES[0]  # node 4 has not learned
        during = [b"during%d" % i for i in range(50)]
        publish(n4, uid, during)  # (pika raises NackError on a nack)
        assert leader_of(n4, uid) == leader_of(n2, uid)  # (from node 1's answer: etcd is still out of reach)
        leader = {NAMES[1]: n2, NAMES[2]: n3}[leader_of(n2, uid)]
        assert drain(leader, uid) == [b"before", *during]
    finally:
        for node in (n1, n2, n3, n4):
            node.stop()
        proxy.close()
        etcd.stop()


def lag(node: BrokerProcess, queue: str, follower: str) -> float | None:
    """A follower's lag as the leader's /metrics reports it (None: not a follower there)."""
    request = urllib.request.Request(f"http://127.0.0.1:{node.mgmt_port}/metrics")
    request.add_header("Authorization", "Basic Z3Vlc3Q6Z3Vlc3Q=")
    with urllib.request.urlopen(request, timeout=5) as reply:
        for line in reply.read().decode().splitlines():
            if line.startswith("warren_quorum_follower_lag{") and f'queue="{queue}"' in line \
                    and f'follower="{follower}"' in line:
                return float(line.rsplit(" ", 1)[1])
    return None


def test_members_are_added_and_removed_with_warrenctl(nodes, uid):
    _, (n1, n2, n3) = nodes
    with connect(n1) as connection:
        connection.channel().queue_declare(uid, durable=True,
                                           arguments={**QUORUM, "x-quorum-initial-group-size": 2})
    wait_for(lambda: api(n1, f"/queues/%2F/{uid}")["members"] == NAMES[:2], "a group of two")
    publish(n1, uid, [b"m%d" % i for i in range(50)])
    assert "joins" in ok(n1, "quorum", "add-member", uid, NAMES[2])
    wait_for(lambda: all(sorted(api(n, f"/queues/%2F/{uid}")["members"]) == NAMES for n in (n1, n2, n3)),
             "three members everywhere")
    wait_for(lambda: lag(n1, uid, NAMES[2]) == 0, "node 3 caught up")
    n2.kill()  # with node 2 gone, a confirm needs node 3's copy
    publish(n1, uid, [b"n%d" % i for i in range(10)])
    assert len(drain(n1, uid)) == 60
    assert "leaves" in ok(n3, "quorum", "delete-member", uid, NAMES[1])  # (through a member that does not lead)
    wait_for(lambda: api(n3, f"/queues/%2F/{uid}")["members"] == [NAMES[0], NAMES[2]], "node 2 left")
    assert "leaves" in ok(n1, "quorum", "delete-member", uid, NAMES[1])  # (no longer a member: RabbitMQ's ok)
    assert api(n3, f"/queues/%2F/{uid}")["members"] == [NAMES[0], NAMES[2]]
    assert "no node 'nowhere@localhost'" in fails(n1, "quorum", "add-member", uid, "nowhere@localhost")
    assert "no quorum queue" in fails(n1, "quorum", "add-member", f"{uid}-missing", NAMES[1])


def test_consumers_go_on_through_failover_with_bindings_kept(nodes, uid):
    _, (n1, n2, n3) = nodes
    with connect(n1) as connection:
        channel = connection.channel()
        channel.queue_declare(uid, durable=True, arguments=QUORUM)
        channel.queue_bind(uid, "amq.direct", routing_key=uid)
    wait_for(lambda: leader_of(n2, uid) == NAMES[0] and leader_of(n3, uid) == NAMES[0], "leader known")
    bodies = [b"m%d" % i for i in range(20)]
    publish(n3, uid, bodies)
    connection = connect(n2)
    try:
        channel = connection.channel()
        cancelled: list[str | None] = []
        got: list[tuple[int, bytes]] = []
        channel.add_on_cancel_callback(lambda frame: cancelled.append(frame.method.consumer_tag))
        channel.basic_qos(prefetch_count=1)
        channel.basic_consume(uid, lambda ch, method, props, body: got.append((delivery_tag(method), body)))
        wait_for_events(connection, lambda: len(got) == 1)  # one unacked when the leader dies
        n1.kill()
        wait_for(lambda: leader_of(n2, uid) in NAMES[1:], "a new leader", timeout=20)
        channel.basic_ack(got[0][0])  # its tag still valid at the new leader
        while len(got) < 20:
            count = len(got)
            wait_for_events(connection, lambda count=count: len(got) > count)
            channel.basic_ack(got[-1][0])
        assert [body for _, body in got] == bodies and not cancelled
        with connect(n3) as other:  # the binding moved with the queue
            other.channel().basic_publish("amq.direct", uid, b"routed")
        wait_for_events(connection, lambda: len(got) == 21)
        assert got[-1][1] == b"routed"
    finally:
        connection.close()


def test_a_follower_that_was_down_catches_up_before_it_leads(nodes, uid):
    _, (n1, n2, n3) = nodes
    with connect(n1) as connection:
        connection.channel().queue_declare(uid, durable=True, arguments=QUORUM)
    wait_for(lambda: leader_of(n3, uid) == NAMES[0], "leader known")
    # node 3's copy is of this term once it has an op of it (knowing the leader is not enough: a copy of no
    # term yet gets a snapshot, not the log)
    publish(n1, uid, [b"first"])
    wait_for(lambda: lag(n1, uid, NAMES[2]) == 0, "node 3 in step")
    n3.kill()
    bodies = [b"m%05d" % i for i in range(5000)]  # two snapshot frames
    publish_all_then_confirm(n2, uid, bodies)
    n3.start()
    wait_for(lambda: lag(n1, uid, NAMES[2]) == 0, "node 3 caught up", timeout=60)
    assert f"{NAMES[2]} catches up on / {uid} from the log: 5000 ops" in n1.said()
    n1.kill()  # nodes 2 and 3 have the same position: the tie goes to the name that sorts last, node 3
    wait_for(lambda: leader_of(n2, uid) in NAMES[1:] and leader_of(n3, uid) == leader_of(n2, uid), "a new leader",
             timeout=20)
    assert leader_of(n3, uid) == NAMES[2]
    assert drain(n3, uid) == [b"first", *bodies]


def test_after_a_failover_a_follower_in_step_keeps_its_copy_without_a_snapshot(nodes, uid):
    """The members left by a dead leader were in step: the new leader's term adopts the other's copy as it is
    (a snapshot of a deep queue would hold the first confirm after the failover for as long as it takes), and
    that copy is whole: with the new leader killed in turn, it leads with every confirmed message."""
    _, (n1, n2, n3) = nodes
    declare_led_by_n1((n1, n2, n3), uid)
    before = [b"m%05d" % i for i in range(3000)]
    publish_all_then_confirm(n1, uid, before)
    wait_for(lambda: lag(n1, uid, NAMES[1]) == 0 and lag(n1, uid, NAMES[2]) == 0, "followers in step")
    n1.kill()  # nodes 2 and 3 have the same position: node 3 leads (the name that sorts last)
    wait_for(lambda: leader_of(n2, uid) == NAMES[2] and leader_of(n3, uid) == NAMES[2], "node 3 leads", timeout=20)
    after = [b"a%03d" % i for i in range(100)]
    publish(n2, uid, after)  # confirmed once node 2 has them too: node 3's the only other copy
    log_of_n3 = n3.said()
    assert f"{NAMES[1]} catches up on / {uid} from the log: 0 ops (its copy of term" in log_of_n3
    assert f"takes a snapshot of / {uid}" not in log_of_n3
    n3.kill()
    n1.start()  # its copy is of the first term, node 2's of the second: node 2 leads
    wait_for(lambda: leader_of(n1, uid) == NAMES[1] and leader_of(n2, uid) == NAMES[1], "node 2 leads", timeout=30)
    assert drain(n2, uid) == before + after


def test_a_frozen_leader_that_wakes_up_confirms_nothing_the_group_loses(nodes, uid):
    """SIGSTOP, as a long pause or a host cut off from everything: the others elect a leader; when the old one
    runs again it still believes it leads until it finds its lease revoked, and confirms nothing meanwhile."""
    _, (n1, n2, n3) = nodes
    declare_led_by_n1((n1, n2, n3), uid)
    confirmed = [b"before%d" % i for i in range(50)]
    publish(n1, uid, confirmed)
    outcomes: list[tuple[bytes, str]] = []
    connection = connect(n1)
    channel = connection.channel()
    channel.confirm_delivery()
    n1.proc.send_signal(signal.SIGSTOP)

    def thaw() -> None:
        time.sleep(1.0)
        n1.proc.send_signal(signal.SIGCONT)

    try:
        wait_for(lambda: leader_of(n2, uid) in NAMES[1:], "a leader elected without node 1", timeout=20)
        stopped = threading.Thread(target=thaw)
        stopped.start()
        for i in range(20):  # written while node 1 is frozen; it reads them when it runs again
            body = b"during%d" % i
            try:
                channel.basic_publish("", uid, body, pika.BasicProperties(delivery_mode=2))
                outcomes.append((body, "confirmed"))
            except pika.exceptions.NackError:
                outcomes.append((body, "nacked"))
            except AMQPError:
                break
        stopped.join()
    finally:
        n1.proc.send_signal(signal.SIGCONT)
        try:
            connection.close()
        except AMQPError:
            pass
    leader = {NAMES[1]: n2, NAMES[2]: n3}[leader_of(n2, uid)]
    got = drain(leader, uid)
    during = [body for body, outcome in outcomes if outcome == "confirmed"]
    assert [body for body in confirmed + during if body not in got] == []
    assert len(got) == len(set(got))
    assert during  # what the old leader took after its pause is passed on to the new one, or refused: never lost
    wait_for(lambda: leader_of(n1, uid) == leader_of(n2, uid), "node 1 follows", timeout=20)


def test_a_follower_paused_past_the_heartbeats_deposes_no_healthy_leader(nodes, uid):
    """SIGSTOP on a follower for longer than the links' heartbeats: the leader closes their links for silence.
    The follower, running again, finds its link to the leader closed by the other end, yet revokes no lease (it
    was the silent one, not the leader): node 1 leads on, and the follower follows it again."""
    _, (n1, n2, n3) = nodes
    declare_led_by_n1((n1, n2, n3), uid)
    publish(n1, uid, [b"first"])
    assert n3.proc is not None
    n3.proc.send_signal(signal.SIGSTOP)
    try:
        wait_for(lambda: "link with warren3@localhost silent" in n1.said(), "node 1 closes the links", timeout=20)
        time.sleep(1.0)
    finally:
        n3.proc.send_signal(signal.SIGCONT)
    wait_for(lambda: n3.said().count("link to node warren1@localhost up") >= 2, "node 3 links again", timeout=30)
    time.sleep(quorum.LEASE_TTL)  # the lease's time: revoked, node 1 would have been deposed by now
    assert "no longer leads" not in n1.said()
    assert leader_of(n2, uid) == NAMES[0] and leader_of(n3, uid) == NAMES[0]
    wait_for(lambda: lag(n1, uid, NAMES[2]) == 0, "node 3 back in step", timeout=30)
    publish(n3, uid, [b"second"])
    assert drain(n1, uid) == [b"first", b"second"]


def test_the_declaring_node_leads_before_declare_ok_and_keeps_no_queue_of_its_own(nodes, uid):
    """What is published right after declare-ok is in the replicated queue; after a restart the node has no
    classic copy of the queue (the declaration is the cluster's quorum queue, members and all)."""
    _, (n1, n2, n3) = nodes
    with connect(n1) as connection:
        channel = connection.channel()
        channel.queue_declare(uid, durable=True, arguments=QUORUM)
        channel.confirm_delivery()
        channel.basic_publish("", uid, b"at once", pika.BasicProperties(delivery_mode=2))
    assert api(n1, f"/queues/%2F/{uid}")["leader"] == NAMES[0]
    n1.stop()
    wait_for(lambda: leader_of(n2, uid) in NAMES[1:], "a new leader")
    n1.start()
    wait_for(lambda: sorted(api(n1, f"/queues/%2F/{uid}")["online"]) == NAMES, "node 1 back")
    info = api(n1, f"/queues/%2F/{uid}")
    assert (info["type"], sorted(info["members"]), info["leader"]) == ("quorum", NAMES, leader_of(n2, uid))
    assert drain(n1, uid) == [b"at once"]


def test_the_delivery_count_is_replicated(nodes, uid):
    _, (n1, n2, n3) = nodes
    with connect(n1) as connection:
        connection.channel().queue_declare(uid, durable=True, arguments=QUORUM)
    wait_for(lambda: leader_of(n3, uid) == NAMES[0], "leader known")
    publish(n1, uid, [b"m"])
    with connect(n2) as connection:
        channel = connection.channel()
        for _ in range(2):
            method, _, _ = channel.basic_get(uid)
            channel.basic_nack(delivery_tag(method), requeue=True)
    time.sleep(0.5)  # the returns reach the followers
    n1.kill()
    wait_for(lambda: leader_of(n2, uid) in NAMES[1:], "a new leader", timeout=20)
    with connect(n3) as connection:
        method, properties, body = connection.channel().basic_get(uid, auto_ack=True)
        assert method is not None and properties is not None
        assert (body, method.redelivered, properties.headers) == (b"m", True, {"x-delivery-count": 2})


def test_large_bodies_go_byte_exact_from_the_leaders_store_and_then_from_a_new_leaders_copy(nodes, uid):
    """Bodies at the edges of framing and of 16 MiB, which the leader leaves to its store and sends from its file
    (to a consumer on its node, returned, then to basic.get with the header it makes), reach a consumer byte-exact;
    after the leader's death, the next leader sends them from its copy's records, counted as returned."""
    from test_large_bodies import SIZES, body

    _, (n1, n2, n3) = nodes
    declare_led_by_n1((n1, n2, n3), uid)
    bodies = [body(size) for size in SIZES]
    publish_all_then_confirm(n1, uid, bodies)
    with connect(n1) as connection:
        channel = connection.channel()
        channel.basic_qos(prefetch_count=len(bodies))
        got: list[bytes] = []
        for deliver, _properties, data in channel.consume(uid, inactivity_timeout=30):
            assert deliver is not None and data is not None  # (not idle)
            got.append(data)
            if len(got) == len(bodies):
                break
        channel.cancel()  # (before the returns, which it would be delivered again)
        channel.basic_nack(delivery_tag(deliver), multiple=True, requeue=True)
        counts: list[tuple[bool, Any]] = []
        for _ in bodies:
            method, properties, data = channel.basic_get(uid)
            assert method is not None and properties is not None
            counts.append((data == bodies[len(counts)], properties.headers))
            channel.basic_nack(delivery_tag(method), requeue=True)
    assert got == bodies
    assert counts == [(True, {"x-delivery-count": 1})] * len(bodies)
    time.sleep(0.5)  # the returns reach the followers
    n1.kill()
    wait_for(lambda: leader_of(n2, uid) in NAMES[1:] and leader_of(n3, uid) == leader_of(n2, uid), "a new leader",
             timeout=20)
    leader = {NAMES[1]: n2, NAMES[2]: n3}[leader_of(n2, uid)]
    with connect(leader) as connection:
        channel = connection.channel()
        again: list[tuple[bool, Any]] = []
        for _ in bodies:
            method, properties, data = channel.basic_get(uid, auto_ack=True)
            assert method is not None and properties is not None
            again.append((data == bodies[len(again)], properties.headers))
    assert again == [(True, {"x-delivery-count": 2})] * len(bodies)


def test_an_amqp10_release_through_another_node_counts_no_delivery(nodes, uid):
    """AMQP 1.0's ``released`` of a quorum queue's message, by a receiver on a node that does not lead the queue,
    returns it uncounted there too (RabbitMQ 4.x): more releases than the delivery limit allows returns, and the
    message is still there."""
    pytest.importorskip("proton")
    from proton.utils import BlockingConnection
    _, (n1, n2, _) = nodes
    with connect(n1) as connection:
        connection.channel().queue_declare(uid, durable=True, arguments={**QUORUM, "x-delivery-limit": 1})
    wait_for(lambda: leader_of(n2, uid) == NAMES[0], "leader known")
    publish(n1, uid, [b"m"])
    amqp = BlockingConnection(f"amqp://guest:guest@127.0.0.1:{n2.port}", timeout=10, allowed_mechs="PLAIN")
    try:
        receiver = amqp.create_receiver(f"/queues/{uid}", credit=1)
        for _ in range(4):
            assert receiver.receive(timeout=10).body == b"m"
            receiver.release(delivered=False)
        assert receiver.receive(timeout=10).body == b"m"
        receiver.accept()
    finally:
        amqp.close()


def test_an_amqp10_redelivery_through_another_node_carries_the_failed_deliveries_the_leader_counted(nodes, uid):
    """mc_amqp:protocol_state, for a receiver on a node that does not lead the queue: a first delivery says
    ``first-acquirer``, a redelivery does not and its header's ``delivery-count`` is the count the leader keeps
    (``modified`` with delivery-failed counts one, ``released`` none)."""
    pytest.importorskip("proton")
    from proton import Delivery
    from proton.utils import BlockingConnection
    _, (n1, n2, _) = nodes
    with connect(n1) as connection:
        connection.channel().queue_declare(uid, durable=True, arguments=QUORUM)
    wait_for(lambda: leader_of(n2, uid) == NAMES[0], "leader known")
    publish(n1, uid, [b"m"])
    amqp = BlockingConnection(f"amqp://guest:guest@127.0.0.1:{n2.port}", timeout=10, allowed_mechs="PLAIN")
    got = []
    try:
        receiver = amqp.create_receiver(f"/queues/{uid}", credit=1)
        for settle in ("failed", "released", "accepted"):
            message = receiver.receive(timeout=10)
            got.append((message.first_acquirer, message.delivery_count))
            if settle == "failed":
                assert receiver.fetcher is not None  # (a blocking receiver's)
                receiver.fetcher.unsettled[0].local.failed = True
                receiver.settle(Delivery.MODIFIED)
            elif settle == "released":
                receiver.release(delivered=False)
            else:
                receiver.accept()
    finally:
        amqp.close()
    assert got == [(True, 0), (False, 1), (False, 1)]


def test_a_member_added_while_the_queue_changes_gets_all_of_it(nodes, uid):
    """The snapshot is sent a chunk per loop turn while publishes, acks and returns go on; the new member's
    copy ends up the leader's, as shown when it leads."""
    _, (n1, n2, n3) = nodes
    with connect(n1) as connection:
        connection.channel().queue_declare(uid, durable=True,
                                           arguments={**QUORUM, "x-quorum-initial-group-size": 2})
    wait_for(lambda: api(n2, f"/queues/%2F/{uid}")["members"] == NAMES[:2], "a group of two")
    first = [b"a%05d" % i for i in range(10000)]
    publish_all_then_confirm(n1, uid, first)
    later = [b"b%05d" % i for i in range(1000)]
    acked: list[bytes] = []

    def consume() -> None:  # through node 2, while the snapshot goes: 1,500 got, every 10th returned
        with connect(n2) as connection:
            channel = connection.channel()
            got = 0
            while got < 1500:
                method, _, body = channel.basic_get(uid)
                if method is None:
                    continue
                assert method.delivery_tag is not None and body is not None  # (with a method)
                got += 1
                if got % 10 == 0:
                    channel.basic_nack(method.delivery_tag, requeue=True)
                else:
                    channel.basic_ack(method.delivery_tag)
                    acked.append(body)

    consumer = threading.Thread(target=consume)
    consumer.start()
    assert "joins" in ok(n1, "quorum", "add-member", uid, NAMES[2])
    publish(n1, uid, later)
    consumer.join(60)
    wait_for(lambda: lag(n1, uid, NAMES[2]) == 0 and lag(n1, uid, NAMES[1]) == 0, "both in step", timeout=30)
    n1.kill()
    wait_for(lambda: leader_of(n2, uid) in NAMES[1:], "a new leader", timeout=20)
    assert leader_of(n3, uid) == NAMES[2]  # same positions: the tie goes to node 3, whose copy is the snapshot's
    expected = sorted(set(first + later) - set(acked))
    assert sorted(drain(n3, uid)) == expected


def test_a_wiped_node_rejoins_and_catches_up_by_snapshot(nodes, uid):
    _, (n1, n2, n3) = nodes
    with connect(n1) as connection:
        connection.channel().queue_declare(uid, durable=True, arguments=QUORUM)
    wait_for(lambda: leader_of(n3, uid) == NAMES[0], "leader known")
    bodies = [b"m%04d" % i for i in range(3000)]
    publish_all_then_confirm(n1, uid, bodies[:1000])
    n3.kill()
    shutil.rmtree(n3.data_dir)  # its disk is lost
    publish_all_then_confirm(n2, uid, bodies[1000:])
    n3.start()
    wait_for(lambda: lag(n1, uid, NAMES[2]) == 0, "node 3 caught up", timeout=30)
    assert f"{NAMES[2]} takes a snapshot of / {uid}" in n1.said()
    n1.kill()  # nodes 2 and 3 have the same position: node 3, rebuilt from the snapshot, leads
    wait_for(lambda: leader_of(n2, uid) in NAMES[1:] and leader_of(n3, uid) == leader_of(n2, uid), "a new leader",
             timeout=20)
    assert leader_of(n3, uid) == NAMES[2]
    assert drain(n3, uid) == bodies


class InstallCrashes:
    """A follower's node as a snapshot comes into its copy's spare index id (``QuorumGroups.replicate``): its data
    directory copied at four points of the install, each restarted later from its copy."""

    KEPT = {"mid-snapshot": "old", "at its end": "old", "at its end, staged": "new", "committed": "new"}

    def __init__(self, tmp_path: Path, term: int) -> None:
        self.tmp_path, self.term = tmp_path, term
        self.crashes: list[tuple[str, str]] = []

    def opened(self, data: str) -> tuple[Broker, QuorumGroups, Group]:
        broker = Broker(data)
        groups = QuorumGroups(SimpleNamespace(broker=broker, name="me", client=None))
        group = Group("/", "q", ["leader", "me"], QueueRecord("/", "q"), leader="leader", term=self.term)
        groups._open_copy(group)
        groups.groups[group.key] = group
        return broker, groups, group

    def crash(self, when: str) -> None:
        """The node's data as it is on disk now, for a restart from it later."""
        copy = shutil.copytree(self.tmp_path / "data", self.tmp_path / f"crash-{len(self.crashes)}")
        self.crashes.append((when, str(copy)))

    def at_install(self, groups: QuorumGroups) -> None:
        """A crash just as the snapshot's end swaps the copies, before anything is staged."""
        install = groups._install

        def crash_at_install(*args: Any) -> int:
            replaced = install(*args)
            self.crash("at its end")
            return replaced

        groups._install = crash_at_install  # type: ignore[method-assign, assignment]

    def restarted(self, old: int, spare: int) -> Iterator[tuple[str, int, int, Broker, Group]]:
        """Each crash's node restarted: (when, the copy it keeps, the other, its broker, its group); the copy is
        the old one before the install is staged, the new one after."""
        for when, data in self.crashes:
            (self.tmp_path / data / "msg_store_persistent" / "clean_shutdown").unlink(missing_ok=True)
            broker, _, group = self.opened(data)
            try:
                copy, other = (old, spare) if self.KEPT[when] == "old" else (spare, old)
                assert (group.index_id, group.spare) == (copy, other), when
                yield when, copy, other, broker, group
            finally:
                broker.close()


def stored_record(body: bytes) -> bytes:
    return b"".join(make_message("", "q", commands.Basic.Properties(delivery_mode=2), body).payload())


async def test_a_snapshot_comes_in_beside_the_copy_and_a_crash_anywhere_leaves_one_copy_whole(tmp_path):
    """A follower's copy stays as it stood, in memory and on disk, while a snapshot comes into its spare index
    id; the snapshot's end makes the spare the copy and the old copy the spare.  A crash at any point of that
    (the node's data copied as it is on disk then) comes back to one whole copy: the old one, or the new one,
    never a mix, and the other's rows gone.  A new leader's ADOPT frame carries on the copy where the new term
    began; the old one's, once replaced, asks to catch up."""
    from amqp_server.queues.quorum_machine import State, encode_state
    from forwarder.quorum.oplog import ADOPT_OP, ENTRY, ENTRY_OP, HEAD, MARK, REPLAY_OP, RESET_OP
    from forwarder.peers.owner_side import PeerSession

    crashes = InstallCrashes(tmp_path, 3)
    record, crash = stored_record, crashes.crash

    def body_at_1(broker: Broker, index_id: int) -> bytes | None:
        row = broker.persistence.index.peek(index_id, 1)
        return None if row is None else broker.persistence.store.read(row.msg_id)[-3:]

    broker, groups, group = crashes.opened(str(tmp_path / "data"))
    try:
        old = group.index_id
        broker.replicas.put(old, 1, record(b"old"), 0)
        broker.replicas.position(old, 3, 10, State())
        group.applied_term, group.applied = 3, 10
        group.state = broker.replicas.copy_state(old)
        broker.persistence.commit_now()
        asked: list[tuple] = []
        # a stand-in for the leader's link session: replicate reads only its link's peer name and sends on it
        session = cast(PeerSession, SimpleNamespace(link=SimpleNamespace(peer_name="leader",
                                                                     send=lambda *parts: asked.append(parts))))

        def frame(term: int, first: int, *ops: bytes) -> bytes:
            return HEAD.pack(term, first, len(group.key.encode())) + group.key.encode() + b"".join(ops)

        snapshot = State()
        snapshot.ready.add_run(1, 2)
        snapshot.next_seq = 2
        state, row = encode_state(snapshot), record(b"new")
        groups.replicate(session, frame(3, 20, MARK.pack(RESET_OP, len(state)), state,
                                        ENTRY.pack(ENTRY_OP, 1, 0, 0, 0, 3, len(row)), row))
        spare = group.spare
        assert spare and group.incoming is not None and group.incoming.at == 20
        assert (group.index_id, group.position) == (old, (3, 10))
        assert broker.persistence.index.position(old) == (3, 10) and body_at_1(broker, old) == b"old"
        assert body_at_1(broker, spare) == b"new"
        broker.persistence.commit_now()
        crash("mid-snapshot")
        crashes.at_install(groups)
        groups.replicate(session, frame(3, 21, MARK.pack(REPLAY_OP, 0)))  # the snapshot's end
        crash("at its end, staged")
        assert (group.index_id, group.spare, group.position) == (spare, old, (3, 20))
        broker.persistence.commit_now()
        crash("committed")
        assert body_at_1(broker, spare) == b"new" and body_at_1(broker, old) is None

        group.leader, group.term = "new", 4
        session.link.peer_name = "new"
        groups.replicate(session, frame(4, 21, MARK.pack(ADOPT_OP, 3)))
        assert group.position == (4, 20) and not asked
    finally:
        broker.close()

    for when, copy, other, broker, group in crashes.restarted(old, spare):
        assert group.position == ((3, 10) if copy == old else (3, 20)), when
        assert body_at_1(broker, copy) == InstallCrashes.KEPT[when].encode(), when
        assert body_at_1(broker, other) is None, when


async def test_a_diff_snapshot_keeps_the_copys_rows_beside_it_and_a_crash_anywhere_leaves_one_copy_whole(tmp_path):
    """A DIFF (a copy diverged from where the leader's term began) comes into the spare as a snapshot does, with the
    copy's own rows of the entries below its seq that the state holds (their records shared), flagged as the state
    says; its rows of others (its own tail, what the state no longer holds) stay in the copy until the end.  A crash
    at any point comes back to one whole copy, the old or the new, and a record both shared is still there once
    the old copy's rows are gone, after a restart too."""
    from amqp_server.queues.quorum_machine import State, encode_state
    from forwarder.quorum.oplog import DIFF, DIFF_OP, ENTRY, ENTRY_OP, HEAD, MARK, MORE_OP, REPLAY_OP
    from forwarder.peers.owner_side import PeerSession

    crashes = InstallCrashes(tmp_path, 4)
    record, crash = stored_record, crashes.crash

    def rows(broker: Broker, index_id: int) -> dict[int, tuple[bool, int, bytes]]:
        """seq: (held, returns, the body's last 3 bytes)."""
        persistence = broker.persistence
        persistence.index.commit()
        return {row.seq: (row.delivered, row.returns, persistence.store.read(row.msg_id)[-3:])
                for row in persistence.index.entries(index_id)}

    old_rows = {1: (False, 0, b"ol1"), 2: (True, 0, b"ol2"), 5: (False, 0, b"lon")}
    new_rows = {1: (True, 2, b"ol1"), 3: (False, 0, b"mis"), 7: (False, 0, b"new")}
    broker, groups, group = crashes.opened(str(tmp_path / "data"))
    try:
        old = group.index_id
        for seq, (held, _, body) in old_rows.items():  # 1 and 2 made before the leader's term, 5 its own tail
            broker.replicas.put(old, seq, record(body), 0, held=held)
        broker.replicas.position(old, 3, 10, State())
        group.applied_term, group.applied = 3, 10
        group.state = broker.replicas.copy_state(old)
        broker.persistence.commit_now()
        session = cast(PeerSession, SimpleNamespace(link=SimpleNamespace(peer_name="leader", send=lambda *_: None)))

        def frame(first: int, *ops: bytes) -> bytes:
            return HEAD.pack(4, first, len(group.key.encode())) + group.key.encode() + b"".join(ops)

        # the leader's state: 1 held twice returned (ours, kept), 2 gone, 3 one we settled alone (sent), 7 its own
        snapshot = State(next_seq=8)
        snapshot.checked_out[1] = 2
        snapshot.counts[1] = 2
        snapshot.ready.add(3)
        snapshot.ready.add(7)
        state = encode_state(snapshot)
        assert group.state.ready.first() == 1 and 3 not in group.state.ready
        groups.replicate(session, frame(20, DIFF.pack(DIFF_OP, len(state), 4, 3, 10), state))
        assert group.incoming is not None
        groups.replicate(session, frame(20, DIFF.pack(DIFF_OP, len(state), 4, 3, 9), state))  # made for (3, 9)
        assert group.incoming is None  # (not for our copy as it stands: nothing taken, nor one begun before)
        groups.replicate(session, frame(20, DIFF.pack(DIFF_OP, len(state), 4, 3, 10), state))
        spare = group.spare
        assert spare and group.incoming is not None
        mis, new = record(b"mis"), record(b"new")
        groups.replicate(session, frame(20, MARK.pack(MORE_OP, 0), ENTRY.pack(ENTRY_OP, 3, 0, 0, 0, 3, len(mis)), mis,
                                        ENTRY.pack(ENTRY_OP, 7, 0, 0, 0, 3, len(new)), new))
        assert (group.index_id, group.position) == (old, (3, 10)) and rows(broker, old) == old_rows
        assert rows(broker, spare) == new_rows
        broker.persistence.commit_now()
        crash("mid-snapshot")
        crashes.at_install(groups)
        groups.replicate(session, frame(21, MARK.pack(REPLAY_OP, 0)))  # the snapshot's end
        crash("at its end, staged")
        assert (group.index_id, group.spare, group.position) == (spare, old, (4, 20))
        assert group.annotated == 20  # (the leader's rows may hold annotations of its ops up to there)
        broker.persistence.commit_now()
        crash("committed")
        assert rows(broker, spare) == new_rows and rows(broker, old) == {}
    finally:
        broker.close()

    for when, copy, other, broker, group in crashes.restarted(old, spare):
        assert group.position == ((3, 10) if copy == old else (4, 20)), when
        assert rows(broker, copy) == (old_rows if copy == old else new_rows), when
        assert rows(broker, other) == {}, when
        assert group.annotated == (10 if when == "mid-snapshot" else 20), when  # (a restart keeps it)


async def test_a_followers_answer_counts_only_for_the_term_whose_ops_it_took(tmp_path):
    """A follower's copy is durable only once a group commit has it; should it follow another term by then (a
    leader re-elected after a restart that lost ops it had shipped, a follower paused past the election), its
    answer must not say that term's: the leader would count ops of its earlier term at those indexes as its
    new ones on this copy, and confirm what one copy alone has."""
    from types import SimpleNamespace
    from typing import cast

    from amqp_server.broker import Broker
    from amqp_server.records import QueueRecord
    from forwarder.quorum.groups import Group, QuorumGroups
    from forwarder.quorum.oplog import ACKED, ADOPT_OP, HEAD, MARK
    from forwarder.peers.owner_side import PeerSession

    broker = Broker(str(tmp_path / "data"))
    try:
        groups = QuorumGroups(SimpleNamespace(broker=broker, name="me", client=None))
        group = Group("/", "q", ["leader", "me"], QueueRecord("/", "q"), index_id=broker.next_index_id(),
                      leader="leader", term=3, applied_term=2, applied=10)
        groups.groups[group.key] = group
        sent: list[tuple] = []
        session = cast(PeerSession, SimpleNamespace(link=SimpleNamespace(peer_name="leader",
                                                                     send=lambda *parts: sent.append(parts))))
        key = group.key.encode()
        groups.replicate(session, HEAD.pack(3, 11, len(key)) + key + MARK.pack(ADOPT_OP, 2))  # (term 3's ops)
        assert group.acks and group.position == (3, 10)
        group.term = 4  # (the same node leads again, in term 4, before the commit is on disk)
        groups.synced(broker.persistence.batch)
        assert not sent
        group.term = 3
        groups.replicate(session, HEAD.pack(3, 11, len(key)) + key)  # (an empty frame at the next index)
        groups.synced(broker.persistence.batch)
        assert [ACKED.unpack_from(parts[1])[:2] for parts in sent] == [(3, 10)]
    finally:
        broker.close()


def publish_until_confirmed(node: BrokerProcess, queue: str, bodies: list[bytes], timeout: float = 30.0) -> int:
    """Publish each message with a confirm, sending it again after a nack, a closed channel or a closed
    connection, until every one is confirmed; how many nacks that took."""
    deadline = time.monotonic() + timeout
    left = list(bodies)
    nacks = 0
    while left:
        assert time.monotonic() < deadline, f"{len(left)} of {len(bodies)} never confirmed"
        try:
            with connect(node) as connection:
                channel = connection.channel()
                channel.confirm_delivery()
                while left:
                    try:
                        channel.basic_publish("", queue, left[0], pika.BasicProperties(delivery_mode=2))
                        left.pop(0)
                    except pika.exceptions.NackError:
                        nacks += 1
                        assert time.monotonic() < deadline, f"{len(left)} of {len(bodies)} never confirmed"
        except AMQPError:
            time.sleep(0.2)
    return nacks


def test_etcd_frozen_longer_than_the_lease_and_the_queue_leads_and_confirms_again(nodes, uid):
    """Every lease may lapse while etcd is frozen (SIGSTOP, twice the lease): the leader goes on confirming what
    its group has (a member elected later would have it), and once etcd runs again it finds its lease alive
    and leads on, or finds it gone, steps down, and the members elect a leader (an election whose position was
    written under a lease etcd then dropped tries again under the node's new lease); every confirmed message
    is there."""
    etcd, (n1, n2, n3) = nodes
    declare_led_by_n1((n1, n2, n3), uid)
    before = [b"before%d" % i for i in range(100)]
    publish(n2, uid, before)
    nacks: list[float] = []
    confirms: list[float] = []
    stop = threading.Event()

    def publisher() -> None:  # publishes through node 2 (a message nacked is sent again) until stopped
        with connect(n2) as connection:
            channel = connection.channel()
            channel.confirm_delivery()
            while not stop.is_set():
                try:
                    channel.basic_publish("", uid, b"during", pika.BasicProperties(delivery_mode=2))
                    confirms.append(time.monotonic())
                except pika.exceptions.NackError:
                    nacks.append(time.monotonic())

    thread = threading.Thread(target=publisher, daemon=True)
    thread.start()
    time.sleep(0.5)
    frozen = time.monotonic()
    etcd.proc.send_signal(signal.SIGSTOP)
    try:
        time.sleep(2 * quorum.LEASE_TTL)
    finally:
        thawed = time.monotonic()
        etcd.proc.send_signal(signal.SIGCONT)
    assert confirms and confirms[0] < frozen
    # the lease may have lapsed from half its TTL after the last refresh (every eighth of it) on
    assert [at - frozen for at in confirms if frozen + 0.75 * quorum.LEASE_TTL < at < thawed]
    after = [b"after%d" % i for i in range(100)]
    publish_until_confirmed(n3, uid, after)
    stop.set()
    thread.join(20)
    # no leader known for seconds: each publish waited for one, and was confirmed by it, never nacked
    assert nacks == [], len(nacks)
    leader = {NAMES[0]: n1, NAMES[1]: n2, NAMES[2]: n3}[leader_of(n3, uid)]
    wait_for(lambda: all(leader_of(n, uid) == leader_of(leader, uid) for n in (n1, n2, n3)), "one leader everywhere")
    got = [body for body in drain(n1, uid) if body != b"during"]
    # a publish nacked by the leader that found its lease gone may be in the queue too (a majority may have had
    # it), besides its copy sent again: every confirmed one once, in order
    assert [body for i, body in enumerate(got) if body not in got[:i]] == before + after


def test_a_leader_killed_while_etcd_is_away_is_replaced_as_soon_as_etcd_is_back(nodes, uid):
    """The leader is killed while etcd restarts.  Etcd gives every lease its whole TTL anew when it starts, so the
    dead leader's key stood a lease longer after etcd's return, and the queue had no leader; the followers whose
    links the dead node closed revoke its lease once etcd answers, and the members elect a leader at once."""
    etcd, (n1, n2, n3) = nodes
    declare_led_by_n1((n1, n2, n3), uid)
    before = [b"before%d" % i for i in range(100)]
    publish(n2, uid, before)
    etcd.kill()
    n1.kill()
    time.sleep(1.0)  # (the links close, and the followers' revokes find no etcd)
    etcd.start()
    back = time.monotonic()
    wait_for(lambda: leader_of(n2, uid) in NAMES[1:] and leader_of(n3, uid) == leader_of(n2, uid), "a new leader",
             timeout=20)
    elected = time.monotonic() - back
    assert elected < quorum.LEASE_TTL - 0.5, elected
    assert drain(n3, uid) == before


def test_a_paused_leader_s_successor_confirms_publishes_through_a_follower_s_node_within_the_link_timeout(nodes, uid):
    """The leader is paused (SIGSTOP) with a publish through node 2 waiting on it: the paused leader can neither
    confirm it nor pass it on, so node 2's window of the queue sends it again to the leader elected next, which
    confirms it — at the election (the lease lapses 3 s after its last refresh), with no nack, rather than
    once the link to the paused node is found silent (5 s)."""
    _, (n1, n2, n3) = nodes
    declare_led_by_n1((n1, n2, n3), uid)
    publish(n2, uid, [b"before"])
    n1.proc.send_signal(signal.SIGSTOP)
    try:
        paused = time.monotonic()
        nacks = publish_until_confirmed(n2, uid, [b"during"])
        waited = time.monotonic() - paused
    finally:
        n1.proc.send_signal(signal.SIGCONT)
    assert (nacks, waited < 4.5) == (0, True), (nacks, waited)
    leader = {NAMES[1]: n2, NAMES[2]: n3}[leader_of(n2, uid)]
    assert drain(leader, uid) == [b"before", b"during"]


def quorum_critical(node: BrokerProcess) -> tuple[int, dict]:
    request = urllib.request.Request(f"http://127.0.0.1:{node.mgmt_port}/api/health/checks/node-is-quorum-critical")
    request.add_header("Authorization", "Basic Z3Vlc3Q6Z3Vlc3Q=")
    try:
        with urllib.request.urlopen(request, timeout=5) as reply:
            return reply.status, json.load(reply)
    except urllib.error.HTTPError as exc:
        return exc.code, json.load(exc)


def test_node_is_quorum_critical_lists_the_queues_its_shutdown_would_leave_without_a_majority(nodes, uid):
    """RabbitMQ's check before a rolling restart: 503 and the queues (of which this node is a member) that no more
    than a bare majority of members runs now; 200 when there are none."""
    _, (n1, n2, n3) = nodes
    pair = f"{uid}-pair"
    with connect(n1) as connection:
        connection.channel().queue_declare(uid, durable=True, arguments=QUORUM)
    with connect(n2) as connection:  # members: node 2, then node 1 (the next running by name)
        connection.channel().queue_declare(pair, durable=True,
                                           arguments={**QUORUM, "x-quorum-initial-group-size": 2})
    wait_for(lambda: all(sorted(api(n, f"/queues/%2F/{pair}")["members"]) == NAMES[:2] for n in (n1, n2, n3)),
             "both queues known everywhere")
    failed = {"status": "failed",
              "reason": "There are quorum queues that would lose their quorum if the target node is shut down"}
    assert quorum_critical(n3) == (200, {"status": "ok"})  # a member of the first only, which all three run
    assert quorum_critical(n1) == (503, {**failed, "queues": [  # the pair has no member to spare
        {"readable_name": f"queue '{pair}' in vhost '/'", "name": pair, "virtual_host": "/", "type": "quorum"}]})
    n2.kill()
    wait_for(lambda: quorum_critical(n3)[0] == 503, "node 2 seen gone")
    assert quorum_critical(n3) == (503, {**failed, "queues": [
        {"readable_name": f"queue '{uid}' in vhost '/'", "name": uid, "virtual_host": "/", "type": "quorum"}]})


# -- consumers outlive a change of leader, as RabbitMQ's do: no basic.cancel, acks after it count, what is never
# acked comes back once the consumer closes ----------------------------------------------------------------------

HANDOVER_PREFETCH = 10
KEPT = 2  # of the deliveries held at the change, never acked: they come back once the consumer closes


def thirty_led_by_node_one(nodes: list[BrokerProcess], uid: str) -> list[bytes]:
    """A quorum queue led by node 1 as every node knows, with 30 confirmed messages on every copy."""
    with connect(nodes[0]) as connection:
        connection.channel().queue_declare(uid, durable=True, arguments=QUORUM)
    wait_for(lambda: all(leader_of(node, uid) == NAMES[0] for node in nodes), "the leader everywhere")
    bodies = [b"m%d" % i for i in range(30)]
    publish(nodes[0], uid, bodies)
    wait_for(lambda: all(api(node, f"/queues/%2F/{uid}")["messages"] == 30 for node in nodes[1:]), "copies")
    return bodies


def consume_across_a_change_of_leader(nodes: list[BrokerProcess], uid: str, at: int, change: Callable[[], None],
                                      early: int = 0) -> None:
    """30 messages; a consumer on node ``at`` (prefetch 10) holds 10 when ``change`` moves the leader from node 1
    (to node 3: of two copies as long, the name that sorts last leads); it acks ``early`` of them at once, the
    rest but ``KEPT`` once the new leader is known, then every later delivery."""
    bodies = thirty_led_by_node_one(nodes, uid)
    node = nodes[at]
    connection = connect(node)
    channel = connection.channel()
    channel.basic_qos(prefetch_count=HANDOVER_PREFETCH)
    got: list[tuple[int, bytes, bool, object]] = []
    cancels: list[object] = []
    acking: list[bool] = []

    def on_message(_channel, method, properties, body) -> None:
        got.append((method.delivery_tag, body, method.redelivered, (properties.headers or {}).get("x-delivery-count")))
        if acking:
            channel.basic_ack(method.delivery_tag)

    channel.add_on_cancel_callback(cancels.append)
    channel.basic_consume(uid, on_message)
    pump(connection, lambda: len(got) == HANDOVER_PREFETCH, 10)
    assert [body for _, body, _, _ in got] == bodies[:HANDOVER_PREFETCH]
    change()
    for tag, _, _, _ in got[:early]:  # acked before a new leader is known: they wait for it
        channel.basic_ack(tag)
    survivors = [other for other in nodes if other.proc is not None and other.proc.poll() is None]
    wait_for(lambda: all(leader_of(other, uid) == NAMES[2] for other in survivors), "node 3 leads", timeout=20)
    pump(connection, lambda: len(got) == HANDOVER_PREFETCH + early, 20)  # (bounds, not pauses: a loaded machine)
    pump(connection, lambda: False, 1.0)
    assert len(got) == HANDOVER_PREFETCH + early  # the new leader counts what it took back against the prefetch
    acking.append(True)
    for tag, _, _, _ in got[early:HANDOVER_PREFETCH - KEPT] + got[HANDOVER_PREFETCH:]:
        channel.basic_ack(tag)
    pump(connection, lambda: len(got) == 30, 30)
    pump(connection, lambda: False, 6.0)  # past the new leader's grace period: nothing comes again
    assert not cancels
    delivered = [body for _, body, _, _ in got]
    assert sorted(delivered) == sorted(bodies), delivered  # each once
    assert not any(redelivered or count for _, _, redelivered, count in got)
    connection.close()
    kept = [body for _, body, _, _ in got[HANDOVER_PREFETCH - KEPT:HANDOVER_PREFETCH]]
    assert sorted(drain(survivors[0], uid)) == sorted(kept)  # nothing confirmed lost


def test_a_consumer_on_another_node_outlives_the_leaders_death(nodes, uid):
    _, started = nodes
    consume_across_a_change_of_leader(started, uid, 1, started[0].kill, early=3)


def test_a_consumer_on_the_node_that_then_leads_outlives_the_leaders_death(nodes, uid):
    _, started = nodes
    consume_across_a_change_of_leader(started, uid, 2, started[0].kill, early=3)


def body_of(message: Any) -> bytes:
    """A copy of a Proton message's body, which is a view of the message's own memory."""
    return bytes(message.body)


@pytest.mark.parametrize("at", [1, 2])
def test_an_amqp10_receiver_outlives_the_leaders_death(nodes, uid, at):
    """An AMQP 1.0 receiver of a quorum queue (on another node, or on the node that then leads) holds 10
    unsettled when the leader dies; it accepts them once node 3 leads, then takes the rest: each message once,
    and the queue ends empty."""
    proton = pytest.importorskip("proton")
    from proton.utils import BlockingConnection
    _, started = nodes
    bodies = thirty_led_by_node_one(started, uid)
    amqp = BlockingConnection(f"amqp://guest:guest@127.0.0.1:{started[at].port}", timeout=10, allowed_mechs="PLAIN")
    try:
        receiver = amqp.create_receiver(f"/queues/{uid}", credit=HANDOVER_PREFETCH)
        got = [body_of(receiver.receive(timeout=10)) for _ in range(HANDOVER_PREFETCH)]
        assert got == bodies[:HANDOVER_PREFETCH]
        started[0].kill()
        wait_for(lambda: all(leader_of(node, uid) == NAMES[2] for node in started[1:]), "node 3 leads", timeout=20)
        for _ in got:
            receiver.accept()
        while len(got) < len(bodies):
            got.append(body_of(receiver.receive(timeout=20)))
            receiver.accept()
        with pytest.raises(proton.Timeout):
            receiver.receive(timeout=6)  # past the new leader's grace period: nothing comes again
    finally:
        amqp.close()
    assert sorted(got) == sorted(bodies)  # each once
    assert drain(started[2], uid) == []


def test_a_consumer_on_a_deposed_leader_outlives_its_deposition(nodes, uid):
    _, started = nodes
    n1 = started[0]

    def pause() -> None:
        assert n1.proc is not None
        n1.proc.send_signal(signal.SIGSTOP)
        time.sleep(4)  # twice the lease: the others elect another leader
        n1.proc.send_signal(signal.SIGCONT)

    consume_across_a_change_of_leader(started, uid, 0, pause)


def declared_on_node_1(nodes: list[BrokerProcess], uid: str) -> None:
    n1, n2, n3 = nodes
    declare_led_by_n1((n1, n2, n3), uid)


@contextlib.contextmanager
def no_leader_until_etcd_runs(etcd: Etcd, nodes: list[BrokerProcess]) -> Iterator[None]:
    """Node 1, the leader, is killed while etcd is frozen: the others know no leader they can reach, and cannot
    elect one, until etcd runs again (when the block ends)."""
    n1, n2, n3 = nodes
    etcd.proc.send_signal(signal.SIGSTOP)
    try:
        n1.kill()
        wait_for(lambda: NAMES[0] not in running_nodes(n2) and NAMES[0] not in running_nodes(n3), "node 1 gone")
        yield
    finally:
        etcd.proc.send_signal(signal.SIGCONT)


def test_an_amqp10_publisher_waits_for_the_next_leader_granted_no_credit_never_rejected(nodes, uid):
    """The same over AMQP 1.0: once a few of its transfers wait for a leader, the sending link through node 2 is
    granted no more credit (RabbitMQ 4.x's session grants none to a link whose queue blocks it), so that what
    waits stays bounded; once a leader is elected every transfer is accepted, none rejected or released."""
    pytest.importorskip("proton")
    from proton import Message
    from proton.handlers import MessagingHandler
    from proton.reactor import Container

    etcd, (n1, n2, n3) = nodes
    declared_on_node_1([n1, n2, n3], uid)
    count = 2_000

    class Sender(MessagingHandler):
        def __init__(self) -> None:
            super().__init__()
            self.sent = self.accepted = self.refused = 0

        def on_start(self, event: Any) -> None:
            connection = event.container.connect(f"amqp://guest:guest@127.0.0.1:{n2.port}", allowed_mechs="PLAIN")
            event.container.create_sender(connection, f"/queues/{uid}")

        def on_sendable(self, event: Any) -> None:
            while event.sender.credit and self.sent < count:
                event.sender.send(Message(body=b"x" * 100, durable=True))
                self.sent += 1

        def on_accepted(self, event: Any) -> None:
            self.accepted += 1
            if self.accepted + self.refused == count:
                event.connection.close()

        def on_rejected(self, event: Any) -> None:
            self.refused += 1

        on_released = on_rejected

    sender = Sender()
    with no_leader_until_etcd_runs(etcd, [n1, n2, n3]):
        thread = threading.Thread(target=Container(sender).run, daemon=True)
        thread.start()
        wait_for(lambda: sender.sent > 0, "the first transfers")
        time.sleep(3)
        held = sender.sent
        assert held <= 2 * 128 + 32, held  # (two grants of RabbitMQ's link credit, and the few that wait)
        time.sleep(1)
        assert sender.sent == held, "credit granted while transfers wait for a leader"
        assert sender.accepted == sender.refused == 0
    thread.join(60)
    assert (sender.accepted, sender.refused) == (count, 0)
    wait_for(lambda: passive(n2, uid) == count, "every transfer in the queue")


def test_a_declare_a_get_and_a_consume_through_other_members_wait_for_the_next_leader(nodes, uid):
    """While no leader can be elected, a passive queue.declare and a basic.get through node 2 and a basic.consume
    through node 3 wait for the next leader and are answered once it is elected, rather than fail at once with 404
    "home node 'warren1@localhost' of durable queue ... is down or inaccessible" (RabbitMQ answers through any
    member while a majority has a leader)."""
    etcd, (n1, n2, n3) = nodes
    declared_on_node_1([n1, n2, n3], uid)
    publish(n2, uid, [b"one", b"two"])
    answers: dict[str, Any] = {}

    def declare_and_get() -> None:
        try:
            with connect(n2) as connection:
                channel = connection.channel()
                answers["declare"] = channel.queue_declare(uid, passive=True).method
                answers["get"] = channel.basic_get(uid, auto_ack=True)[2]
        except AMQPError as exc:
            answers["declare"] = exc

    def consume() -> None:
        try:
            with connect(n3) as connection:
                channel = connection.channel()
                channel.basic_qos(prefetch_count=1)  # (it holds one: the other is basic.get's)
                channel.basic_consume(uid, lambda ch, method, properties, body: answers.setdefault("consumed", body))
                pump(connection, lambda: "consumed" in answers, timeout=60)
        except AMQPError as exc:
            answers["consumed"] = exc

    with no_leader_until_etcd_runs(etcd, [n1, n2, n3]):
        threads = [threading.Thread(target=declare_and_get, daemon=True), threading.Thread(target=consume, daemon=True)]
        for thread in threads:
            thread.start()
        time.sleep(1.0)
        assert answers == {}, answers
    for thread in threads:
        thread.join(60)
    assert answers["get"] in (b"one", b"two") and answers["consumed"] in (b"one", b"two"), answers
    assert answers["get"] != answers["consumed"]


def test_a_publisher_waits_for_the_next_leader_held_back_never_nacked(nodes, uid):
    """While no leader can be elected (for longer than a publish once waited before it was nacked), a publisher
    through node 2 that sends far more than fits in the socket buffers is read no more once a few of its publishes
    wait (its connection in flow), and is not nacked; once a leader is elected every publish is confirmed."""
    etcd, (n1, n2, n3) = nodes
    declared_on_node_1([n1, n2, n3], uid)
    count, body = 20_000, b"x" * 1000
    raw = Raw(n2, timeout=120)
    raw.handshake()
    raw.open_channel()
    raw.send_method(1, commands.Confirm.Select())
    raw.expect(commands.Confirm.SelectOk)
    frames = publish_frames(1, "", uid, body)
    with no_leader_until_etcd_runs(etcd, [n1, n2, n3]):
        sender = threading.Thread(target=raw.send, args=(frames * count,), daemon=True)
        sender.start()
        wait_for(lambda: [c["state"] for c in api(n2, "/connections")] == ["flow"], "the publisher held")
        time.sleep(6)  # (a publish waited 5 s for a leader before it was nacked)
        assert sender.is_alive(), "every publish read while no leader is known"
    acked, nacks = 0, 0
    while acked < count:
        _, frame = raw.read_frame()
        if isinstance(frame, commands.Basic.Nack):
            nacks += 1
        assert isinstance(frame, (commands.Basic.Ack, commands.Basic.Nack)), frame
        acked = max(acked, frame.delivery_tag)
    sender.join(10)
    raw.close()
    assert nacks == 0
    wait_for(lambda: passive(n2, uid) == count, "every publish in the queue")
