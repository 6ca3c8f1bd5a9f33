"""HTTP transport for ``warrenctl``: basic auth, JSON in and out, errors as one-line reasons (stdlib only)."""
from __future__ import annotations

import base64
import html
import json
import socket
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass
from http import HTTPStatus
from typing import Any

DEFAULT_TIMEOUT = 30.0
# Reasons the RabbitMQ management API gives that say no more than the status line does.
_GENERIC_REASONS = {"not found", "object not found", "not_found", "object_not_found", "vhost_not_found", ""}


class CtlError(Exception):
    """A failure ``warrenctl`` reports as one line and a non-zero exit code."""

    exit_code = 1


class ApiError(CtlError):
    """The API answered with an error status."""

    def __init__(self, status: int, reason: str) -> None:
        self.status = status
        self.reason = reason
        super().__init__(f"{status} {_phrase(status)}: {reason}" if reason else f"{status} {_phrase(status)}")


class Unreachable(CtlError):
    """No HTTP answer at all: refused, unresolvable, timed out."""

    exit_code = 3


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    """A redirect is an error, never followed: urllib would send our Authorization header to wherever it
    points, another host included (rabbitmqadmin follows none either)."""

    def redirect_request(self, req: urllib.request.Request, fp: Any, code: int, msg: str, headers: Any,
                         newurl: str) -> None:
        return None


_OPENER = urllib.request.build_opener(_NoRedirect)


def _phrase(status: int) -> str:
    try:
        return HTTPStatus(status).phrase
    except ValueError:
        return "Error"


def quote(segment: str) -> str:
    """One path segment, with '/' encoded (the default vhost is ``%2F``)."""
    return urllib.parse.quote(segment, safe="")


def path(*segments: str) -> str:
    """``/api/<seg>/<seg>...`` from raw names."""
    return "/api/" + "/".join(quote(s) for s in segments)


def error_reason(body: bytes) -> str:
    """The reason in a RabbitMQ-style error body ``{"error": ..., "reason": ...}``, else the text; on one line."""
    text = body.decode("utf-8", errors="replace").strip()
    try:
        data = json.loads(text)
    except ValueError:
        return " ".join(text.split())[:300]
    if isinstance(data, dict):
        reason = data.get("reason") or data.get("error") or ""
        # one line: RabbitMQ's validation reasons span several ("Validation failed\n\n..."), some escaped for HTML
        if isinstance(reason, (dict, list)):
            return json.dumps(reason)
        return " ".join(html.unescape(str(reason)).split())
    return str(data)


@dataclass
class ApiClient:
    base_url: str
    user: str
    password: str
    timeout: float = DEFAULT_TIMEOUT

    def _auth_header(self) -> str:
        token = base64.b64encode(f"{self.user}:{self.password}".encode()).decode()
        return f"Basic {token}"

    def request(self, method: str, api_path: str, body: Any = None, not_found: str | None = None,
                query: dict[str, Any] | None = None) -> Any:
        """Send one request; the decoded JSON answer (None when empty).

        ``not_found`` replaces a bare "Not Found" reason on a 404 with something useful.
        """
        url = self.base_url.rstrip("/") + api_path
        if query:
            url += "?" + urllib.parse.urlencode({k: v for k, v in query.items() if v is not None})
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(url, data=data, method=method)
        req.add_header("Authorization", self._auth_header())
        req.add_header("Accept", "application/json")
        if data is not None:
            req.add_header("Content-Type", "application/json")
        try:
            with _OPENER.open(req, timeout=self.timeout) as resp:
                raw = resp.read()
        except urllib.error.HTTPError as exc:
            if 300 <= exc.code < 400:
                location = exc.headers.get("Location", "")
                raise ApiError(exc.code, f"redirected to {location!r}, not followed") from None
            raise self._api_error(exc.code, exc.read(), not_found) from None
        except (urllib.error.URLError, OSError) as exc:
            raise Unreachable(f"cannot reach {self.base_url.rstrip('/')}: {_os_reason(exc)}") from None
        return decode(raw)

    @staticmethod
    def _api_error(status: int, body: bytes, not_found: str | None) -> ApiError:
        reason = error_reason(body)
        if status == 404 and not_found and reason.lower() in _GENERIC_REASONS:
            reason = not_found
        if status == 401 and reason.lower() in {"", "not_authorised", "not_authorized", "unauthorized"}:
            reason = "login failed"
        return ApiError(status, reason)

    def get(self, api_path: str, not_found: str | None = None, query: dict[str, Any] | None = None) -> Any:
        return self.request("GET", api_path, not_found=not_found, query=query)

    def put(self, api_path: str, body: Any, not_found: str | None = None) -> Any:
        return self.request("PUT", api_path, body if body is not None else {}, not_found=not_found)

    def post(self, api_path: str, body: Any, not_found: str | None = None) -> Any:
        return self.request("POST", api_path, body if body is not None else {}, not_found=not_found)

    def delete(self, api_path: str, not_found: str | None = None, query: dict[str, Any] | None = None) -> Any:
        return self.request("DELETE", api_path, not_found=not_found, query=query)


def decode(raw: bytes) -> Any:
    if not raw.strip():
        return None
    try:
        return json.loads(raw)
    except ValueError:
        return raw.decode("utf-8", errors="replace")


def _os_reason(exc: BaseException) -> str:
    """'Connection refused' rather than '<urlopen error [Errno 111] Connection refused>'."""
    inner = getattr(exc, "reason", exc)
    if isinstance(inner, socket.timeout) or isinstance(exc, socket.timeout):
        return "timed out"
    if isinstance(inner, OSError) and inner.strerror:
        return inner.strerror
    return str(inner) or type(inner).__name__
