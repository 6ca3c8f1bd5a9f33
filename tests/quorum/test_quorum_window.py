"""A node's window of confirmed publishes to a quorum queue led elsewhere (``forwarder.peers.remote_queue.Window``),
in-process: the floor it sends with each publish, below which the leader need not wait for any."""
from __future__ import annotations

from pamqp import commands

from amqp_server.message import make_message
from forwarder.peers import node_link as link
from forwarder.peers.remote_queue import Publish, Window

MESSAGE = make_message("", "q", commands.Basic.Properties(), b"x")  # (the window only carries it)


class Sink:
    """A channel's confirm sink (``ports.ConfirmSink``)."""

    def __init__(self) -> None:
        self.seq = 0
        self.confirmed: list[int] = []

    def forwarded(self) -> int:
        self.seq += 1
        return self.seq

    def remote_confirmed(self, seq: int, rejected: bool) -> None:
        self.confirmed.append(seq)

    def waiting(self, change: int) -> None:
        pass


class Unwalked(dict):
    """The window's publishes, which finding the floor must not walk: the first key of a dict whose oldest keys
    go is found past every slot they left (microseconds a publish, with a thousand in flight)."""

    def __iter__(self):
        raise AssertionError("the publishes walked")


async def test_the_floor_is_the_oldest_unanswered_seq_whatever_the_order_of_answers():
    window, sink, sent = Window(), Sink(), list[Publish]()
    window.publishes = Unwalked()

    def send(publish: Publish) -> bool:
        sent.append(publish)
        return True

    window.send = send
    assert window.floor == 1
    for _ in range(5):
        window.publish(sink, MESSAGE)
    assert window.floor == 1
    by_seq = {publish.seq: publish for publish in sent}

    def answer(seq: int) -> None:
        window.answered(by_seq[seq], link.CONFIRM_OK)

    answer(2)  # (out of order: the floor stays)
    assert window.floor == 1
    answer(1)
    assert window.floor == 3
    taken = window.take()[1]  # a publish the node's own queue took as leader: never in the window
    assert taken == 6 and window.floor == 3
    for seq in (3, 4, 5):
        answer(seq)
    assert window.floor == 7 and not window.publishes
    window.adopt(taken, sink, MESSAGE)  # (its queue was deposed before its group had it)
    assert window.floor == taken
    window.answered(window.publishes[taken], link.CONFIRM_OK)
    assert window.floor == 7
    window.close()  # (the resend the adopted publish armed)
    assert isinstance(by_seq[1], Publish) and len(sink.confirmed) == 6
