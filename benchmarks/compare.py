#!/usr/bin/env python3
"""Warren beside RabbitMQ in one sitting: every row of the README's performance table, and their ratios.

Each round runs ``run_warren.sh`` and ``run_rabbitmq.sh`` (Debian's rabbitmq-server) one after the other: each
starts its broker on free loopback ports with a data directory of its own, runs every workload once with
``amqp_load.py`` and stops it.  Rounds alternate which broker goes first, so a drift in the machine's load falls
on both alike.  Printed: the date, the load average, each row's median over the rounds for both brokers, Warren
÷ RabbitMQ, and each broker's CPU time per delivery (steadier than throughput when other work shares the
machine), then every round's figures.  Run as root (or the rabbitmq user), on a quiet machine for figures to
publish:

    .venv/bin/python benchmarks/compare.py --rounds 3 --seconds 5

A round takes about 2 minutes with ``--seconds 5``; ``--workload`` picks rows (amqp_load.py's names, NAME@SIZE
for another body size) for a quick check, e.g. ``--workload transient-noack,latency --rounds 1 --seconds 1``;
``--workload large`` runs the large bodies' rows (64 KiB, 1 MiB and 16 MiB), with each broker's CPU per MiB and
peak resident memory.
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass, field

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from amqp_load import parse_workload  # noqa: E402 (after sys.path takes this folder)
from cluster import free_port  # noqa: E402 (after sys.path takes this folder)

# The README's performance table: its rows' words, and the amqp_load.py workload behind each.
ROWS = {
    "transient-noack": "transient, one queue, no-ack",
    "transient-ack": "transient, manual ack, prefetch 200",
    "priority": "the same through an `x-max-priority` 10 queue, random priorities",
    "fanout4": "fanout to 4 queues, no-ack",
    "persistent-confirm": "persistent, durable queue, confirms (1,000 in flight), manual ack",
    "persistent-confirm@4096": "the same, 4 KiB bodies",
    "persistent-confirm@65536": "the same, 64 KiB bodies",
    "latency": "round trip, one message at a time",
}
# Large bodies (``--workload large``): persistent with confirms and transient with manual acks, at 64 KiB, 1 MiB
# and 16 MiB; their table gives the broker's CPU per MiB moved and its peak resident memory as well.
LARGE = {f"{name}@{size}": f"{words}, {label} bodies"
         for size, label in ((65536, "64 KiB"), (1 << 20, "1 MiB"), (16 << 20, "16 MiB"))
         for name, words in (("persistent-confirm", "persistent, durable queue, confirms, manual ack"),
                             ("transient-ack", "transient, manual ack"))}


@dataclass
class Broker:
    name: str
    script: str
    version: str = ""
    runs: dict[str, list[dict]] = field(default_factory=dict)  # workload -> one result per round
    failures: list[str] = field(default_factory=list)

    def env(self) -> dict[str, str]:
        """Free ports for the run (and, for RabbitMQ, a node name of its own)."""
        ports = {"BENCH_PORT": str(free_port()), "BENCH_DIST_PORT": str(free_port()),
                 "BENCH_NODENAME": f"compare-{os.getpid()}-{time.monotonic_ns()}@localhost"}
        return {**os.environ, **ports}

    def run(self, workloads: list[str], seconds: float, timeout: float) -> None:
        """One round: start the broker, run each workload once, stop it; the results kept per workload."""
        args = [os.path.join(HERE, self.script), "--workload", ",".join(workloads), "--seconds", f"{seconds:g}",
                "--runs", "1", "--json"]
        script = subprocess.Popen(args, env=self.env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                  start_new_session=True)
        try:
            out, err = script.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(script.pid, signal.SIGTERM)  # the script's trap stops its broker and removes its data
            out, err = script.communicate(timeout=60)
            self.failures.append(f"timed out after {timeout:.0f} s")
        try:
            report = json.loads(out)
        except json.JSONDecodeError:
            self.failures.append(f"{self.script} exited {script.returncode}: {err.strip()[-500:]}")
            return
        self.version = self.version or f"{report['server'].get('product')} {report['server'].get('version')}"
        for workload, entry in report["results"].items():
            if "error" in entry:
                self.failures.append(f"{workload}: {entry['error']}")
            self.runs.setdefault(workload, []).extend(entry["runs"])

    def median(self, workload: str, key: str) -> float | None:
        values = [run[key] for run in self.runs.get(workload, []) if key in run]
        return statistics.median(values) if values else None


def figure(broker: Broker, workload: str) -> str:
    if workload.startswith("latency"):
        p50, p99 = broker.median(workload, "p50_us"), broker.median(workload, "p99_us")
        return "n/a" if p50 is None else f"p50 {p50:,.0f} µs, p99 {p99:,.0f} µs"
    rate = broker.median(workload, "rate")
    unit = "deliveries/s" if workload.startswith("fanout4") else "msg/s"
    return "n/a" if rate is None else f"{rate:,.0f} {unit}"


def ratio(warren: Broker, rabbitmq: Broker, workload: str, key: str) -> str:
    ours, theirs = warren.median(workload, key), rabbitmq.median(workload, key)
    return "n/a" if ours is None or not theirs else f"{ours / theirs:.2f}×"


def ratios(warren: Broker, rabbitmq: Broker, workload: str) -> str:
    if workload.startswith("latency"):
        return (f"p50 {ratio(warren, rabbitmq, workload, 'p50_us')}, p99 {ratio(warren, rabbitmq, workload, 'p99_us')}"
                " (time: lower is better)")
    return ratio(warren, rabbitmq, workload, "rate")


def cpu(warren: Broker, rabbitmq: Broker, workload: str) -> str:
    ours, theirs = warren.median(workload, "broker_cpu_us"), rabbitmq.median(workload, "broker_cpu_us")
    if ours is None or theirs is None:
        return "n/a"
    return f"{ours:.1f} / {theirs:.1f} µs ({ours / theirs:.2f}×)"


def per_mib(warren: Broker, rabbitmq: Broker, workload: str) -> str:
    ours, theirs = warren.median(workload, "broker_cpu_us_per_mib"), rabbitmq.median(workload, "broker_cpu_us_per_mib")
    if ours is None or theirs is None:
        return "n/a"
    return f"{ours / 1000:.2f} / {theirs / 1000:.2f} ms ({ours / theirs:.2f}×)"


def peak_rss(warren: Broker, rabbitmq: Broker, workload: str) -> str:
    ours, theirs = warren.median(workload, "broker_peak_rss_mib"), rabbitmq.median(workload, "broker_peak_rss_mib")
    return "n/a" if ours is None or theirs is None else f"{ours:,.0f} / {theirs:,.0f} MiB"


def per_round(broker: Broker, workload: str) -> str:
    runs = broker.runs.get(workload, [])
    if workload.startswith("latency"):
        return ", ".join(f"{run['p50_us']:.0f}/{run['p99_us']:.0f} µs" for run in runs)
    return ", ".join(f"{run['rate']:,.0f}" for run in runs)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=3, help="runs of each broker; medians over them (3)")
    parser.add_argument("--seconds", type=float, default=5.0, help="measured seconds per workload and run (5)")
    parser.add_argument("--workload", default=",".join(ROWS),
                        help="amqp_load.py workloads, comma separated (default: the README table's rows; 'large': "
                        "the large bodies' rows)")
    args = parser.parse_args(argv)
    workloads = [w.strip() for w in args.workload.replace("large", ",".join(LARGE)).split(",") if w.strip()]
    bad = [w for w in workloads if parse_workload(w, 100) is None]
    if bad:
        parser.error(f"unknown workload(s): {', '.join(bad)}")
    warren, rabbitmq = Broker("Warren", "run_warren.sh"), Broker("RabbitMQ", "run_rabbitmq.sh")
    timeout = 180 + len(workloads) * (args.seconds + 30)
    started, load_before = time.monotonic(), os.getloadavg()
    for round_ in range(args.rounds):
        for broker in (warren, rabbitmq) if round_ % 2 == 0 else (rabbitmq, warren):
            print(f"round {round_ + 1}/{args.rounds}: {broker.name} ...", file=sys.stderr, flush=True)
            broker.run(workloads, args.seconds, timeout)
    minutes, load_after = (time.monotonic() - started) / 60, os.getloadavg()

    print(f"{datetime.date.today().isoformat()} on {socket.gethostname()} ({os.cpu_count()} cores): "
          f"{warren.version or 'Warren'} beside {rabbitmq.version or 'RabbitMQ'}, medians of {args.rounds} "
          f"round{'s' if args.rounds > 1 else ''} of {args.seconds:g} s per workload, brokers one after the other "
          "(order alternating); "
          f"{minutes:.1f} min, load average {load_before[0]:.2f} before and {load_after[0]:.2f} after\n")
    large = [workload for workload in workloads if workload in LARGE]
    small = [workload for workload in workloads if workload not in LARGE]
    if small:
        print(f"| workload | Warren | {rabbitmq.version or 'RabbitMQ'} | Warren ÷ RabbitMQ "
              "| broker CPU per delivery, Warren / RabbitMQ |")
        print("|---|---|---|---|---|")
    for workload in small:
        print(f"| {ROWS.get(workload, workload)} | {figure(warren, workload)} | {figure(rabbitmq, workload)} "
              f"| {ratios(warren, rabbitmq, workload)} | {cpu(warren, rabbitmq, workload)} |")
    if large:
        print(f"\n| workload | Warren | {rabbitmq.version or 'RabbitMQ'} | Warren ÷ RabbitMQ "
              "| broker CPU per MiB, Warren / RabbitMQ | broker peak RSS, Warren / RabbitMQ |")
        print("|---|---|---|---|---|---|")
    for workload in large:
        print(f"| {LARGE[workload]} | {figure(warren, workload)} | {figure(rabbitmq, workload)} "
              f"| {ratios(warren, rabbitmq, workload)} | {per_mib(warren, rabbitmq, workload)} "
              f"| {peak_rss(warren, rabbitmq, workload)} |")
    print("\nper round (throughput, or latency p50/p99):")
    for workload in workloads:
        print(f"  {workload:<26} Warren {per_round(warren, workload)}; RabbitMQ {per_round(rabbitmq, workload)}")
    for broker in (warren, rabbitmq):
        for failure in broker.failures:
            print(f"{broker.name} failed: {failure}", file=sys.stderr)
    return 1 if warren.failures or rabbitmq.failures else 0


if __name__ == "__main__":
    sys.exit(main())
