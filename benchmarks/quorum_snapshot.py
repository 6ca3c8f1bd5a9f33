"""What a quorum queue's snapshot costs: a follower that missed more than the leader's log keeps is sent the whole
queue (``forwarder.quorum.oplog``).  In one process, on the fake cluster of ``tests/fake_cluster.py`` (three nodes,
their links in memory, a fake etcd): n3 goes down, the leader takes ``--messages`` persistent messages of
``--size`` bytes, n3 comes back and gets a snapshot.  Prints the snapshot's wall time, the process's CPU time
over it, and the process's resident memory before and after (every node is this process).

    .venv/bin/python benchmarks/quorum_snapshot.py --messages 20000 --size 100
    .venv/bin/python benchmarks/quorum_snapshot.py --messages 3000 --size 65536

``--diverged N``: n1, cut off from n2 and n3, makes ``N`` ops no majority has (half of them publishes, a quarter
gets and a quarter acks of those), and is deposed; n2 or n3 leads and takes ``--new`` publishes, and n1's copy,
diverged from where that term began, catches up (a DIFF snapshot: only the rows it lacks; ``--full`` as before
it, the whole queue).  Prints the rows sent besides.

    .venv/bin/python benchmarks/quorum_snapshot.py --messages 100000 --diverged 200 --new 1000 [--full]
"""
from __future__ import annotations

import argparse
import asyncio
import cProfile
import gc
import os
import pstats
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]

from pamqp import commands  # noqa: E402

from amqp_server.message import make_message  # noqa: E402
from fake_cluster import Network  # noqa: E402
from forwarder.quorum import groups as quorum, oplog  # noqa: E402
from forwarder.quorum.groups import queue_key  # noqa: E402

KEY = queue_key("/", "q")


def rss_mib() -> int:
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") >> 20


async def until(check, timeout: float = 600.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise TimeoutError
        await asyncio.sleep(0.01)


async def diverged(network: Network, args: argparse.Namespace) -> None:
    """n1 leads ``--messages``, then takes ``--diverged`` publishes alone and is deposed; n1 catches up."""
    if args.full:  # (a request without what the copy holds: the whole queue, as before DIFF snapshots)
        request = quorum.QuorumGroups._catch_up_request
        quorum.QuorumGroups._catch_up_request = staticmethod(  # type: ignore[method-assign]
            lambda group, term: request(group, term)[:2])
    node = network.nodes["n1"]
    await publish(node, args.messages, args.size)
    await until(lambda: all(lag == 0 for lag in node.quorum.lag()[KEY].values()))
    for other in ("n2", "n3"):
        network.hold("n1", other)
    await publish(node, args.diverged // 2, args.size)  # (on n1 alone)
    queue = node.broker.vhosts["/"].queues["q"]
    taken = [queue.get(no_ack=False) for _ in range(args.diverged // 4)]
    node.broker.settle(queue, [entry for entry in taken if entry is not None], False)
    for other in ("n2", "n3"):
        network.cut("n1", other)
        network.release("n1", other)
    assert node.quorum.lease is not None
    network.etcd.revoke(node.quorum.lease.id)
    await until(lambda: any(other.quorum.groups[KEY].replicator is not None for other in network.nodes.values()
                            if other is not node))
    new = next(other for other in network.nodes.values() if other.quorum.groups[KEY].replicator is not None)
    replicator = new.quorum.groups[KEY].replicator
    assert replicator is not None
    await publish(new, args.new, args.size)
    await until(lambda: all(lag == 0 for name, lag in new.quorum.lag()[KEY].items() if name != "n1"))
    gc.collect()
    before, started, cpu = rss_mib(), time.monotonic(), time.process_time()
    for other in ("n2", "n3"):
        network.heal("n1", other)
    await until(lambda: replicator.followers["n1"].joined and replicator.followers["n1"].snapshot is None
                and new.quorum.lag()[KEY].get("n1") == 0)
    took, cpu = time.monotonic() - started, time.process_time() - cpu
    print(f"{args.messages} messages of {args.size} bytes, {args.diverged} diverged ops, {args.new} new: n1 in step "
          f"again in "
          f"{took:.2f} s, CPU {cpu:.2f} s, {replicator.followers['n1'].rows} rows sent, resident memory {before} -> "
          f"{rss_mib()} MiB")


async def publish(node, count: int, size: int) -> None:
    vhost = node.broker.vhosts["/"]
    properties = commands.Basic.Properties(delivery_mode=2)
    body = b"x" * size
    for i in range(count):
        node.broker.publish(vhost, vhost.exchange(""), make_message("", "q", properties, body))
        if i % 50 == 49:
            await asyncio.sleep(0)


async def run(args: argparse.Namespace) -> None:
    quorum.ELECTION_GRACE, quorum.ELECTION_POLL, quorum.RETRY_INTERVAL = 1.0, 0.02, 0.1
    if not args.diverged:
        oplog.LOG_BYTES = 20_000  # (n3 then misses more than the log: a snapshot)
    with tempfile.TemporaryDirectory() as root:
        network = await Network(Path(root), ["n1", "n2", "n3"]).start()
        try:
            await network.declare("q", "n1")
            await until(lambda: all(node.quorum.groups[KEY].leader == "n1" for node in network.nodes.values()))
            if args.diverged:
                await diverged(network, args)
                return
            node = network.nodes["n1"]
            await network.kill("n3")
            vhost = node.broker.vhosts["/"]
            properties = commands.Basic.Properties(delivery_mode=2)
            body = b"x" * args.size
            for i in range(args.messages):
                node.broker.publish(vhost, vhost.exchange(""), make_message("", "q", properties, body))
                if i % 50 == 49:
                    await asyncio.sleep(0)
            replicator = node.quorum.groups[KEY].replicator
            assert replicator is not None, "n1 no longer leads (a loaded machine: try again)"
            await until(lambda: all(lag == 0 for name, lag in node.quorum.lag()[KEY].items() if name != "n3"))
            gc.collect()
            before, started, cpu = rss_mib(), time.monotonic(), time.process_time()
            profile = cProfile.Profile() if args.profile else None
            if profile is not None:
                profile.enable()
            await network.start_node("n3")
            await until(lambda: replicator.followers["n3"].joined and replicator.followers["n3"].snapshot is None
                        and node.quorum.lag()[KEY].get("n3") == 0)  # (n3 applied it all and said so)
            took, cpu = time.monotonic() - started, time.process_time() - cpu
            if profile is not None:
                profile.disable()
                pstats.Stats(profile).sort_stats("tottime").print_stats(25)
            gc.collect()
            print(f"{args.messages} messages of {args.size} bytes: snapshot {took:.2f} s, CPU {cpu:.2f} s, "
                  f"resident memory {before} -> {rss_mib()} MiB")
        finally:
            await network.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--messages", type=int, default=20000)
    parser.add_argument("--size", type=int, default=100, help="body size, bytes")
    parser.add_argument("--profile", action="store_true", help="print the 25 costliest functions (cProfile)")
    parser.add_argument("--diverged", type=int, default=0, help="ops a deposed leader alone took")
    parser.add_argument("--new", type=int, default=1000, help="with --diverged: publishes at the new leader")
    parser.add_argument("--full", action="store_true", help="with --diverged: a snapshot of the whole queue")
    asyncio.run(run(parser.parse_args()))


if __name__ == "__main__":
    main()
