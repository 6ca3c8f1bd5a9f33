"""A message's content as it is stored and shipped: the one layout of the message store's records (``message.py``),
the cluster links' message frames (``forwarder/peers/node_link.py``) and what the Spark bridge's record readers read off
the segment files a column at a time (``amqp_server/spark_bridge/record_reader.py``).

The layout: the route's length (uint16) and the content header's (uint32), then the route (exchange and routing key
as AMQP short strings, as published), the content header payload, and the body.  A message published over AMQP 1.0
keeps its sections before the body as they came (``Message.amqp10``): the route's length then carries ``SECTIONS``,
and the sections' length (uint32) and the sections come between the lengths and the route, so that a restart, a
page-out or another node's copy gives an AMQP 1.0 reader the message it was sent.
"""
from __future__ import annotations

import struct
from typing import TypeVar

import numpy as np

HEAD = struct.Struct(">HI")  # route length (with ``SECTIONS``), header length
SECTIONS = 0x8000  # a route is at most 512 bytes: this bit of its length says AMQP 1.0 sections follow the lengths
SECTIONS_LEN = struct.Struct(">I")
Bytes = TypeVar("Bytes", bytes, bytearray)
Body = TypeVar("Body")  # a body as its writer has it: bytes, or a range of the store's file it is sent from


def encode(route: bytes, header: bytes, body: Body, sections: bytes | None = None) -> tuple[bytes, bytes, bytes, Body]:
    """The payload in parts, never concatenated here: a store or a socket writes them one after another.  The
    first part is the lengths, with the AMQP 1.0 sections, if any."""
    if sections is None:
        return HEAD.pack(len(route), len(header)), route, header, body
    return (HEAD.pack(len(route) | SECTIONS, len(header)) + SECTIONS_LEN.pack(len(sections)) + sections, route,
            header, body)


def decode(payload: bytes, pos: int = 0) -> tuple[bytes, bytes, bytes, bytes | None]:
    """(route, header, body, AMQP 1.0 sections or None) of the payload at ``pos`` of ``payload``, whose body runs
    to its end."""
    route, header, body_at, sections = decode_head(payload, pos)
    return route, header, payload[body_at:], sections


def decode_head(payload: Bytes, pos: int = 0) -> tuple[Bytes, Bytes, int, bytes | None]:
    """``decode`` but for the body: where it begins instead (route and header are slices of ``payload``'s
    type)."""
    route_len, header_len = HEAD.unpack_from(payload, pos)
    route_at = pos + HEAD.size
    sections = None
    if route_len & SECTIONS:
        route_len ^= SECTIONS
        sections_len, = SECTIONS_LEN.unpack_from(payload, route_at)
        sections = bytes(payload[route_at + SECTIONS_LEN.size:route_at + SECTIONS_LEN.size + sections_len])
        route_at += SECTIONS_LEN.size + sections_len
    header_at = route_at + route_len
    body_at = header_at + header_len
    return payload[route_at:header_at], payload[header_at:body_at], body_at, sections


def body_size(payload: bytes | memoryview) -> int:
    """The size of the body of ``payload`` (a whole one: its body runs to its end)."""
    route_len, header_len = HEAD.unpack_from(payload)
    if route_len & SECTIONS:
        route_len ^= SECTIONS
        route_len += SECTIONS_LEN.size + SECTIONS_LEN.unpack_from(payload, HEAD.size)[0]
    return len(payload) - HEAD.size - route_len - header_len


def route_names(route: bytes) -> tuple[str, str]:
    """(exchange, routing key) of a route; bytes that are not UTF-8 are replaced, never refused."""
    ex_len = route[0]
    return route[1:1 + ex_len].decode(errors="replace"), route[2 + ex_len:].decode(errors="replace")


def spans(buffer: np.ndarray, at: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``decode`` of many payloads at once: where the route, the header and the body of each payload in ``buffer``
    (bytes) begin, for payloads beginning at ``at``."""

    def octet(k: int) -> np.ndarray:
        return buffer[at + k].astype(np.int64)

    route_len = octet(0) << 8 | octet(1)  # HEAD, big-endian
    header_len = octet(2) << 24 | octet(3) << 16 | octet(4) << 8 | octet(5)
    route_at = at + HEAD.size
    flagged = (route_len & SECTIONS) != 0
    if flagged.any():  # AMQP 1.0 sections before the route, skipped (any payload is longer than 10 bytes)
        route_len &= SECTIONS - 1
        sections_len = octet(6) << 24 | octet(7) << 16 | octet(8) << 8 | octet(9)
        route_at = route_at + np.where(flagged, SECTIONS_LEN.size + sections_len, 0)
    header_at = route_at + route_len
    return route_at, header_at, header_at + header_len
