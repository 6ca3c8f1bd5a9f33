"""``Expect: 100-continue`` answered only when the body is wanted: once the request has logged in, and its declared
length is one the API takes.

aiohttp answers 100 Continue as soon as it has the head, before any middleware runs: a client without valid
credentials, or with a body larger than ``--mgmt-max-body-size``, was invited to send it, and up to 128 KiB of it
was read before the refusal.  Every route's expect handler here sends nothing; the auth middleware calls
:func:`proceed` once the request has logged in, which refuses a body too large (413) before it is sent.  A
request refused before (401) never sees a 100 Continue, so its body never comes (a client that sends it anyway is
read and discarded by aiohttp, or held by the gate before a login).
"""
from __future__ import annotations

from aiohttp import HttpVersion11, hdrs, web

from .http import HTTPError


def _continue_expected(request: web.BaseRequest) -> bool:
    return request.version == HttpVersion11 and hdrs.EXPECT in request.headers


async def defer(request: web.Request) -> None:
    """Every route's expect handler: no 100 Continue yet; an expectation other than 100-continue is 417, as
    aiohttp's own handler answers it."""
    if _continue_expected(request) and request.headers[hdrs.EXPECT].lower() != "100-continue":
        raise web.HTTPExpectationFailed(text=f"Unknown Expect: {request.headers[hdrs.EXPECT]}")


async def proceed(request: web.Request, max_body_size: int) -> None:
    """The request logged in: 413 if it declared a body larger than ``max_body_size``, else its 100 Continue."""
    if not _continue_expected(request):
        return
    if (request.content_length or 0) > max_body_size:
        raise HTTPError(413, "payload_too_large", f"request body over {max_body_size} bytes")
    await request.writer.write(b"HTTP/1.1 100 Continue\r\n\r\n")
    request.writer.output_size = 0  # (as aiohttp's handler: the answer's own head is yet to come)
