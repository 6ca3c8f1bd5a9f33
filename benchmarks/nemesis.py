#!/usr/bin/env python3
"""A nemesis for replicated (quorum) queues: a workload of confirming publishers and a consumer, all
reconnecting, while a seeded schedule of faults hits the cluster, some at once; then a checker of what was
confirmed.

Warren (``--broker warren``, run as root): etcd and three nodes, each in a network namespace of its own on
a bridge in another one, made for the run (``ip netns``, veth) and removed after it, whatever happens; the
workload runs in a namespace of its own too, so every address lives inside namespaces the run made, and a
node cut off from etcd and its peers still has its clients.
RabbitMQ (``--broker rabbitmq``): the three nodes of ``rabbitmq-cluster.sh`` (127.0.0.1:5681-5683; the tool
is ``../shared/tools/rabbitmq-cluster.sh`` from the repository's root, or ``--rabbitmq-cluster PATH``), which
the run starts and stops; they share loopback, so a cut drops with iptables what one node sends on its
connections to the other.  A fault on etcd is quiet time in its schedule, so that a seed draws the same
schedule for both brokers.

Workload: one queue (``x-queue-type: quorum``); one publisher per node sends persistent 100-byte messages,
not mandatory (``--mandatory`` to make them so), with confirms (``--in-flight`` unconfirmed at most,
``--rate`` per second); a message nacked, returned or unconfirmed when its connection went is not sent again.
One consumer (manual acks, prefetch 50) stays on a node until any error, then moves to the next.  A publisher
whose connection stays silent for ``STALL`` seconds with messages unconfirmed drops it and connects again.
A watcher asks every node's HTTP API for the queue twice a second.  Meanwhile a durable classic queue is
declared and bound every second through the next node, and an older one deleted.  Some seeds (drawn) run a
CPU hog beside the cluster (``--hog``).

Faults (``--schedule random``: drawn from ``--seed``, in steps 2-6 s apart, half of them two faults at once,
the second beginning during the first; lengths uniform in 0.3-11 s; ``issue``: the fixed schedule the
replicated queue first failed under, one fault at a time; ``rabbitmq``: the same without its etcd step):
  pause (SIGSTOP) the leader or a follower; kill -9 the leader or a follower and start it again after the
  fault's length; freeze etcd (SIGSTOP) or kill it and start it again; cut the leader from the followers (not
  from etcd or its clients); cut a node (the leader, or a follower) off from etcd and both peers but not its
  clients; cut one node from etcd only; an asymmetric cut (what the leader sends to one follower is lost, what
  that follower sends arrives).  Pairs drawn on purpose leave no side with a majority (the leader cut off
  while a follower is paused or dead, ...) or hit etcd during a kill or a pause of the leader.

Checker, once every fault is healed, publishing stopped and the queue drained by the consumer, then through
each node in turn: every confirmed message delivered at least once, or else lost; one found only after every
node (then etcd too) restarted from its data is "stranded", reported apart (``--no-recover``: no restarts,
and as many as the leader still holds ready are stranded); duplicates; no message confirmed to a publisher
whose node was on a side without a majority (paused or dead, or reaching and heard by no running peer) from
before it was published until after it was confirmed (each pause checked to have stopped its node, from its
start to its end: ``pauses_not_held`` names any that did not); the periods with no majority anywhere; per publisher,
deliveries out of publish order and the longest gap between confirms; the longest gap between any two
confirms; nacks; ready messages no consumer got for ``STUCK`` seconds while one was attached; every time a
node answered without the queue; every node with the same declared queues and bindings, and with each one
answered as made (not deleted since) and none answered as deleted.

Usage (as root):  python benchmarks/nemesis.py --seed 7
                  python benchmarks/nemesis.py --seeds 1-20 --broker both   # and the distribution over them
                  python benchmarks/nemesis.py --summary nemesis-results.jsonl
                  python benchmarks/nemesis.py --broker rabbitmq --schedule rabbitmq
The last line printed is the report as JSON (``--json`` prints only that).
"""
from __future__ import annotations

import argparse
import asyncio
import concurrent.futures
import ctypes
import json
import os
import random
import shutil
import signal
import statistics
import struct
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import amqp_load  # noqa: E402 (after sys.path takes this folder)
import etcd_local  # noqa: E402 (after sys.path takes this folder)
from amqp_load import method_frame, publish_frames, shortstr, table  # noqa: E402 (after sys.path takes this folder)

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
QUEUE = "nemesis"
STALL = 5.0  # a publisher connection silent this long with messages unconfirmed is given up
CONNECT_TIMEOUT = 3.0
LENGTH = (0.3, 11.0)  # a fault's length, seconds, drawn uniformly
GAP = (2.0, 6.0)  # quiet seconds between two steps of a random schedule
OVERLAP = 0.5  # the share of a random schedule's steps that are two faults at once
WATCH = 0.5  # every node's HTTP API is asked for the queue this often, seconds
STUCK = 10.0  # ready messages no consumer got for this long, with one attached, are "stuck"
IDLE = 4.0  # the final drain through a node ends after this long without a delivery
DRAIN = 60.0  # ... or after this long
DRAIN_LAST = 900.0  # ... but the last one after a restart, which goes on while messages come: what a slow drain
# had yet to reach was counted lost
HOG = 0.35  # the share of seeds with a CPU hog beside the cluster
AMQP_PORT, MGMT_PORT, LINK_PORT, ETCD_PORT = 5701, 15701, 25701, 2379
SUBNET = "10.77.0"
ETCD_ADDRESS, CLIENT_ADDRESS = f"{SUBNET}.2", f"{SUBNET}.100"
# start/kill/restart/stop; CI lays shared/ beside the clone
RABBIT_TOOL = os.path.join(os.path.dirname(ROOT), "shared", "tools", "rabbitmq-cluster.sh")
CLONE_NEWNET = 0x40000000

KINDS = ["pause-leader", "pause-follower", "kill-leader", "kill-follower", "freeze-etcd", "restart-etcd",
         "cut-leader-from-followers", "cut-off-leader", "cut-off-follower", "cut-node-from-etcd", "cut-asymmetric"]
ETCD_KINDS = {"freeze-etcd", "restart-etcd"}
NEEDS_ETCD = ETCD_KINDS | {"cut-node-from-etcd"}
# two faults that leave no side with a majority while they overlap (each hits another node)
NO_MAJORITY = [("cut-off-leader", "pause-follower"), ("cut-off-leader", "kill-follower"),
               ("cut-leader-from-followers", "pause-follower"), ("pause-leader", "cut-off-follower"),
               ("kill-leader", "cut-off-follower")]
ETCD_DURING = [("freeze-etcd", "kill-leader"), ("restart-etcd", "kill-leader"), ("freeze-etcd", "pause-leader"),
               ("freeze-etcd", "cut-off-follower")]

# -- the schedule ---------------------------------------------------------------------------------------------

@dataclass
class Fault:
    kind: str
    seconds: float  # how long it lasts (a pause, a cut, a frozen etcd) or the node stays dead
    gap: float = 0.0  # quiet seconds after its step (on the step's first fault)
    after: float = 0.0  # seconds after its step began that it begins (a second fault of a step overlaps the first)
    step: int = 0
    started: float = 0.0  # when it began and ended, seconds since the workload's start
    ended: float = 0.0
    target: str = ""  # the node it hit (named when it runs)


def _length(rng: random.Random) -> float:
    return round(rng.uniform(*LENGTH), 2)


def random_schedule(seed: int, seconds: float, kinds: list[str]) -> list[Fault]:
    """Faults for about ``seconds`` in steps 2-6 s apart: a step is one fault, or (``OVERLAP`` of them) two, the
    second beginning while the first lasts; half of these pairs are drawn from ``NO_MAJORITY`` and
    ``ETCD_DURING``, the others from any two kinds not both on etcd."""
    rng = random.Random(seed)
    faults: list[Fault] = []
    at, step = 0.0, 0
    pairs = [pair for pair in NO_MAJORITY + ETCD_DURING if set(pair) <= set(kinds)]
    while at < seconds:
        first = Fault(rng.choice(kinds), _length(rng), step=step)
        chosen = [first]
        if rng.random() < OVERLAP:
            if pairs and rng.random() < 0.5:
                a, b = rng.choice(pairs)
                first.kind, second_kind = (a, b) if rng.random() < 0.5 else (b, a)
            else:
                second_kind = rng.choice([k for k in kinds if not {k, first.kind} <= ETCD_KINDS] or kinds)
            second = Fault(second_kind, _length(rng), after=round(rng.uniform(0.0, first.seconds), 2), step=step)
            chosen.append(second)
        first.gap = round(rng.uniform(*GAP), 2)
        faults += chosen
        at += max(f.after + f.seconds for f in chosen) + first.gap
        step += 1
    return faults


def issue_schedule(with_etcd: bool) -> list[Fault]:
    """The schedule a replicated queue once vanished under (and RabbitMQ's figures were taken with, without the
    etcd step): one fault at a time."""
    steps = [Fault("pause-leader", 6, 8), Fault("kill-follower", 3, 8), Fault("freeze-etcd", 4, 8),
             Fault("kill-leader", 3, 8), Fault("pause-follower", 6, 8), Fault("pause-leader", 1, 2),
             Fault("pause-leader", 3, 8), Fault("kill-leader", 0.5, 8)]
    kept = [fault for fault in steps if with_etcd or fault.kind not in NEEDS_ETCD]
    for index, fault in enumerate(kept):
        fault.step = index
    return kept


# -- network namespaces ---------------------------------------------------------------------------------------

def sh(*command: str, check: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run(command, capture_output=True, text=True, check=check, timeout=30)


class Network:
    """A bridge in a namespace of its own (``<prefix>-hub``) and a namespace per member (etcd, the nodes, the
    clients), each with one veth on the bridge and one address in ``SUBNET``.  Cuts are blackhole routes in a
    member's namespace: what it sends to that address is dropped."""

    def __init__(self, prefix: str, members: dict[str, str]) -> None:
        self.prefix = prefix
        self.members = members  # name -> address
        self.cuts: Counter = Counter()  # (member, address it cannot send to) -> faults that cut it

    def ns(self, member: str) -> str:
        return f"{self.prefix}-{member}"

    def create(self) -> None:
        hub = self.ns("hub")
        sh("ip", "netns", "add", hub)
        sh("ip", "netns", "exec", hub, "ip", "link", "add", "br0", "type", "bridge")
        sh("ip", "netns", "exec", hub, "ip", "link", "set", "br0", "up")
        for index, (member, address) in enumerate(self.members.items()):
            ns = self.ns(member)
            sh("ip", "netns", "add", ns)
            sh("ip", "netns", "exec", hub, "ip", "link", "add", f"v{index}", "type", "veth", "peer", "name", "eth0",
               "netns", ns)
            sh("ip", "netns", "exec", hub, "ip", "link", "set", f"v{index}", "master", "br0", "up")
            sh("ip", "netns", "exec", ns, "ip", "addr", "add", f"{address}/24", "dev", "eth0")
            sh("ip", "netns", "exec", ns, "ip", "link", "set", "eth0", "up")
            sh("ip", "netns", "exec", ns, "ip", "link", "set", "lo", "up")

    def cut(self, member: str, other: str) -> tuple[str, str]:
        """What ``member`` sends to ``other`` is lost until ``uncut`` of what this returns (as often as it was
        cut: overlapping faults may cut the same way)."""
        key = (member, self.members[other])
        if not self.cuts[key]:
            sh("ip", "netns", "exec", self.ns(member), "ip", "route", "add", "blackhole", f"{key[1]}/32")
        self.cuts[key] += 1
        return key

    def uncut(self, key: tuple[str, str]) -> None:
        self.cuts[key] -= 1
        if not self.cuts[key]:
            del self.cuts[key]
            sh("ip", "netns", "exec", self.ns(key[0]), "ip", "route", "del", "blackhole", f"{key[1]}/32", check=False)

    def enter(self, member: str) -> None:
        """This process (its main thread, and the threads it starts later) moves into ``member``'s namespace."""
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        fd = os.open(f"/var/run/netns/{self.ns(member)}", os.O_RDONLY)
        try:
            if libc.setns(fd, CLONE_NEWNET) != 0:
                raise OSError(ctypes.get_errno(), "setns")
        finally:
            os.close(fd)

    @staticmethod
    def remove(prefix: str) -> None:
        """Kill what runs in the run's namespaces and delete them (also those a killed run left)."""
        listed = sh("ip", "netns", "list", check=False).stdout.split()
        for ns in [name for name in listed if name.startswith(f"{prefix}-")]:
            for pid in sh("ip", "netns", "pids", ns, check=False).stdout.split():
                if int(pid) == os.getpid():
                    continue  # this run, in its client namespace
                try:
                    os.kill(int(pid), signal.SIGKILL)
                except ProcessLookupError:
                    pass
            sh("ip", "netns", "del", ns, check=False)


# -- the brokers ----------------------------------------------------------------------------------------------

class Cluster:
    """Three nodes and what the nemesis does to them."""

    names: list[str]
    addresses: list[tuple[str, int, int]]  # (host, AMQP port, HTTP port) per node
    has_etcd = False

    def api(self, index: int, path: str, timeout: float = 2.0) -> Any:
        """GET ``/api{path}`` of a node's HTTP API (as guest); its JSON."""
        host, _, mgmt = self.addresses[index]
        request = urllib.request.Request(f"http://{host}:{mgmt}/api{path}")
        request.add_header("Authorization", "Basic Z3Vlc3Q6Z3Vlc3Q=")
        with urllib.request.urlopen(request, timeout=timeout) as reply:
            return json.load(reply)

    def leader(self) -> str | None:
        """The queue's leader as a running node's HTTP API says (None: none known)."""
        for index in self.running():
            try:
                leader = self.api(index, f"/queues/%2F/{QUEUE}").get("leader")
            except (OSError, ValueError):
                continue
            if leader in self.names:
                return leader
        return None

    def depth(self) -> int | None:
        """Ready plus unacked messages of the queue, as the leader's node says."""
        leader = self.leader()
        try:
            info = self.api(self.names.index(leader), f"/queues/%2F/{QUEUE}") if leader else None
        except (OSError, ValueError):
            return None
        return None if info is None else info.get("messages_ready", 0) + info.get("messages_unacknowledged", 0)

    def declared_on(self, index: int) -> bool:
        try:
            return self.api(index, f"/queues/%2F/{QUEUE}", timeout=5).get("name") == QUEUE
        except urllib.error.HTTPError:
            return False

    def running(self) -> list[int]:
        raise NotImplementedError

    def pause(self, index: int) -> None:
        raise NotImplementedError

    def pid(self, index: int) -> int | None:
        """The process a pause stops (None: not running)."""
        raise NotImplementedError

    def resume(self, index: int) -> None:
        raise NotImplementedError

    def kill(self, index: int) -> None:
        raise NotImplementedError

    async def restart(self, index: int) -> None:
        raise NotImplementedError

    def cut(self, index: int, other: int | None) -> list[Any]:
        """What node ``index`` sends to node ``other`` (None: to etcd) is lost until ``uncut`` of what this
        returns."""
        raise NotImplementedError

    def uncut(self, cuts: list[Any]) -> None:
        raise NotImplementedError

    def stop_nodes(self) -> None:
        """Stop every node (etcd left running)."""
        raise NotImplementedError

    def start_nodes(self) -> None:
        """Start every node again from its data, and wait until they see each other."""
        raise NotImplementedError

    def restart_etcd(self) -> None:
        raise NotImplementedError


class Warren(Cluster):
    has_etcd = True

    def __init__(self, network: Network, data: str) -> None:
        self.network = network
        self.data = data
        self.names = [f"warren{i}@n{i}" for i in (1, 2, 3)]
        self.hosts = [f"{SUBNET}.{10 + i}" for i in (1, 2, 3)]
        self.addresses = [(host, AMQP_PORT, MGMT_PORT) for host in self.hosts]
        self.procs: list[subprocess.Popen | None] = [None, None, None]
        self.paused: set[int] = set()
        self.etcd: subprocess.Popen | None = None
        self.etcd_paused = False

    def start(self) -> None:
        self.start_etcd()
        for index in range(3):
            self.start_node(index)
        self._wait_for_nodes()

    def _wait_for_nodes(self) -> None:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if all(self._nodes_seen(index) == 3 for index in range(3)):
                return
            time.sleep(0.2)
        raise RuntimeError("the nodes did not see each other")

    def _nodes_seen(self, index: int) -> int:
        try:
            return sum(1 for node in self.api(index, "/nodes") if node["running"])
        except (OSError, ValueError):
            return 0

    def start_etcd(self) -> None:
        url, peer = f"http://{ETCD_ADDRESS}:{ETCD_PORT}", f"http://{ETCD_ADDRESS}:{ETCD_PORT + 1}"
        log = open(os.path.join(self.data, "etcd.log"), "ab")
        self.etcd = subprocess.Popen(
            ["ip", "netns", "exec", self.network.ns("etcd"),
             *etcd_local.command("nemesis", os.path.join(self.data, "etcd"), url, peer)],
            stdout=log, stderr=subprocess.STDOUT)
        log.close()
        if not etcd_local.healthy(url, 20):
            raise RuntimeError("etcd did not start")

    def start_node(self, index: int) -> None:
        log = open(os.path.join(self.data, f"node{index + 1}.log"), "ab")
        self.procs[index] = subprocess.Popen(
            ["ip", "netns", "exec", self.network.ns(f"n{index + 1}"), sys.executable, "-m", "amqp_server",
             "--bind", self.hosts[index], "--amqp-port", str(AMQP_PORT), "--mgmt-port", str(MGMT_PORT),
             "--data-dir", os.path.join(self.data, f"node{index + 1}"), "--node-name", self.names[index],
             "--cluster-etcd", f"{ETCD_ADDRESS}:{ETCD_PORT}", "--cluster-secret", "nemesis",
             "--cluster-port", str(LINK_PORT), "--loopback-users-only", "false"],
            cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, env=dict(os.environ, COLUMNS="200"))
        log.close()

    def running(self) -> list[int]:
        return [i for i, proc in enumerate(self.procs) if proc is not None and proc.poll() is None
                and i not in self.paused]

    def pause(self, index: int) -> None:
        self.procs[index].send_signal(signal.SIGSTOP)
        self.paused.add(index)

    def pid(self, index: int) -> int | None:
        proc = self.procs[index]
        return proc.pid if proc is not None else None

    def resume(self, index: int) -> None:
        self.procs[index].send_signal(signal.SIGCONT)
        self.paused.discard(index)

    def kill(self, index: int) -> None:
        self.procs[index].kill()
        self.procs[index].wait()
        self.paused.discard(index)

    async def restart(self, index: int) -> None:
        self.start_node(index)

    def cut(self, index: int, other: int | None) -> list[Any]:
        cuts = [self.network.cut(f"n{index + 1}", "etcd" if other is None else f"n{other + 1}")]
        if other is None:
            cuts.append(self.network.cut("etcd", f"n{index + 1}"))
        return cuts

    def uncut(self, cuts: list[Any]) -> None:
        for key in cuts:
            self.network.uncut(key)

    def stop_nodes(self) -> None:
        for proc in self.procs:
            if proc is not None and proc.poll() is None:
                proc.send_signal(signal.SIGCONT)
                proc.terminate()
                try:
                    proc.wait(15)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()
        self.paused.clear()

    def start_nodes(self) -> None:
        for index in range(3):
            self.start_node(index)
        self._wait_for_nodes()

    def restart_etcd(self) -> None:
        self.thaw_etcd()
        self.kill_etcd()
        self.start_etcd()

    def freeze_etcd(self) -> None:
        self.etcd.send_signal(signal.SIGSTOP)
        self.etcd_paused = True

    def thaw_etcd(self) -> None:
        self.etcd.send_signal(signal.SIGCONT)
        self.etcd_paused = False

    def kill_etcd(self) -> None:
        self.etcd.kill()
        self.etcd.wait()

    def stop(self) -> None:
        for proc in [*self.procs, self.etcd]:
            if proc is not None and proc.poll() is None:
                proc.send_signal(signal.SIGCONT)
                proc.kill()
                proc.wait()


class Rabbit(Cluster):
    """``rabbitmq-cluster.sh``'s three nodes; a pause stops the node's Erlang VM.  They share the loopback
    interface, so a cut drops (iptables, OUTPUT on lo) what one node's VM sends on each TCP connection it has
    with the other's at the time: their distribution link, which Erlang keeps open through a cut shorter than
    its net_ticktime (60 s), so no new one is made meanwhile.  A cut to a node that is down cuts nothing."""

    def __init__(self, tool: str) -> None:
        self.tool = tool
        self.names = [f"rabbit{i}@localhost" for i in (1, 2, 3)]
        self.addresses = [("127.0.0.1", 5680 + i, 15680 + i) for i in (1, 2, 3)]
        self.pids: list[int | None] = [None, None, None]
        self.paused: set[int] = set()

    def start(self) -> None:
        subprocess.run([self.tool, "start"], check=True, timeout=600)
        for index in range(3):
            self.pids[index] = self._pid(index)

    def stop_nodes(self) -> None:
        for index, pid in enumerate(self.pids):
            if pid is not None:
                self.resume(index)
                self.kill(index)

    def start_nodes(self) -> None:
        """All three at once: a node started alone waits for the others' tables."""
        starts = [subprocess.Popen([self.tool, "restart", str(index + 1)], stdout=subprocess.DEVNULL,
                                   stderr=subprocess.DEVNULL) for index in range(3)]
        for index, proc in enumerate(starts):
            proc.wait(300)
            self.pids[index] = self._pid(index)

    def restart_etcd(self) -> None:
        """(No etcd here.)"""

    @staticmethod
    def _pid(index: int) -> int:
        out = subprocess.run(["rabbitmqctl", "-n", f"rabbit{index + 1}@localhost", "eval", "os:getpid()."],
                             capture_output=True, text=True, timeout=60, check=True).stdout
        return int(out.strip().strip('"'))

    def running(self) -> list[int]:
        return [i for i, pid in enumerate(self.pids) if pid is not None and i not in self.paused]

    def pause(self, index: int) -> None:
        os.kill(self.pids[index], signal.SIGSTOP)
        self.paused.add(index)

    def pid(self, index: int) -> int | None:
        return self.pids[index]

    def resume(self, index: int) -> None:
        os.kill(self.pids[index], signal.SIGCONT)
        self.paused.discard(index)

    def kill(self, index: int) -> None:
        os.kill(self.pids[index], signal.SIGKILL)
        self.pids[index] = None
        self.paused.discard(index)

    async def restart(self, index: int) -> None:
        proc = await asyncio.create_subprocess_exec(self.tool, "restart", str(index + 1),
                                                    stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        await proc.wait()
        self.pids[index] = await asyncio.get_running_loop().run_in_executor(None, self._pid, index)

    def cut(self, index: int, other: int | None) -> list[Any]:
        if other is None or self.pids[index] is None or self.pids[other] is None:
            return []
        owners = {}  # (local port, peer port) -> the owner's pid, of every established TCP connection on loopback
        listed = sh("ss", "-tnpH", "state", "established", "src", "127.0.0.1", "dst", "127.0.0.1")
        for line in listed.stdout.splitlines():
            fields = line.split()
            if len(fields) >= 5 and "pid=" in fields[-1]:
                ends = int(fields[2].rsplit(":", 1)[1]), int(fields[3].rsplit(":", 1)[1])
                owners[ends] = int(fields[-1].split("pid=", 1)[1].split(",", 1)[0])
        links = [(local, peer) for (local, peer), pid in owners.items()
                 if pid == self.pids[index] and owners.get((peer, local)) == self.pids[other]]
        rules = []
        for local, peer in links:
            rule = ["OUTPUT", "-o", "lo", "-p", "tcp", "--sport", str(local), "--dport", str(peer), "-j", "DROP"]
            sh("iptables", "-I", *rule)
            rules.append(rule)
        return rules

    def uncut(self, cuts: list[Any]) -> None:
        for rule in cuts:
            sh("iptables", "-D", *rule, check=False)

    def stop(self) -> None:
        for pid in self.pids:
            if pid is not None:
                try:
                    os.kill(pid, signal.SIGCONT)
                except ProcessLookupError:
                    pass
        subprocess.run([self.tool, "stop"], timeout=300, capture_output=True)


# -- a small asyncio AMQP client ------------------------------------------------------------------------------

class Closed(Exception):
    pass


HEAD = struct.Struct("!BHI")
CLASS_METHOD = struct.Struct("!HH")


class Connection:
    """One AMQP connection with channel 1 open; ``frame()`` returns the next (type, payload) on the channel."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader = reader
        self.writer = writer
        self.buffer = bytearray()
        self.last_read = time.monotonic()

    @classmethod
    async def open(cls, host: str, port: int) -> "Connection":
        reader, writer = await asyncio.wait_for(asyncio.open_connection(host, port), CONNECT_TIMEOUT)
        connection = cls(reader, writer)
        try:
            await asyncio.wait_for(connection._handshake(), CONNECT_TIMEOUT)
        except BaseException:
            connection.abort()
            raise
        return connection

    async def _handshake(self) -> None:
        self.writer.write(b"AMQP\x00\x00\x09\x01")
        await self.method(10, 10)
        props = table({"product": "warren-nemesis", "capabilities": {
            "publisher_confirms": True, "consumer_cancel_notify": True, "basic.nack": True}})
        self.writer.write(method_frame(0, 10, 11, props + shortstr("PLAIN") + amqp_load.longstr(b"\0guest\0guest")
                                       + shortstr("en_US")))
        await self.method(10, 30)
        self.writer.write(method_frame(0, 10, 31, struct.pack("!HIH", 16, 131072, 0)))
        self.writer.write(method_frame(0, 10, 40, shortstr("/") + shortstr("") + b"\x00"))
        await self.method(10, 41)
        self.writer.write(method_frame(1, 20, 10, shortstr("")))
        await self.method(20, 11)

    def abort(self) -> None:
        self.writer.transport.abort()

    async def close(self) -> None:
        try:
            self.writer.write(method_frame(0, 10, 50, struct.pack("!H", 200) + shortstr("bye") + b"\0\0\0\0"))
            await asyncio.wait_for(self.writer.drain(), 1)
        except (OSError, asyncio.TimeoutError, ConnectionError):
            pass
        self.abort()

    async def frame(self) -> tuple[int, bytes]:
        """The next frame: (type, payload); connection and channel closes raise Closed."""
        while True:
            buffer = self.buffer
            if len(buffer) >= 7:
                kind, _, size = HEAD.unpack_from(buffer)
                if len(buffer) >= 8 + size:
                    payload = bytes(buffer[7:7 + size])
                    del buffer[:8 + size]
                    if kind == 1:
                        class_id, method_id = CLASS_METHOD.unpack_from(payload)
                        if (class_id, method_id) in ((10, 50), (20, 40)):
                            code, length = struct.unpack_from("!HB", payload, 4)
                            raise Closed(f"{code} {payload[7:7 + length].decode(errors='replace')}")
                    return kind, payload
            data = await self.reader.read(65536)
            if not data:
                raise Closed("connection lost")
            self.last_read = time.monotonic()
            buffer += data

    async def method(self, class_id: int, method_id: int) -> bytes:
        """Wait for a method (frames before it are dropped: only used before anything else flows)."""
        while True:
            kind, payload = await self.frame()
            if kind == 1 and CLASS_METHOD.unpack_from(payload) == (class_id, method_id):
                return payload[4:]

    async def content(self) -> bytes:
        """The body of a delivery or a return whose method was just read."""
        kind, payload = await self.frame()
        size = struct.unpack_from("!Q", payload, 4)[0]
        body = bytearray()
        while len(body) < size:
            kind, payload = await self.frame()
            body += payload
        return bytes(body)


def publish(body: bytes, mandatory: bool) -> bytes:
    """basic.publish of a persistent message to the queue; mandatory: unroutable is returned, then acked (not
    mandatory, as most applications publish: unroutable is dropped and acked)."""
    frames = publish_frames(1, "", QUEUE, body, True, 131072)
    if not mandatory:
        return frames
    method = method_frame(1, 60, 40, struct.pack("!H", 0) + shortstr("") + shortstr(QUEUE) + b"\x01")
    return method + frames[len(method):]


def message_id(body: bytes) -> str:
    return body.split(b".", 1)[0].decode()


# -- the workload ---------------------------------------------------------------------------------------------

@dataclass
class Publisher:
    index: int
    host: str
    port: int
    rate: float
    in_flight: int
    mandatory: bool = False
    published: dict[int, float] = field(default_factory=dict)  # seq -> when sent
    confirmed: dict[int, float] = field(default_factory=dict)  # seq -> when confirmed
    nacked: list[float] = field(default_factory=list)  # when each nack came
    returned: set[int] = field(default_factory=set)
    unknown: set[int] = field(default_factory=set)  # unconfirmed when the connection went
    connections: int = 0
    seq: int = 0

    async def run(self, stop: asyncio.Event, started: float) -> None:
        while not stop.is_set():
            try:
                connection = await Connection.open(self.host, self.port)
            except (OSError, asyncio.TimeoutError, Closed, ConnectionError, asyncio.IncompleteReadError):
                await asyncio.sleep(0.5)
                continue
            self.connections += 1
            outstanding: dict[int, int] = {}  # delivery tag -> seq
            try:
                connection.writer.write(method_frame(1, 85, 10, b"\x00"))
                await asyncio.wait_for(connection.method(85, 11), CONNECT_TIMEOUT)
                await self._session(connection, outstanding, stop, started)
            except (OSError, asyncio.TimeoutError, Closed, ConnectionError, asyncio.IncompleteReadError):
                pass
            finally:
                self.unknown.update(outstanding.values())
                connection.abort()
            await asyncio.sleep(0.2)

    async def _session(self, connection: Connection, outstanding: dict[int, int], stop: asyncio.Event,
                       started: float) -> None:
        loop = asyncio.get_running_loop()
        reading = loop.create_task(self._read(connection, outstanding, started))
        tag = 0
        next_at = loop.time()
        try:
            while not stop.is_set() and not reading.done():
                now = loop.time()
                if len(outstanding) >= self.in_flight or now < next_at:
                    if outstanding and time.monotonic() - connection.last_read > STALL:
                        raise Closed("stalled")
                    await asyncio.sleep(min(0.01, max(next_at - now, 0.001)))
                    continue
                if connection.writer.is_closing():
                    raise Closed("connection lost")
                next_at = max(next_at + 1 / self.rate, now - 0.1)  # no burst of more than 0.1 s behind
                self.seq += 1
                tag += 1
                outstanding[tag] = self.seq
                self.published[self.seq] = time.monotonic() - started
                connection.writer.write(publish(f"p{self.index}-{self.seq}.".encode().ljust(100, b"x"),
                                                self.mandatory))
            if not reading.done() and outstanding:  # the last confirms, for a little while
                deadline = loop.time() + STALL
                while outstanding and loop.time() < deadline and not reading.done():
                    await asyncio.sleep(0.05)
        finally:
            reading.cancel()
            try:
                await reading
            except (asyncio.CancelledError, Closed, OSError, ConnectionError):
                pass

    async def _read(self, connection: Connection, outstanding: dict[int, int], started: float) -> None:
        while True:
            kind, payload = await connection.frame()
            if kind != 1:
                continue
            method = CLASS_METHOD.unpack_from(payload)
            if method in ((60, 80), (60, 120)):
                tag, multiple = struct.unpack_from("!QB", payload, 4)
                tags = [t for t in outstanding if t <= tag] if multiple & 1 else [tag]
                now = time.monotonic() - started
                for done in tags:
                    seq = outstanding.pop(done, None)
                    if seq is None:
                        continue
                    if method == (60, 80) and seq not in self.returned:
                        self.confirmed[seq] = now
                    elif method == (60, 120):
                        self.nacked.append(now)
            elif method == (60, 50):  # basic.return (mandatory): unroutable, not confirmed as stored
                body = await connection.content()
                self.returned.add(int(message_id(body).split("-")[1]))


@dataclass
class Consumer:
    """One consumer (manual acks, prefetch 50) that stays on a node until an error (a closed connection or
    channel, a cancel, a refused connection), then moves to the next node."""

    hosts: list[tuple[str, int]]
    deliveries: Counter = field(default_factory=Counter)  # message id -> times delivered
    order: dict[int, list[int]] = field(default_factory=dict)  # publisher -> seqs in first-delivery order
    last_delivery: float = 0.0
    connections: int = 0
    ended: Counter = field(default_factory=Counter)  # why its sessions ended
    started: float = 0.0
    # each message come a second time: (when, when it came first, redelivered flag the second time), so that a
    # prefetch window sent again at once (a consumer or leader lost) is told from one returned to the queue's back
    again: list[tuple[float, float, bool]] = field(default_factory=list)
    first: dict[str, float] = field(default_factory=dict)  # message id -> when it came first
    attached: int | None = None  # the node it consumes through now (consume-ok received), if any
    phase: str = "run"  # what deliveries count towards: the run, or a drain after restarts
    found: dict[str, set[str]] = field(default_factory=dict)  # phase -> message ids first delivered in it
    # (when sent, seconds until consume-ok, or until the session ended unanswered) of each basic.consume
    consume_waits: list[tuple[float, float, bool]] = field(default_factory=list)
    # each session of ``run`` that ended in an error: (connected, ended, node, why, messages come again in it),
    # to lay its duplicates beside the faults of the moment: a lost session is a fault's or unexplained
    sessions: list[tuple[float, float, int, str, int]] = field(default_factory=list)

    async def run(self, stop: asyncio.Event) -> None:
        turn = 0
        while not stop.is_set():
            node = turn % len(self.hosts)
            try:
                connection = await Connection.open(*self.hosts[node])
            except (OSError, asyncio.TimeoutError, Closed, ConnectionError, asyncio.IncompleteReadError) as exc:
                self.ended[f"connect: {str(exc)[:60] or type(exc).__name__}"] += 1
                turn += 1
                await asyncio.sleep(0.2)
                continue
            self.connections += 1
            connected, again = time.monotonic() - self.started, len(self.again)
            session = asyncio.ensure_future(self._session(connection, node))
            stopping = asyncio.ensure_future(stop.wait())
            await asyncio.wait([session, stopping], return_when=asyncio.FIRST_COMPLETED)
            stopping.cancel()
            if not session.done():
                session.cancel()
            try:
                await session
            except asyncio.CancelledError:
                pass
            except (OSError, Closed, ConnectionError, asyncio.IncompleteReadError) as exc:
                why = str(exc)[:80] or type(exc).__name__
                self.ended[why] += 1
                self.sessions.append((round(connected, 1), round(time.monotonic() - self.started, 1),
                                      node, why, len(self.again) - again))
                turn += 1  # the next node, after any error
                await asyncio.sleep(0.2)  # as a client would, before it tries again
            finally:
                self.attached = None
                await connection.close()

    async def drain(self, node: int, limit: float) -> int:
        """Consume through one node until ``IDLE`` seconds pass without a delivery (at most ``limit``); how many
        came."""
        before = sum(self.deliveries.values())
        try:
            connection = await Connection.open(*self.hosts[node])
        except (OSError, asyncio.TimeoutError, Closed, ConnectionError, asyncio.IncompleteReadError):
            return 0
        session = asyncio.ensure_future(self._session(connection, node))
        deadline = time.monotonic() + limit
        try:
            while not session.done() and time.monotonic() < deadline:
                await asyncio.sleep(0.5)
                if time.monotonic() - max(self.last_delivery, deadline - limit) > IDLE:
                    break
        finally:
            session.cancel()
            try:
                await session
            except (asyncio.CancelledError, OSError, Closed, ConnectionError, asyncio.IncompleteReadError):
                pass
            self.attached = None
            await connection.close()
        return sum(self.deliveries.values()) - before

    async def _session(self, connection: Connection, node: int) -> None:
        writer = connection.writer
        writer.write(method_frame(1, 60, 10, struct.pack("!IHB", 0, 50, 0)))
        await connection.method(60, 11)
        writer.write(method_frame(1, 60, 20, struct.pack("!H", 0) + shortstr(QUEUE) + shortstr("c") + b"\x00"
                                  + table(None)))
        sent = time.monotonic()
        try:
            await self._consuming(connection, node, sent)
        finally:
            if self.attached != node:  # (never answered)
                self.consume_waits.append((round(sent - self.started, 1), round(time.monotonic() - sent, 1), False))

    async def _consuming(self, connection: Connection, node: int, sent: float) -> None:
        writer = connection.writer
        while True:
            kind, payload = await connection.frame()
            if kind != 1:
                continue
            method = CLASS_METHOD.unpack_from(payload)
            if method == (60, 60):
                tag_at = 4 + 1 + payload[4]
                tag = struct.unpack_from("!Q", payload, tag_at)[0]
                redelivered = bool(payload[tag_at + 8] & 1)
                body = await connection.content()
                self._delivered(message_id(body), redelivered)
                if writer.is_closing():
                    raise Closed("connection lost")
                writer.write(method_frame(1, 60, 80, struct.pack("!QB", tag, 0)))
            elif method == (60, 21):
                self.attached = node
                self.consume_waits.append((round(sent - self.started, 1), round(time.monotonic() - sent, 1), True))
            elif method == (60, 30):  # basic.cancel from the broker (the leader moved)
                raise Closed("cancelled")

    def _delivered(self, mid: str, redelivered: bool = False) -> None:
        self.last_delivery = time.monotonic()
        at = self.last_delivery - self.started
        self.deliveries[mid] += 1
        if self.deliveries[mid] == 2:
            self.again.append((at, self.first[mid], redelivered))
        if self.deliveries[mid] == 1:
            self.first[mid] = at
            self.found.setdefault(self.phase, set()).add(mid)
            publisher, seq = mid[1:].split("-")
            self.order.setdefault(int(publisher), []).append(int(seq))


@dataclass
class Watcher:
    """Asks every node's HTTP API for the queue every ``WATCH`` seconds: a node that answers without it (404)
    is a queue missing from that node's view.  Keeps the episodes in which the consumer is attached and gets
    nothing for ``STUCK`` seconds while confirmed messages wait undelivered (more confirmed than delivered, or
    the leader says some are ready), and every 5 s a line of the leader's counts."""

    cluster: Cluster
    consumer: Consumer
    publishers: list[Publisher]
    started: float
    missing: list[tuple[float, str]] = field(default_factory=list)  # (when, node) it answered without the queue
    stuck: list[dict[str, Any]] = field(default_factory=list)  # episodes: from, to, most waiting, node attached
    ready: int = 0  # messages_ready in the last answer of a node that said it leads the queue
    leader: dict[str, Any] = field(default_factory=dict)  # that answer
    timeline: list[list[Any]] = field(default_factory=list)
    views: int = 0
    _episode: dict[str, Any] | None = None

    async def run(self, stop: asyncio.Event) -> None:
        loop = asyncio.get_running_loop()
        pool = concurrent.futures.ThreadPoolExecutor(3)
        asking: dict[int, asyncio.Future] = {}
        try:
            while not stop.is_set():
                for node in range(3):
                    if node not in asking or asking[node].done():
                        asking[node] = loop.run_in_executor(pool, self.look, node)
                await asyncio.sleep(WATCH)
                self._check_stuck()
                if len(self.timeline) * 5 < time.monotonic() - self.started:
                    self._line()
            await asyncio.gather(*asking.values())
        finally:
            pool.shutdown(wait=False)
        self._close_episode()

    def look(self, node: int) -> dict[str, Any] | None:
        at = time.monotonic() - self.started
        name = self.cluster.names[node]
        try:
            info = self.cluster.api(node, f"/queues/%2F/{QUEUE}", timeout=2)
        except urllib.error.HTTPError as exc:
            if exc.code == 404:
                self.missing.append((round(at, 1), name))
            return None
        except (OSError, ValueError):
            return None  # not answering (paused, dead, starting): not a view
        self.views += 1
        if info.get("leader") == name:
            self.ready = info.get("messages_ready", 0)
            self.leader = info
        return info

    def _check_stuck(self) -> None:
        now, attached = time.monotonic(), self.consumer.attached
        waiting = max(self.ready, self._undelivered())
        stuck = waiting > 0 and attached is not None and now - self.consumer.last_delivery > STUCK
        if stuck and self._episode is None and attached is not None:
            self._episode = {"from": round(self.consumer.last_delivery - self.started, 1), "waiting": waiting,
                             "attached": self.cluster.names[attached]}
        elif stuck and self._episode is not None:
            self._episode["waiting"] = max(self._episode["waiting"], waiting)
        elif not stuck:
            self._close_episode()

    def _undelivered(self) -> int:
        """At least this many confirmed messages are not delivered yet (whatever was delivered unconfirmed)."""
        return sum(len(p.confirmed) for p in self.publishers) - len(self.consumer.deliveries)

    def _line(self) -> None:
        """[seconds, leader, ready, unacked, consumers (as the leader said last), consumer attached through,
        confirmed minus delivered]."""
        info, attached = self.leader, self.consumer.attached
        self.timeline.append([round(time.monotonic() - self.started), info.get("leader"),
                              info.get("messages_ready"), info.get("messages_unacknowledged"),
                              info.get("consumers"), None if attached is None else self.cluster.names[attached],
                              self._undelivered()])

    def _close_episode(self) -> None:
        if self._episode is not None:
            self._episode["to"] = round(time.monotonic() - self.started, 1)
            self.stuck.append(self._episode)
            self._episode = None


@dataclass
class Definitions:
    """Definitions made and deleted while the faults go on: every second a durable classic queue ``def-N`` is
    declared and bound to amq.direct through the next node, and an older one deleted; what was answered ok is
    what every node must have (or not have) once the faults are healed."""

    hosts: list[tuple[str, int]]
    made: set[str] = field(default_factory=set)  # declared and bound (both answered ok)
    deleted: set[str] = field(default_factory=set)  # delete answered ok
    tried: set[str] = field(default_factory=set)  # a delete was sent (its outcome may be unknown)
    failed: int = 0

    async def run(self, stop: asyncio.Event) -> None:
        turn = 0
        while not stop.is_set():
            await asyncio.sleep(1.0)
            host, port = self.hosts[turn % len(self.hosts)]
            name = f"def-{turn}"
            turn += 1
            older = sorted(self.made - self.tried, key=lambda n: int(n[4:]))
            try:
                connection = await Connection.open(host, port)
            except (OSError, asyncio.TimeoutError, Closed, ConnectionError, asyncio.IncompleteReadError):
                self.failed += 1
                continue
            try:
                await asyncio.wait_for(self._change(connection, name, older[0] if turn % 2 and older else None), 5)
            except (OSError, asyncio.TimeoutError, Closed, ConnectionError, asyncio.IncompleteReadError):
                self.failed += 1
            await connection.close()

    async def _change(self, connection: Connection, name: str, victim: str | None) -> None:
        writer = connection.writer
        writer.write(method_frame(1, 50, 10, struct.pack("!H", 0) + shortstr(name) + b"\x02" + table(None)))
        await connection.method(50, 11)
        writer.write(method_frame(1, 50, 20, struct.pack("!H", 0) + shortstr(name) + shortstr("amq.direct")
                                  + shortstr(name) + b"\x00" + table(None)))
        await connection.method(50, 21)
        self.made.add(name)
        if victim is not None:
            self.tried.add(victim)
            writer.write(method_frame(1, 50, 40, struct.pack("!H", 0) + shortstr(victim) + b"\x00"))
            await connection.method(50, 41)
            self.deleted.add(victim)

    def check(self, cluster: "Cluster") -> dict[str, Any]:
        """Each node's def-* queues and their bindings against what was answered, once they agree (or 30 s)."""
        deadline = time.monotonic() + 30
        while True:
            seen = [self._held(cluster, index) for index in range(3)]
            if all(view == seen[0] for view in seen) or time.monotonic() > deadline:
                break
            time.sleep(1)
        kept = self.made - self.tried
        return {"made": len(self.made), "deleted": len(self.deleted), "failed": self.failed,
                "nodes_disagree": any(view != seen[0] for view in seen),
                "missing": sorted({name for queues, bound in seen for name in kept - (queues & bound)}),
                "resurrected": sorted({name for queues, bound in seen for name in self.deleted & (queues | bound)})}

    @staticmethod
    def _held(cluster: "Cluster", index: int) -> tuple[set[str], set[str]]:
        """(queues, queues bound to amq.direct) named def-* on a node."""
        try:
            queues = {q["name"] for q in cluster.api(index, "/queues/%2F", timeout=10) if q["name"].startswith("def-")}
            bound = {b["destination"] for b in cluster.api(index, "/exchanges/%2F/amq.direct/bindings/source",
                                                         timeout=10) if b["destination"].startswith("def-")}
        except (OSError, ValueError):
            return set(), set()
        return queues, bound


# -- the nemesis ----------------------------------------------------------------------------------------------

class Nemesis:
    """Runs a schedule's steps (the faults of a step at once, each at its offset; the next step once all of them
    are over and the step's gap has passed), and keeps, from what it did, when each node was on a side without
    a majority: stopped, or with no running node it could both reach and hear."""

    def __init__(self, cluster: Cluster, started: float) -> None:
        self.cluster = cluster
        self.started = started
        self.log: list[str] = []
        self.stopped: Counter = Counter()  # node -> faults pausing or killing it now
        self.links_down: Counter = Counter()  # (node, node it cannot send to) -> faults cutting it now
        self.busy: set[int] = set()  # nodes paused or dead now (another pause or kill picks another)
        self.cuts: list[list[Any]] = []  # cuts in place now (healed at the end, whatever happens)
        self.minority_since: dict[int, float] = {}
        self.minority: list[tuple[int, float, float]] = []  # (node, from, to)
        self.nowhere_since: float | None = None
        self.no_majority: list[tuple[float, float]] = []  # no node on a side with a majority
        # pauses that did not stop their node, or not to their end (the minority accounting assumes they did: a
        # run once counted 11,135 confirms of a leader as a minority's, no other node having found it silent)
        self.unheld: list[str] = []

    def now(self) -> float:
        return time.monotonic() - self.started

    def note(self, text: str) -> str:
        self.log.append(f"{self.now():7.1f} {text}")
        print(self.log[-1], flush=True)
        return self.log[-1]

    def _changed(self) -> None:
        """Called after every change of the faults in place: opens and closes the minority episodes."""
        now = self.now()
        alone = set()
        for node in range(3):
            peers = [other for other in range(3) if other != node and not self.stopped[other]
                     and not self.links_down[(node, other)] and not self.links_down[(other, node)]]
            if self.stopped[node] or not peers:
                alone.add(node)
        for node in range(3):
            if node in alone and node not in self.minority_since:
                self.minority_since[node] = now
            elif node not in alone and node in self.minority_since:
                self.minority.append((node, self.minority_since.pop(node), now))
        if len(alone) == 3 and self.nowhere_since is None:
            self.nowhere_since = now
            self.note("no side has a majority")
        elif len(alone) < 3 and self.nowhere_since is not None:
            self.no_majority.append((self.nowhere_since, now))
            self.nowhere_since = None
            self.note("a majority again")

    def finish(self) -> None:
        """Heal what is left (an error stopped the schedule) and close the open episodes."""
        for cuts in self.cuts:
            self.cluster.uncut(cuts)
        self.cuts.clear()
        self.stopped.clear()
        self.links_down.clear()
        self._changed()

    async def leader(self) -> int:
        """The leader's index, waiting a little for one to be known (node 1 if none)."""
        for _ in range(30):
            name = await asyncio.get_running_loop().run_in_executor(None, self.cluster.leader)
            if name is not None:
                return self.cluster.names.index(name)
            await asyncio.sleep(0.2)
        return 0

    async def target(self, fault: Fault, taken: set[int]) -> int:
        """The node a fault hits: the leader, or a follower (one this step has not hit yet, if any); a pause or a
        kill passes over nodes already paused or dead."""
        leader = await self.leader()
        process = fault.kind.startswith(("pause", "kill"))
        allowed = [node for node in range(3) if not (process and node in self.busy)]
        if "leader" in fault.kind or fault.kind == "cut-asymmetric":
            choices = [leader] if leader in allowed else allowed
        elif "follower" in fault.kind:
            followers = [node for node in allowed if node != leader]
            choices = [node for node in followers if node not in taken] or followers or allowed
        else:
            choices = [node for node in allowed if node not in taken] or allowed
        return random.Random(int(self.now() * 1000)).choice(choices)

    async def run(self, faults: list[Fault]) -> None:
        steps: dict[int, list[Fault]] = {}
        for fault in faults:
            steps.setdefault(fault.step, []).append(fault)
        try:
            for step in steps.values():
                taken: set[int] = set()
                begun = self.now()
                await asyncio.gather(*(self._at(begun + fault.after, fault, taken) for fault in step))
                await asyncio.sleep(step[0].gap)
        finally:
            self.finish()

    async def _at(self, when: float, fault: Fault, taken: set[int]) -> None:
        await asyncio.sleep(max(0.0, when - self.now()))
        await self.apply(fault, taken)

    async def apply(self, fault: Fault, taken: set[int]) -> None:
        cluster, kind = self.cluster, fault.kind
        node = -1
        if kind not in ETCD_KINDS:
            node = await self.target(fault, taken)
            taken.add(node)
            fault.target = cluster.names[node]
        fault.started = self.now()
        if kind in NEEDS_ETCD and not cluster.has_etcd:  # the same schedule, its etcd faults as quiet time
            self.note(f"{kind}: no etcd here, quiet for {fault.seconds} s")
            await asyncio.sleep(fault.seconds)
            fault.ended = self.now()
            return
        self.note(f"{kind} {fault.target} for {fault.seconds} s")
        if kind.startswith(("pause", "kill")):
            self.busy.add(node)
            self.stopped[node] += 1
            if kind.startswith("pause"):
                cluster.pause(node)
                if not await _stopped(cluster.pid(node), 1.0):
                    self.unheld.append(self.note(f"the pause of {fault.target} did not take"))
            else:
                cluster.kill(node)
            self._changed()
            await asyncio.sleep(fault.seconds)
            self.stopped[node] -= 1  # (as it starts again: what it confirms once back counts as a majority's)
            if kind.startswith("pause"):
                if not await _stopped(cluster.pid(node), 0.0):
                    self.unheld.append(self.note(f"{fault.target} was running before its pause ended"))
                cluster.resume(node)
            self._changed()
            if kind.startswith("kill"):
                await cluster.restart(node)
            self.busy.discard(node)
        elif kind == "freeze-etcd":
            cluster.freeze_etcd()
            await asyncio.sleep(fault.seconds)
            cluster.thaw_etcd()
        elif kind == "restart-etcd":
            cluster.kill_etcd()
            await asyncio.sleep(fault.seconds)
            await asyncio.get_running_loop().run_in_executor(None, cluster.start_etcd)
        else:
            others = [i for i in range(3) if i != node]
            if kind in ("cut-leader-from-followers", "cut-off-leader", "cut-off-follower"):
                pairs = [(node, other) for other in others] + [(other, node) for other in others]
            elif kind == "cut-asymmetric":  # the leader's frames to one follower are lost, that follower's reach it
                pairs = [(node, others[0])]
            else:
                pairs = []
            cuts = [cut for a, b in pairs for cut in cluster.cut(a, b)]
            if kind in ("cut-off-leader", "cut-off-follower", "cut-node-from-etcd"):
                cuts += cluster.cut(node, None)
            self.cuts.append(cuts)
            for pair in pairs:
                self.links_down[pair] += 1
            self._changed()
            await asyncio.sleep(fault.seconds)
            for pair in pairs:
                self.links_down[pair] -= 1
            self._changed()
            self.cuts.remove(cuts)
            cluster.uncut(cuts)
        self._changed()
        fault.ended = self.now()
        self.note(f"{kind} {fault.target} over")


async def _stopped(pid: int | None, within: float) -> bool:
    """The process is stopped (SIGSTOP) now, or becomes so within ``within`` seconds (the signal is taken as the
    kernel schedules it)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + within
    while pid is not None:
        try:
            with open(f"/proc/{pid}/stat") as stat:
                state = stat.read().rsplit(")", 1)[1].split()[0]
        except (OSError, IndexError):
            return False
        if state in ("T", "t"):
            return True
        if loop.time() >= deadline:
            return False
        await asyncio.sleep(0.01)
    return False


# -- the run --------------------------------------------------------------------------------------------------

async def workload(cluster: Cluster, faults: list[Fault], args: argparse.Namespace,
                   report: dict[str, Any]) -> None:
    started = time.monotonic()
    report["started_at"] = time.strftime("%H:%M:%S", time.gmtime())  # the nodes' logs' clock at time 0
    hosts = [(host, port) for host, port, _ in cluster.addresses]
    connection = await Connection.open(*hosts[0])
    connection.writer.write(method_frame(1, 50, 10, struct.pack("!H", 0) + shortstr(QUEUE) + b"\x02"
                                         + table({"x-queue-type": "quorum"})))
    await connection.method(50, 11)
    await connection.close()
    publishers = [Publisher(i, host, port, args.rate, args.in_flight, args.mandatory)
                  for i, (host, port) in enumerate(hosts)]
    consumer = Consumer(hosts, started=started)
    watcher = Watcher(cluster, consumer, publishers, started)
    definitions = Definitions(hosts)
    stop_publishing, stop_consuming, stop_watching = asyncio.Event(), asyncio.Event(), asyncio.Event()
    loop = asyncio.get_running_loop()
    tasks = [loop.create_task(p.run(stop_publishing, started)) for p in publishers]
    tasks.append(loop.create_task(definitions.run(stop_publishing)))
    consuming = loop.create_task(consumer.run(stop_consuming))
    watching = loop.create_task(watcher.run(stop_watching))
    nemesis = Nemesis(cluster, started)
    await asyncio.sleep(args.warmup)
    await nemesis.run(faults)
    nemesis.note("every fault healed; publishing on")
    settle = loop.time() + args.settle
    before = sum(len(p.confirmed) for p in publishers)
    while loop.time() < settle or sum(len(p.confirmed) for p in publishers) <= before:
        if loop.time() > settle + 60:
            nemesis.note("no confirm for 60 s after the faults")
            break
        await asyncio.sleep(0.5)
    stop_publishing.set()
    await asyncio.gather(*tasks)
    nemesis.note("publishers stopped; draining")
    deadline = loop.time() + args.drain
    while loop.time() < deadline:
        await asyncio.sleep(1)
        idle = time.monotonic() - consumer.last_delivery
        if idle > 5:
            left = await loop.run_in_executor(None, cluster.depth)
            if left == 0 or idle > 3 * STUCK:  # (what is left and not delivered for so long: the drains next)
                break
    stop_consuming.set()
    await consuming
    consumer.phase = "drain through each node"
    for node in range(3):
        got = await consumer.drain(node, DRAIN)
        nemesis.note(f"drained {got} through {cluster.names[node]}")
    left = await loop.run_in_executor(None, cluster.depth)
    stop_watching.set()
    await watching
    held = watcher.ready
    nemesis.note(f"drained ({left} messages left in the queue, {held} ready)")
    confirmed = {f"p{p.index}-{seq}" for p in publishers for seq in p.confirmed}
    for phase, restart in (("after restarting the nodes", False), ("after restarting etcd and the nodes", True)):
        if not args.recover or not confirmed - set(consumer.deliveries):
            break
        nemesis.note(f"{len(confirmed - set(consumer.deliveries))} confirmed not delivered: draining {phase}")
        try:
            await loop.run_in_executor(None, recover, cluster, restart)
        except (OSError, RuntimeError, subprocess.SubprocessError) as exc:  # what was found so far still counts
            nemesis.note(f"restarting failed: {exc}")
            report["recovery_failed"] = str(exc)
            break
        consumer.phase = phase
        for node in range(3):
            got = await consumer.drain(node, DRAIN if node < 2 else DRAIN_LAST)
            nemesis.note(f"drained {got} through {cluster.names[node]} {phase}")
    report.update(check(publishers, consumer, nemesis, watcher, cluster, held if not args.recover else 0))
    report["left_in_queue"] = left  # not 0 at the end of the drains: stranded (or the drain ran out of time)
    report["definitions"] = await loop.run_in_executor(None, definitions.check, cluster)
    confirms = sorted(at for p in publishers for at in p.confirmed.values())
    for fault in faults:  # the longest time without any confirm that overlapped it (or the 2 s after it)
        gaps = [b - a for a, b in zip(confirms, confirms[1:]) if fault.started < b and a < fault.ended + 2]
        fault.longest_gap = round(max(gaps, default=0.0), 2)  # type: ignore[attr-defined]  # a field added to each fault for the report
    report["faults"] = [vars(fault) for fault in faults]


def recover(cluster: Cluster, with_etcd: bool) -> None:
    """Restart every node from its data (and etcd first, if ``with_etcd``), and wait for a leader."""
    cluster.stop_nodes()
    if with_etcd:
        cluster.restart_etcd()
    cluster.start_nodes()
    deadline = time.monotonic() + 60
    while cluster.leader() is None and time.monotonic() < deadline:
        time.sleep(0.5)


def duplicates_detail(again: list[tuple[float, float, bool]]) -> dict[int, list[Any]]:
    """By the second in which they came again: [how many, how many flagged redelivered, the least and the most
    seconds since each came first]."""
    detail: dict[int, list[Any]] = {}
    for at, first, redelivered in again:
        row = detail.setdefault(int(at), [0, 0, float("inf"), 0.0])
        row[0] += 1
        row[1] += redelivered
        row[2], row[3] = min(row[2], round(at - first, 1)), max(row[3], round(at - first, 1))
    return detail


def check(publishers: list[Publisher], consumer: Consumer, nemesis: Nemesis, watcher: Watcher, cluster: Cluster,
          held: int) -> dict[str, Any]:
    """Lost: confirmed, never delivered.  Stranded: confirmed, not delivered through the run and the drain
    through each node, but found once the nodes (then etcd too) restarted; without those restarts, as many of
    the undelivered as the leader still held ready at the end (``held``)."""
    delivered = consumer.deliveries
    late = set().union(*(ids for phase, ids in consumer.found.items() if phase.startswith("after")))
    lost, stranded, minority = [], [], []
    confirms: list[float] = []
    per_publisher = {}
    for p in publishers:
        ids = {seq: f"p{p.index}-{seq}" for seq in p.published}
        lost += [ids[seq] for seq in p.confirmed if delivered[ids[seq]] == 0]
        stranded += [ids[seq] for seq in p.confirmed if ids[seq] in late]
        times = sorted(p.confirmed.values())
        confirms += times
        order = consumer.order.get(p.index, [])
        out_of_order = sum(1 for a, b in zip(order, order[1:]) if b < a)
        for node, cut, healed in nemesis.minority:
            if node == p.index:
                minority += [ids[seq] for seq, at in p.confirmed.items() if cut < p.published[seq] and at < healed]
        per_publisher[f"p{p.index}"] = {
            "node": cluster.names[p.index], "published": len(p.published), "confirmed": len(p.confirmed),
            "nacked": len(p.nacked), "returned": len(p.returned), "unknown": len(p.unknown),
            "connections": p.connections, "longest_confirm_gap": round(_longest_gap(times)[0], 2),
            "delivered_out_of_order": out_of_order, "max_nacks_per_second": _peak(p.nacked),
            "most_nacks_at": _peak_at(p.nacked)}
    if held and lost:  # no restarts: what the leader still holds ready is stranded, the rest lost
        stranded, lost = lost[:held], lost[held:]
    confirms.sort()
    gap, at = _longest_gap(confirms)
    confirmed_ids = {f"p{p.index}-{seq}" for p in publishers for seq in p.confirmed}
    missing_on = [cluster.names[i] for i in range(3) if not cluster.declared_on(i)]
    return {
        "confirmed": len(confirmed_ids), "lost": len(lost), "lost_runs": _runs(lost, publishers),
        "stranded": len(stranded), "stranded_runs": _runs(stranded, publishers),
        "found_by_phase": {phase: len(ids & confirmed_ids) for phase, ids in consumer.found.items()},
        "duplicates": sum(count - 1 for count in delivered.values() if count > 1),
        "delivered": len(delivered), "unconfirmed_delivered": len(set(delivered) - confirmed_ids),
        "nacked": sum(len(p.nacked) for p in publishers),
        "max_nacks_per_second": _peak(sorted(t for p in publishers for t in p.nacked)),
        "longest_confirm_gap": round(gap, 2), "longest_gap_ends_at": round(at, 1),
        "minority_confirms": len(minority), "minority_sample": sorted(minority)[:20],
        "no_majority": [[round(a, 1), round(b, 1)] for a, b in nemesis.no_majority],
        "no_majority_seconds": round(sum(b - a for a, b in nemesis.no_majority), 1),
        "pauses_not_held": nemesis.unheld,
        "queue_missing_on": missing_on, "queue_missing_seen": len(watcher.missing),
        "queue_missing_sample": watcher.missing[:20], "views": watcher.views, "stuck_while_attached": watcher.stuck,
        "timeline": watcher.timeline,
        "consumer_connections": consumer.connections, "consumer_sessions_ended": dict(consumer.ended),
        "consumer_sessions_lost": [(connected, ended, cluster.names[node], why, again)
                                   for connected, ended, node, why, again in consumer.sessions],
        # [sent at, seconds, answered]: the basic.consume that waited longest for consume-ok (a quorum queue's
        # consume waits up to 10 s for a leader, as RabbitMQ's member does)
        "longest_consume_wait": max(consumer.consume_waits, key=lambda wait: wait[1], default=None),
        "duplicates_by_second": dict(Counter(int(t) for t, _, _ in consumer.again)),
        "duplicates_detail": duplicates_detail(consumer.again),
        "confirms_by_second": dict(Counter(int(t) for t in confirms)),
        "nacks_by_second": dict(Counter(int(t) for p in publishers for t in p.nacked)),
        "publishers": per_publisher, "nemesis": nemesis.log}


def _runs(ids: list[str], publishers: list[Publisher]) -> dict[str, list[list[float]]]:
    """Per publisher, its runs of consecutive seqs among ``ids``: [first, last, published at, confirmed at] (the
    first's times, seconds since the start)."""
    seqs: dict[int, list[int]] = {}
    for mid in ids:
        publisher, number = mid[1:].split("-")
        seqs.setdefault(int(publisher), []).append(int(number))
    runs: dict[str, list[list[float]]] = {}
    for index, numbers in sorted(seqs.items()):
        numbers.sort()
        p = publishers[index]
        start = prev = numbers[0]
        for seq in [*numbers[1:], 0]:  # (0: no seq, the end)
            if seq == prev + 1:
                prev = seq
                continue
            runs.setdefault(f"p{index}", []).append(
                [start, prev, round(p.published[start], 2), round(p.confirmed.get(start, -1), 2)])
            start = prev = seq
    return runs


def _longest_gap(times: list[float]) -> tuple[float, float]:
    best, at = 0.0, 0.0
    for a, b in zip(times, times[1:]):
        if b - a > best:
            best, at = b - a, b
    return best, at


def _peak(times: list[float]) -> int:
    """The most of these that fell within one second."""
    counts = Counter(int(t) for t in times)
    return max(counts.values(), default=0)


def _peak_at(times: list[float]) -> int | None:
    """The second (since the start) in which most of these fell."""
    counts = Counter(int(t) for t in times)
    return max(counts, key=counts.__getitem__, default=None)


def hog_drawn(seed: int) -> bool:
    """Whether a seed runs with a CPU hog beside the cluster (drawn apart from its schedule)."""
    return random.Random(f"hog-{seed}").random() < HOG


def parse_seeds(text: str) -> list[int]:
    """``1-20``, ``3,5,9`` or both (``1-5,9``)."""
    seeds: list[int] = []
    for part in text.split(","):
        low, _, high = part.partition("-")
        seeds += range(int(low), int(high or low) + 1)
    return seeds


def run_seeds(argv: list[str], seeds: list[int], brokers: list[str], results: str) -> None:
    """Each seed (on each broker) in a run of its own, its report appended to ``results``; then the summary."""
    passed: list[str] = []
    skip = False
    for arg in argv:  # this command's options, but for those that pick runs
        if skip:
            skip = False
        elif arg in ("--seeds", "--broker", "--results", "--seed"):
            skip = True
        elif not arg.startswith(("--seeds=", "--broker=", "--results=", "--seed=", "--json")):
            passed.append(arg)
    for seed in seeds:
        for broker in brokers:
            command = [sys.executable, os.path.abspath(__file__), *passed, "--seed", str(seed), "--broker", broker,
                       "--json"]
            run = subprocess.run(command, capture_output=True, text=True)
            lines = run.stdout.strip().splitlines()
            try:
                report = json.loads(lines[-1])
            except (IndexError, ValueError):
                report = {"broker": broker, "seed": seed, "error": run.stderr[-2000:]}
            with open(results, "a") as out:
                out.write(json.dumps(report) + "\n")
            print(one_line(report), flush=True)
    print(summary([results]))


def one_line(report: dict[str, Any]) -> str:
    if "error" in report:
        return f"{report['broker']} seed {report['seed']}: failed to run: {report['error'][-300:]}"
    return (f"{report['broker']} seed {report['seed']}: confirmed {report['confirmed']}, lost {report['lost']}, "
            f"stranded {report['stranded']}, duplicates {report['duplicates']}, nacked {report['nacked']}, gap "
            f"{report['longest_confirm_gap']} s, minority confirms {report['minority_confirms']}, queue missing "
            f"{report['queue_missing_seen']}, no majority {report['no_majority_seconds']} s, hog "
            f"{report.get('cpu_hog')}, load {report.get('load_average')}, data {report.get('data', '-')}"
            + (f", PAUSES NOT HELD {len(report['pauses_not_held'])}" if report.get("pauses_not_held") else ""))


SUMMED = ["confirmed", "lost", "stranded", "duplicates", "nacked", "longest_confirm_gap", "minority_confirms",
          "queue_missing_seen", "no_majority_seconds"]


def summary(paths: list[str]) -> str:
    """The distribution (median, worst) of each figure over the runs in ``paths``, per broker, then each seed's
    figures, Warren beside RabbitMQ where both ran (the last run of a seed and schedule counts)."""
    runs: dict[tuple[str, str, int], dict[str, Any]] = {}
    for path in paths:
        with open(path) as lines:
            for line in lines:
                report = json.loads(line)
                if "error" not in report:
                    runs[(report["broker"], report["schedule"], report["seed"])] = report
    brokers = sorted({broker for broker, _, _ in runs}, key=lambda b: b != "warren")
    out = ["| figure | " + " | ".join(f"{b}: median | {b}: worst" for b in brokers) + " |",
           "|---|" + "---|---|" * len(brokers)]
    for key in SUMMED:
        cells = []
        for broker in brokers:
            values = sorted(r[key] for (b, _, _), r in runs.items() if b == broker)
            worst = values[0] if key == "confirmed" else values[-1]
            cells += [f"{statistics.median(values):g}", f"{worst:g}"]
        out.append(f"| {key} | " + " | ".join(cells) + " |")
    for broker in brokers:
        ran = [r for (b, _, _), r in runs.items() if b == broker]
        out.append(f"{broker}: {len(ran)} runs, {sum(1 for r in ran if r['lost'])} with lost, "
                   f"{sum(1 for r in ran if r['stranded'])} with stranded, "
                   f"{sum(1 for r in ran if r['queue_missing_seen'])} with the queue missing from a view, "
                   f"{sum(1 for r in ran if r['minority_confirms'])} with minority confirms")
    out += ["", "| schedule | seed | hog | " + " | ".join(f"{key}" for key in SUMMED) + " |",
            "|---|---|---|" + "---|" * len(SUMMED)]
    for schedule, seed in sorted({(s, n) for _, s, n in runs}):
        row = [runs.get((b, schedule, seed)) for b in brokers]
        cells = [" / ".join("-" if r is None else f"{r[key]:g}" for r in row) for key in SUMMED]
        hog = " / ".join("-" if r is None else ("yes" if r.get("cpu_hog") else "no") for r in row)
        out.append(f"| {schedule} | {seed} | {hog} | " + " | ".join(cells) + " |")
    out.append("(cells: " + " / ".join(brokers) + ")")
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--broker", choices=("warren", "rabbitmq", "both"), default="warren",
                        help="both: each seed of --seeds on Warren, then on RabbitMQ")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--seeds", help="run these seeds one after another (1-20, 3,5,9) and summarise them")
    parser.add_argument("--results", default="nemesis-results.jsonl",
                        help="with --seeds: each run's report is appended to this file")
    parser.add_argument("--summary", nargs="+", metavar="FILE", help="only summarise the reports in these files")
    parser.add_argument("--schedule", choices=("random", "issue", "rabbitmq"), default="random")
    parser.add_argument("--seconds", type=float, default=90, help="length of a random schedule's faults")
    parser.add_argument("--kinds", help="the fault kinds a random schedule draws from, comma-separated (default: "
                                        "all)")
    parser.add_argument("--hog", choices=("seed", "on", "off"), default="seed",
                        help="a CPU hog beside the cluster: as the seed draws (random schedules only), always, never")
    parser.add_argument("--rate", type=float, default=1500, help="messages per second per publisher")
    parser.add_argument("--in-flight", type=int, default=100)
    parser.add_argument("--mandatory", action="store_true", help="publish mandatory (default: not, as most "
                                                                 "applications)")
    parser.add_argument("--no-recover", dest="recover", action="store_false",
                        help="do not restart the nodes and etcd to tell stranded from lost")
    parser.add_argument("--warmup", type=float, default=5)
    parser.add_argument("--settle", type=float, default=10, help="seconds of publishing after the last fault")
    parser.add_argument("--drain", type=float, default=600, help="at most this long to drain the queue")
    parser.add_argument("--prefix", default=f"wn{os.getpid()}", help="names of the run's network namespaces")
    parser.add_argument("--data", help="directory for the nodes' data and logs (default: a new temporary one, "
                                       "removed after a run that lost, stranded and duplicated nothing)")
    parser.add_argument("--rabbitmq-cluster", default=RABBIT_TOOL, metavar="PATH",
                        help="the RabbitMQ cluster tool (default: ../shared/tools/rabbitmq-cluster.sh from the "
                             "repository's root)")
    parser.add_argument("--json", action="store_true", help="print only the report")
    args = parser.parse_args(argv)
    if args.summary:
        print(summary(args.summary))
        return 0
    if args.seeds:
        run_seeds(argv, parse_seeds(args.seeds), ["warren", "rabbitmq"] if args.broker == "both" else [args.broker],
                  args.results)
        return 0
    if args.broker == "both":
        parser.error("--broker both needs --seeds")
    if args.broker == "rabbitmq" and not os.access(args.rabbitmq_cluster, os.X_OK):
        parser.error(f"no RabbitMQ cluster tool at {args.rabbitmq_cluster} (give it with --rabbitmq-cluster PATH)")
    if args.broker == "rabbitmq" and shutil.which("iptables") is None:
        parser.error("cutting RabbitMQ's nodes apart needs iptables (Debian: apt-get install iptables)")
    kinds = args.kinds.split(",") if args.kinds else KINDS
    unknown = set(kinds) - set(KINDS)
    if unknown:
        parser.error(f"no such fault: {', '.join(sorted(unknown))}")
    if args.schedule == "random":
        faults = random_schedule(args.seed, args.seconds, kinds)
    else:
        faults = issue_schedule(args.schedule == "issue" and args.broker == "warren")
    hog = args.hog == "on" or (args.hog == "seed" and args.schedule == "random" and hog_drawn(args.seed))
    report: dict[str, Any] = {"broker": args.broker, "seed": args.seed, "schedule": args.schedule, "cpu_hog": hog,
                              "load_average": [round(x, 2) for x in os.getloadavg()]}
    data = args.data or tempfile.mkdtemp(prefix="nemesis-")
    os.makedirs(data, exist_ok=True)
    if args.json:
        sys.stdout = open(os.devnull, "w")
    network = None
    hogging = None
    try:
        if args.broker == "warren":
            Network.remove(args.prefix)
            network = Network(args.prefix, {"etcd": ETCD_ADDRESS, "n1": f"{SUBNET}.11", "n2": f"{SUBNET}.12",
                                            "n3": f"{SUBNET}.13", "client": CLIENT_ADDRESS})
            network.create()
            network.enter("client")  # the workload, the HTTP checks and etcd's health check run from there
            cluster: Cluster = Warren(network, data)
        else:
            cluster = Rabbit(args.rabbitmq_cluster)
        try:
            cluster.start()
            if hog:
                hogging = subprocess.Popen([sys.executable, "-c", "while True: pass"])
            asyncio.run(workload(cluster, faults, args, report))
        finally:
            if hogging is not None:
                hogging.kill()
                hogging.wait()
            cluster.stop()
    finally:
        if network is not None:
            Network.remove(args.prefix)
        report["load_average_after"] = [round(x, 2) for x in os.getloadavg()]
        if args.data is None:
            if not any(report.get(key, 1) for key in ("lost", "stranded", "duplicates", "queue_missing_seen",
                                                       "minority_confirms", "left_in_queue", "stuck_while_attached",
                                                       "pauses_not_held")) \
                    and report.get("longest_confirm_gap", 0) < 30:
                shutil.rmtree(data, ignore_errors=True)
            else:
                report["data"] = data  # kept, to look into
    sys.stdout = sys.__stdout__
    print(json.dumps(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
