"""Requests about a queue of another node, answered by that node's management API (cluster mode).

The request is checked here first (authentication, the caller's permission), then sent on with the
caller's credentials, and the owner's answer is streamed back as it arrives: the Spark bridge's offset
reads (``offsets``) and peek work through any node, as AMQP does.
"""
from __future__ import annotations

from typing import Any

import aiohttp
from aiohttp import web

from amqp_server.queues.queue import AnyQueue

from .context import ctx
from .http import error_response

FORWARDED_HEADERS = ("Content-Type", "X-Warren-Head", "X-Warren-Tail")


class Forwarder:
    """One HTTP client per application, made at the first forward (it needs the running loop)."""

    def __init__(self) -> None:
        self._session: aiohttp.ClientSession | None = None

    def request(self, method: str, url: str, **kwargs: Any) -> Any:
        """A request to another node (``async with``) that follows no redirect: the caller's credentials go to
        that node only, never where an answer would send them."""
        if self._session is None:
            self._session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(sock_connect=5))
        return self._session.request(method, url, allow_redirects=False, **kwargs)

    async def close(self, _app: web.Application) -> None:
        if self._session is not None:
            await self._session.close()


KEY = web.AppKey("forwarder", Forwarder)


def setup(app: web.Application) -> None:
    forwarder = app[KEY] = Forwarder()
    app.on_cleanup.append(forwarder.close)


async def by_owner(request: web.Request, queue: AnyQueue) -> web.StreamResponse | None:
    """The answer of the node ``queue`` lives on, if that is another (the caller checked the request here);
    None for a queue of this node, which the caller answers."""
    return await forward(request, queue.node) if queue.remote else None


async def forward(request: web.Request, node: str) -> web.StreamResponse:
    """``node``'s answer to this request (502 if it serves no management API or cannot be reached)."""
    broker = ctx(request).broker
    peer = broker.cluster.peers.get(node) if broker.cluster is not None else None
    if peer is None or peer.http is None:
        return error_response(502, "bad_gateway", f"node {node} serves no management API")
    host, port = peer.http
    headers = {key: request.headers[key] for key in ("Authorization", "Content-Type") if key in request.headers}
    data = await request.read() if request.can_read_body else None
    try:
        async with request.app[KEY].request(request.method, f"http://{host}:{port}{request.path_qs}",
                                            headers=headers, data=data) as upstream:
            response = web.StreamResponse(status=upstream.status, headers={
                key: upstream.headers[key] for key in FORWARDED_HEADERS if key in upstream.headers})
            await response.prepare(request)
            async for chunk in upstream.content.iter_any():
                await response.write(chunk)
            await response.write_eof()
            return response
    except aiohttp.ClientError as exc:
        return error_response(502, "bad_gateway", f"node {node}: {exc}")
