"""Requests over many messages (get, peek, move): a slice per loop turn, the answer streamed as it is made.

One request may ask for hundreds of thousands of messages.  Done in one go it held the event loop, and
with it every AMQP client and every other request, for seconds, and built its whole answer in memory.
Here a request works in slices (a :class:`Turn`: ``SLICE_SECONDS``, ``SLICE`` messages or ``SLICE_BYTES``
of bodies, whichever is spent first) and lets the loop turn between them, and handles at most
``MAX_MESSAGES`` in all (the Spark bridge's ``records`` cap; RabbitMQ's get has none): asking for more
answers as a queue holding fewer would.  A JSON answer is written a slice at a time, so what it holds in
memory is a slice's, whatever the count.
"""
from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from typing import Any

from aiohttp import web

from amqp_server.errors import AMQPError

from .http import HTTPError, encode

MAX_MESSAGES = 1_000_000  # messages one get, peek or move handles at most
SLICE_SECONDS = 0.001  # a slice's time on the loop: what another request waits for, at most, per turn
SLICE = 1000  # ... or messages handled
SLICE_BYTES = 4 << 20  # ... or bodies of this many bytes, whichever is spent first
STEP = 64  # messages a slice takes from a queue at once (a peek, a move)


def capped(count: int) -> int:
    return min(count, MAX_MESSAGES)


class Turn:
    """One slice's budget."""

    __slots__ = ("bytes", "ends", "messages")

    def __init__(self) -> None:
        self.messages = SLICE
        self.bytes = SLICE_BYTES
        self.ends = time.monotonic() + SLICE_SECONDS

    def spend(self, messages: int, size: int) -> bool:
        """``messages`` handled, with ``size`` bytes of bodies: whether the slice may go on."""
        self.messages -= messages
        self.bytes -= size
        return self.messages > 0 and self.bytes > 0 and time.monotonic() < self.ends


async def next_turn() -> None:
    """Let the loop serve everybody else before the next slice: twice, so that a request needing a few turns
    of its own (read, handle, write) meets a slice every other turn only."""
    await asyncio.sleep(0)
    await asyncio.sleep(0)


async def json_array(request: web.Request, slices: AsyncIterator[list[Any]]) -> web.StreamResponse:
    """The items of ``slices`` written as one JSON array, as ``json_response`` of them all would write it.

    The first slice is made before anything is sent, so that a refusal there (no such queue, no permission)
    is an error answer as usual; a refusal later (the queue deleted meanwhile) ends the array where it came.
    """
    parts = slices.__aiter__()
    part: list[Any] = await anext(parts, [])
    response = web.StreamResponse(headers={"Content-Type": "application/json"})
    await response.prepare(request)
    opened = False
    while True:
        if part:
            encoded = encode(part)  # "[a,b]": its inside follows "[" or ","
            await response.write((b"," if opened else b"[") + encoded[1:-1])
            opened = True
        try:
            part = await parts.__anext__()
        except StopAsyncIteration:
            break
        except (AMQPError, HTTPError):  # the status is sent: the answer ends where the refusal came
            break
    await response.write(b"]" if opened else b"[]")
    await response.write_eof()
    return response
