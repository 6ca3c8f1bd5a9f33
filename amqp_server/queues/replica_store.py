"""The quorum queues' storage: each copy of a quorum queue on this node (its leader's queue, or a follower's copy,
``forwarder.quorum.groups``) is rows of the queue index under the copy's id, its messages in the persistent store,
and where it stands in its group's log beside them.

A follower carries out its machine's storage effects (``quorum_machine.Effects``) on its rows by index id and seq,
with no queue in memory; a leader's queue writes its entries through ``Persistence`` as any durable queue does, and
the rest of what its machine decides (a return to the back, an entry held no longer) here.  Either reads its
replicated state back from its rows (``copy_state``) when it starts.  The rows are made durable by the node's group
commit (``persistence``).
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Sequence

import numpy as np
from queue_index import FLAG_DELIVERED, Totals
from queue_index.index import MAX_RETURNS, RETURNS_SHIFT

from stream_log import amqp10

from .. import payload
from ..message import Message
from .quorum_machine import State
from .quorum_ops import REASONS

if TYPE_CHECKING:
    from .persistence import Persistence, StoredQueue
    from .ready import Entry


class ReplicaStore:
    """The rows of every copy of a quorum queue on this node, by the copy's index id."""

    def __init__(self, persistence: Persistence) -> None:
        self.persistence = persistence
        self.index = persistence.index
        self.store = persistence.store
        self.has = self.index.has  # whether a copy has a row at a seq (a snapshot or an op replayed may have put it)

    # -- a follower's copy: its machine's effects -------------------------------------------------------

    def put(self, index_id: int, seq: int, record: bytes | memoryview, expiry: int, held: bool = False,
            returns: int = 0, size: int | None = None) -> None:
        """An entry of a copy, its message as the leader's store keeps it (``Message.payload``); ``size``: its body's,
        if known."""
        self.store_row(index_id, seq, record, expiry, payload.body_size(record) if size is None else size, held,
                       returns)
        self.persistence.stage()

    def store_row(self, index_id: int, seq: int, record: bytes | memoryview, expiry: int, size: int,
                  held: bool = False, returns: int = 0) -> None:
        """``put``, staged by the caller: once for the entries of a frame (``oplog.apply``)."""
        msg_id = self.store.new_id()
        self.store.write(msg_id, (record,), 1)
        self.index.publish(index_id, seq, msg_id, expiry, size, held, returns=returns)

    def store_rows(self, index_id: int,
                   rows: Sequence[tuple[int, bytes | memoryview, int, int, bool, int, bool]]) -> None:
        """``store_row`` of each of ``rows`` (seq, record, expiry, size, held, returns, front: served first), the
        records written in one call: a snapshot's frame of rows (``oplog.apply``)."""
        msg_ids = self.store.new_ids(len(rows))
        self.store.write_many(msg_ids, [row[1] for row in rows], 1)
        publish = self.index.publish
        for msg_id, (seq, _, expiry, size, held, returns, front) in zip(msg_ids, rows):
            publish(index_id, seq, msg_id, expiry, size, held, returns=returns, front=front)

    def delivered(self, index_id: int, seq: int) -> None:
        self.index.mark_delivered(index_id, seq)
        self.persistence.stage()

    def wait(self, index_id: int, seqs: list[int], reason: str) -> None:
        """The entries of these seqs wait as dead letters (``machine.WaitingDead``)."""
        code = REASONS.index(reason)
        for seq in seqs:
            self.index.mark_waiting(index_id, seq, code)
        self.persistence.stage()

    def remove(self, index_id: int, seqs: list[int]) -> None:
        """The entries of these seqs leave the copy (those it has), with their store references."""
        index, store = self.index, self.store
        for seq in seqs:
            entry = index.remove(index_id, seq)
            if entry is not None:
                store.remove(entry.msg_id)
        self.persistence.stage()

    def move(self, index_id: int, old_seq: int, new_seq: int, returns: int, front: bool = False) -> None:
        """A returned entry's row goes to ``new_seq``; ``front``: marked served first (``Move.front``)."""
        row = self.index.remove(index_id, old_seq)
        if row is None:
            return
        if old_seq != new_seq and self.index.has(index_id, new_seq):  # (a snapshot read it there already)
            self.store.remove(row.msg_id)
        else:
            self.index.publish(index_id, new_seq, row.msg_id, row.expiry, row.size, returns=returns, front=front)
        self.persistence.stage()

    def annotate(self, index_id: int, seqs: list[int], annotations: bytes) -> None:
        """The messages of these entries take a modified outcome's annotations (``annotated``): each a record of
        its own, which its row now names, the old one's reference released."""
        index = self.index
        for seq in seqs:
            row = index.peek(index_id, seq)
            if row is None:
                continue
            index.relink(index_id, seq, self.annotated(Message.stored(row.msg_id, row.size), annotations).msg_id)
            self.store.remove(row.msg_id)
        self.persistence.stage()

    def annotated(self, message: Message, annotations: bytes) -> Message:
        """``message``, which the store holds, with a modified outcome's annotations (``amqp10.modified``), as a
        record of its own (a reference for the caller; staged by the caller): written from memory if the
        message holds its body, else with the body copied from the old record's file a slice at a time
        (``MessageStore.write_from``), never read whole into memory (a large body its queue left to the store,
        16 MiB rewritten on every copy for each modified outcome)."""
        if message.header is None:  # (``Message.stored``: a copy's row, or an entry recovered without its head)
            self.persistence.load_head(message)
        out = amqp10.modified(message, annotations)
        out.msg_id = self.store.new_id()
        if message.body is None:
            self.store.write_from(out.msg_id, out.payload()[:-1], message.msg_id, message.body_size, 1)
        else:
            self.store.write(out.msg_id, out.payload(), 1)
        return out

    def drop(self, index_id: int, runs: list[tuple[int, int]]) -> None:
        """The entries of the copy with seqs in ``runs`` (``[start, end)``) go, with their store references."""
        self.persistence.drop(index_id, runs)

    def clear(self, index_id: int) -> None:
        """Every entry of the copy goes (a snapshot replaces them), with its store reference."""
        while len((rows := self.index.take(index_id, 0, 1 << 63, 65536)[1])):
            self.store.remove_many(rows["msg_id"])
        self.persistence.stage()

    def unhold(self, index_id: int, seq: int, returns: int) -> None:
        """An entry a consumer held is ready again in its place, counting ``returns`` (a leader's too)."""
        self.index.mark_returned(index_id, seq, returns)
        self.persistence.stage()

    def position(self, index_id: int, term: int, index: int, state: State) -> None:
        """A copy's position in its group's log, and what of its state its rows do not hold, committed with the
        rows staged before them: its enqueuers (a copy restarted from its rows knows which publishes of each
        window it took: a window sends again what no leader confirmed), its next seq (its last entries may be
        gone: an empty copy that came to lead gave seqs the others had passed, and they skipped its enqueues as
        replays), and the delivery limit and dead-letter strategy its ops apply by (a follower back without them
        moved a return past the limit to the back, under the seq the leader's next enqueue took, and skipped that
        enqueue as one it had)."""
        self.index.set_position(index_id, term, index, _settings(state), state.next_seq)
        self.index.set_enqueuers(index_id, state.enqueuers)
        self.persistence.stage()

    # -- a leader's queue ---------------------------------------------------------------------------------

    def returned(self, queue: StoredQueue, old_seq: int, entry: Entry, returns: int, front: bool = False) -> None:
        """A leader's entry came back to it for the ``returns``-th time (its x-delivery-count) and went to the
        back, under a new seq (``front``: served first): its index entry moves there, ready (the store keeps its
        message)."""
        message = entry.message
        self.index.ack(queue.index_id, old_seq)
        self.index.publish(queue.index_id, entry.seq, message.msg_id, entry.expiry, message.body_size,
                           returns=returns, front=front)
        self.persistence.stage()

    def recover_queue(self, queue: StoredQueue) -> None:
        """A queue made from a copy kept here while the node runs (a new leader's): its totals and expiries from
        the index, as at a restart; the store's references are claimed already."""
        index, queue_id = self.index, queue.index_id
        index.commit()
        totals = index.totals(queue_id) or Totals()
        expiries: list[tuple[int, int]] = []
        if totals.expiring:
            for seqs, values in index.columns(queue_id):
                expiring = values["expiry"] != 0
                expiries.extend(zip(values["expiry"][expiring].tolist(), seqs[expiring].tolist()))
        queue.recover(totals.count, totals.bytes, index.last_seq(queue_id), expiries)

    def copy_state(self, index_id: int) -> State:
        """The replicated state a copy's rows stand for (``State.from_rows``), read as arrays, with the enqueuers
        kept beside them (``position``).  The ready entries served first are those whose row says so, in seq
        order, which is the order they came back in (each came back under a new seq)."""
        self.index.commit()
        state = State()
        for seqs, values in self.index.columns(index_id):
            seqs = seqs.astype(np.int64)
            flags = values["flags"]
            held = (flags & FLAG_DELIVERED) != 0
            ready = seqs[~held]
            if len(ready):
                cuts = np.flatnonzero(np.diff(ready) != 1)
                starts = np.concatenate((ready[:1], ready[cuts + 1]))
                ends = np.concatenate((ready[cuts] + 1, ready[-1:] + 1))
                for start, end in zip(starts.tolist(), ends.tolist()):
                    state.ready.add_run(start, end)
            state.checked_out.update(dict.fromkeys(seqs[held].tolist(), 0))  # (the terms are not kept)
            returns = flags >> RETURNS_SHIFT
            counted = returns != 0
            state.counts.update(zip(seqs[counted].tolist(), returns[counted].tolist()))
            index = self.index
            for seq, out in zip(seqs[returns == MAX_RETURNS].tolist(), held[returns == MAX_RETURNS].tolist()):
                # (this many or more, served first, or waiting: kept apart)
                count, code = index.returns(index_id, seq), index.waiting(index_id, seq)
                if count:
                    state.counts[seq] = count
                else:
                    del state.counts[seq]
                if code is not None:
                    state.checked_out.pop(seq, None)
                    state.dead[seq] = REASONS[code]
                elif not out and index.front(index_id, seq):
                    state.returns.add(seq)
            state.next_seq = int(seqs[-1]) + 1
        state.enqueuers = self.index.enqueuers(index_id)
        settings, next_seq = self.index.position_settings(index_id)
        state.next_seq = max(state.next_seq, next_seq)  # (the last entries may be gone)
        state.delivery_limit = (settings >> 1) - 1 if settings >> 1 else None
        state.at_least_once = bool(settings & 1)
        return state


SETTINGS_LIMIT_MAX = (1 << 31) - 2  # a delivery limit above it is kept as it (no count ever gets that far)


def _settings(state: State) -> int:
    """A state's delivery limit and dead-letter strategy as the u32 kept with its position: the limit plus one
    (0: none) above the at-least-once bit."""
    limit = 0 if state.delivery_limit is None else min(state.delivery_limit, SETTINGS_LIMIT_MAX) + 1
    return limit << 1 | state.at_least_once
