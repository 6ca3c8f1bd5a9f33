#!/usr/bin/env python3
"""Cluster throughput: publish -> consume msg/s across nodes against one node.

Starts its own etcd (Debian's etcd-server) and three Warren nodes in cluster mode on free
loopback ports, then measures with the raw-socket generator of ``amqp_load.py``:

``local``    publisher, queue owner and consumer all on node 1 (the single-node figure)
``3-nodes``  queue owned by node 1, publisher on node 2, consumer on node 3
``spread``   three queues, one owned by each node, each with a publisher on the next node
             and a consumer on the one after: the sum shows how load over owners scales
``fanout4``  publisher on node 2 to a fanout exchange bound to four queues owned by node 1,
             consumed there: deliveries/s summed over the four (one link crossing per message)

Transient messages, no-ack consumers (``transient-noack``) or ``--ack`` for manual acks.
Usage: ``python benchmarks/cluster.py --seconds 5 --runs 3``
"""
from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import amqp_load  # noqa: E402 (after sys.path takes this folder)

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def wait_port(port: int, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), 0.2).close()
            return
        except OSError:
            time.sleep(0.1)
    raise TimeoutError(f"nothing listens on {port}")


@contextmanager
def stopping(procs: list[subprocess.Popen], tmp: str) -> Iterator[None]:
    """However the body ends: ``procs`` stopped (the last started first, as many as the list then holds) and
    ``tmp`` removed."""
    try:
        yield
    finally:
        for proc in reversed(procs):
            proc.terminate()
            proc.wait(10)
        shutil.rmtree(tmp, ignore_errors=True)


def start_cluster(tmp: str) -> tuple[list[subprocess.Popen], list[int]]:
    client, peer = free_port(), free_port()
    procs = [subprocess.Popen(
        [shutil.which("etcd") or "etcd", "--data-dir", f"{tmp}/etcd",
         "--listen-client-urls", f"http://127.0.0.1:{client}", "--advertise-client-urls", f"http://127.0.0.1:{client}",
         "--listen-peer-urls", f"http://127.0.0.1:{peer}", "--initial-advertise-peer-urls",
         f"http://127.0.0.1:{peer}", "--initial-cluster", f"default=http://127.0.0.1:{peer}"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)]
    wait_port(client)
    ports = []
    for i in (1, 2, 3):
        port = free_port()
        procs.append(subprocess.Popen(
            [sys.executable, "-m", "amqp_server", "--bind", "127.0.0.1", "--amqp-port", str(port),
             "--mgmt-enabled", "false", "--data-dir", f"{tmp}/node{i}", "--node-name", f"bench{i}@localhost",
             "--cluster-etcd", f"127.0.0.1:{client}", "--cluster-secret", "bench", "--cluster-port",
             str(free_port()), "--log-level", "WARNING"], cwd=ROOT, stdout=subprocess.DEVNULL))
        wait_port(port)
        ports.append(port)
    time.sleep(2)  # links up
    return procs, ports


def measure(ports: list[int], pairs: list[tuple[int, int, int]], seconds: float, no_ack: bool,
            width: int = 1) -> float:
    """pairs: (owner, publisher, consumer) node indexes; returns consumed msg/s summed over the queues.

    ``width`` > 1: the publisher sends to a fanout exchange bound to that many queues of the owner.
    """
    ctx = mp.get_context("fork")
    base = {"host": "127.0.0.1", "user": "guest", "password": "guest", "vhost": "/", "size": 100,
            "window": 20000, "tls_ca": None}
    targets = []  # (exchange, [queues]) per pair
    for owner, _, _ in pairs:
        name = f"bench-{os.urandom(4).hex()}"
        ctl = amqp_load.Connection("127.0.0.1", ports[owner], "guest", "guest")
        ctl.channel_open(1)
        if width == 1:
            ctl.queue_declare(1, name)
            targets.append(("", [name]))
        else:
            ctl.exchange_declare(1, name, "fanout")
            queues = [f"{name}-{i}" for i in range(width)]
            for queue in queues:
                ctl.queue_declare(1, queue)
                ctl.queue_bind(1, queue, name)
            targets.append((name, queues))
        ctl.close()
    time.sleep(0.5)  # definitions reach every node
    stop, go, errq = ctx.RawValue("b", 0), ctx.RawValue("b", 0), ctx.Queue()
    counters = []
    procs = []
    try:
        for (_, pub, con), (exchange, queues) in zip(pairs, targets):
            mine = [ctx.RawValue("q", 0) for _ in queues]
            counters += mine
            for queue, counter in zip(queues, mine):
                ready = ctx.RawValue("b", 0)
                proc = ctx.Process(target=amqp_load.consumer_proc, daemon=True,
                                   args=(dict(base, port=ports[con]), queue, no_ack, counter, ready, stop, errq))
                proc.start()
                procs.append(proc)
                amqp_load._wait_ready([ready], procs, errq)
            ready = ctx.RawValue("b", 0)
            proc = ctx.Process(target=amqp_load.publisher_proc, daemon=True,
                               args=(dict(base, port=ports[pub]), exchange, queues[0], False, False, mine,
                                     ctx.RawValue("q", 0), amqp_load.Signals(ready, go, stop, errq)))
            proc.start()
            procs.append(proc)
            amqp_load._wait_ready([ready], procs, errq)
        go.value = 1
        time.sleep(1.0)
        c0, t0 = sum(c.value for c in counters), time.perf_counter()
        time.sleep(seconds)
        c1, t1 = sum(c.value for c in counters), time.perf_counter()
        errors = amqp_load._drain(errq)
        if errors:
            raise RuntimeError("; ".join(errors))
        return (c1 - c0) / (t1 - t0)
    finally:
        stop.value = 1
        for proc in procs:
            proc.join(5)
            if proc.is_alive():
                proc.terminate()


SCENARIOS = {
    "local": [(0, 0, 0)],
    "3-nodes": [(0, 1, 2)],
    "spread": [(0, 1, 2), (1, 2, 0), (2, 0, 1)],
    "fanout4": [(0, 1, 0)],
}
WIDTH = {"fanout4": 4}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--ack", action="store_true", help="manual acks instead of no-ack consumers")
    parser.add_argument("--only", nargs="*", choices=list(SCENARIOS), help="these scenarios only")
    args = parser.parse_args()
    if not shutil.which("etcd"):
        print("etcd not found: apt-get install etcd-server", file=sys.stderr)
        return 2
    tmp = tempfile.mkdtemp(prefix="warren-cluster-bench-")
    procs, ports = start_cluster(tmp)
    with stopping(procs, tmp):
        results = {}
        for scenario, pairs in SCENARIOS.items():
            if args.only and scenario not in args.only:
                continue
            runs = [measure(ports, pairs, args.seconds, not args.ack, WIDTH.get(scenario, 1)) for _ in range(args.runs)]
            results[scenario] = statistics.median(runs)
            print(f"{scenario:<8} {results[scenario]:>10.0f} msg/s   runs: {', '.join(f'{r:.0f}' for r in runs)}")
        if "3-nodes" in results and "local" in results:
            print(f"3-nodes / local = {results['3-nodes'] / results['local']:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
