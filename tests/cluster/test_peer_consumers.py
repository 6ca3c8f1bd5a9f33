"""A consumer of a remote queue consumes again, at the same node or another (a quorum queue's consumer following
its leader, or trying again): the answer to an earlier consume, which may come later, is stale.  Each link numbers
its consumers itself, so the consumer's id now may be another consumer's at the node the stale answer comes from."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from amqp_server.errors import ChannelError
from amqp_server.publisher_flow import PublisherFlow
from forwarder.peers.peer import Peer
from forwarder.peers.remote_queue import RemoteConsumer


class Queue:
    """What a remote quorum queue hears from a peer about its consumers."""

    replicated = True

    def __init__(self) -> None:
        self.heard: list[tuple[str, Any]] = []

    def reattached(self, remote: RemoteConsumer, ok: bool, tags: list[int]) -> None:
        self.heard.append(("reattached", ok))

    def unanswered(self, remote: RemoteConsumer, error: ChannelError) -> None:
        self.heard.append(("unanswered", error))

    def refused(self, consumer: object) -> None:
        self.heard.append(("refused", consumer))

    def cancelled(self, consumer: object) -> None:
        self.heard.append(("cancelled", consumer))


def peers() -> tuple[Peer, Peer]:
    """n2's peers n1 and n3, with no link: what they would send goes nowhere."""
    flow = PublisherFlow()
    broker = SimpleNamespace(cluster=SimpleNamespace(quorum=SimpleNamespace(peer_down=lambda name, silent: None)))
    return (Peer("n1", broker, b"", flow), Peer("n3", broker, b"", flow))  # type: ignore[arg-type]


def consumer() -> SimpleNamespace:
    """A consumer of a channel with no shared prefetch, as the peer sees it."""
    return SimpleNamespace(limiter=None)


async def moved_consumer() -> tuple[Peer, Peer, Queue, RemoteConsumer, int]:
    """A consumer that consumed at n1 (its id there ``first``), again at n1, then at n3, where it has the id
    its first consume had at n1 (another consumer took n3's first id)."""
    n1, n3 = peers()
    queue = Queue()
    remote = n1.consume(queue, consumer())  # type: ignore[arg-type]
    first = remote.id
    remote.accepted.set_result(None)
    n1.consume(queue, remote.consumer, remote, [], [])  # type: ignore[arg-type]  # (its answer has not come)
    n1.forget(remote)
    n3.consume(queue, consumer())  # type: ignore[arg-type]
    n3.consume(queue, remote.consumer, remote, [], [])  # type: ignore[arg-type]
    assert remote.id != first and n3.consumers[remote.id] == (queue, remote)
    return n1, n3, queue, remote, first


async def test_a_stale_refusal_changes_nothing():
    n1, n3, queue, remote, first = await moved_consumer()
    n1._consumed({"id": first, "error": [404, "NOT_FOUND - no longer the leader"]})
    assert first not in n1.consumers and not queue.heard
    assert n3.consumers[remote.id] == (queue, remote)


async def test_a_stale_acceptance_changes_nothing():
    n1, n3, queue, remote, first = await moved_consumer()
    remote.attached = False  # (its answer from n3 is on its way)
    n1._consumed({"id": first, "error": None, "tags": []})
    assert first not in n1.consumers and not queue.heard and not remote.attached


async def test_a_stale_cancel_and_a_link_gone_leave_the_consumer_where_it_consumes():
    n1, n3, queue, remote, first = await moved_consumer()
    n1._cancelled(first)
    assert not queue.heard
    n1, n3, queue, remote, first = await moved_consumer()
    n1._went_down()
    assert not queue.heard and remote.attached
    assert n3.consumers[remote.id] == (queue, remote)


async def test_a_consumer_cancelled_is_cancelled_where_it_consumes_not_under_its_number_elsewhere():
    n1, n3, queue, remote, first = await moved_consumer()
    other = RemoteConsumer(remote.id, consumer())  # type: ignore[arg-type]
    other.owner = n1
    # another consumer at n1 under the moved one's number at n3
    n1.consumers[remote.id] = (queue, other)  # type: ignore[assignment]
    n1.cancel(remote)
    assert n1.consumers[remote.id] == (queue, other)
    assert remote.id not in n3.consumers
