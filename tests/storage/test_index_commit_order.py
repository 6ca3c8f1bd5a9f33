"""An index entry never reaches the disk before its message: whatever commits the queue index (the group commit,
or a read of it, which commits what is staged first) hands the message store's buffered records to the operating
system first.  A node killed right after such a read came back with entries whose message was gone and dropped
them: a quorum queue's copy lost messages its position said it had, and a leader elected from it never
delivered them."""
from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

from amqp_server.queues.persistence import Persistence
from amqp_server.queues.ready import Entry

QUEUE_ID = 7
COUNT = 100

CHILD = textwrap.dedent(f"""
    import asyncio, os, signal, sys
    from amqp_server.message import Message
    from amqp_server.queues.persistence import Persistence
    from amqp_server.queues.ready import Entry

    class Stored:
        index_id, ranked = {QUEUE_ID}, False
        row_key = staticmethod(lambda entry: entry.seq)
        recover = staticmethod(lambda *counts: None)

    async def main() -> None:
        persistence = Persistence(sys.argv[1])
        queue = Stored()
        persistence.recover([queue])
        for seq in range({COUNT}):
            message = Message("", "q", b"", b"", b"body %d" % seq)
            persistence.write(queue, Entry(seq, message))
        persistence.index.read({QUEUE_ID}, 0, 1)  # (a ready list reading entries back from disk)
        os.kill(os.getpid(), signal.SIGKILL)  # before any group commit

    asyncio.run(main())
""")


class Stored:
    """A durable queue as the storage sees it."""

    index_id = QUEUE_ID
    ranked = False

    def __init__(self) -> None:
        self.count = -1

    def row_key(self, entry: Entry) -> int:
        return entry.seq

    def recover(self, count: int, size: int, last_seq: int | None, expiries: object) -> None:
        self.count = count


@pytest.mark.timeout(60)
async def test_entries_a_read_committed_keep_their_messages_through_a_kill(tmp_path):
    child = subprocess.run([sys.executable, "-c", CHILD, str(tmp_path)], timeout=30, capture_output=True,
                           cwd=str(tmp_path), env={"PYTHONPATH": ":".join(sys.path)})
    assert child.returncode == -9, child.stderr.decode()
    persistence = Persistence(str(tmp_path))
    try:
        queue = Stored()
        persistence.recover([queue])
        assert queue.count == COUNT
        bodies = [persistence.store.read(row.msg_id) for row in persistence.index.entries(QUEUE_ID)]
        assert [body.endswith(b"body %d" % seq) for seq, body in enumerate(bodies)] == [True] * COUNT
    finally:
        persistence.close()
