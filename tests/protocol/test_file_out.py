"""framing.file_out in-process: output with ranges of a file reaches a slow reader byte-exact through a real
socket and transport, the socket taken directly while it takes bytes and the transport given the rest as the reader
catches up; a range's descriptor is closed once it is sent, or dropped."""
from __future__ import annotations

import asyncio
import os
import socket
from collections.abc import Callable

import pytest

from amqp_server.framing.file_out import WRITE_ALONE, FileRange, Outbox, cut, direct_socket

pytestmark = pytest.mark.timeout(60)

HIGH = 256 * 1024


class Sender(asyncio.Protocol):
    """A protocol as the AMQP connection uses the outbox: pump on flush and when writing may resume."""

    def __init__(self) -> None:
        self.outbox = Outbox()
        self.transport: asyncio.Transport | None = None
        self.sock: socket.socket | None = None
        self.pauses = 0

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        transport.set_write_buffer_limits(high=HIGH)  # type: ignore[attr-defined]
        self.sock = direct_socket(transport)

    def pump(self) -> None:
        assert self.transport is not None
        self.outbox.pump(self.transport, self.sock, HIGH)

    def pause_writing(self) -> None:
        self.pauses += 1

    def resume_writing(self) -> None:
        self.pump()


def fd_open(fd: int) -> bool:
    try:
        os.fstat(fd)
    except OSError:
        return False
    return True


async def send_slowly(tmp_path, parts_of, data: bytes | None = None,
                      pumped: Callable[[Sender], None] = lambda sender: None) -> tuple[bytes, Sender, bytes]:
    """Write a file of ``data`` (4 random MiB by default), hand the outbox ``parts_of(fd)``, see it after its first
    pump (``pumped``) and read what arrives in small sips."""
    data = os.urandom(4 << 20) if data is None else data
    path = tmp_path / "segment"
    path.write_bytes(data)
    loop = asyncio.get_running_loop()
    ours, theirs = socket.socketpair()
    _, sender = await loop.connect_accepted_socket(Sender, ours)
    theirs.setblocking(False)
    fd = os.open(path, os.O_RDONLY)
    parts = parts_of(fd)
    expected = b"".join(bytes(p) if not isinstance(p, FileRange) else data[p.pos:p.pos + p.size] for p in parts)
    sender.outbox.extend(parts)
    sender.pump()
    pumped(sender)
    got = bytearray()
    while len(got) < len(expected):
        got += await loop.sock_recv(theirs, 256 * 1024)
        await asyncio.sleep(0)
    assert sender.transport is not None
    sender.transport.close()
    theirs.close()
    return bytes(got), sender, expected


async def test_frames_of_a_file_reach_a_slow_reader_byte_exact_and_its_descriptor_is_closed(tmp_path):
    owned: list[int] = []

    def parts_of(fd: int) -> list:
        owned.append(fd)
        parts: list = []
        for piece in FileRange(fd, 1000, 3 << 20, owns=True).pieces(131064):
            parts += [b"head%d" % piece.pos, piece, b"\xce"]
        return parts

    got, sender, expected = await send_slowly(tmp_path, parts_of)
    assert got == expected
    assert sender.pauses  # (the transport was given the rest: the socket did not take it all at once)
    assert not sender.outbox
    assert not fd_open(owned[0])


async def test_output_dropped_closes_the_descriptors_its_ranges_own(tmp_path):
    path = tmp_path / "segment"
    path.write_bytes(b"x" * 1000)
    fd = os.open(path, os.O_RDONLY)
    outbox = Outbox()
    outbox.extend([b"head", *FileRange(fd, 0, 1000, owns=True).pieces(300), b"end"])
    outbox.clear()
    assert not fd_open(fd)


async def test_output_cut_in_frames_is_the_same_bytes_and_the_range_s_last_piece_owns_its_descriptor(tmp_path):
    """``cut``: the parts of an AMQP 1.0 transfer in runs of a frame's payload, bytes as views and a range as
    ranges (each with its part of the bytes in memory), the whole read back byte-exact."""
    data = os.urandom(100)
    path = tmp_path / "segment"
    path.write_bytes(b"-" * 10 + data)
    fd = os.open(path, os.O_RDONLY)
    runs = list(cut([b"head", FileRange(fd, 10, 100, owns=True, data=data), b"", b"tail"], 30))
    ranges = [part for run in runs for part in run if isinstance(part, FileRange)]
    assert [sum(map(len, run)) for run in runs] == [30, 30, 30, 18]
    assert b"".join(part.read() if isinstance(part, FileRange) else bytes(part) for run in runs
                    for part in run) == b"head" + data + b"tail"
    assert b"".join(bytes(part.data) for part in ranges if part.data is not None) == data
    assert [part.owns for part in ranges] == [False, False, False, True]
    for part in ranges:
        part.close()
    assert not fd_open(fd)


async def test_a_range_whose_bytes_are_in_memory_is_written_from_them(tmp_path):
    """A body the node still holds goes from memory (one sendmsg with its frames), not from its file: here the
    memory's bytes differ from the file's, to tell which was sent."""
    size = 64 * 1024
    held = os.urandom(size)
    got, sender, _ = await send_slowly(
        tmp_path, lambda fd: [b"head", *FileRange(fd, 0, size, owns=True, data=held).pieces(16 * 1024), b"end"])
    assert got == b"head" + held + b"end"
    assert not sender.outbox


async def test_what_the_socket_does_not_take_at_once_waits_without_the_bytes_in_memory(tmp_path):
    """The first direct write sends what the socket takes from memory; the rest waits as plain ranges of the
    file (a client that does not read makes the node hold no body), and arrives byte-exact."""
    data = os.urandom(3 << 20)
    fds: list[int] = []
    waiting: list[FileRange] = []

    def parts_of(fd: int) -> list:
        fds.append(fd)
        return [b"head", *FileRange(fd, 0, len(data), owns=True, data=data).pieces(131064), b"end"]

    got, _, _ = await send_slowly(tmp_path, parts_of, data, lambda sender: waiting.extend(
        part for part in sender.outbox.parts if isinstance(part, FileRange)))
    assert waiting and all(part.data is None for part in waiting)
    assert got == b"head" + data + b"end"
    assert not fd_open(fds[0])


async def test_a_large_body_in_memory_the_socket_does_not_take_at_once_is_given_to_the_transport_a_piece_at_a_time(
        tmp_path):
    """What the socket does not take of a body the node holds in memory goes to the transport in pieces while it
    has room (each copied once, into its buffer), the rest waiting as a view of the body: not all of it joined and
    copied into the transport at once."""
    body = bytearray(os.urandom(8 << 20))
    buffered: list[int] = []
    got, _, _ = await send_slowly(tmp_path, lambda fd: [b"head", body, b"end"], pumped=lambda sender: buffered.append(
        sender.transport.get_write_buffer_size()))  # type: ignore[union-attr]  # (connected)
    assert got == b"head" + body + b"end"
    assert buffered[0] <= HIGH + WRITE_ALONE, f"{buffered[0] >> 20} MiB given to the transport at once"


class Loan:
    """What lent a range its descriptor, as a message store's segment is: told when the file is read through it
    and when it is given back."""

    def __init__(self) -> None:
        self.read = self.back = 0

    def read_through(self) -> None:
        self.read += 1

    def given_back(self) -> None:
        self.back += 1


@pytest.mark.parametrize("size", [64 * 1024, 3 << 20])
async def test_a_ranges_loan_is_given_back_once_and_told_whether_the_file_was_read(tmp_path, size):
    """A body the socket takes at once from memory leaves its file unread (its segment may be written again once
    deleted); one the socket does not take at once is read from the file (a transport may map it), and the loan
    hears so before its descriptor is given back."""
    data = os.urandom(size)
    loan = Loan()
    got, _, _ = await send_slowly(tmp_path, lambda fd: [
        b"head", *FileRange(fd, 0, size, owns=True, data=data, loan=loan).pieces(131064), b"end"], data)
    assert got == b"head" + data + b"end"
    assert loan.back == 1
    assert bool(loan.read) == (size > 1 << 20)
