"""The management port's connections until they log in: a gate in front of aiohttp's protocol.

Until one of its requests has logged in, a connection sends one request head at a time, of at most
``HEAD_MAX`` bytes; reading pauses where the head ends, so nothing after it (a body) is read before the
request's credentials are checked.  The auth middleware then opens the gate for good, or, after an answer
given without a login (the UI's files, a 401), lets the next head through.  Such a connection has
``handshake_timeout`` from connecting to log in, and at most ``handshakes_max`` wait at once
(``amqp_server.frontend.front_end``).  Once open, the gate only passes bytes on, and aiohttp's limits hold: a request
line and each header of at most 8190 bytes, 128 headers, ``--mgmt-idle-timeout`` to send a request's head.
"""
from __future__ import annotations

import asyncio
import logging
import ssl
from typing import Any, cast

from aiohttp import web
from aiohttp.http_exceptions import HttpProcessingError

from amqp_server.logs import untrusted
from amqp_server.frontend.front_end import Unauthenticated, listen_tls

HEAD_END = b"\r\n\r\n"
HEAD_MAX = 32 * 1024  # bytes of a request head before its connection has logged in
TOO_LARGE = b"HTTP/1.1 431 Request Header Fields Too Large\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"


class Gate(asyncio.Protocol):
    """Wraps one connection's aiohttp protocol: every transport callback is passed on to it, the bytes read only
    as far as the rules above allow."""

    def __init__(self, inner: asyncio.Protocol, handshakes: Unauthenticated) -> None:
        self.inner = inner
        self.handshakes = handshakes
        self.transport: asyncio.Transport | None = None
        self.name = "?"
        self.open = False  # a request has logged in: everything passes
        self._head = 0  # bytes of the head coming in
        self._tail = b""  # its last three bytes (a head's end may be split between two reads)
        self._waiting = False  # a head went on: reading pauses until its request logged in or was answered
        self._held = bytearray()  # what came after that head
        self._answered = False  # a request went through without login (what follows may be its body)

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # a TCP connection's
        peer = transport.get_extra_info("peername")
        self.name = f"{peer[0]}:{peer[1]}" if peer else "?"
        self.inner.connection_made(transport)
        self.handshakes.enter(self, self.name)

    def connection_lost(self, exc: Exception | None) -> None:
        self.handshakes.leave(self)
        self._held.clear()
        self.inner.connection_lost(exc)

    def pause_writing(self) -> None:
        self.inner.pause_writing()

    def resume_writing(self) -> None:
        self.inner.resume_writing()

    def eof_received(self) -> bool | None:
        return self.inner.eof_received()

    def data_received(self, data: bytes) -> None:
        if self.open:
            self.inner.data_received(data)
        elif self._waiting:  # (a read already under way when reading paused)
            self._held += data
            if len(self._held) > HEAD_MAX:
                self._refuse("sent more than a head before its login")
        else:
            self._head_bytes(data)

    def _head_bytes(self, data: bytes) -> None:
        seen = self._tail + data
        end = seen.find(HEAD_END)
        cut = len(data) if end < 0 else end + len(HEAD_END) - len(self._tail)
        self._head += cut
        if self._head > HEAD_MAX:
            self._refuse(f"request head over {HEAD_MAX} bytes before its login",
                         b"" if self._answered else TOO_LARGE)
            return
        if end < 0:
            self._tail = seen[-3:]
            self.inner.data_received(data)
            return
        self._head, self._tail, self._waiting = 0, b"", True
        self._held += data[cut:]
        if self.transport is not None:
            self.transport.pause_reading()
        self.inner.data_received(data[:cut])

    def logged_in(self) -> None:
        """A request on this connection logged in: everything passes from now on."""
        if not self.open:
            self.open = True
            self.handshakes.leave(self)
            self._resume()

    def answered(self) -> None:
        """A request was answered without logging in: the next head may come (once the answer is written: the
        auth middleware calls this as its handler returns, so soon after)."""
        if not self.open and self._waiting:
            self._answered = True
            self._resume()

    def _resume(self) -> None:
        self._waiting = False
        held, self._held = bytes(self._held), bytearray()
        if self.transport is None or self.transport.is_closing():
            return
        self.transport.resume_reading()
        if held:
            self.data_received(held)

    def _refuse(self, why: str, answer: bytes = b"") -> None:
        self.handshakes.log.warning("HTTP connection %s closed: %s", self.name, why)
        self._held.clear()
        if self.transport is not None:
            if answer:
                self.transport.write(answer)
            self.transport.close()

    def abandon(self) -> None:
        if self.transport is not None:
            self.transport.abort()


class ServerLog(logging.LoggerAdapter):
    """aiohttp's server log (its ``logger``).  A request it cannot parse is one line, few a second, instead of a
    traceback; and that exception lets go of its traceback, whose frames hold the connection, its parser and
    the bytes last read in a reference cycle: with the node's garbage collection thresholds 1,000 such
    requests of 32 KB each kept 60 MiB until a full collection."""

    def __init__(self, handshakes: Unauthenticated) -> None:
        super().__init__(logging.getLogger("aiohttp.server"), {})
        self.handshakes = handshakes

    def log(self, level: int, msg: object, *args: Any, exc_info: Any = None, **kwargs: Any) -> None:
        if isinstance(exc_info, HttpProcessingError):
            exc_info.__traceback__ = None
            remote = args[0] if args else "?"
            self.handshakes.log.warning("HTTP request from %s refused: %s", untrusted(remote), untrusted(exc_info))
            return
        self.logger.log(level, msg, *args, exc_info=exc_info, **kwargs)


def gate_of(request: web.Request) -> Gate | None:
    """The gate of the request's connection (none in front of an aiohttp test server)."""
    transport = request.transport
    protocol = transport.get_protocol() if transport is not None else None
    return protocol if isinstance(protocol, Gate) else None


def let_next_head(request: web.Request) -> None:
    """The request is answered: if its connection has not logged in, its next head may come once the answer is
    written (within this loop turn)."""
    gate = gate_of(request)
    if gate is not None and not gate.open:
        asyncio.get_running_loop().call_soon(gate.answered)


class GatedSite(web.BaseSite):
    """aiohttp's TCPSite, its connections made through a :class:`Gate` counted in one ``handshakes``."""

    def __init__(self, runner: web.BaseRunner, host: str, port: int, handshakes: Unauthenticated,
                 ssl_context: ssl.SSLContext | None = None) -> None:
        super().__init__(runner, ssl_context=ssl_context)
        self.host, self.port, self.handshakes, self.ssl_context = host, port, handshakes, ssl_context

    @property
    def name(self) -> str:
        return f"{'https' if self.ssl_context else 'http'}://{self.host}:{self.port}"

    async def start(self) -> None:
        await super().start()
        protocol: Any = self._runner.server
        if self.ssl_context is not None:  # its TLS handshakes counted with the connections not logged in
            self._server = await listen_tls(lambda: Gate(protocol(), self.handshakes), self.host, self.port,  # type: ignore[assignment]  # closes as a server does
                                            self.ssl_context, self.handshakes)
            return
        self._server = await asyncio.get_running_loop().create_server(
            lambda: Gate(protocol(), self.handshakes), self.host, self.port, reuse_address=True, backlog=1024)
