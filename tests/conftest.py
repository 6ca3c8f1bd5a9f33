"""Shared fixtures: a real Warren node in a subprocess on a free loopback port (``broker``, shared; ``start_broker``,
a test's own; ``node_fixture``, a module's own), and the core in-process (``core``, ``vhost``).  The helpers tests
share beside these are in support.py.

Parity mode (for humans comparing Warren with RabbitMQ, never CI): ``WARREN_TEST_BROKER=host:port`` makes
the ``broker`` fixture point at that already running broker (user guest/guest, vhost ``/``) instead of
starting Warren; ``WARREN_TEST_BROKER_MGMT=port`` adds its HTTP API. Tests marked ``warren_only`` (they
check a deliberate Warren improvement or need warren-admin, the data directory, the node's log) and tests
using ``start_broker`` are skipped then. E.g. against a throwaway RabbitMQ on port 5733:

    WARREN_TEST_BROKER=127.0.0.1:5733 python -m pytest -p no:cacheprovider tests/amqp091/test_amqp_queues.py
"""
from __future__ import annotations

import base64
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn, TypeVar

import pika
import pytest

if TYPE_CHECKING:  # imported by the fixture: the environment below is set before the node's modules read it
    from amqp_server.broker import Broker
    from amqp_server.broker.vhost import VHost

ROOT = Path(__file__).resolve().parent.parent
os.environ.setdefault("WARREN_CHECK_INVARIANTS", "1")  # quorum queues check their state after every op, in-process
# and in the nodes the tests start (amqp_server.queues.quorum_machine.CHECKS)


def _share_bytecode() -> None:
    """Under PYTHONDONTWRITEBYTECODE (many CI images set it) every node the tests start compiled its modules anew,
    0.4 s of CPU of a start's 1 s, hundreds of times a run: the programs started here keep their bytecode in a
    cache of this user's outside the checkout instead (PYTHONPYCACHEPREFIX)."""
    if not os.environ.get("PYTHONDONTWRITEBYTECODE") or os.environ.get("PYTHONPYCACHEPREFIX"):
        return
    cache = Path(tempfile.gettempdir()) / f"warren-test-pycache-{os.getuid()}"
    cache.mkdir(mode=0o700, exist_ok=True)
    status = cache.stat()
    if status.st_uid == os.getuid() and not status.st_mode & 0o022:  # (bytecode nobody else could have put there)
        del os.environ["PYTHONDONTWRITEBYTECODE"]
        os.environ["PYTHONPYCACHEPREFIX"] = str(cache)


_share_bytecode()


def unavailable(reason: str) -> NoReturn:
    """A tool a test needs (Chromium, Java, RabbitMQ's rabbitmqadmin) is missing: skip here, but fail
    under CI (``WARREN_TEST_ALL=1``, set by .ci/run), where test.sh installs them and nothing may skip."""
    if os.environ.get("WARREN_TEST_ALL") == "1":
        pytest.fail(f"required under WARREN_TEST_ALL=1: {reason}", pytrace=False)
    pytest.skip(reason, allow_module_level=True)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


START_TIMEOUT = 60.0  # a node's start, to its listening port: over 15 s on a loaded machine (2 cores, load 30)


def wait_for_port(port: int, proc: subprocess.Popen, timeout: float = START_TIMEOUT) -> None:
    """Until ``proc`` listens on ``port``.  A connection to itself is not a listener: ports here are in the
    ephemeral range, and a connect to one nobody listens on gets it as its own source port now and then (TCP's
    simultaneous open), which once took a restarting node for started (its client then had the connection
    reset)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"broker exited with {proc.returncode}")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.2) as sock:
                if sock.getsockname() != sock.getpeername():
                    return
        except OSError:
            pass
        time.sleep(0.05)
    raise TimeoutError(f"broker did not listen on {port} within {timeout}s")


@dataclass
class BrokerProcess:
    """A running ``warren-server``; ``admin()`` runs ``warren-admin`` on its data directory."""

    data_dir: Path
    port: int = 0
    mgmt_port: int = 0
    extra: list[str] = field(default_factory=list)
    streams: bool = False  # serve the stream protocol too, on ``stream_port``
    stream_port: int = 0
    link_port: int = 0  # a cluster node's (tests/cluster/test_cluster.py's start_node)
    proc: subprocess.Popen | None = None
    log_path: Path | None = None

    host = "127.0.0.1"

    def start(self) -> "BrokerProcess":
        """Start the node.  Ports left 0 are chosen free, and chosen again should another process take one before
        the node binds it (a port free a moment ago may go to any outgoing connection); a node that exits
        anyway fails the test with the end of its log."""
        chosen = (not self.port, not self.mgmt_port, self.streams and not self.stream_port)
        self.log_path = self.data_dir.parent / f"{self.data_dir.name}-broker.log"
        env = dict(os.environ, COLUMNS="200")
        tries = 3
        while True:
            tries -= 1
            self.port = self.port or free_port()
            self.mgmt_port = self.mgmt_port or free_port()
            streams = []
            if self.streams:
                self.stream_port = self.stream_port or free_port()
                streams = ["--stream-enabled", "true", "--stream-port", str(self.stream_port)]
            with open(self.log_path, "ab") as log:
                self.proc = subprocess.Popen(
                    [sys.executable, "-m", "amqp_server", "--bind", "127.0.0.1", "--amqp-port", str(self.port),
                     "--mgmt-port", str(self.mgmt_port), "--data-dir", str(self.data_dir), *streams, *self.extra],
                    cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, env=env)
            try:
                wait_for_port(self.port, self.proc)
                if self.streams:
                    wait_for_port(self.stream_port, self.proc)
                return self
            except TimeoutError as exc:  # a node that never listened is not left running
                self.kill()
                raise TimeoutError(f"{exc}; its log ends with:\n{self.log()[-3000:]}") from None
            except RuntimeError as exc:
                tail = self.log()[-3000:]
                if not (tries and any(chosen) and "address already in use" in tail.lower()):
                    raise RuntimeError(f"{exc}; its log ends with:\n{tail}") from None
            if chosen[0]:
                self.port = 0
            if chosen[1]:
                self.mgmt_port = 0
            if chosen[2]:
                self.stream_port = 0

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 10.0) -> int:
        if self.proc is None:
            return 0
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            return self.proc.wait(timeout)

    def kill(self) -> None:
        self.stop(signal.SIGKILL)

    def log(self) -> str:
        return self.log_path.read_text() if self.log_path and self.log_path.exists() else ""

    def said(self) -> str:
        """The log as one line of words: rich wraps a line where the console's width falls, which the paths and
        names in it move, so a phrase the node logged may span two lines of ``log()``."""
        return " ".join(self.log().replace("\0", " ").split())

    def admin(self, *args: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "amqp_server.node.admin", "--data-dir", str(self.data_dir), *args],
                              cwd=ROOT, capture_output=True, text=True, timeout=30)

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    @property
    def url(self) -> str:
        return f"amqp://guest:guest@127.0.0.1:{self.port}/"


@dataclass
class ExternalBroker:
    """A broker the tests did not start (parity mode): only its address, no process, log or data dir."""

    host: str
    port: int
    mgmt_port: int = 0
    running = True

    @property
    def url(self) -> str:
        return f"amqp://guest:guest@{self.host}:{self.port}/"

    def admin(self, command: str, *args: str) -> subprocess.CompletedProcess:
        """The few ``warren-admin`` commands tests use, done through the broker's HTTP API instead."""
        quote = lambda name: urllib.parse.quote(name, safe="")  # noqa: E731 (a one-line helper)
        if command == "add-user":
            path, body = f"/api/users/{quote(args[0])}", {"password": args[1], "tags": ""}
        elif command == "add-vhost":
            path, body = f"/api/vhosts/{quote(args[0])}", {}
        elif command == "set-permissions":
            vhost, user, configure, write, read = args
            path, body = f"/api/permissions/{quote(vhost)}/{quote(user)}", {
                "configure": configure, "write": write, "read": read}
        else:
            pytest.skip(f"warren-admin {command} has no HTTP equivalent here (parity mode)")
        if not self.mgmt_port:
            pytest.skip("needs WARREN_TEST_BROKER_MGMT (parity mode)")
        request = urllib.request.Request(
            f"http://{self.host}:{self.mgmt_port}{path}", data=json.dumps(body).encode(), method="PUT",
            headers={"content-type": "application/json",
                     "authorization": "Basic " + base64.b64encode(b"guest:guest").decode()})
        try:
            urllib.request.urlopen(request, timeout=10).close()
        except urllib.error.HTTPError as exc:
            return subprocess.CompletedProcess([command, *args], 1, "", exc.read().decode())
        return subprocess.CompletedProcess([command, *args], 0, "", "")


EXTERNAL = os.environ.get("WARREN_TEST_BROKER", "")


# Tiers.  A test's tier is what it needs, read from the fixtures it uses (their own and the ones they use in
# turn), or from a tier mark on the test or its module when it starts something itself; the heaviest wins:
#   fast         nothing outside this process: the core, queue types, state machines, codecs, exchanges, storage
#   integration  a Warren node in a subprocess (`broker`, `start_broker` and every fixture built on them)
#   client       a program other than Warren: Spark's JVM, Chromium, Node.js, PHP, Ruby, rabbitmq-c, rabbitmqadmin
#   cluster      etcd, and the nodes of a cluster
# A fixture says what it starts under its @pytest.fixture: @starts(INTEGRATION).  A fast test that starts a
# program other than this interpreter (or this interpreter running a node) fails, naming it.  `./test.sh -m fast`
# runs one tier; the whole suite runs them in this order, so a break in the fast tier shows first.
# test.sh runs them on parallel workers (pytest-xdist, --dist loadgroup): within a tier, tests marked ``long`` (tens
# of seconds of work) go first, so that the workers end together; the cluster tier's tests (etcd and nodes each,
# timed failovers) run one at a time, on one worker.
TIERS = ("fast", "integration", "client", "cluster")
FAST, INTEGRATION, CLIENT, CLUSTER = TIERS
TIER = pytest.StashKey[str]()
Fixture = TypeVar("Fixture", bound=Callable)


def starts(tier: str) -> Callable[[Fixture], Fixture]:
    """Under @pytest.fixture: what this fixture starts puts every test that uses it in ``tier`` (or a heavier one)."""
    def declare(fixture: Fixture) -> Fixture:
        fixture.tier = tier  # type: ignore[attr-defined]  # a mark read back by the tiers
        return fixture
    return declare


def tier_of(item: pytest.Item) -> str:
    """The heaviest of the item's tier marks and the tiers its fixtures start."""
    needs = {mark.name for mark in item.iter_markers() if mark.name in TIERS}
    defs = item._fixtureinfo.name2fixturedefs if isinstance(item, pytest.Function) else {}
    for name in getattr(item, "fixturenames", ()):
        for fixturedef in reversed(defs.get(name, ())):  # the one used, then one it overrides if it asks for it
            needs.add(getattr(fixturedef.func, "tier", FAST))
            if name not in fixturedef.argnames:
                break
    return max(needs, key=TIERS.index, default=FAST)


def _forbidden_in_fast(argv: list[str]) -> str | None:
    """The program ``argv`` starts if a fast test may not start it: anything but this interpreter, and this
    interpreter running a node (it may run the node's own helpers, e.g. the record readers)."""
    if argv and argv[0] == sys.executable and argv[1:3] != ["-m", "amqp_server"]:
        return None
    return " ".join(argv)[:200]


_running: list[pytest.Item] = []  # the test being set up, run or torn down
_execute_child = subprocess.Popen._execute_child  # type: ignore[attr-defined]  # private: the hook the fast tier wraps


def _execute_child_unless_fast(popen: subprocess.Popen, args, executable, *rest, **kwargs):
    """Popen's start of a program, refused to a fast test."""
    if _running and _running[-1].stash.get(TIER, None) == FAST:
        program = _forbidden_in_fast([str(executable or args[0]), *map(str, args[1:])])
        if program is not None:
            pytest.fail(f"a fast test started {program!r}: mark the test, or decorate the fixture that starts it with "
                        f"@starts(...), with its tier (conftest.py, Tiers)", pytrace=False)
    return _execute_child(popen, args, executable, *rest, **kwargs)


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "warren_only(reason): Warren-specific behaviour; skipped in parity mode")
    config.addinivalue_line("markers", "core(**options): the Broker options of the in-process ``core`` fixture")
    config.addinivalue_line("markers", "long: tens of seconds of work, started first among its tier's tests")
    for tier in TIERS:
        config.addinivalue_line("markers", f"{tier}: the {tier} tier (conftest.py says which test is in which)")
    subprocess.Popen._execute_child = _execute_child_unless_fast  # type: ignore[attr-defined]  # private: the hook the fast tier wraps


def pytest_unconfigure(config: pytest.Config) -> None:
    subprocess.Popen._execute_child = _execute_child  # type: ignore[attr-defined]  # private: the hook the fast tier wraps


@pytest.hookimpl(wrapper=True)
def pytest_collection_modifyitems(items: list[pytest.Item]):
    for item in items:
        item.stash[TIER] = tier_of(item)
        item.add_marker(item.stash[TIER])
        if item.stash[TIER] == CLUSTER:
            item.add_marker(pytest.mark.xdist_group(CLUSTER))  # (under --dist loadgroup: one worker, in turn)
        marker = item.get_closest_marker("warren_only")
        if EXTERNAL and marker is not None:
            reason = marker.args[0] if marker.args else "Warren-only"
            item.add_marker(pytest.mark.skip(reason=f"warren_only: {reason}"))
    result = yield  # -m selects by the tier marks just added
    items.sort(key=lambda item: (TIERS.index(item.stash[TIER]), item.get_closest_marker("long") is None))
    return result


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(item: pytest.Item):
    _running.append(item)
    try:
        return (yield)
    finally:
        _running.pop()


@pytest.fixture(scope="session")
@starts(INTEGRATION)
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerProcess | ExternalBroker]:
    """One node shared by the tests that do not restart it; tests use unique names."""
    if EXTERNAL:
        host, _, port = EXTERNAL.rpartition(":")
        yield ExternalBroker(host, int(port), int(os.environ.get("WARREN_TEST_BROKER_MGMT", "0")))
        return
    node = BrokerProcess(tmp_path_factory.mktemp("node") / "data").start()
    yield node
    node.stop()


def node_fixture(*extra: str, streams: bool = False, name: str = "node") -> Any:
    """A fixture ``name``: a node of the module's own, started once for it with ``extra`` arguments, for tests that
    need the node configured otherwise than the shared ``broker``.  In a test module:
    ``node = node_fixture("--consumer-timeout", "500")``; a second one needs its name: ``name="untimed"``."""
    @pytest.fixture(scope="module", name=name)
    @starts(INTEGRATION)
    def own_node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerProcess]:
        if EXTERNAL:
            pytest.skip("starts a Warren node of its own (parity mode)")
        node = BrokerProcess(tmp_path_factory.mktemp(name) / "data", extra=list(extra), streams=streams).start()
        yield node
        node.stop()
    return own_node


@pytest.fixture
@starts(INTEGRATION)
def start_broker(tmp_path: Path) -> Iterator:
    """Factory for nodes of a test's own (restartable, killable, configurable)."""
    if EXTERNAL:
        pytest.skip("starts Warren nodes of its own (parity mode)")
    nodes: list[BrokerProcess] = []

    def start(*extra: str, data_dir: Path | None = None, port: int = 0) -> BrokerProcess:
        node = BrokerProcess(data_dir or tmp_path / f"data{len(nodes)}", port=port, extra=list(extra))
        nodes.append(node)  # (before its start: a start cut short, by the test's timeout too, is stopped after)
        return node.start()

    yield start
    for node in nodes:
        node.stop()


@pytest.fixture
async def core(tmp_path: Path, request: pytest.FixtureRequest) -> AsyncIterator[Broker]:
    """The broker's core in this process (no sockets, no frames), on a data directory of the test's own: the fast
    tier's counterpart to the node ``broker``.  Broker's options come from a ``core`` mark, e.g.
    ``pytestmark = pytest.mark.core(queue_window=16)``."""
    from amqp_server.broker import Broker

    mark = request.node.get_closest_marker("core")
    core = Broker(str(tmp_path / "data"), **(mark.kwargs if mark else {}))
    yield core
    core.close()


@pytest.fixture
def vhost(core: Broker) -> VHost:
    """The in-process core's default vhost."""
    return core.vhost("/")


@pytest.fixture
def uid(request: pytest.FixtureRequest) -> str:
    """A name unique to the test, for queues and exchanges on the shared node."""
    return f"{request.node.name[:80]}-{os.urandom(3).hex()}"


def connect(node, user: str = "guest", password: str = "guest", vhost: str = "/", name: str = "",
            heartbeat: int | None = None, blocked_timeout: float | None = 10) -> pika.BlockingConnection:
    """A pika connection to a node (``name``: the client's connection_name), bounded by timeouts.

    ``heartbeat`` None takes the node's; ``blocked_timeout`` None lets a blocked connection wait."""
    return pika.BlockingConnection(pika.ConnectionParameters(
        node.host, node.port, vhost, pika.PlainCredentials(user, password), connection_attempts=1,
        socket_timeout=5, blocked_connection_timeout=blocked_timeout, heartbeat=heartbeat,
        client_properties={"connection_name": name} if name else None))


@pytest.fixture
def conn(broker):
    connection = connect(broker)
    yield connection
    if connection.is_open:
        connection.close()


@pytest.fixture
def ch(conn):
    """A channel on ``conn``."""
    return conn.channel()
