"""Exchange federation throughput between two Warren nodes.

A backlog of ``--messages`` persistent messages of ``--size`` bytes waits in the upstream queue (as if published
while the link was away); then the downstream node gets an upstream and a policy (``ack-mode`` on-confirm,
``prefetch-count`` 1000, RabbitMQ's defaults), and the clock runs until the downstream queue bound to the federated
exchange holds every message.  Reported: messages per second (link start included), and the CPU time each node
spent per message (user + system, from /proc; it holds up better than a rate on a busy machine), with the load
average.

    .venv/bin/python benchmarks/federation.py --messages 50000
"""
from __future__ import annotations

import argparse
import base64
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request

import pika

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TICKS = os.sysconf("SC_CLK_TCK")
GUEST = "Basic " + base64.b64encode(b"guest:guest").decode()
QUEUE = "federation: fed.x -> down@localhost"  # the upstream queue the link declares


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class Node:
    def __init__(self, name: str, base: str) -> None:
        self.port, self.mgmt = free_port(), free_port()
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "amqp_server", "--bind", "127.0.0.1", "--amqp-port", str(self.port),
             "--mgmt-port", str(self.mgmt), "--data-dir", os.path.join(base, name), "--node-name", f"{name}@localhost"],
            cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        for _ in range(200):
            try:
                self.connect().close()
                return
            except pika.exceptions.AMQPConnectionError:
                time.sleep(0.1)
        raise SystemExit(f"node {name} did not start")

    def connect(self) -> pika.BlockingConnection:
        return pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", self.port, connection_attempts=1))

    def cpu(self) -> float:
        with open(f"/proc/{self.proc.pid}/stat") as stat:
            fields = stat.read().rpartition(")")[2].split()
        return (int(fields[11]) + int(fields[12])) / TICKS

    def depth(self, queue: str) -> int:
        connection = self.connect()
        try:
            return connection.channel().queue_declare(queue, passive=True).method.message_count
        finally:
            connection.close()

    def put(self, path: str, body: dict) -> None:
        request = urllib.request.Request(f"http://127.0.0.1:{self.mgmt}{path}", data=json.dumps(body).encode(),
                                         method="PUT", headers={"Content-Type": "application/json",
                                                                "Authorization": GUEST})
        urllib.request.urlopen(request, timeout=10).close()

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(10)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--messages", type=int, default=50000)
    parser.add_argument("--size", type=int, default=100)
    args = parser.parse_args()
    base = tempfile.mkdtemp(prefix="warren-federation-bench-")
    up = down = None
    try:
        up, down = Node("up", base), Node("down", base)
        connection = down.connect()
        channel = connection.channel()
        channel.exchange_declare("fed.x", "topic", durable=True)
        channel.queue_declare("here", durable=True)
        channel.queue_bind("here", "fed.x", "#")
        connection.close()
        connection = up.connect()
        channel = connection.channel()
        channel.queue_declare(QUEUE, durable=True, arguments={"x-internal-purpose": "federation"})
        body, persistent = b"x" * args.size, pika.BasicProperties(delivery_mode=2)
        for _ in range(args.messages - 1):
            channel.basic_publish("", QUEUE, body, persistent)
        channel.confirm_delivery()  # the last one confirmed: stored, after all before it
        channel.basic_publish("", QUEUE, body, persistent)
        connection.close()
        while up.depth(QUEUE) < args.messages:
            time.sleep(0.1)
        cpu_up, cpu_down, start = up.cpu(), down.cpu(), time.monotonic()
        down.put("/api/parameters/federation-upstream/%2F/up", {"value": {"uri": f"amqp://127.0.0.1:{up.port}"}})
        down.put("/api/policies/%2F/fed", {"pattern": "^fed\\.", "apply-to": "exchanges",
                                           "definition": {"federation-upstream": "up"}})
        while down.depth("here") < args.messages:
            time.sleep(0.05)
        seconds = time.monotonic() - start
        print(json.dumps({"run": "warren exchange federation, two nodes", "messages": args.messages,
                          "seconds": round(seconds, 2), "msg_per_s": round(args.messages / seconds),
                          "upstream_cpu_us_per_msg": round((up.cpu() - cpu_up) / args.messages * 1e6),
                          "downstream_cpu_us_per_msg": round((down.cpu() - cpu_down) / args.messages * 1e6),
                          "loadavg": " ".join(f"{x:.2f}" for x in os.getloadavg())}))
    finally:
        for node in (up, down):
            if node is not None:
                node.stop()
        shutil.rmtree(base, ignore_errors=True)


if __name__ == "__main__":
    main()
