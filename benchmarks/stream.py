#!/usr/bin/env python3
"""Streams (``x-queue-type: stream``) on one node: publish rate with confirms, and the rate at which a consumer
reads the whole stream back from ``x-stream-offset: first`` (from disk, the stream being far deeper than what
Warren keeps in memory), then the same read by a second consumer (the reads take nothing).

Against any broker on ``--port`` (a Warren node, or RabbitMQ 3.10 for comparison); ``--messages`` 100-byte
persistent messages, ``--in-flight`` unconfirmed at most, consumers with prefetch ``--prefetch`` acking every
100.  Usage: ``python benchmarks/stream.py --port 5672 --messages 300000 --runs 3``
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import uuid

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import amqp_load  # noqa: E402

BODY = b"x" * 100


def connect(port: int) -> amqp_load.Connection:
    conn = amqp_load.Connection("127.0.0.1", port, "guest", "guest")
    conn.channel_open(1)
    return conn


def run(port: int, messages: int, in_flight: int, prefetch: int) -> tuple[float, float, float]:
    name = f"bench-stream-{uuid.uuid4().hex[:8]}"
    conn = connect(port)
    conn.queue_declare(1, name, durable=True, arguments={"x-queue-type": "stream"})
    conn.confirm_select(1)
    result = amqp_load.publish_confirmed(conn, 1, "", name, BODY, messages, max_unconfirmed=in_flight, timeout=600)
    conn.close()
    if result["nacks"]:
        raise RuntimeError(f"{result['nacks']} nacks")
    reads = []
    for _ in range(2):
        conn = connect(port)
        seconds = amqp_load.consume_count(conn, 1, name, messages, prefetch=prefetch, timeout=600,
                                          arguments={"x-stream-offset": "first"})
        conn.close()
        reads.append(messages / seconds)
    conn = connect(port)
    conn.queue_delete(1, name)
    conn.close()
    return messages / result["confirmed_s"], reads[0], reads[1]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, default=5672)
    parser.add_argument("--messages", type=int, default=300_000)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--in-flight", type=int, default=1000)
    parser.add_argument("--prefetch", type=int, default=1000)
    args = parser.parse_args()
    figures = [run(args.port, args.messages, args.in_flight, args.prefetch) for _ in range(args.runs)]
    for label, values in zip(("publish, confirmed", "read from first", "read again"), zip(*figures)):
        print(f"{label:20s} median {statistics.median(values):>9,.0f} msg/s   runs: "
              + ", ".join(f"{v:,.0f}" for v in values))
    return 0


if __name__ == "__main__":
    sys.exit(main())
