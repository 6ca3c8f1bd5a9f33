#!/usr/bin/env python3
"""Management API latency: GET /api/queues on a node with 1,000 queues under publish/consume load.

Starts a throwaway Warren node (or uses a running broker given ``--amqp-port`` and
``--mgmt-port``, e.g. a RabbitMQ with rabbitmq_management), then

1. declares ``--queues`` (1,000) queues ``warren-bench.mgmt.NNNN``; every 4th gets
   ``--backlog`` (100) ready messages; every 20th gets a consumer (prefetch 5, never
   acking, so it holds unacknowledged messages);
2. starts ``amqp_load.py --workload transient-ack`` in a subprocess against the same
   node (a steady publish/consume load in separate processes) and waits ``--settle`` s
   so that rate samples are being taken;
3. sends ``--requests`` (200) sequential ``GET /api/queues`` (the full listing), then as
   many ``GET /api/queues?page=1&page_size=100``, then as many ``GET /api/whoami`` (the
   floor: what any request waits for the node's event loop and the CPU), each on one
   keep-alive HTTP connection, and reports p50 / p99 / max in milliseconds and the body size;
4. reads the node's own publish and deliver rates from /api/overview (the load's
   throughput while measuring), stops the load and deletes the queues.

    .venv/bin/python benchmarks/mgmt_latency.py
    .venv/bin/python benchmarks/mgmt_latency.py --amqp-port 5699 --mgmt-port 15699   # a running RabbitMQ
"""
from __future__ import annotations

import argparse
import base64
import http.client
import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)

from amqp_load import Connection, publish_frames  # noqa: E402 (after sys.path takes this folder)

PREFIX = "warren-bench.mgmt."


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def wait_port(port: int, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.2):
                return
        except OSError:
            time.sleep(0.1)
    raise TimeoutError(f"nothing listens on {port}")


def start_warren(tmp: str) -> tuple[subprocess.Popen, int, int]:
    amqp_port, mgmt_port = free_port(), free_port()
    log = open(os.path.join(tmp, "broker.log"), "wb")
    proc = subprocess.Popen([sys.executable, "-m", "amqp_server", "--bind", "127.0.0.1", "--amqp-port",
                             str(amqp_port), "--mgmt-port", str(mgmt_port), "--data-dir", os.path.join(tmp, "data"),
                             "--log-level", "WARNING"], cwd=ROOT, stdout=log, stderr=subprocess.STDOUT)
    wait_port(amqp_port)
    wait_port(mgmt_port)
    return proc, amqp_port, mgmt_port


def setup(port: int, queues: int, backlog: int) -> Connection:
    """Declare the queues, fill some, and return the connection whose consumers hold unacked messages."""
    conn = Connection("127.0.0.1", port, "guest", "guest")
    conn.channel_open(1)
    body = b"x" * 100
    for i in range(queues):
        name = f"{PREFIX}{i:04d}"
        conn.queue_declare(1, name)
        if i % 4 == 0:
            conn.send(publish_frames(1, "", name, body, False, conn.frame_max) * backlog)
    conn.queue_declare(1, f"{PREFIX}{0:04d}", passive=True)  # a round trip: the publishes have arrived
    consumers = Connection("127.0.0.1", port, "guest", "guest")
    consumers.channel_open(1)
    consumers.basic_qos(1, 5)
    for i in range(0, queues, 20):
        consumers.basic_consume(1, f"{PREFIX}{i:04d}", no_ack=False, tag=f"c{i}")
    conn.close()
    return consumers


def teardown(port: int, queues: int) -> None:
    conn = Connection("127.0.0.1", port, "guest", "guest")
    conn.channel_open(1)
    for i in range(queues):
        conn.queue_delete(1, f"{PREFIX}{i:04d}")
    conn.close()


def get_json(mgmt_port: int, path: str) -> dict:
    token = base64.b64encode(b"guest:guest").decode()
    conn = http.client.HTTPConnection("127.0.0.1", mgmt_port, timeout=60)
    conn.request("GET", path, headers={"Authorization": f"Basic {token}"})
    body = json.loads(conn.getresponse().read())
    conn.close()
    return body


def measure(mgmt_port: int, path: str, requests: int) -> dict:
    token = base64.b64encode(b"guest:guest").decode()
    http_conn = http.client.HTTPConnection("127.0.0.1", mgmt_port, timeout=60)
    times, size, items = [], 0, 0
    for _ in range(requests):
        start = time.perf_counter()
        http_conn.request("GET", path, headers={"Authorization": f"Basic {token}"})
        response = http_conn.getresponse()
        raw = response.read()
        times.append((time.perf_counter() - start) * 1000)
        if response.status != 200:
            raise RuntimeError(f"GET {path}: {response.status} {raw[:200]!r}")
        size = len(raw)
    body = json.loads(raw)
    items = len(body["items"]) if isinstance(body, dict) and "items" in body else len(body)
    http_conn.close()
    times.sort()
    return {"path": path, "requests": requests, "items": items, "bytes": size,
            "p50_ms": round(statistics.median(times), 1), "p99_ms": round(times[int(len(times) * 0.99) - 1], 1),
            "max_ms": round(times[-1], 1), "mean_ms": round(statistics.fmean(times), 1)}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--amqp-port", type=int, help="use a running broker (else a throwaway Warren is started)")
    ap.add_argument("--mgmt-port", type=int)
    ap.add_argument("--queues", type=int, default=1000)
    ap.add_argument("--backlog", type=int, default=100, help="ready messages in every 4th queue")
    ap.add_argument("--requests", type=int, default=200)
    ap.add_argument("--page-size", type=int, default=100)
    ap.add_argument("--settle", type=float, default=6.0, help="seconds of load before measuring")
    ap.add_argument("--no-load", action="store_true", help="measure without the publish/consume load")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    if (args.amqp_port is None) != (args.mgmt_port is None):
        ap.error("--amqp-port and --mgmt-port go together")

    tmp = tempfile.mkdtemp(prefix="warren-mgmt-bench.")
    broker = load = None
    try:
        if args.amqp_port is None:
            broker, amqp_port, mgmt_port = start_warren(tmp)
        else:
            amqp_port, mgmt_port = args.amqp_port, args.mgmt_port
        consumers = setup(amqp_port, args.queues, args.backlog)
        if not args.no_load:
            load = subprocess.Popen([sys.executable, os.path.join(HERE, "amqp_load.py"), "--port", str(amqp_port),
                                     "--workload", "transient-ack", "--seconds", "600", "--runs", "1"],
                                    stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                                    start_new_session=True)
        time.sleep(args.settle)
        if load is not None and load.poll() is not None:
            raise RuntimeError(f"load generator exited: {load.stderr.read()}")
        results = [measure(mgmt_port, path, args.requests) for path in (
            "/api/queues", f"/api/queues?page=1&page_size={args.page_size}", "/api/whoami")]
        stats = get_json(mgmt_port, "/api/overview")["message_stats"]
        rates = {key: stats.get(f"{key}_details", {}).get("rate", 0.0) for key in ("publish", "deliver_get")}
        consumers.close()
        teardown(amqp_port, args.queues)
    finally:
        if load is not None:
            os.killpg(load.pid, 9)  # the generator and its publisher/consumer processes
            load.wait()
        if broker is not None:
            broker.terminate()
            broker.wait(15)
        shutil.rmtree(tmp, ignore_errors=True)
    if args.json:
        print(json.dumps({"queues": args.queues, "load_rates": rates, "results": results}, indent=2))
    else:
        print(f"{args.queues} queues, {args.requests} requests each, "
              f"{'no load' if args.no_load else 'under transient-ack load'}; node's rates at the end: "
              f"publish {rates['publish']:,.0f}/s, deliver {rates['deliver_get']:,.0f}/s")
        for r in results:
            print(f"GET {r['path']:<40} items {r['items']:>5}  {r['bytes'] / 1024:>7.0f} KiB  "
                  f"p50 {r['p50_ms']:>6.1f} ms  p99 {r['p99_ms']:>6.1f} ms  max {r['max_ms']:>6.1f} ms")
    return 0


if __name__ == "__main__":
    sys.exit(main())
