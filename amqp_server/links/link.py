"""What a shovel and a federation link share: a life of sessions over :class:`client.Client` connections, and a
session's flow of messages from one broker to another.

A :class:`Link` runs sessions until stopped: it reports ``starting``, runs :meth:`Link._session` (which reports
``running`` once its connections are up), and when a session fails closes every connection, reports the failure
with its reason, waits ``reconnect_delay`` seconds and starts again (0: it stays failed, as in RabbitMQ).  A
session that raises :class:`Finished` ends the link for good.  URIs are tried in turn, starting after the one
that failed last; ``amqp://`` with no host is this node's own listener (:func:`resolver`).

A :class:`Transfer` moves one session's messages: deliveries in, publishes out, and the source's acks after the
destination's confirms (``on-confirm``: nothing is lost whatever fails), at once (``on-publish``) or never
(``no-ack``).  What a delivery becomes — where it goes, its new content header, or nothing — the link decides
(``Forward``); a message it drops is acked.
"""
from __future__ import annotations

import asyncio
import datetime
import logging
from collections import OrderedDict
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable

from ..logs import untrusted
from ..tasks import stop_tasks
from . import uri as uri_module
from .amqp_client import Client, ClientError

if TYPE_CHECKING:
    from ..access_control import AccessControl

log = logging.getLogger("warren.link")
CHANNEL = 1  # the working channel on each side


@dataclass
class Endpoint:
    """Where and as whom a URI connects: a remote broker, or this node's own listener for ``amqp://``."""

    host: str
    port: int
    user: str
    password: str


Resolve = Callable[[uri_module.AMQPURI], Endpoint]


def resolver(access: "AccessControl", local: tuple[str, int], setter: str) -> Resolve:
    """Endpoints for URIs of a parameter ``setter`` set: ``amqp://`` acts on this node as the URI's user or the
    setter, proving itself with the node's direct secret; other URIs with their credentials (guest by default)."""
    host, port = local

    def resolve(uri: uri_module.AMQPURI) -> Endpoint:
        if uri.direct:
            return Endpoint(host, port, uri.user or setter, access.direct_secret)
        return Endpoint(uri.host, uri.port, uri.user if uri.user is not None else "guest",
                        uri.password if uri.password is not None else "guest")
    return resolve


def local_address(host: str, port: int) -> tuple[str, int]:
    """Where this node's links reach its own AMQP listener."""
    return (host if host not in ("", "0.0.0.0", "::") else "127.0.0.1", port)


def status_time(t: datetime.datetime) -> str:
    """A status timestamp as RabbitMQ's management plugins print it: the hour not padded."""
    return f"{t:%Y-%m-%d} {t.hour}:{t:%M:%S}"


class Finished(Exception):
    """The link did all it had to (a shovel's src-delete-after): it ends."""


class Link:
    """One link's life; subclasses give :meth:`_session` and, if they clean up, :meth:`_stopped`."""

    FAILED = "terminated"  # the state a failed session reports (RabbitMQ's shovel; federation says "error")
    PRODUCT = "Warren"  # the client properties' product

    def __init__(self, what: str, connection_name: str, resolve: Resolve, reconnect_delay: float) -> None:
        self.what = what  # for logs: "shovel 'x' in vhost '/'"
        self.connection_name = connection_name
        self._resolve = resolve
        self.reconnect_delay = reconnect_delay
        self.state = "starting"
        self.reason = ""
        self.timestamp = datetime.datetime.now()
        self.moved = 0  # messages published on (for the status and tests)
        self._attempts: dict[int, int] = {}  # the next URI to try, per side
        self._task: asyncio.Task[None] | None = None
        self.clients: list[Client] = []

    def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name=self.what)

    async def stop(self, cleanup: bool = True) -> None:
        """Stop; for good (``cleanup``) a subclass's :meth:`_stopped` may still use the connections before they
        close."""
        await stop_tasks(self._task)
        try:
            if cleanup:
                await self._stopped()
        except (ClientError, OSError, asyncio.TimeoutError) as exc:
            log.warning("%s: cleaning up failed: %s", self.what, untrusted(str(exc)))
        finally:
            self._close()

    async def _stopped(self) -> None:
        """Stopped for good (not a node shutdown): what to undo while the connections are still open."""

    def _report(self, state: str, reason: str = "") -> None:
        self.state, self.reason, self.timestamp = state, reason, datetime.datetime.now()

    def _running(self, description: str) -> None:
        self._report("running")
        log.info("%s running: %s", self.what, description)

    async def _session(self) -> None:
        raise NotImplementedError

    async def _finished(self) -> None:
        """The session raised :class:`Finished`."""

    async def _run(self) -> None:
        while True:
            self._report("starting")
            try:
                await self._session()
            except Finished:
                self._close()
                log.info("%s: done", self.what)
                await self._finished()
                return
            except (ClientError, OSError) as exc:
                reason = str(exc)
            except Exception as exc:  # a bug must not end the link for good
                log.exception("%s failed", self.what)
                reason = f"{{{type(exc).__name__},{exc}}}"
            self._close()
            self._report(self.FAILED, reason)
            log.warning("%s %s: %s", self.what, self.FAILED, untrusted(reason))
            if self.reconnect_delay <= 0:  # (RabbitMQ: 0 leaves it failed; so does a negative delay, not a busy loop)
                return
            await asyncio.sleep(self.reconnect_delay)

    def _close(self) -> None:
        for client in self.clients:
            try:
                client.close()
            except Exception:  # closing is best effort: the socket goes whatever happens
                log.exception("%s: closing a connection failed", self.what)
        self.clients = []

    async def _connect(self, side: int, uris: list[str]) -> tuple[Client, str]:
        """The first URI of ``uris`` that connects, starting after the one that failed last; and it, redacted."""
        error: ClientError | None = None
        for _ in range(len(uris)):
            attempt = self._attempts.get(side, 0)
            text = uris[attempt % len(uris)]
            try:
                client = await self._open(text)
            except ClientError as exc:
                error = exc
                self._attempts[side] = attempt + 1
                continue
            self.clients.append(client)
            return client, uri_module.redacted(text)
        assert error is not None
        raise error

    async def _open(self, text: str) -> Client:
        """A connection to one URI, which the caller closes."""
        parsed = uri_module.parse(text)
        endpoint = self._resolve(parsed)
        return await Client.connect(parsed, endpoint.host, endpoint.port, endpoint.user, endpoint.password,
                                    self.connection_name, self.PRODUCT)

    async def _until_closed(self, *waiting: "asyncio.Future[Any]") -> None:
        """Wait until a connection ends (raise its reason) or one of ``waiting`` is done."""
        await asyncio.wait([client.closed for client in self.clients] + list(waiting),
                           return_when=asyncio.FIRST_COMPLETED)
        for client in self.clients:
            if client.closed.done():
                raise client.closed.result()


Forward = Callable[[bool, str, str, bytes, int], "tuple[str, str, bytes] | None"]
"""(redelivered, exchange, routing key, header, body size) -> where to publish and with which header, or None
to drop (and ack) the message."""


class Transfer:
    """One session's flow: deliveries in, publishes out, confirms back to acks.  ``remaining``: messages still to
    publish before the link is finished (None: no limit)."""

    def __init__(self, link: Link, src: Client, dest: Client, ack_mode: str, forward: Forward,
                 remaining: int | None = None) -> None:
        self.link = link
        self.src = src
        self.dest = dest
        self.mode = ack_mode
        self.forward = forward
        self.remaining = remaining
        self.unconfirmed = remaining  # ... and to be confirmed (on-confirm) or published (other modes)
        self.pending: OrderedDict[int, int] = OrderedDict()  # destination publish seq -> source delivery tag
        self.seq = 0
        self.finished: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        src.on_deliver[CHANNEL] = self.delivered
        dest.on_confirm[CHANNEL] = self.confirmed
        dest.on_writable = self.writable

    def writable(self, ok: bool) -> None:
        """The destination's socket is full (or drained again): stop (or resume) reading from the source."""
        transport = self.src.transport
        if transport is not None:
            (transport.resume_reading if ok else transport.pause_reading)()

    def delivered(self, tag: int, redelivered: bool, exchange: str, routing_key: str, header: bytes,
                  body: bytes) -> None:
        if self.remaining is not None:
            if self.remaining <= 0:
                return  # past the limit: left unacked, it goes back to the queue when we close
            self.remaining -= 1
        target = self.forward(redelivered, exchange, routing_key, header, len(body))
        if target is None:
            if self.mode != "no-ack":
                self.src.ack(CHANNEL, tag, False)
            self._count_done(1)
            return
        exchange, routing_key, header = target
        self.dest.publish(CHANNEL, exchange, routing_key, header, body)
        self.link.moved += 1
        if self.mode == "on-confirm":
            self.seq += 1
            self.pending[self.seq] = tag
            return
        if self.mode == "on-publish":
            self.src.ack(CHANNEL, tag, False)
        self._count_done(1)

    def confirmed(self, seq: int, multiple: bool, nack: bool) -> None:
        pending = self.pending
        if not multiple:
            tag = pending.pop(seq, None)
            if tag is not None:
                self.src.ack(CHANNEL, tag, False, nack)
                self._count_done(1)
            return
        tags: list[int] = []
        while pending:
            first = next(iter(pending))
            if first > seq:
                break
            tags.append(pending.pop(first))
        if tags:  # the source's tags grow with the destination's seqs: none below these is still pending (a
            # dropped message's tag, acked already, is no error in a multiple ack)
            self.src.ack(CHANNEL, tags[-1], True, nack)
            self._count_done(len(tags))

    def _count_done(self, count: int) -> None:
        if self.unconfirmed is None:
            return
        self.unconfirmed -= count
        if self.unconfirmed <= 0 and not self.finished.done():
            self.finished.set_result(None)
