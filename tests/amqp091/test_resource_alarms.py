"""Resource alarms on AMQP 0-9-1, as rabbit_reader throttles: a connection is blocked (not read, told
``connection.blocked`` if it asked) only once it publishes while an alarm stands, and each alarm starts afresh
(``publish_received``, ``maybe_block``, ``maybe_unblock``).  A node in this process, whose alarms the tests set."""
from __future__ import annotations

from pathlib import Path
from typing import Iterator

import pytest
from pamqp import commands

from amqp_server.publisher_flow import DISK, MEMORY
from conftest import free_port
from support import Raw, Running, call, publish_frames, start

pytestmark = pytest.mark.timeout(60)

BLOCKED_CAPABLE = {"connection.blocked": True}


@pytest.fixture
def node(tmp_path: Path) -> Iterator[Running]:
    running = start(tmp_path)
    yield running
    running.stop()


def _alarm(node: Running, on: bool, reason: str = MEMORY) -> None:
    assert node.node is not None
    flow = node.node.flow
    node.call(lambda: flow.block(reason) if on else flow.unblock(reason))


def _declared(raw: Raw, queue: str) -> None:
    """The connection is read: a passive declare is answered, and is the next frame (no connection.blocked)."""
    raw.send_method(1, commands.Queue.Declare(queue=queue, passive=True))
    raw.expect(commands.Queue.DeclareOk)


def _got(raw: Raw, queue: str) -> bool:
    """basic.get: whether a message came (its header and body read)."""
    raw.send_method(1, commands.Basic.Get(queue=queue, no_ack=True))
    _, answer = raw.read_frame()
    if isinstance(answer, commands.Basic.GetEmpty):
        return False
    assert isinstance(answer, commands.Basic.GetOk), answer
    raw.read_frame()
    raw.read_frame()
    return True


def _client(node: Running, queue: str) -> Raw:
    raw = Raw(node)
    raw.handshake(capabilities=BLOCKED_CAPABLE)
    raw.open_channel(1)
    raw.send_method(1, commands.Queue.Declare(queue=queue))
    raw.expect(commands.Queue.DeclareOk)
    return raw


def test_a_connection_opened_during_an_alarm_is_not_told_blocked_until_it_publishes(node):
    """connection.open registers for alarms and calls control_throttle with should_block false: open-ok, and no
    connection.blocked for a consumer (pika's blocked_connection_timeout would close it)."""
    _alarm(node, True)
    raw = _client(node, "open-during")
    try:
        _declared(raw, "open-during")
        raw.send(publish_frames(1, "", "open-during", b"m"))
        assert raw.expect(commands.Connection.Blocked).reason == "low on memory"
        _alarm(node, False)
        raw.expect(commands.Connection.Unblocked)
        _declared(raw, "open-during")
    finally:
        raw.close()


def test_a_connection_that_published_before_an_alarm_is_read_until_it_publishes_again(node):
    """A connection that publishes and consumes keeps being read through an alarm (its acks, gets, declares)
    until it publishes during it; once the alarm clears, the next alarm blocks it only at its next publish."""
    raw = _client(node, "mixed")
    try:
        raw.send(publish_frames(1, "", "mixed", b"before"))
        _declared(raw, "mixed")
        for ready in (True, False):  # two alarms, each starting afresh
            _alarm(node, True)
            _declared(raw, "mixed")
            assert _got(raw, "mixed") is ready
            raw.send(publish_frames(1, "", "mixed", b"during"))
            assert raw.expect(commands.Connection.Blocked).reason == "low on memory"
            _alarm(node, False)
            raw.expect(commands.Connection.Unblocked)
            assert _got(raw, "mixed")
    finally:
        raw.close()


def test_too_little_free_disk_space_blocks_publishers_and_shows_in_the_http_api(tmp_path):
    """rabbit_disk_monitor: free space on the data directory's disk below ``disk_free_limit`` sets the disk alarm
    from the node's start: a publisher is told "low on disk" and held, ``/api/nodes`` says ``disk_free_alarm``,
    the alarm health checks fail naming it, and /metrics has RabbitMQ's gauge."""
    node = start(tmp_path, mgmt_enabled=True, mgmt_port=free_port(), disk_free_limit=1 << 62)
    raw = _client(node, "disk")
    try:
        [info] = call(node, "GET", "/api/nodes").json
        assert (info["disk_free_alarm"], info["disk_free_limit"], info["mem_alarm"]) == (True, 1 << 62, False)
        checked = call(node, "GET", "/api/health/checks/local-alarms")
        assert checked.status == 503
        assert checked.json["alarms"] == [{"node": node.config.node_name, "resource": "disk"}]
        assert "rabbitmq_alarms_free_disk_space_watermark 1" in call(node, "GET", "/metrics").raw.decode()
        _declared(raw, "disk")
        raw.send(publish_frames(1, "", "disk", b"m"))
        assert raw.expect(commands.Connection.Blocked).reason == "low on disk"
        _alarm(node, True, MEMORY)
        _alarm(node, False, DISK)  # the memory alarm still holds it, with no new word to the client
        raw.sock.settimeout(0.5)
        with pytest.raises(TimeoutError):
            raw.read_frame()
        raw.sock.settimeout(5)
        _alarm(node, False, MEMORY)
        raw.expect(commands.Connection.Unblocked)
        assert call(node, "GET", "/api/health/checks/local-alarms").status == 200
    finally:
        raw.close()
        node.stop()
