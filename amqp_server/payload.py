"""A message's content as it is stored and shipped: the one layout of the message store's records (``message.py``),
the cluster links' message frames (``forwarder/peers/node_link.py``) and what the Spark bridge's record readers read off
the segment files a column at a time (``amqp_server/spark_bridge/record_reader.py``).

The layout: the route's length (uint16) and the content header's (uint32), then the route (exchange and routing key
as AMQP short strings, as published), the content header payload, and the body.
"""
from __future__ import annotations

import struct

import numpy as np

HEAD = struct.Struct(">HI")  # route length, header length


def encode(route: bytes, header: bytes, body: bytes) -> tuple[bytes, bytes, bytes, bytes]:
    """The payload in parts, never concatenated here: a store or a socket writes them one after another."""
    return HEAD.pack(len(route), len(header)), route, header, body


def decode(payload: bytes, pos: int = 0) -> tuple[bytes, bytes, bytes]:
    """(route, header, body) of the payload at ``pos`` of ``payload``, whose body runs to its end."""
    route_len, header_len = HEAD.unpack_from(payload, pos)
    route_at = pos + HEAD.size
    header_at = route_at + route_len
    body_at = header_at + header_len
    return payload[route_at:header_at], payload[header_at:body_at], payload[body_at:]


def body_size(payload: bytes | memoryview) -> int:
    """The size of the body of ``payload`` (a whole one: its body runs to its end)."""
    route_len, header_len = HEAD.unpack_from(payload)
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
    header_at = route_at + route_len
    return route_at, header_at, header_at + header_len
