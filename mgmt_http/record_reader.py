"""Reader processes for the Spark bridge's ``/records``: a queue's part on disk becomes Arrow batches in
another process, so that a large read does not take the event loop's GIL from AMQP traffic.

The loop finds where a batch's payloads lie (``Queue.disk_span``: the queue index and the stores'
locations, as arrays) and sends that, with the descriptors of the segment files, to an idle reader over a
Unix socket.  The reader reads the records (one ``pread`` per run of neighbours), builds the record batch
column by column (``arrow_records.encode_columns``) and sends back its serialised IPC message, which the
loop writes to the response as it is.  A descriptor stays readable after a compaction or a deletion
unlinks its file, so the records a span names are there however the store moves on meanwhile.

When the client's connection is plain TCP, the loop passes its socket along too and the reader writes the
batch to the client itself (an HTTP chunk, as aiohttp would frame it): the loop never touches the batch's
bytes.  It writes what the socket takes within ``WRITE_WAIT`` and sends back only what is left, for the loop
to write as it would have the whole batch, so a slow client cannot keep a reader busy.

The queue index is walked there too (``walk``): LMDB lets another process read it while the broker
writes, and a walk of 16,384 entries is milliseconds the loop would otherwise spend.

Wire format, both ways over a stream socket: a request is ``REQUEST`` (header length, rows), the JSON
header (a walk's index, queue id, start and limit; or a batch's queue name and body format), then for a
batch the span's five arrays back to back, its descriptors riding along with the first bytes.  A reply is
``REPLY`` (status, length) and that many bytes: the walk's keys' length, keys and values, or the batch's
IPC message (with a client's socket: what of it is left to write), or the error's text (status 1; status 2
when writing to the client failed).
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
from typing import Any

import lmdb
import numpy as np
import pyarrow as pa

from amqp_server.queue import DiskSpan
from queue_index import as_columns, open_reader, walk

log = logging.getLogger("warren.mgmt.records")

REQUEST = struct.Struct(">II")  # header length, rows
REPLY = struct.Struct(">BQ")  # status (0: the batch, 1: an error, 2: the client's socket failed), length
KEYS_LENGTH = struct.Struct(">I")  # a walk's reply: its keys' length, then keys and values
PAYLOAD_HEAD = struct.Struct(">HI")  # a stored payload: route length, header length (amqp_server.message)
READ_GAP = 64 * 1024  # dead bytes between two wanted records read through rather than seeked over
MAX_FDS = 4096
WRITE_WAIT = 0.05  # seconds a reader waits, in all, for a client's socket to take a batch, before handing back the rest
# a reader process's program: imported, not run as ``-m`` (the package imports this module first, and runpy
# would warn that it runs a second copy of it)
MAIN = "import socket, sys; from mgmt_http.record_reader import serve; serve(socket.socket(fileno=int(sys.argv[1])))"
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_COLUMNS = (("seqs", np.int64), ("redelivered", np.bool_), ("files", np.uint32), ("offsets", np.uint32),
            ("sizes", np.uint32))


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


class RecordReaders:
    """``size`` reader processes, started on first use (``start``); ``read`` hands a span to an idle one."""

    def __init__(self, size: int) -> None:
        self.size = size
        self._idle: asyncio.Queue[_Reader] | None = None
        self._all: list[_Reader] = []

    async def walk(self, index_path: str, queue_id: int, start: int, limit: int) -> tuple[np.ndarray, np.ndarray]:
        """Up to ``limit`` index entries of the queue from ``seq >= start``, as ``queue_index.as_columns``."""
        reply = await self._ask(lambda reader: reader.request({"walk": [index_path, queue_id, start, limit]}))
        keys_length = KEYS_LENGTH.unpack_from(reply)[0]
        return as_columns(reply[KEYS_LENGTH.size:KEYS_LENGTH.size + keys_length],
                          reply[KEYS_LENGTH.size + keys_length:])

    async def read(self, queue_name: str, span: DiskSpan, body_text: bool,
                   client: ClientSocket | None = None) -> memoryview:
        """The span's record batch, serialised (an Arrow IPC message); with ``client``, written to it, and what is
        left to write (already framed) returned."""
        header: dict[str, Any] = {"queue": queue_name, "text": body_text}
        if client is not None:
            header["out"] = "chunked" if client.chunked else "raw"
        return await self._ask(lambda reader: reader.request(header, span, client.fd if client is not None else None))

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

    async def _ask(self, request: Any) -> memoryview:
        self.start()
        if not self._all:
            raise ReaderUnavailable("no reader processes")
        reader = await self._idle.get()
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
            self._idle.put_nowait(reader)

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

    async def request(self, header: dict, span: DiskSpan | None = None, out: int | None = None) -> memoryview:
        """Send a request (``out``: a client's socket, passed after the span's descriptors) and read its reply."""
        loop = asyncio.get_running_loop()
        encoded = json.dumps(header).encode()
        head = REQUEST.pack(len(encoded), len(span.seqs) if span is not None else 0) + encoded
        fds = (span.fds if span is not None else []) + ([out] if out is not None else [])
        socket.send_fds(self.sock, [head], fds)  # few bytes, an empty buffer
        if span is not None:
            await loop.sock_sendall(self.sock, b"".join(getattr(span, name).astype(kind, copy=False).tobytes()
                                                        for name, kind in _COLUMNS))
        status, length = REPLY.unpack(await self._exactly(REPLY.size))
        body = await self._exactly(length)
        if status == 2:
            raise ClientGone(bytes(body).decode(errors="replace"))
        if status:
            raise OSError(bytes(body).decode(errors="replace"))
        return body

    async def _exactly(self, size: int) -> memoryview:
        """``size`` bytes from the reader, into memory not zeroed first (a batch is tens of MiB)."""
        loop = asyncio.get_running_loop()
        view = memoryview(np.empty(size, np.uint8))
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
    view = memoryview(buffer)
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


def _batch(header: dict, columns: dict[str, np.ndarray], fds: list[int]) -> memoryview:
    """The record batch of the span, its columns gathered from the records as arrays (row by row only
    where ``arrow_records`` decodes each distinct route and header once)."""
    from . import arrow_records

    buffer, at, size, order = _payloads(fds, columns["files"], columns["offsets"], columns["sizes"])

    def octet(k: int) -> np.ndarray:
        return buffer[at + k].astype(np.int64)

    route_len = octet(0) << 8 | octet(1)  # PAYLOAD_HEAD, big-endian, read for every row at once
    header_len = octet(2) << 24 | octet(3) << 16 | octet(4) << 8 | octet(5)
    route_at = at + PAYLOAD_HEAD.size
    header_at = route_at + route_len
    body_at = header_at + header_len
    props_at = np.minimum(header_at + arrow_records.PROPERTIES_AT, body_at)
    columns_in_buffer_order = [_gather(buffer, begin, stop) for begin, stop in
                               ((route_at, header_at), (props_at, body_at), (body_at, at + size))]
    if np.any(order[1:] < order[:-1]):  # records not in offset order (a compaction moved some): rows' order back
        back = np.empty_like(order)
        back[order] = np.arange(len(order))
        columns_in_buffer_order = [column.take(back) for column in columns_in_buffer_order]
    routes, props, bodies = columns_in_buffer_order
    schema = arrow_records.arrow_schema(header["text"])
    batch = arrow_records.encode_columns(header["queue"], columns["seqs"], columns["redelivered"], routes, props,
                                         bodies, header["text"], schema)
    return memoryview(batch.serialize())


def _write_out(fd: int, batch: memoryview, chunked: bool) -> bytes:
    """Write ``batch`` to a client's socket (non-blocking: the loop's own), as an HTTP chunk if ``chunked``;
    what it did not take within ``WRITE_WAIT``, framed, is returned for the loop to write."""
    parts = [f"{len(batch):x}\r\n".encode(), batch, b"\r\n"] if chunked else [batch]
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


def _walk(envs: dict[str, Any], index_path: str, queue_id: int, start: int, limit: int) -> bytes:
    env = envs.get(index_path)
    if env is None:
        env = envs[index_path] = open_reader(index_path)
    try:
        keys, values = walk(env, queue_id, start, limit)
    except lmdb.MapResizedError:  # the broker's index outgrew the map this process opened it with: adopt its size
        env.set_mapsize(0)
        keys, values = walk(env, queue_id, start, limit)
    return KEYS_LENGTH.pack(len(keys)) + keys + values


def serve(sock: socket.socket) -> None:
    """Answer requests until the broker closes its end."""
    buffer = bytearray()
    envs: dict[str, Any] = {}  # the queue indexes walked, open to read
    while True:
        data, fds, _flags, _address = socket.recv_fds(sock, 1 << 16, MAX_FDS)
        if not data:
            return
        buffer += data
        try:
            header_len, rows = REQUEST.unpack(_receive(sock, REQUEST.size, buffer))
            header = json.loads(_receive(sock, header_len, buffer))
            columns = {name: np.frombuffer(_receive(sock, rows * np.dtype(kind).itemsize, buffer), kind)
                       for name, kind in _COLUMNS} if rows else {}
            try:
                reply = _walk(envs, *header["walk"]) if "walk" in header else _batch(header, columns, fds)
                status = 0
            except Exception as exc:  # noqa: BLE001 - told to the broker, which builds the batch itself
                reply, status = repr(exc).encode(), 1
            if not status and "out" in header:
                try:
                    reply = _write_out(fds[-1], reply, header["out"] == "chunked")
                except OSError as exc:
                    reply, status = repr(exc).encode(), 2
        finally:
            for fd in fds:
                os.close(fd)
        sock.sendall(REPLY.pack(status, len(reply)))
        sock.sendall(reply)

