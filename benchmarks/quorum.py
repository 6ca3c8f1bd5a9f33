#!/usr/bin/env python3
"""Replicated (quorum) queues on three nodes: publish rate with confirms against a classic durable queue on
the same cluster, and (Warren) the failover time after a kill -9 of the leader.

``--broker warren`` starts its own etcd and three Warren nodes on free loopback ports.
``--broker rabbitmq`` uses three clustered RabbitMQ nodes already running on ``--ports`` (default
5681,5682,5683), e.g. three Debian rabbitmq-server nodes joined with ``rabbitmqctl join_cluster``; with
``--kill-leader CMD`` (a shell command that kills -9 the first node) it measures their failover too.

For each queue type (classic durable, quorum) one publisher sends ``--messages`` persistent 100-byte
messages with confirms (``--in-flight`` unconfirmed at most) through the queue's own node (``leader``)
and through another node (``follower``); the queue is purged in between.  Failover: messages are
published and confirmed, the leader is killed with SIGKILL, and the time is measured until a publish
with confirm through another node is acked again; then every confirmed message is counted.

Usage: ``python benchmarks/quorum.py --broker warren --messages 50000 --runs 3``; ``--quorum-only`` runs only the
quorum queue's two publish phases (the brokers' CPU per message, old and new code alternately, in less time).
"""
from __future__ import annotations

import argparse
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Callable

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import amqp_load  # noqa: E402 (after sys.path takes this folder)
from cluster import start_cluster, stopping  # noqa: E402 (after sys.path takes this folder)

BODY = b"x" * 100


def connect(port: int) -> amqp_load.Connection:
    conn = amqp_load.Connection("127.0.0.1", port, "guest", "guest")
    conn.channel_open(1)
    return conn


def declare(port: int, name: str, quorum: bool) -> None:
    conn = connect(port)
    conn.queue_declare(1, name, durable=True, arguments={"x-queue-type": "quorum"} if quorum else None)
    conn.close()


def publish_rate(port: int, queue: str, count: int, in_flight: int) -> float:
    conn = connect(port)
    conn.confirm_select(1)
    result = amqp_load.publish_confirmed(conn, queue, BODY, count, max_unconfirmed=in_flight, timeout=300)
    conn.close()
    if result["nacks"]:
        raise RuntimeError(f"{result['nacks']} nacks")
    return count / result["confirmed_s"]


def purge(port: int, queue: str) -> None:
    conn = connect(port)
    conn.rpc(1, 50, 30, b"\x00\x00" + amqp_load.shortstr(queue) + b"\x00", 31)
    conn.close()


def count(port: int, queue: str) -> int:
    conn = connect(port)
    messages, _ = conn.queue_declare(1, queue, passive=True)
    conn.close()
    return messages


def acked(port: int, queue: str) -> bool:
    """One publish with confirm through ``port`` was acked (not nacked, not refused)."""
    try:
        conn = amqp_load.Connection("127.0.0.1", port, "guest", "guest", timeout=2)
        conn.channel_open(1)
        conn.confirm_select(1)
        result = amqp_load.publish_confirmed(conn, queue, BODY, 1, timeout=2)
        conn.close()
        return result["nacks"] == 0
    except (amqp_load.AMQPError, OSError):
        return False


def cpu_seconds(pids: list[int]) -> float:
    """User and system CPU time the processes ``pids`` have used so far, summed (Linux /proc)."""
    total = 0
    for pid in pids:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        total += int(fields[11]) + int(fields[12])  # utime, stime (the stat file's 14th and 15th fields)
    return total / os.sysconf("SC_CLK_TCK")


def rates(ports: list[int], messages: int, runs: int, in_flight: int, pids: list[int] | None = None,
          kinds: tuple[bool, ...] = (False, True)) -> None:
    """Publish rates; with ``pids`` (the brokers' processes), also the CPU time they spend per message, which
    other work on the machine changes much less than the rate: in all, and the median per node (the leader's, then
    the node ``follower`` publishes through, then the third)."""
    for quorum in kinds:
        kind = "quorum" if quorum else "classic"
        queue = f"bench-{kind}-{os.urandom(3).hex()}"
        declare(ports[0], queue, quorum)
        time.sleep(1.0)  # the queue and its leader are known on every node
        for via, port in (("leader", ports[0]), ("follower", ports[1])):
            figures, costs, nodes = [], [], []
            for _ in range(runs):
                used = [cpu_seconds([pid]) for pid in pids] if pids else []
                figures.append(publish_rate(port, queue, messages, in_flight))
                if pids:
                    nodes.append([(cpu_seconds([pid]) - before) / messages * 1e6 for pid, before in zip(pids, used)])
                    costs.append(sum(nodes[-1]))
                purge(ports[0], queue)
            per_node = " / ".join(f"{statistics.median(cost):.1f}" for cost in zip(*nodes))
            cost = (f"   brokers' CPU {statistics.median(costs):.1f} us/msg ({', '.join(f'{c:.1f}' for c in costs)}; "
                    f"per node {per_node})")
            print(f"{kind:<8} publish+confirm via {via:<8} {statistics.median(figures):>9.0f} msg/s   "
                  f"runs: {', '.join(f'{r:.0f}' for r in figures)}{cost if pids else ''}", flush=True)


def failover(kill: Callable[[], None], ports: list[int], messages: int) -> None:
    """Kill -9 the leader (node 1) and time until node 2 confirms a publish again."""
    queue = f"bench-failover-{os.urandom(3).hex()}"
    declare(ports[0], queue, True)
    time.sleep(1.0)
    publish_rate(ports[1], queue, messages, 1000)
    kill()
    killed = time.monotonic()
    while not acked(ports[1], queue):
        if time.monotonic() - killed > 60:
            raise RuntimeError("no leader after 60 s")
        time.sleep(0.05)
    took = time.monotonic() - killed
    deadline = time.monotonic() + 5  # a node that is not the new leader reports its count once a second
    while (kept := count(ports[1], queue)) < messages + 1 and time.monotonic() < deadline:
        time.sleep(0.2)
    print(f"failover: confirms again {took:.2f} s after kill -9 of the leader; "
          f"{kept - 1} of {messages} confirmed messages there", flush=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--broker", choices=("warren", "rabbitmq"), default="warren")
    parser.add_argument("--ports", default="5681,5682,5683", help="RabbitMQ's three AMQP ports")
    parser.add_argument("--messages", type=int, default=50000)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--in-flight", type=int, default=1000, help="unconfirmed publishes at most")
    parser.add_argument("--kill-leader", metavar="CMD", help="RabbitMQ: a shell command that kills -9 node 1")
    parser.add_argument("--quorum-only", action="store_true",
                        help="the quorum queue's publish phases only: no classic queue, no failover")
    args = parser.parse_args()
    kinds = (True,) if args.quorum_only else (False, True)
    if args.broker == "rabbitmq":
        ports = [int(p) for p in args.ports.split(",")]
        rates(ports, args.messages, args.runs, args.in_flight, kinds=kinds)
        if args.kill_leader and not args.quorum_only:
            failover(lambda: subprocess.run(args.kill_leader, shell=True, check=True), ports, args.messages)
        return 0
    if not shutil.which("etcd"):
        print("etcd not found: apt-get install etcd-server", file=sys.stderr)
        return 2
    tmp = tempfile.mkdtemp(prefix="warren-quorum-bench-")
    procs, ports = start_cluster(tmp)
    with stopping(procs, tmp):
        rates(ports, args.messages, args.runs, args.in_flight, [proc.pid for proc in procs[1:]], kinds)
        if not args.quorum_only:
            failover(lambda: procs[1].send_signal(signal.SIGKILL), ports, args.messages)  # procs[0] is etcd
    return 0


if __name__ == "__main__":
    sys.exit(main())
