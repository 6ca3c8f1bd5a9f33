"""Shared fixtures: a real Warren node in a subprocess on a free loopback port."""
from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator

import pytest

ROOT = Path(__file__).resolve().parent.parent


def unavailable(reason: str) -> None:
    """A tool a test needs (Chromium, Java, RabbitMQ's rabbitmqadmin) is missing: skip here, but fail
    under CI (``WARREN_TEST_ALL=1``, set by .ci/run), where test.sh installs them and nothing may skip."""
    if os.environ.get("WARREN_TEST_ALL") == "1":
        pytest.fail(f"required under WARREN_TEST_ALL=1: {reason}", pytrace=False)
    pytest.skip(reason, allow_module_level=True)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def wait_for_port(port: int, proc: subprocess.Popen, timeout: float = 15.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"broker exited with {proc.returncode}")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.2):
                return
        except OSError:
            time.sleep(0.05)
    raise TimeoutError(f"broker did not listen on {port} within {timeout}s")


@dataclass
class BrokerProcess:
    """A running ``warren-server``; ``admin()`` runs ``warren-admin`` on its data directory."""

    data_dir: Path
    port: int = 0
    mgmt_port: int = 0
    extra: list[str] = field(default_factory=list)
    proc: subprocess.Popen | None = None
    log_path: Path | None = None

    host = "127.0.0.1"

    def start(self) -> "BrokerProcess":
        self.port = self.port or free_port()
        self.mgmt_port = self.mgmt_port or free_port()
        self.log_path = self.data_dir.parent / f"{self.data_dir.name}-broker.log"
        env = dict(os.environ, COLUMNS="200")
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "amqp_server", "--bind", "127.0.0.1", "--amqp-port", str(self.port),
                 "--mgmt-port", str(self.mgmt_port), "--data-dir", str(self.data_dir), *self.extra],
                cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, env=env)
        wait_for_port(self.port, self.proc)
        return self

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

    def admin(self, *args: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "amqp_server.admin", "--data-dir", str(self.data_dir), *args],
                              cwd=ROOT, capture_output=True, text=True, timeout=30)

    @property
    def url(self) -> str:
        return f"amqp://guest:guest@127.0.0.1:{self.port}/"


@pytest.fixture(scope="session")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerProcess]:
    """One node shared by the tests that do not restart it; tests use unique names."""
    node = BrokerProcess(tmp_path_factory.mktemp("node") / "data").start()
    yield node
    node.stop()


@pytest.fixture
def start_broker(tmp_path: Path) -> Iterator:
    """Factory for nodes of a test's own (restartable, killable, configurable)."""
    nodes: list[BrokerProcess] = []

    def start(*extra: str, data_dir: Path | None = None, port: int = 0) -> BrokerProcess:
        node = BrokerProcess(data_dir or tmp_path / f"data{len(nodes)}", port=port, extra=list(extra)).start()
        nodes.append(node)
        return node

    yield start
    for node in nodes:
        node.stop()


@pytest.fixture
def uid(request: pytest.FixtureRequest) -> str:
    """A name unique to the test, for queues and exchanges on the shared node."""
    return f"{request.node.name[:80]}-{os.urandom(3).hex()}"
