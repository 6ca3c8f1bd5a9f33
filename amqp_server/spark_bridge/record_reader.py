"""Reader processes for the Spark bridge's ``/records``: a queue's part on disk becomes Arrow batches in
other processes, so that a large read does not take the event loop's GIL from AMQP traffic.

A batch takes one reader two steps (``RecordReaders.read``).  The reader walks the queue index (LMDB lets
another process read it while the broker writes), keeps the entries below the range's end and unexpired, and
sends the loop their seqs and message ids.  The loop finds where their payloads lie (``RecordSource.locate``: the
stores' locations, as arrays) and sends that back, with the descriptors of the segment files.  The reader reads
the records (one ``preadv`` per run of neighbours), builds the record batch column by column
(``arrow_records.encode_columns``) and sends back its serialised IPC message, which the loop writes to the
response as it is.  A descriptor stays readable after a compaction or a deletion unlinks its file, so the
records a span names are there however the store moves on meanwhile.  The loop's share is a few array
operations per batch, whatever its rows.

A stream's chunks take one step: the loop finds where they lie in its log (``RecordSource.chunk_span``: arrays
from the segments' indexes) and sends that, with the segment files' descriptors; the reader reads the chunks,
converts their records as an AMQP 0-9-1 consumer gets them (``stream_log.amqp10``) and builds the batch.

When the client's connection is plain TCP, the loop passes its socket along too and the reader writes the
batch to the client itself (an HTTP chunk, as aiohttp would frame it): the loop never touches the batch's
bytes.  It writes what the socket takes within ``WRITE_WAIT`` and sends back only what is left, for the loop
to write as it would have the whole batch, so a slow client cannot keep a reader busy.

Wire format, both ways over a stream socket: a request is ``REQUEST`` (header length, payload length), the
JSON header, then the payload, descriptors riding along with the first bytes.  A walk's header names the
index, queue id, first seq, rows, bytes, the range's end and the time; a build's, the queue, the body format,
the walked rows it skips and the framing of the client's socket (last of the descriptors), with the
locations of the rest as its payload (``LOCATIONS``, column after column); a chunks request's, the stream, the
body format and the offsets and rows wanted, with the chunks' places as its payload (``CHUNK_LOCATIONS``).  A
reply is ``REPLY`` (status, length) and that many bytes: the walk's ``WALKED`` and its rows' seqs, message ids and
transient flags; the build's IPC message (with a client's socket: what of it is left to write), after
``CHUNKS_READ`` for a chunks request; or the error's text (status 1; status 2 when writing to the client
failed).
"""
from __future__ import annotations

import asyncio
import json
import logging
import os
import select
import socket
import struct
import subprocess
import sys
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Awaitable, Callable, Sequence, TypeVar

import lmdb
import numpy as np
import pyarrow as pa

from queue_index import FLAG_DELIVERED, FLAG_TRANSIENT, IndexRows, as_rows, open_reader, walk

from .. import payload as payload_codec
from .queue_reads import DiskSpan

if TYPE_CHECKING:
    from stream_log.log import ChunkSpan

    from .arrow_records import Layout

log = logging.getLogger("warren.mgmt.records")
_T = TypeVar("_T")

REQUEST = struct.Struct(">II")  # header length, payload length
REPLY = struct.Struct(">BQ")  # status (0: the batch, 1: an error, 2: the client's socket failed), length
WALKED = struct.Struct(">Iq")  # a walk's reply: its rows and the seq following them (-1: none), then the rows
READ_GAP = 64 * 1024  # dead bytes between two wanted records read through rather than seeked over
MAX_FDS = 4096
WRITE_WAIT = 0.05  # seconds a reader waits, in all, for a client's socket to take a batch, before handing back the rest
# a reader process's program: imported, not run as ``-m`` (the package imports this module first, and runpy
# would warn that it runs a second copy of it)
MAIN = ("import socket, sys; from amqp_server.spark_bridge.record_reader import serve; "
        "serve(socket.socket(fileno=int(sys.argv[1])))")
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
LOCATIONS = (("found", np.bool_), ("files", np.uint32), ("offsets", np.uint32), ("sizes", np.uint32))
CHUNK_LOCATIONS = (("files", np.uint32), ("positions", np.uint64), ("sizes", np.uint32), ("ids", np.uint64))
CHUNKS_READ = struct.Struct(">Iq")  # a chunks request's reply: its rows, the offset after what it read


class ReaderUnavailable(Exception):
    """No reader process could serve the batch: the caller builds it itself."""


class ClientGone(Exception):
    """Writing a batch to the client's socket failed: the client closed or reset its connection."""


@dataclass(frozen=True)
class ClientSocket:
    """A client's connection a reader may write a batch to: its socket's descriptor, and whether the response
    is in HTTP chunks."""

    fd: int
    chunked: bool


def _columns(data: "bytes | memoryview", count: int, kinds: Sequence[Any]) -> list[np.ndarray]:
    """Arrays of ``count`` items each of ``kinds``, one after the other in ``data`` (views, no copy)."""
    columns, at = [], 0
    for kind in kinds:
        size = count * np.dtype(kind).itemsize
        columns.append(np.frombuffer(data[at:at + size], kind))
        at += size
    return columns


@dataclass
class Walked:
    """A reader's walk of a queue's part on disk: the entries' seqs and message ids, which of them are in the
    transient store, and the seq where the entries after them begin (None: the walk reached the last)."""

    seqs: np.ndarray
    msg_ids: np.ndarray
    transient: np.ndarray
    following: int | None

    @classmethod
    def unpack(cls, reply: memoryview) -> "Walked":
        count, following = WALKED.unpack_from(reply)
        seqs, msg_ids, transient = _columns(reply[WALKED.size:], count, (np.int64, np.int64, np.bool_))
        return cls(seqs, msg_ids, transient, None if following < 0 else following)


@dataclass
class Located:
    """The loop's answer to a walk: its rows from ``skip`` on are to be read, where ``span`` says (those it did
    not find left out)."""

    skip: int
    span: DiskSpan


@dataclass
class Read:
    """A batch read: its rows, where the entries after them begin (``Walked.following``), and what of the batch
    the caller is to write (with a client's socket: what the reader left; else all of it)."""

    rows: int
    following: int | None
    rest: memoryview


class RecordReaders:
    """``size`` reader processes, started on first use (``start``); ``read`` takes an idle one."""

    def __init__(self, size: int) -> None:
        self.size = size
        self._idle: asyncio.Queue[_Reader] | None = None
        self._all: list[_Reader] = []

    async def walk(self, index_path: str, queue_id: int, start: int, limit: int, max_bytes: int, end: int,
                   now: int) -> Walked:
        """Up to ``limit`` index entries of the queue from ``seq >= start``, of ``max_bytes`` of payloads at most
        (at least one), of them those below ``end`` and not expired at ``now`` (epoch ms)."""
        return await self._ask(lambda reader: self._walk(reader, index_path, queue_id, start, limit, max_bytes,
                                                         end, now))

    async def read(self, where: tuple[str, int, int], limit: int, max_bytes: int, end: int, now: int,
                   locate: Callable[[Walked], Located], queue_name: str, layout: Layout,
                   client: ClientSocket | None = None) -> Read:
        """A record batch of the queue's part on disk from ``where`` (``RecordSource.disk_index``), as ``walk`` chooses
        its entries, their payloads where ``locate`` finds them; with ``client``, written to it."""

        async def walk_and_build(reader: _Reader) -> Read:
            walked = await self._walk(reader, *where, limit, max_bytes, end, now)
            located = locate(walked)
            span = located.span
            try:
                rows = int(np.count_nonzero(span.found))
                if not rows:
                    return Read(0, walked.following, memoryview(b""))
                header: dict[str, Any] = {"build": [queue_name, layout.columns, layout.body_text, located.skip]}
                fds = list(span.fds)
                if client is not None:
                    header["out"] = "chunked" if client.chunked else "raw"
                    fds.append(client.fd)
                payload = [getattr(span, name).astype(kind, copy=False) for name, kind in LOCATIONS]
                return Read(rows, walked.following, await reader.request(header, payload, fds))
            finally:
                span.close()

        return await self._ask(walk_and_build)

    async def read_chunks(self, span: ChunkSpan, limit: int, queue_name: str, layout: Layout,
                          client: ClientSocket | None = None) -> Read:
        """A record batch of the stream's records in the chunks ``span`` names (from ``span.start``, below
        ``span.end``, ``limit`` at most), built by a reader from the segment files; with ``client``, written to
        it.  The span's descriptors stay the caller's to close."""

        async def build(reader: _Reader) -> Read:
            header: dict[str, Any] = {"chunks": [queue_name, layout.columns, layout.body_text, span.start, span.end,
                                                 limit]}
            fds = list(span.fds)
            if client is not None:
                header["out"] = "chunked" if client.chunked else "raw"
                fds.append(client.fd)
            payload = [getattr(span, name).astype(kind, copy=False) for name, kind in CHUNK_LOCATIONS]
            reply = await reader.request(header, payload, fds)
            rows, following = CHUNKS_READ.unpack_from(reply)
            return Read(rows, following, reply[CHUNKS_READ.size:])

        return await self._ask(build)

    @staticmethod
    async def _walk(reader: "_Reader", index_path: str, queue_id: int, start: int, limit: int, max_bytes: int,
                    end: int, now: int) -> Walked:
        return Walked.unpack(await reader.request({"walk": [index_path, queue_id, start, limit, max_bytes, end, now]}))

    def start(self) -> None:
        """Start the processes if they are not yet (their imports take a while: a client asking for offsets is
        about to read, so the offsets call starts them)."""
        if self._idle is not None:
            return
        self._idle = asyncio.Queue()
        for _ in range(self.size):
            try:
                reader = _Reader()
            except OSError as exc:
                log.warning("cannot start a record reader: %s", exc)
                continue
            self._all.append(reader)
            self._idle.put_nowait(reader)

    async def _ask(self, request: Callable[["_Reader"], Awaitable[_T]]) -> _T:
        self.start()
        if not self._all:
            raise ReaderUnavailable("no reader processes")
        idle = self._idle
        assert idle is not None  # start() made it
        reader = await idle.get()
        try:
            if reader.proc.poll() is not None:
                reader = self._replace(reader, f"exited with {reader.proc.returncode}")
            return await request(reader)
        except ClientGone:
            raise
        except (OSError, EOFError) as exc:
            reader = self._replace(reader, str(exc))
            raise ReaderUnavailable(str(exc)) from None
        except BaseException:  # cancelled mid-request: its reply would be taken for the next request's
            reader = self._replace(reader, "a request was cancelled")
            raise
        finally:
            idle.put_nowait(reader)

    def _replace(self, reader: "_Reader", why: str) -> "_Reader":
        log.warning("record reader %d failed (%s); starting another", reader.proc.pid, why)
        reader.close()
        self._all.remove(reader)
        reader = _Reader()
        self._all.append(reader)
        return reader

    def close(self) -> None:
        for reader in self._all:
            reader.close()
        self._all.clear()


class _Reader:
    """One reader process and the loop's end of its socket."""

    def __init__(self) -> None:
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            self.proc = subprocess.Popen([sys.executable, "-c", MAIN, str(theirs.fileno())],
                                         pass_fds=(theirs.fileno(),), cwd=ROOT, stdin=subprocess.DEVNULL)
        finally:
            theirs.close()
        ours.setblocking(False)
        self.sock = ours

    async def request(self, header: dict, payload: Sequence[np.ndarray] = (), fds: Sequence[int] = ()) -> memoryview:
        """Send a request (``fds`` passed with its first bytes) and read its reply."""
        loop = asyncio.get_running_loop()
        encoded = json.dumps(header).encode()
        columns = [np.ascontiguousarray(column).data.cast("B") for column in payload]  # sent as they are
        size = sum(map(len, columns))
        # few bytes, into an empty buffer: sent at once
        socket.send_fds(self.sock, [REQUEST.pack(len(encoded), size) + encoded], list(fds))
        for column in columns:
            if len(column):
                await loop.sock_sendall(self.sock, column)
        status, length = REPLY.unpack(await self._exactly(REPLY.size))
        reply = await self._exactly(length)
        if status == 2:
            raise ClientGone(bytes(reply).decode(errors="replace"))
        if status:
            raise OSError(bytes(reply).decode(errors="replace"))
        return reply

    async def _exactly(self, size: int) -> memoryview:
        """``size`` bytes from the reader, into memory not zeroed first (a batch is tens of MiB)."""
        loop = asyncio.get_running_loop()
        view = np.empty(size, np.uint8).data
        got = 0
        while got < size:
            count = await loop.sock_recv_into(self.sock, view[got:])
            if not count:
                raise EOFError("the reader closed its socket")
            got += count
        return view

    def close(self) -> None:
        self.sock.close()
        try:
            self.proc.wait(5)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


# -- the reader process -----------------------------------------------------------------------

def _receive(sock: socket.socket, size: int, buffer: bytearray) -> bytes:
    while len(buffer) < size:
        data = sock.recv(max(size - len(buffer), 1 << 16))
        if not data:
            raise EOFError
        buffer += data
    taken = bytes(buffer[:size])
    del buffer[:size]
    return taken


def _payloads(fds: list[int], files: np.ndarray, offsets: np.ndarray,
              sizes: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """The rows' payloads read into one buffer, a ``preadv`` per run of neighbouring records of a file: (buffer,
    where each payload starts in it, its size, the rows in buffer order)."""
    order = np.lexsort((offsets, files))
    file, first = files[order], offsets[order].astype(np.int64)
    size = sizes[order].astype(np.int64)
    end = first + size
    breaks = np.flatnonzero((file[1:] != file[:-1]) | (first[1:] - end[:-1] > READ_GAP)) + 1
    starts, stops = np.concatenate(([0], breaks)), np.concatenate((breaks, [len(order)])).astype(np.int64)
    run_at, run_end = first[starts], end[stops - 1]
    base = np.concatenate(([0], np.cumsum(run_end - run_at)))
    buffer = np.empty(int(base[-1]), np.uint8)
    view = buffer.data
    position = np.empty(len(order), np.int64)
    for run, (i, j) in enumerate(zip(starts.tolist(), stops.tolist())):
        at, into, upto = int(run_at[run]), int(base[run]), int(base[run + 1])
        got = os.preadv(fds[int(file[i])], [view[into:upto]], at)
        if got != upto - into:
            raise OSError(f"short read of {upto - into} bytes at {at}")
        position[i:j] = first[i:j] - at + into
    return buffer, position, size, order


def _gather(buffer: np.ndarray, starts: np.ndarray, stops: np.ndarray) -> pa.Array:
    """The binary array of ``buffer[starts[i]:stops[i]]``, copied by numpy, not a slice per row: a strided
    block per group of ranges alike and evenly spaced (a backlog of messages of one size is a few groups, split
    where a run of records ends), else, for ranges that differ all along, through an index of every byte."""
    count = len(starts)
    lengths = stops - starts
    offsets = np.zeros(count + 1, np.int64)
    np.cumsum(lengths, out=offsets[1:])
    steps = np.diff(starts)
    breaks = np.flatnonzero((lengths[1:] != lengths[:-1]) | np.concatenate(([False], steps[1:] != steps[:-1]))) + 1
    if not count:
        data = np.zeros(0, np.uint8)
    elif len(breaks) <= count // 16:
        data = np.empty(int(offsets[-1]), np.uint8)
        bounds = np.concatenate(([0], breaks, [count])).tolist()
        for a, b in zip(bounds[:-1], bounds[1:]):  # each group copied once, straight to its place
            width = int(lengths[a])
            data[int(offsets[a]):int(offsets[b])].reshape(b - a, width)[...] = np.lib.stride_tricks.as_strided(
                buffer[int(starts[a]):], shape=(b - a, width), strides=(int(steps[a]) if b - a > 1 else 0, 1),
                writeable=False)
    else:
        data = buffer[np.repeat(starts - offsets[:-1], lengths) + np.arange(offsets[-1])]
    return pa.Array.from_buffers(pa.binary(), count,
                                 [None, pa.py_buffer(offsets.astype(np.int32)), pa.py_buffer(data)])


def _batch(queue_name: str, layout: Layout, rows: IndexRows, files: np.ndarray, offsets: np.ndarray,
           sizes: np.ndarray, fds: list[int]) -> memoryview:
    """The record batch of ``rows``, their payloads where ``files``, ``offsets`` and ``sizes`` say, its columns
    gathered from the records as arrays (row by row only where ``arrow_records`` decodes each distinct route
    and header once); of the parts of the payloads the layout's columns need, none read for a layout that
    needs none (offsets, the queue's name, redelivered flags)."""
    from . import arrow_records

    wanted = set(layout.columns)
    needs = {"routes": bool(wanted.intersection(arrow_records.ROUTE_COLUMNS)),
             "props": bool(wanted.intersection(arrow_records.PROPERTY_COLUMNS)), "bodies": "body" in wanted}
    parts: dict[str, pa.Array] = {}
    if any(needs.values()):
        buffer, at, size, order = _payloads(fds, files, offsets, sizes)
        route_at, header_at, body_at = payload_codec.spans(buffer, at)  # every row's at once
        props_at = np.minimum(header_at + arrow_records.PROPERTIES_AT, body_at)
        spans = {"routes": (route_at, header_at), "props": (props_at, body_at), "bodies": (body_at, at + size)}
        parts = {part: _gather(buffer, *spans[part]) for part, needed in needs.items() if needed}
        if np.any(order[1:] < order[:-1]):  # records not in offset order (a compaction moved some): rows' order back
            back = np.empty_like(order)
            back[order] = np.arange(len(order))
            parts = {part: column.take(back) for part, column in parts.items()}
    batch = arrow_records.encode_columns(queue_name, rows.seqs, (rows.flags & FLAG_DELIVERED) != 0,
                                         parts.get("routes"), parts.get("props"), parts.get("bodies"), layout)
    return memoryview(batch.serialize())


def _write_out(fd: int, batch: memoryview, chunked: bool) -> bytes:
    """Write ``batch`` to a client's socket (non-blocking: the loop's own), as an HTTP chunk if ``chunked``;
    what it did not take within ``WRITE_WAIT``, framed, is returned for the loop to write."""
    parts: list[bytes | memoryview] = [f"{len(batch):x}\r\n".encode(), batch, b"\r\n"] if chunked else [batch]
    poller = select.poll()
    poller.register(fd, select.POLLOUT)
    waited = 0.0
    while parts:
        try:
            sent = os.writev(fd, parts)
        except BlockingIOError:
            if waited >= WRITE_WAIT:
                break
            began = time.monotonic()
            poller.poll(WRITE_WAIT * 1000)
            waited += time.monotonic() - began
            continue
        while parts and sent >= len(parts[0]):
            sent -= len(parts[0])
            parts.pop(0)
        if parts:
            parts[0] = memoryview(parts[0])[sent:]
    return b"".join(parts)


def _walk(envs: dict[str, Any], index_path: str, queue_id: int, start: int, limit: int, max_bytes: int,
          end: int, now: int) -> tuple[IndexRows, int]:
    """The rows a batch may hold (below ``end``, unexpired) and the seq following the walked ones (-1: none)."""
    env = envs.get(index_path)
    if env is None:
        env = envs[index_path] = open_reader(index_path)
    try:
        rows = as_rows(*walk(env, queue_id, start, limit))
    except lmdb.MapResizedError:  # the broker's index outgrew the map this process opened it with: adopt its size
        env.set_mapsize(0)
        rows = as_rows(*walk(env, queue_id, start, limit))
    following = int(rows.seqs[-1]) + 1 if len(rows) == limit else -1
    fits = max(1, int(np.searchsorted(np.cumsum(rows.sizes, dtype=np.int64), max_bytes, "right")))
    if fits < len(rows):  # bigger messages than the queue's mean: the batch stops at max_bytes
        following, rows = int(rows.seqs[fits]), rows[:fits]
    keep = (rows.seqs < end) & ((rows.expiry == 0) | (rows.expiry > now))
    return (rows if keep.all() else rows[keep]), following


def _build(payload: bytes, fds: list[int], pending: IndexRows, queue_name: str, columns: list[str], body_text: bool,
           skip: int) -> memoryview:
    """The batch of the walked rows from ``skip`` on, located by the broker (``LOCATIONS``)."""
    rows = pending[skip:]
    found, files, offsets, sizes = _columns(payload, len(rows), [kind for _name, kind in LOCATIONS])
    if not found.all():
        rows, files, offsets, sizes = rows[found], files[found], offsets[found], sizes[found]
    from . import arrow_records

    return _batch(queue_name, arrow_records.Layout(tuple(columns), body_text), rows, files, offsets, sizes, fds)


def _chunks(payload: bytes, fds: list[int], queue_name: str, columns: list[str], body_text: bool, start: int,
            end: int, limit: int) -> bytes:
    """``CHUNKS_READ`` and the batch of the records from ``start`` (below ``end``, ``limit`` at most) in the chunks
    the payload places: each read whole, its records converted as an AMQP 0-9-1 consumer of the stream gets them
    (a record this node cannot read keeps its offset and is left out)."""
    from stream_log import amqp10, chunk

    from . import arrow_records

    count = len(payload) // sum(np.dtype(kind).itemsize for _name, kind in CHUNK_LOCATIONS)
    files, positions, sizes, ids = (column.tolist() for column in _columns(
        payload, count, [kind for _name, kind in CHUNK_LOCATIONS]))
    message = amqp10.Decoder(queue_name).message
    seqs: list[int] = []
    routes: list[bytes] = []
    props: list[bytes] = []
    bodies: list[bytes] = []
    following = start
    for file, position, size, first in zip(files, positions, sizes, ids):
        raw = os.pread(fds[file], size, position)
        if len(raw) != size:
            raise OSError(f"short read of {size} bytes at {position}")
        entries, data_len = chunk.HEADER.unpack_from(raw)[2], chunk.HEADER.unpack_from(raw)[8]
        offset = first
        for record in chunk.records(memoryview(raw)[chunk.HEADER.size:chunk.HEADER.size + data_len], entries):
            if offset >= end or len(seqs) >= limit:
                break
            if offset >= start and record is not None:
                try:
                    converted = message(record)
                except amqp10.TooLarge:  # (left out, as a consumer of the stream is refused it)
                    offset += 1
                    continue
                seqs.append(offset)
                routes.append(converted.route)
                props.append(converted.header[arrow_records.PROPERTIES_AT:])
                bodies.append(converted.body)
            offset += 1
        following = max(following, offset)
        if offset >= end or len(seqs) >= limit:
            break
    layout = arrow_records.Layout(tuple(columns), body_text)
    batch = arrow_records.encode_columns(queue_name, seqs, [False] * len(seqs), routes, props, bodies, layout)
    return CHUNKS_READ.pack(len(seqs), following) + batch.serialize().to_pybytes()


def serve(sock: socket.socket) -> None:
    """Answer requests until the broker closes its end."""
    buffer = bytearray()
    envs: dict[str, Any] = {}  # the queue indexes walked, open to read
    pending = IndexRows.empty()  # the last walk's rows, for the build that follows it
    while True:
        data, fds, _flags, _address = socket.recv_fds(sock, 1 << 16, MAX_FDS)
        if not data:
            return
        buffer += data
        try:
            header_len, payload_len = REQUEST.unpack(_receive(sock, REQUEST.size, buffer))
            header = json.loads(_receive(sock, header_len, buffer))
            payload = _receive(sock, payload_len, buffer)
            try:
                if "walk" in header:
                    pending, following = _walk(envs, *header["walk"])
                    reply = (WALKED.pack(len(pending), following) + pending.seqs.tobytes() + pending.msg_ids.tobytes()
                             + ((pending.flags & FLAG_TRANSIENT) != 0).tobytes())
                elif "chunks" in header:
                    reply = _chunks(payload, fds[:-1] if "out" in header else fds, *header["chunks"])
                else:
                    reply = _build(payload, fds[:-1] if "out" in header else fds, pending, *header["build"])
                status = 0
            except Exception as exc:  # noqa: BLE001 - told to the broker, which builds the batch itself
                reply, status = repr(exc).encode(), 1
            if not status and "out" in header:
                head = reply[:CHUNKS_READ.size] if "chunks" in header else b""
                try:
                    reply = head + _write_out(fds[-1], memoryview(reply)[len(head):], header["out"] == "chunked")
                except OSError as exc:
                    reply, status = repr(exc).encode(), 2
        finally:
            for fd in fds:
                os.close(fd)
        sock.sendall(REPLY.pack(status, len(reply)))
        sock.sendall(reply)
