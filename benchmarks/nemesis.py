#!/usr/bin/env python3
"""A nemesis for replicated (quorum) queues: a workload of confirming publishers and a consumer, all
reconnecting, while a seeded schedule of faults hits the cluster; then a checker of what was confirmed.

Warren (``--broker warren``, run as root): etcd and three nodes, each in a network namespace of its own on
a bridge in another one, made for the run (``ip netns``, veth) and removed after it, whatever happens; the
workload runs in a namespace of its own too, so every address lives inside namespaces the run made.
RabbitMQ (``--broker rabbitmq``): the three nodes of ``rabbitmq-cluster.sh`` (127.0.0.1:5681-5683), which
the run starts and stops; they share loopback, so a cut drops with iptables what one node sends on its
connections to the other.  A fault on etcd is quiet time in its schedule, so that a seed draws the same
schedule for both brokers.

Workload: one queue (``x-queue-type: quorum``); one publisher per node sends persistent 100-byte messages,
mandatory, with confirms (``--in-flight`` unconfirmed at most, ``--rate`` per second); a message nacked,
returned or unconfirmed when its connection went is not sent again.  One consumer (manual acks, prefetch
50) moves to the next node every ``ROTATE`` seconds and after any failure.  A publisher whose connection
stays silent for ``STALL`` seconds with messages unconfirmed drops it and connects again.  Meanwhile a durable
classic queue is declared and bound every second through the next node, and an older one deleted.

Faults (``--schedule random``: drawn from ``--seed``, each kind once in a shuffled round, then again;
``issue``: the fixed schedule the replicated queue first failed under; ``rabbitmq``: the same without its
etcd step):
  pause the leader or a follower (SIGSTOP) shorter or longer than the 2 s lease; kill -9 the leader or a
  follower and start it again after 0.5 s or after 3-5 s; freeze etcd (SIGSTOP) or restart it; cut the leader
  from the followers (not from etcd or its clients); cut one node from etcd only; an asymmetric cut (what
  the leader sends to one follower is lost, what that follower sends arrives).

Checker, once every fault is healed and the queue drained: every confirmed message delivered at least
once; duplicates counted; no message confirmed through a node cut off from both others that it took after
the cut (a side without a majority); per publisher, deliveries out of publish order and the longest gap
between confirms; the longest gap between any two confirms; nacks; what is left in the queue (not 0: the
drain ran out of time, and what it holds counts as lost); the queue declared on every node; every node with
the same declared queues and bindings, and with each one answered as made (not deleted since) and none
answered as deleted.

Usage (as root):  python benchmarks/nemesis.py --seed 7
                  python benchmarks/nemesis.py --broker rabbitmq --schedule rabbitmq
The last line printed is the report as JSON (``--json`` prints only that).
"""
from __future__ import annotations

import argparse
import asyncio
import ctypes
import json
import os
import random
import shutil
import signal
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
from amqp_load import method_frame, publish_frames, shortstr, table  # noqa: E402 (after sys.path takes this folder)

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
QUEUE = "nemesis"
LEASE = 2.0  # Warren's etcd lease, seconds: pauses are drawn shorter and longer than it
ROTATE = 10.0  # the consumer moves to the next node this often
STALL = 5.0  # a publisher connection silent this long with messages unconfirmed is given up
CONNECT_TIMEOUT = 3.0
GAP = (5.0, 9.0)  # quiet seconds between two faults
AMQP_PORT, MGMT_PORT, LINK_PORT, ETCD_PORT = 5701, 15701, 25701, 2379
SUBNET = "10.77.0"
ETCD_ADDRESS, CLIENT_ADDRESS = f"{SUBNET}.2", f"{SUBNET}.100"
# start/kill/restart/stop
RABBIT_TOOL = os.environ.get("RABBITMQ_CLUSTER_TOOL", "/work/shared/tools/rabbitmq-cluster.sh")
CLONE_NEWNET = 0x40000000

KINDS = ["pause-leader-short", "pause-leader-long", "pause-follower-short", "pause-follower-long",
         "kill-leader-fast", "kill-leader-slow", "kill-follower-fast", "kill-follower-slow",
         "freeze-etcd", "restart-etcd", "cut-leader-from-followers", "cut-node-from-etcd", "cut-asymmetric"]
NEEDS_ETCD = {"freeze-etcd", "restart-etcd", "cut-node-from-etcd"}


# -- the schedule ---------------------------------------------------------------------------------------------

@dataclass
class Fault:
    kind: str
    seconds: float  # how long it lasts (a pause, a cut, a frozen etcd) or the node stays dead
    gap: float  # quiet seconds after it
    started: float = 0.0  # when it began and ended, seconds since the workload's start
    ended: float = 0.0
    target: str = ""  # the node it hit (named when it runs)


def random_schedule(seed: int, seconds: float, kinds: list[str]) -> list[Fault]:
    """Faults for about ``seconds``: every kind once in a shuffled round, then another round, and so on."""
    rng = random.Random(seed)
    faults: list[Fault] = []
    total = 0.0
    round_: list[str] = []
    while total < seconds:
        if not round_:
            round_ = list(kinds)
            rng.shuffle(round_)
        kind = round_.pop()
        if kind.startswith("pause"):
            length = rng.uniform(0.5, LEASE * 0.6) if kind.endswith("short") else rng.uniform(LEASE * 1.5, LEASE * 3)
        elif kind.startswith("kill"):
            length = 0.5 if kind.endswith("fast") else rng.uniform(3.0, 5.0)
        elif kind == "freeze-etcd":
            length = rng.uniform(1.0, LEASE * 2.5)
        elif kind == "restart-etcd":
            length = rng.uniform(0.5, 3.0)
        else:
            length = rng.uniform(4.0, 10.0)
        fault = Fault(kind, round(length, 2), round(rng.uniform(*GAP), 2))
        faults.append(fault)
        total += fault.seconds + fault.gap
    return faults


def issue_schedule(with_etcd: bool) -> list[Fault]:
    """The schedule a replicated queue once vanished under (and RabbitMQ's figures were taken with, without the
    etcd step)."""
    steps = [Fault("pause-leader-long", 6, 8), Fault("kill-follower-slow", 3, 8),
             Fault("freeze-etcd", 4, 8), Fault("kill-leader-slow", 3, 8), Fault("pause-follower-long", 6, 8),
             Fault("pause-leader-short", 1, 2), Fault("pause-leader-long", 3, 8), Fault("kill-leader-fast", 0.5, 8)]
    return [step for step in steps if with_etcd or step.kind not in NEEDS_ETCD]


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
        self.cuts: list[tuple[str, str]] = []  # (member, address it cannot send to)

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

    def cut(self, member: str, other: str) -> None:
        """What ``member`` sends to ``other`` is lost from now on."""
        address = self.members[other]
        sh("ip", "netns", "exec", self.ns(member), "ip", "route", "add", "blackhole", f"{address}/32")
        self.cuts.append((member, address))

    def heal(self) -> None:
        for member, address in self.cuts:
            sh("ip", "netns", "exec", self.ns(member), "ip", "route", "del", "blackhole", f"{address}/32", check=False)
        self.cuts = []

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

    def resume(self, index: int) -> None:
        raise NotImplementedError

    def kill(self, index: int) -> None:
        raise NotImplementedError

    async def restart(self, index: int) -> None:
        raise NotImplementedError

    def cut(self, index: int, other: int | None) -> None:
        """What node ``index`` sends to node ``other`` (None: to etcd) is lost until ``heal``."""
        raise NotImplementedError

    def heal(self) -> None:
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
            ["ip", "netns", "exec", self.network.ns("etcd"), shutil.which("etcd") or "etcd", "--name", "nemesis",
             "--data-dir", os.path.join(self.data, "etcd"), "--listen-client-urls", url,
             "--advertise-client-urls", url, "--listen-peer-urls", peer, "--initial-advertise-peer-urls", peer,
             "--initial-cluster", f"nemesis={peer}"], stdout=log, stderr=subprocess.STDOUT)
        log.close()
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            try:
                with urllib.request.urlopen(f"{url}/health", timeout=1) as reply:
                    if json.load(reply).get("health") == "true":
                        return
            except OSError:
                time.sleep(0.1)
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

    def resume(self, index: int) -> None:
        self.procs[index].send_signal(signal.SIGCONT)
        self.paused.discard(index)

    def kill(self, index: int) -> None:
        self.procs[index].kill()
        self.procs[index].wait()
        self.paused.discard(index)

    async def restart(self, index: int) -> None:
        self.start_node(index)

    def cut(self, index: int, other: int | None) -> None:
        self.network.cut(f"n{index + 1}", "etcd" if other is None else f"n{other + 1}")
        if other is None:
            self.network.cut("etcd", f"n{index + 1}")

    def heal(self) -> None:
        self.network.heal()

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
    its net_ticktime (60 s), so no new one is made meanwhile."""

    def __init__(self) -> None:
        self.names = [f"rabbit{i}@localhost" for i in (1, 2, 3)]
        self.addresses = [("127.0.0.1", 5680 + i, 15680 + i) for i in (1, 2, 3)]
        self.pids: list[int | None] = [None, None, None]
        self.paused: set[int] = set()
        self.rules: list[list[str]] = []

    def start(self) -> None:
        subprocess.run([RABBIT_TOOL, "start"], check=True, timeout=600)
        for index in range(3):
            self.pids[index] = self._pid(index)

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

    def resume(self, index: int) -> None:
        os.kill(self.pids[index], signal.SIGCONT)
        self.paused.discard(index)

    def kill(self, index: int) -> None:
        os.kill(self.pids[index], signal.SIGKILL)
        self.pids[index] = None
        self.paused.discard(index)

    async def restart(self, index: int) -> None:
        proc = await asyncio.create_subprocess_exec(RABBIT_TOOL, "restart", str(index + 1),
                                                    stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        await proc.wait()
        self.pids[index] = await asyncio.get_running_loop().run_in_executor(None, self._pid, index)

    def cut(self, index: int, other: int | None) -> None:
        owners = {}  # (local port, peer port) -> the owner's pid, of every established TCP connection on loopback
        listed = sh("ss", "-tnpH", "state", "established", "src", "127.0.0.1", "dst", "127.0.0.1")
        for line in listed.stdout.splitlines():
            fields = line.split()
            if len(fields) >= 5 and "pid=" in fields[-1]:
                ends = int(fields[2].rsplit(":", 1)[1]), int(fields[3].rsplit(":", 1)[1])
                owners[ends] = int(fields[-1].split("pid=", 1)[1].split(",", 1)[0])
        links = [(local, peer) for (local, peer), pid in owners.items()
                 if pid == self.pids[index] and owners.get((peer, local)) == self.pids[other]]
        if not links:
            raise RuntimeError(f"{self.names[index]} has no connection to {self.names[other]} to cut")
        for local, peer in links:
            rule = ["OUTPUT", "-o", "lo", "-p", "tcp", "--sport", str(local), "--dport", str(peer), "-j", "DROP"]
            sh("iptables", "-I", *rule)
            self.rules.append(rule)

    def heal(self) -> None:
        for rule in self.rules:
            sh("iptables", "-D", *rule, check=False)
        self.rules = []

    def stop(self) -> None:
        self.heal()
        for pid in self.pids:
            if pid is not None:
                try:
                    os.kill(pid, signal.SIGCONT)
                except ProcessLookupError:
                    pass
        subprocess.run([RABBIT_TOOL, "stop"], timeout=300, capture_output=True)


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


def publish_mandatory(body: bytes) -> bytes:
    """basic.publish of a persistent message to the queue, mandatory (unroutable: returned, then acked)."""
    method = method_frame(1, 60, 40, struct.pack("!H", 0) + shortstr("") + shortstr(QUEUE) + b"\x01")
    return method + publish_frames(1, "", QUEUE, body, True, 131072)[len(method):]


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
                connection.writer.write(publish_mandatory(f"p{self.index}-{self.seq}.".encode().ljust(100, b"x")))
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
    hosts: list[tuple[str, int]]
    deliveries: Counter = field(default_factory=Counter)  # message id -> times delivered
    order: dict[int, list[int]] = field(default_factory=dict)  # publisher -> seqs in first-delivery order
    last_delivery: float = 0.0
    connections: int = 0
    ended: Counter = field(default_factory=Counter)  # why its sessions ended
    started: float = 0.0
    again: list[float] = field(default_factory=list)  # when a message came a second time

    async def run(self, stop: asyncio.Event) -> None:
        turn = 0
        while not stop.is_set():
            host, port = self.hosts[turn % len(self.hosts)]
            turn += 1
            try:
                connection = await Connection.open(host, port)
            except (OSError, asyncio.TimeoutError, Closed, ConnectionError, asyncio.IncompleteReadError):
                await asyncio.sleep(0.5)
                continue
            self.connections += 1
            try:
                await asyncio.wait_for(self._session(connection, stop), ROTATE)
            except asyncio.TimeoutError:
                self.ended["rotated"] += 1
            except (OSError, Closed, ConnectionError, asyncio.IncompleteReadError) as exc:
                self.ended[str(exc)[:80] or type(exc).__name__] += 1
                await connection.close()
                await asyncio.sleep(0.2)  # as a client would, before it tries again
                continue
            await connection.close()

    async def _session(self, connection: Connection, stop: asyncio.Event) -> None:
        writer = connection.writer
        writer.write(method_frame(1, 60, 10, struct.pack("!IHB", 0, 50, 0)))
        await connection.method(60, 11)
        writer.write(method_frame(1, 60, 20, struct.pack("!H", 0) + shortstr(QUEUE) + shortstr("c") + b"\x00"
                                  + table(None)))
        while not stop.is_set():
            kind, payload = await connection.frame()
            if kind != 1:
                continue
            method = CLASS_METHOD.unpack_from(payload)
            if method == (60, 60):
                tag_at = 4 + 1 + payload[4]
                tag = struct.unpack_from("!Q", payload, tag_at)[0]
                body = await connection.content()
                self._delivered(message_id(body))
                if writer.is_closing():
                    raise Closed("connection lost")
                writer.write(method_frame(1, 60, 80, struct.pack("!QB", tag, 0)))
            elif method == (60, 30):  # basic.cancel from the broker (the leader moved)
                raise Closed("cancelled")

    def _delivered(self, mid: str) -> None:
        self.last_delivery = time.monotonic()
        self.deliveries[mid] += 1
        if self.deliveries[mid] == 2:
            self.again.append(self.last_delivery - self.started)
        if self.deliveries[mid] == 1:
            publisher, seq = mid[1:].split("-")
            self.order.setdefault(int(publisher), []).append(int(seq))


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
    def __init__(self, cluster: Cluster, started: float) -> None:
        self.cluster = cluster
        self.started = started
        self.isolated: list[tuple[int, float, float]] = []  # (node, from, to): cut off from both others
        self.log: list[str] = []

    def now(self) -> float:
        return time.monotonic() - self.started

    def note(self, text: str) -> None:
        self.log.append(f"{self.now():7.1f} {text}")
        print(self.log[-1], flush=True)

    async def target(self, leader: bool) -> int:
        """The leader's index (waiting a little for one to be known), or a follower's."""
        name = None
        for _ in range(30):
            name = await asyncio.get_running_loop().run_in_executor(None, self.cluster.leader)
            if name is not None:
                break
            await asyncio.sleep(0.2)
        names = self.cluster.names
        chosen = names.index(name) if name in names else 0
        if leader:
            return chosen
        return random.Random(int(self.now() * 1000)).choice([i for i in range(3) if i != chosen])

    async def run(self, faults: list[Fault]) -> None:
        for fault in faults:
            await self.apply(fault)
            await asyncio.sleep(fault.gap)

    async def apply(self, fault: Fault) -> None:
        cluster, kind = self.cluster, fault.kind
        node = -1
        if "leader" in kind or "follower" in kind or kind == "cut-asymmetric":
            node = await self.target("follower" not in kind)
        elif kind == "cut-node-from-etcd":
            node = random.Random(int(self.now() * 1000)).randrange(3)
        if node >= 0:
            fault.target = cluster.names[node]
        fault.started = self.now()
        if kind in NEEDS_ETCD and not cluster.has_etcd:  # the same schedule, its etcd faults as quiet time
            self.note(f"{kind}: no etcd here, quiet for {fault.seconds} s")
            await asyncio.sleep(fault.seconds)
            fault.ended = self.now()
            return
        self.note(f"{kind} {fault.target} for {fault.seconds} s")
        if kind.startswith("pause"):
            cluster.pause(node)
            await asyncio.sleep(fault.seconds)
            cluster.resume(node)
        elif kind.startswith("kill"):
            cluster.kill(node)
            await asyncio.sleep(fault.seconds)
            await cluster.restart(node)
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
            if kind == "cut-leader-from-followers":
                for other in others:
                    cluster.cut(node, other)
                    cluster.cut(other, node)
            elif kind == "cut-node-from-etcd":
                cluster.cut(node, None)
            else:  # asymmetric: the leader's frames to one follower are lost, that follower's reach it
                cluster.cut(node, others[0])
            await asyncio.sleep(fault.seconds)
            cluster.heal()
            if kind == "cut-leader-from-followers":
                self.isolated.append((node, fault.started, self.now()))
        fault.ended = self.now()
        self.note(f"{kind} {fault.target} over")


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
    publishers = [Publisher(i, host, port, args.rate, args.in_flight) for i, (host, port) in enumerate(hosts)]
    consumer = Consumer(hosts, started=started)
    definitions = Definitions(hosts)
    stop_publishing, stop_consuming = asyncio.Event(), asyncio.Event()
    loop = asyncio.get_running_loop()
    tasks = [loop.create_task(p.run(stop_publishing, started)) for p in publishers]
    tasks.append(loop.create_task(definitions.run(stop_publishing)))
    consuming = loop.create_task(consumer.run(stop_consuming))
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
        if time.monotonic() - consumer.last_delivery > 5:
            left = await loop.run_in_executor(None, cluster.depth)
            if left == 0:
                break
    stop_consuming.set()
    await consuming
    left = await loop.run_in_executor(None, cluster.depth)
    nemesis.note(f"drained ({left} messages left in the queue)")
    report.update(check(publishers, consumer, nemesis, cluster))
    report["left_in_queue"] = left  # not 0: the drain ran out of time, and "lost" counts what is still there
    report["definitions"] = await loop.run_in_executor(None, definitions.check, cluster)
    confirms = sorted(at for p in publishers for at in p.confirmed.values())
    for fault in faults:  # the longest time without any confirm that overlapped it (or the quiet after it)
        gaps = [b - a for a, b in zip(confirms, confirms[1:]) if fault.started < b and a < fault.ended + fault.gap]
        fault.longest_gap = round(max(gaps, default=0.0), 2)  # type: ignore[attr-defined]  # a field added to each fault for the report
    report["faults"] = [vars(fault) for fault in faults]


def check(publishers: list[Publisher], consumer: Consumer, nemesis: Nemesis, cluster: Cluster) -> dict[str, Any]:
    delivered = consumer.deliveries
    lost, minority = [], []
    confirms: list[float] = []
    per_publisher = {}
    for p in publishers:
        ids = {seq: f"p{p.index}-{seq}" for seq in p.published}
        lost += [ids[seq] for seq in p.confirmed if delivered[ids[seq]] == 0]
        times = sorted(p.confirmed.values())
        confirms += times
        order = consumer.order.get(p.index, [])
        out_of_order = sum(1 for a, b in zip(order, order[1:]) if b < a)
        for node, cut, healed in nemesis.isolated:
            if node == p.index:
                minority += [ids[seq] for seq, at in p.confirmed.items() if cut < p.published[seq] and at < healed]
        per_publisher[f"p{p.index}"] = {
            "node": cluster.names[p.index], "published": len(p.published), "confirmed": len(p.confirmed),
            "nacked": len(p.nacked), "returned": len(p.returned), "unknown": len(p.unknown),
            "connections": p.connections, "longest_confirm_gap": round(_longest_gap(times)[0], 2),
            "delivered_out_of_order": out_of_order, "max_nacks_per_second": _peak(p.nacked),
            "most_nacks_at": _peak_at(p.nacked)}
    confirms.sort()
    gap, at = _longest_gap(confirms)
    confirmed_ids = {f"p{p.index}-{seq}" for p in publishers for seq in p.confirmed}
    missing_on = [cluster.names[i] for i in range(3) if not cluster.declared_on(i)]
    return {
        "confirmed": len(confirmed_ids), "lost": len(lost), "lost_sample": sorted(lost)[:20],
        "duplicates": sum(count - 1 for count in delivered.values() if count > 1),
        "delivered": len(delivered), "unconfirmed_delivered": len(set(delivered) - confirmed_ids),
        "nacked": sum(len(p.nacked) for p in publishers),
        "max_nacks_per_second": _peak(sorted(t for p in publishers for t in p.nacked)),
        "longest_confirm_gap": round(gap, 2), "longest_gap_ends_at": round(at, 1),
        "minority_confirms": len(minority), "queue_missing_on": missing_on,
        "consumer_connections": consumer.connections, "consumer_sessions_ended": dict(consumer.ended),
        "duplicates_by_second": dict(Counter(int(t) for t in consumer.again)),
        "confirms_by_second": dict(Counter(int(t) for t in confirms)),
        "nacks_by_second": dict(Counter(int(t) for p in publishers for t in p.nacked)),
        "publishers": per_publisher, "nemesis": nemesis.log}


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


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--broker", choices=("warren", "rabbitmq"), default="warren")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--schedule", choices=("random", "issue", "rabbitmq"), default="random")
    parser.add_argument("--seconds", type=float, default=150, help="length of a random schedule's faults")
    parser.add_argument("--kinds", help="the fault kinds a random schedule draws from, comma-separated (default: "
                                        "all)")
    parser.add_argument("--rate", type=float, default=1500, help="messages per second per publisher")
    parser.add_argument("--in-flight", type=int, default=100)
    parser.add_argument("--warmup", type=float, default=5)
    parser.add_argument("--settle", type=float, default=10, help="seconds of publishing after the last fault")
    parser.add_argument("--drain", type=float, default=600, help="at most this long to drain the queue")
    parser.add_argument("--prefix", default=f"wn{os.getpid()}", help="names of the run's network namespaces")
    parser.add_argument("--data", help="directory for the nodes' data and logs (default: a new temporary one, "
                                       "removed after a run that lost nothing)")
    parser.add_argument("--json", action="store_true", help="print only the report")
    args = parser.parse_args(argv)
    kinds = args.kinds.split(",") if args.kinds else KINDS
    unknown = set(kinds) - set(KINDS)
    if unknown:
        parser.error(f"no such fault: {', '.join(sorted(unknown))}")
    if args.schedule == "random":
        faults = random_schedule(args.seed, args.seconds, kinds)
    else:
        faults = issue_schedule(args.schedule == "issue" and args.broker == "warren")
    report: dict[str, Any] = {"broker": args.broker, "seed": args.seed, "schedule": args.schedule}
    data = args.data or tempfile.mkdtemp(prefix="nemesis-")
    os.makedirs(data, exist_ok=True)
    if args.json:
        sys.stdout = open(os.devnull, "w")
    network = None
    try:
        if args.broker == "warren":
            Network.remove(args.prefix)
            network = Network(args.prefix, {"etcd": ETCD_ADDRESS, "n1": f"{SUBNET}.11", "n2": f"{SUBNET}.12",
                                            "n3": f"{SUBNET}.13", "client": CLIENT_ADDRESS})
            network.create()
            network.enter("client")  # the workload, the HTTP checks and etcd's health check run from there
            cluster: Cluster = Warren(network, data)
        else:
            cluster = Rabbit()
        try:
            cluster.start()
            asyncio.run(workload(cluster, faults, args, report))
        finally:
            cluster.stop()
    finally:
        if network is not None:
            Network.remove(args.prefix)
        if args.data is None:
            if report.get("lost") == 0 and not report.get("queue_missing_on"):
                shutil.rmtree(data, ignore_errors=True)
            else:
                report["data"] = data  # kept, to look into
    sys.stdout = sys.__stdout__
    print(json.dumps(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
