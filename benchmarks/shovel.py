"""Shovel throughput: a dynamic shovel moving a backlog of persistent messages between two queues of one node, and
between two nodes, for Warren and (when its nodes are given) RabbitMQ's own shovel on the same workload.

The workload: ``--messages`` persistent messages of ``--size`` bytes published (with confirms) to ``bench-src`` on
the source; then a shovel (``ack-mode`` on-confirm, ``src-prefetch-count`` 1000, RabbitMQ's defaults) is defined
on the destination node by PUT /api/parameters/shovel/%2F/bench, and the clock runs until ``bench-dest`` holds
every message.  Reported: messages per second, and the CPU time the broker processes spent per message (user +
system, from /proc; it holds up better than a rate on a busy machine).  Warren's nodes are started here; RabbitMQ's
are started first with ``benchmarks/run_rabbitmq_nodes.sh start 2`` and named by ``--rabbitmq``.

    .venv/bin/python benchmarks/shovel.py --messages 20000
    benchmarks/run_rabbitmq_nodes.sh start 2
    .venv/bin/python benchmarks/shovel.py --messages 20000 --rabbitmq 5791:15791,5792:15792 \\
        --rabbitmq-pids $(benchmarks/run_rabbitmq_nodes.sh pid 1),$(benchmarks/run_rabbitmq_nodes.sh pid 2)
    benchmarks/run_rabbitmq_nodes.sh stop
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
import urllib.error
import urllib.request
from dataclasses import dataclass

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from amqp_load import Connection, publish_confirmed  # noqa: E402 (the benchmarks' raw-socket client)

ROOT = os.path.dirname(HERE)
TICKS = os.sysconf("SC_CLK_TCK")
GUEST = "Basic " + base64.b64encode(b"guest:guest").decode()


@dataclass
class Node:
    port: int
    mgmt: int
    pid: int
    proc: subprocess.Popen | None = None

    def api(self, method: str, path: str, body: object = None) -> int:
        request = urllib.request.Request(f"http://127.0.0.1:{self.mgmt}{path}", method=method,
                                         data=json.dumps(body).encode() if body is not None else None,
                                         headers={"content-type": "application/json", "authorization": GUEST})
        try:
            with urllib.request.urlopen(request, timeout=30) as answer:
                return answer.status
        except urllib.error.HTTPError as exc:
            return exc.code


def cpu_seconds(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as stat:
        fields = stat.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICKS


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def start_warren(data_dir: str) -> Node:
    port, mgmt = free_port(), free_port()
    proc = subprocess.Popen([sys.executable, "-m", "amqp_server", "--bind", "127.0.0.1", "--amqp-port", str(port),
                             "--mgmt-port", str(mgmt), "--data-dir", data_dir, "--log-level", "WARNING"],
                            cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            with socket.create_connection(("127.0.0.1", mgmt), timeout=0.5):
                with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                    return Node(port, mgmt, proc.pid, proc)
        except OSError:
            time.sleep(0.2)
    proc.kill()
    raise RuntimeError("Warren did not start")


def depth(node: Node, queue: str) -> int:
    conn = Connection("127.0.0.1", node.port, "guest", "guest")
    try:
        conn.channel_open(1)
        return conn.queue_declare(1, queue, durable=True)[0]
    finally:
        conn.close()


def prepare(source: Node, destination: Node, messages: int, size: int) -> None:
    for node in (source, destination):
        conn = Connection("127.0.0.1", node.port, "guest", "guest")
        conn.channel_open(1)
        for queue in ("bench-src", "bench-dest"):
            conn.queue_declare(1, queue, durable=True)
            conn.queue_delete(1, queue)
            conn.queue_declare(1, queue, durable=True)
        conn.close()
    conn = Connection("127.0.0.1", source.port, "guest", "guest")
    conn.channel_open(1)
    conn.confirm_select(1)
    publish_confirmed(conn, "bench-src", b"x" * size, messages, persistent=True)
    conn.close()


def run(label: str, source: Node, destination: Node, messages: int, size: int, timeout: float) -> dict:
    prepare(source, destination, messages, size)
    src_uri = "amqp://" if source is destination else f"amqp://guest:guest@127.0.0.1:{source.port}"
    pids = {source.pid, destination.pid}
    before = sum(cpu_seconds(pid) for pid in pids)
    started = time.monotonic()
    status = destination.api("PUT", "/api/parameters/shovel/%2F/bench", {"value": {
        "src-uri": src_uri, "src-queue": "bench-src", "dest-uri": "amqp://", "dest-queue": "bench-dest",
        "ack-mode": "on-confirm"}})
    if status not in (201, 204):
        raise RuntimeError(f"{label}: the shovel was refused ({status})")
    moved = 0
    while time.monotonic() - started < timeout:
        moved = depth(destination, "bench-dest")
        if moved >= messages:
            break
        time.sleep(0.05)
    elapsed = time.monotonic() - started
    cpu = sum(cpu_seconds(pid) for pid in pids) - before
    destination.api("DELETE", "/api/parameters/shovel/%2F/bench")
    with open("/proc/loadavg") as load:
        loadavg = " ".join(load.read().split()[:3])
    return {"run": label, "messages": moved, "seconds": round(elapsed, 2), "msg_per_s": round(moved / elapsed),
            "broker_cpu_us_per_msg": round(cpu / max(moved, 1) * 1e6, 1), "loadavg": loadavg}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--messages", type=int, default=20000)
    parser.add_argument("--size", type=int, default=256)
    parser.add_argument("--timeout", type=float, default=600)
    parser.add_argument("--rabbitmq", default="", help="AMQP:MGMT ports of two RabbitMQ nodes, comma-separated")
    parser.add_argument("--rabbitmq-pids", default="", help="their OS pids, comma-separated (CPU time)")
    parser.add_argument("--only", choices=("warren", "rabbitmq"), default=None)
    args = parser.parse_args(argv)
    results = []
    if args.only != "rabbitmq":
        tmp = tempfile.mkdtemp(prefix="warren-shovel-bench.")
        nodes = [start_warren(os.path.join(tmp, f"n{i}")) for i in (1, 2)]
        try:
            results.append(run("warren, one node", nodes[0], nodes[0], args.messages, args.size, args.timeout))
            results.append(run("warren, two nodes", nodes[0], nodes[1], args.messages, args.size, args.timeout))
        finally:
            for node in nodes:
                assert node.proc is not None
                node.proc.terminate()
                node.proc.wait(30)
            shutil.rmtree(tmp, ignore_errors=True)
    if args.rabbitmq and args.only != "warren":
        ports = [tuple(int(p) for p in item.split(":")) for item in args.rabbitmq.split(",")]
        pids = [int(p) for p in args.rabbitmq_pids.split(",")] if args.rabbitmq_pids else [0] * len(ports)
        rabbits = [Node(port, mgmt, pid) for (port, mgmt), pid in zip(ports, pids)]
        results.append(run("rabbitmq, one node", rabbits[0], rabbits[0], args.messages, args.size, args.timeout))
        if len(rabbits) > 1:
            results.append(run("rabbitmq, two nodes", rabbits[0], rabbits[1], args.messages, args.size, args.timeout))
    for result in results:
        print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
