"""Connections that have not logged in yet, on one port: each has a deadline, and at most ``cap`` wait at once.

Before login a peer gets little.  The AMQP connection, the management HTTP gate (``mgmt_http/gate.py``) and
the cluster link each keep one :class:`Unauthenticated`: a connection enters it when it is made and leaves it
once its peer has proved who it is (or it closed).  One that would be one too many closes the one that has
waited longest, not itself: peers trickling bytes to hold every place cannot keep out a client that logs in
at once; they would have to open connections faster than a login takes.  What is refused before login is
logged through :attr:`Unauthenticated.log`, a few lines a second at most.
"""
from __future__ import annotations

import asyncio
import logging
from typing import Protocol

from .logs import Throttle


class Waiting(Protocol):
    def abandon(self) -> None:
        """Close the connection now (it timed out, or made room for a newer one)."""


class Unauthenticated:
    def __init__(self, what: str, cap: int, timeout: float, logger: logging.Logger) -> None:
        self.what = what  # "AMQP", "HTTP", "cluster link": for the log
        self.cap = cap
        self.timeout = timeout
        self.log = Throttle(logger)
        self._waiting: dict[Waiting, tuple[str, asyncio.TimerHandle]] = {}  # in the order they came
        self.timed_out = 0
        self.evicted = 0

    @property
    def waiting(self) -> int:
        return len(self._waiting)

    def enter(self, peer: Waiting, name: str) -> None:
        timer = asyncio.get_running_loop().call_later(self.timeout, self._time_out, peer)
        self._waiting[peer] = (name, timer)
        if len(self._waiting) > self.cap:
            oldest = next(iter(self._waiting))
            self.evicted += 1
            self.log.warning("%s connection %s closed in its handshake to make room: %d others are in theirs (the "
                             "most there may be)", self.what, self._waiting[oldest][0], self.cap)
            self._drop(oldest)

    def leave(self, peer: Waiting) -> None:
        """Logged in, or closed."""
        waiting = self._waiting.pop(peer, None)
        if waiting is not None:
            waiting[1].cancel()

    def _time_out(self, peer: Waiting) -> None:
        if peer in self._waiting:
            self.timed_out += 1
            self.log.warning("%s connection %s closed: its handshake took more than %.0f s", self.what,
                             self._waiting[peer][0], self.timeout)
            self._drop(peer)

    def _drop(self, peer: Waiting) -> None:
        self.leave(peer)
        peer.abandon()
