"""What /api/shovels and /api/federation-links share: each node reports the links it runs, and a node asked
gathers the others' answers (their management APIs, with the caller's credentials) as RabbitMQ gathers every
node's by RPC; the caller sees the vhosts it may see."""
from __future__ import annotations

import asyncio
from typing import Any

import aiohttp
from aiohttp import web

from . import auth
from .context import ctx
from .forward import KEY as FORWARDER, forward

LOCAL = "warren_local"  # query flag: this node's links only (what a node asks the others)
PEER_TIMEOUT = 5.0


async def _peer(request: web.Request, address: tuple[str, int], path: str) -> list[dict[str, Any]]:
    headers = {"Authorization": request.headers.get("Authorization", "")}
    url = f"http://{address[0]}:{address[1]}{path}?{LOCAL}=true"
    try:
        async with request.app[FORWARDER].request("GET", url, headers=headers,
                                                  timeout=aiohttp.ClientTimeout(total=PEER_TIMEOUT)) as answer:
            if answer.status != 200:
                return []
            items = await answer.json()
    except (aiohttp.ClientError, asyncio.TimeoutError, ValueError):
        return []  # a node that does not answer shows none (RabbitMQ: a badrpc shows none)
    return [item for item in items if isinstance(item, dict)] if isinstance(items, list) else []


async def gather(request: web.Request, local: list[dict[str, Any]], path: str) -> list[dict[str, Any]]:
    """``local`` (this node's links) and, unless asked for this node's only, every live peer's from ``path``."""
    items = list(local)
    cluster = ctx(request).broker.cluster
    if cluster is not None and LOCAL not in request.query:
        addresses = [peer.http for name, peer in cluster.peers.items() if dict(cluster.nodes()).get(name)]
        for found in await asyncio.gather(*(_peer(request, a, path) for a in addresses if a is not None)):
            items += found
    visible = set(auth.login_vhosts(request))  # (RabbitMQ's filter_vhost)
    return [item for item in items if item.get("vhost") in visible]


async def on_node(request: web.Request, node: str) -> web.StreamResponse:
    """``node``'s answer to this request (a link's restart), asked for its own links only."""
    return await forward(request.clone(rel_url=request.rel_url.update_query({LOCAL: "true"})), node)
