"""Requests a page on another site could make with a user's cached credentials are refused.

A browser sends a cross-site form post, or a ``fetch`` it may make without asking the server first (a
"simple" request), with the Basic credentials it has cached for the node; such a request can only be a
POST, and only of ``text/plain``, ``application/x-www-form-urlencoded`` or ``multipart/form-data``, with no
header a script chose.  So:

- a POST to the API must be ``application/json`` (RabbitMQ's 415, an empty answer, otherwise; its own
  definitions upload is the one form taken, and only with a header no form can send: ``X-Vhost``, as
  RabbitMQ's UI sends it, or ``X-Requested-With``);
- a request that changes something and names an ``Origin`` other than the node's own is refused (403).

PUT and DELETE cannot be sent across sites without the node's leave (a CORS preflight it never grants), so
they keep RabbitMQ's rules: any content type, or none, as ``curl -X PUT`` sends them.
"""
from __future__ import annotations

from collections.abc import Awaitable, Callable
from urllib.parse import urlsplit

from aiohttp import web

from .http import HTTPError

SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})
FORM_UPLOADS = ("/api/definitions",)  # and /api/definitions/{vhost}: RabbitMQ's UI uploads a file there
FORM_HEADERS = ("X-Vhost", "X-Requested-With")  # not sendable by a form, nor by a fetch without a preflight


def _json(request: web.Request) -> bool:
    return request.content_type == "application/json"  # (aiohttp: lower case, parameters apart)


def _form_upload(request: web.Request) -> bool:
    return (request.content_type == "multipart/form-data" and request.path.startswith(FORM_UPLOADS)
            and any(name in request.headers for name in FORM_HEADERS))


def _cross_site(request: web.Request) -> bool:
    """An ``Origin`` that is not this node's (``null`` included): the host and port the request was sent to."""
    origin = request.headers.get("Origin")
    if origin is None:
        return False
    try:
        netloc = urlsplit(origin).netloc
    except ValueError:
        return True
    return not netloc or netloc.lower() != request.host.lower()


@web.middleware
async def csrf_middleware(request: web.Request,
                          handler: Callable[[web.Request], Awaitable[web.StreamResponse]]) -> web.StreamResponse:
    """After the login (a 401 comes first, as RabbitMQ's), before the handler reads anything."""
    if request.method not in SAFE_METHODS and request.path.startswith("/api/"):
        if request.method == "POST" and not (_json(request) or _form_upload(request)):
            raise HTTPError(415, None, None)  # RabbitMQ's: no body
        if _cross_site(request):
            raise HTTPError(403, "forbidden", "cross-site request refused")
    return await handler(request)
