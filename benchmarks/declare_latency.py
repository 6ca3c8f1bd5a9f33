#!/usr/bin/env python3
"""queue.declare latency of a server-named queue, as an RPC client declares its reply queue per call.

Starts one Warren node alone, then etcd and three nodes (``cluster.py``'s ``start_cluster``), and times
``--count`` declarations one after another on one channel of node 1: exclusive (``amq.gen-…``, the reply
queue), and auto-delete non-exclusive for comparison.
Usage: ``python benchmarks/declare_latency.py --count 300``
"""
from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

import pika

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from cluster import ROOT, free_port, start_cluster, stopping, wait_port  # noqa: E402 (after sys.path takes this folder)


def measure(port: int, count: int, **declare: bool) -> str:
    connection = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", port))
    channel = connection.channel()
    times = []
    for _ in range(count):
        start = time.perf_counter()
        channel.queue_declare("", **declare)
        times.append((time.perf_counter() - start) * 1000)
    connection.close()
    times.sort()
    return (f"median {statistics.median(times):6.2f} ms   p90 {times[int(count * 0.9)]:6.2f} ms   "
            f"mean {statistics.mean(times):6.2f} ms")


def report(where: str, port: int, count: int) -> None:
    """Non-exclusive first: the exclusive queues' deletions when their connection closes keep etcd busy a while."""
    print(f"{where}, non-exclusive: {measure(port, count, auto_delete=True)}")
    print(f"{where}, exclusive:     {measure(port, count, exclusive=True)}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--count", type=int, default=300)
    args = parser.parse_args()
    if not shutil.which("etcd"):
        print("etcd not found: apt-get install etcd-server", file=sys.stderr)
        return 2
    tmp = tempfile.mkdtemp(prefix="warren-declare-bench-")
    port = free_port()
    procs = [subprocess.Popen(
        [sys.executable, "-m", "amqp_server", "--bind", "127.0.0.1", "--amqp-port", str(port), "--mgmt-enabled",
         "false", "--data-dir", f"{tmp}/single", "--log-level", "WARNING"], cwd=ROOT, stdout=subprocess.DEVNULL)]
    with stopping(procs, tmp):
        wait_port(port)
        report("one node     ", port, args.count)
        cluster, ports = start_cluster(tmp)
        procs += cluster
        report("node of three", ports[0], args.count)
    return 0


if __name__ == "__main__":
    sys.exit(main())
