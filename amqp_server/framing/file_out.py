"""Output that includes bytes of files: stored message bodies and stream chunks leave for a client's socket by
``sendfile`` from the store's segment files, never read into the process while the socket takes them.

An output is a list of parts: bytes (or views) and :class:`FileRange`\\ s.  :func:`write_direct` writes parts to a
plain (not TLS) socket as far as it takes them without blocking: ``writev`` for a run of in-memory parts, ``sendfile``
for a file range.  What the socket does not take is the caller's to queue: the stream protocol reads the rest of its
chunk into its transport (:func:`read_rest`); the AMQP 0-9-1 and AMQP 1.0 connections keep it in an :class:`Outbox`
(:class:`FileSender`), which their transport is given a frame at a time while it has room, so what a slow client
holds in memory is bounded by the transport's buffer, not by the bodies in flight.

A range may own its file descriptor (a duplicate taken for it, see ``MessageStore.open_payload``): it is closed once
the range is sent or dropped, and until then the bytes stay readable whatever the store does (a segment file is never
rewritten in place, and one compacted or deleted and unlinked lives on while a descriptor is open).  Such a range
carries its ``loan``, which it tells when the file is read through it (from then on the file is never written
again: a transport may still hold a mapping of it after the range is closed) and when it gives the descriptor back;
a deleted segment whose loans all came back unread has its file written again as a new segment.

A range may also carry its bytes in memory (``data``: a body the node still holds): the first :func:`write_direct`
of its output writes them from there, with the frames around them, in one ``sendmsg``.  On loopback that costs the
node less than a ``sendfile`` and a ``sendmsg`` of the frame head for each body frame (persistent-confirm, alternating:
broker CPU per message 11-13 % less at 64 KiB and 1 MiB).  What that write leaves waits in the outbox as a plain
range (:meth:`Outbox.pump` drops ``data``), so that a client that does not read still makes the node hold no body.
"""
from __future__ import annotations

import asyncio
import mmap
import os
import socket
from collections import deque
from typing import Iterable, Iterator, Protocol, Sequence, Union

WRITEV_MAX = 512  # parts one writev takes at most (the system's IOV_MAX is 1024)
MAP_WINDOW = 16 << 20  # how much of a file the outbox maps at once, for the transport to write from
# an in-memory part at least this large waiting in the outbox (a body) is given to the transport in pieces of this
# size while it has room, each copied once into its buffer (joined with the rest, it was copied twice, all of it)
WRITE_ALONE = 1 << 20


class Loan(Protocol):
    """What lent a range its descriptor (a message store's segment)."""

    def read_through(self) -> None: ...  # the file is read through the descriptor: never write it again

    def given_back(self) -> None: ...  # the descriptor is closed


class FileRange:
    """``size`` bytes of the file ``fd`` from ``pos``.  ``owns``: this range closes ``fd`` once sent or dropped (the
    last of the ranges cut from one descriptor, see :meth:`pieces`), and gives it back to its ``loan``."""

    __slots__ = ("fd", "pos", "size", "owns", "data", "loan")

    def __init__(self, fd: int, pos: int, size: int, owns: bool = False,
                 data: bytes | bytearray | memoryview | None = None, loan: Loan | None = None) -> None:
        self.fd = fd
        self.pos = pos
        self.size = size
        self.owns = owns
        self.data = data  # the same bytes in memory, if the node holds them (see the module's docstring)
        self.loan = loan

    def __len__(self) -> int:
        return self.size

    def pieces(self, limit: int) -> Iterator[FileRange]:
        """The range cut in pieces of at most ``limit`` bytes, in order (the last one owning the descriptor if
        this range does), each with its part of ``data``."""
        end = self.pos + self.size
        view = None if self.data is None else memoryview(self.data)
        for start in range(self.pos, end, limit):
            stop = min(start + limit, end)
            yield FileRange(self.fd, start, stop - start, self.owns and stop == end,
                            None if view is None else view[start - self.pos:stop - self.pos], self.loan)

    def read(self, size: int | None = None) -> bytes:
        """The range's first ``size`` bytes (all of it by default) read into memory."""
        size = self.size if size is None else min(size, self.size)
        if self.loan is not None:
            self.loan.read_through()
        data = os.pread(self.fd, size, self.pos)
        if len(data) != size:
            raise OSError(f"short read of {size} bytes at {self.pos}")
        return data

    def close(self) -> None:
        if self.owns:
            self.owns = False
            os.close(self.fd)
            if self.loan is not None:
                self.loan.given_back()


Part = Union[bytes, bytearray, memoryview, FileRange]


def write_direct(sock: socket.socket, parts: Iterable[Part]) -> int:
    """Write ``parts`` to the non-blocking socket ``sock`` until it takes no more; how many bytes it took.  A file
    range whose bytes are in memory (``data``) is written from there, as the in-memory parts are.  The in-memory
    parts before a file range go with ``MSG_MORE``, so that a frame's head and the file's bytes after it leave in
    full segments, not a small one each.  A peer that went away ends it too (its transport finds out and
    closes)."""
    written = 0
    run: list[bytes | bytearray | memoryview] = []
    fd = sock.fileno()
    try:
        for part in parts:
            data = part.data if isinstance(part, FileRange) else part
            if data is not None:
                run.append(data)
                if len(run) < WRITEV_MAX:
                    continue
            if run:
                wanted = sum(map(len, run))
                took = sock.sendmsg(run, (), socket.MSG_MORE)
                written += took
                run = []
                if took < wanted:
                    return written
            if isinstance(part, FileRange) and data is None:
                if part.loan is not None:
                    part.loan.read_through()
                done = 0
                while done < part.size:
                    took = os.sendfile(fd, part.fd, part.pos + done, part.size - done)
                    if not took:  # (the file is shorter than the range: never, segments only grow)
                        raise OSError(f"sendfile took nothing at {part.pos + done}")
                    done += took
                    written += took
        if run:
            written += sock.sendmsg(run)
    except (BlockingIOError, InterruptedError):
        pass
    except OSError:  # the peer went (the transport finds out) or the socket is closed
        pass
    return written


def read_rest(parts: list[Part], written: int) -> bytes:
    """What :func:`write_direct` left of ``parts`` after ``written`` bytes, read into memory."""
    rest: list[bytes | bytearray | memoryview] = []
    for part in parts:
        size = len(part)
        if written >= size:
            written -= size
            continue
        if type(part) is FileRange:
            rest.append(FileRange(part.fd, part.pos + written, size - written).read())
        else:
            rest.append(part[written:])  # type: ignore[index]  # (bytes or a view)
        written = 0
    return b"".join(rest)


def cut(parts: Iterable[Part], limit: int) -> Iterator[list[Part]]:
    """``parts`` in runs of ``limit`` bytes (the last one may be shorter), a frame's payload each: parts are cut
    where a run ends, none copied (views of bytes; ranges of a file, the last piece of one owning its descriptor
    if the range did, each with its part of ``data``)."""
    run: list[Part] = []
    room = limit
    for part in parts:
        at, size = 0, len(part)
        while at < size:
            take = min(room, size - at)
            run.append(part if take == size else _piece(part, at, take))
            at += take
            room -= take
            if not room:
                yield run
                run, room = [], limit
    if run:
        yield run


def _piece(part: Part, at: int, size: int) -> Part:
    """``size`` bytes of ``part`` from ``at``."""
    if type(part) is FileRange:
        data = None if part.data is None else memoryview(part.data)[at:at + size]
        return FileRange(part.fd, part.pos + at, size, part.owns and at + size == part.size, data, part.loan)
    return memoryview(part)[at:at + size]  # type: ignore[arg-type]  # (bytes or a view)


def discard(parts: Iterable[Part]) -> None:
    """Output that will not be sent: the descriptors its ranges own are closed."""
    for part in parts:
        if type(part) is FileRange:
            part.close()


class Outbox:
    """A connection's output that waits behind a file range its socket did not take at once: given to the
    transport a piece at a time (:meth:`pump`) while its buffer has room, the rest when it drains."""

    def __init__(self) -> None:
        self.parts: deque[Part] = deque()
        self._window: tuple[int, int, memoryview] | None = None  # (fd, position, view) of a file mapped last

    def __bool__(self) -> bool:
        return bool(self.parts)

    def extend(self, parts: Iterable[Part]) -> None:
        self.parts.extend(parts)

    def pump(self, transport: asyncio.WriteTransport, sock: socket.socket | None, high: int) -> None:
        """Send what waits: straight to ``sock`` (None: TLS) while the transport holds nothing, then through
        the transport until it holds more than ``high`` bytes (which pauses the protocol's writing: its
        resumption pumps again)."""
        parts = self.parts
        if sock is not None and not transport.get_write_buffer_size():
            self._consume(write_direct(sock, list(parts)))
        for part in parts:  # what waits goes from the files: the node holds no body for a client not reading
            if type(part) is FileRange:
                part.data = None
        run: list[bytes | bytearray | memoryview] = []
        while parts and transport.get_write_buffer_size() <= high:
            part = parts.popleft()
            if type(part) is FileRange:
                if run:
                    transport.write(b"".join(run))
                    run = []
                data = self._mapped(part)
                if len(data) < part.size:
                    parts.appendleft(FileRange(part.fd, part.pos + len(data), part.size - len(data), part.owns,
                                               loan=part.loan))
                else:
                    self._done(part)
                transport.write(data)
            elif len(part) >= WRITE_ALONE:  # a body in memory: given a piece at a time, not copied into a join
                if run:
                    transport.write(b"".join(run))
                    run = []
                view = memoryview(part)  # type: ignore[arg-type]  # (not a FileRange)
                if len(view) > WRITE_ALONE:
                    parts.appendleft(view[WRITE_ALONE:])
                transport.write(view[:WRITE_ALONE])
            else:
                run.append(part)  # type: ignore[arg-type]  # (not a FileRange)
        if run:
            transport.write(b"".join(run))

    def _consume(self, written: int) -> None:
        """``written`` bytes of the parts went: those sent whole leave, the first one sent in part is cut."""
        parts = self.parts
        while parts and written:
            part = parts[0]
            size = len(part)
            if written < size:
                if type(part) is FileRange:
                    part.pos += written
                    part.size -= written
                else:
                    parts[0] = memoryview(part)[written:]  # type: ignore[arg-type]  # (bytes or a view)
                return
            written -= size
            parts.popleft()
            if type(part) is FileRange:
                self._done(part)

    def _mapped(self, part: FileRange) -> memoryview:
        """As much of ``part`` as lies in the window of its file mapped into memory (mapped anew where it does
        not lie in the last): the transport writes it from the page cache, not from a copy read here.  One
        mapping serves a body's frames, and goes with the last view of it the transport holds."""
        if part.loan is not None:
            part.loan.read_through()
        window = self._window
        if window is None or window[0] != part.fd or not window[1] <= part.pos < window[1] + len(window[2]):
            start = part.pos - part.pos % mmap.ALLOCATIONGRANULARITY
            end = min(os.fstat(part.fd).st_size, part.pos + max(part.size, MAP_WINDOW))
            mapping = mmap.mmap(part.fd, end - start, mmap.MAP_SHARED, mmap.PROT_READ, offset=start)
            window = self._window = (part.fd, start, memoryview(mapping))
        at = part.pos - window[1]
        return window[2][at:at + part.size]

    def _done(self, part: FileRange) -> None:
        """A range is sent: the descriptor it owns is closed, and a window of it forgotten (its number may
        name another file next)."""
        if part.owns and self._window is not None and self._window[0] == part.fd:
            self._window = None
        part.close()

    def clear(self) -> None:
        self._window = None
        discard(self.parts)
        self.parts.clear()


class FileSender:
    """How a connection whose output may hold file ranges (AMQP 0-9-1's, AMQP 1.0's) writes it: through an
    :class:`Outbox`, straight to a socket of its own while the transport holds nothing (made at the first output
    sent so: a descriptor more)."""

    def __init__(self) -> None:
        self.outbox = Outbox()
        self._socket: socket.socket | None = None
        self._socket_taken = False

    def __bool__(self) -> bool:
        """Output waits in the outbox: what follows goes after it."""
        return bool(self.outbox)

    def send(self, transport: asyncio.WriteTransport, parts: Sequence[Part], high: int) -> int:
        """``parts`` go after what waits (the outbox has them now: the caller clears its list); their size."""
        size = sum(map(len, parts))
        self.outbox.extend(parts)
        self.pump(transport, high)
        return size

    def pump(self, transport: asyncio.WriteTransport | None, high: int) -> None:
        """What waits, to the socket and to the transport while it holds no more than ``high`` (``Outbox.pump``)."""
        if transport is not None and not transport.is_closing():
            if not self._socket_taken:
                self._socket_taken = True
                self._socket = direct_socket(transport)
            self.outbox.pump(transport, self._socket, high)

    def close(self) -> None:
        """The connection is lost: what waits is dropped (its descriptors closed), and the socket closed."""
        self.outbox.clear()
        if self._socket is not None:
            self._socket.close()
            self._socket = None


def direct_socket(transport: asyncio.BaseTransport) -> socket.socket | None:
    """A socket object on the transport's socket (a duplicate descriptor: the caller closes it), for
    :func:`write_direct` while the transport has nothing waiting; None where bytes must go through the transport
    (TLS encrypts them there)."""
    sock = transport.get_extra_info("socket")
    if sock is None or transport.get_extra_info("sslcontext") is not None:
        return None
    own = socket.socket(sock.family, sock.type, sock.proto, os.dup(sock.fileno()))
    own.setblocking(False)
    return own
