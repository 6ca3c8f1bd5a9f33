"""AMQP URIs as RabbitMQ's ``amqp_uri`` reads them, for a shovel's ``src-uri`` and ``dest-uri`` and a federation
upstream's ``uri``.

``amqp://host:port/vhost`` with optional ``user:password@`` (guest/guest when absent), ``amqps://`` for TLS, and
``amqp://`` with no host: this node (RabbitMQ's direct connection), acting as the URI's user or, without one, as
the user who set the parameter.  The query may set ``heartbeat``, ``connection_timeout`` and, for ``amqps``,
``cacertfile``, ``certfile``, ``keyfile`` (``password`` when it is encrypted: never asked for on a terminal),
``verify`` (``verify_peer``, the default here, or ``verify_none``) and ``server_name_indication``.
:func:`redacted` is ``amqp_uri:remove_credentials``: scheme, host, port and path only.
"""
from __future__ import annotations

import ssl
import urllib.parse
from dataclasses import dataclass, field

DEFAULT_PORTS = {"amqp": 5672, "amqps": 5671}
QUERY_KEYS = frozenset({"heartbeat", "connection_timeout", "channel_max", "frame_max", "cacertfile", "certfile",
                        "keyfile", "password", "verify", "server_name_indication", "auth_mechanism"})


class URIError(ValueError):
    """Not a URI RabbitMQ's amqp_uri accepts; the text is its reason."""


@dataclass(frozen=True)
class AMQPURI:
    scheme: str
    host: str  # '' for this node
    port: int
    vhost: str
    user: str | None
    password: str | None
    query: dict[str, str] = field(default_factory=dict)

    @property
    def direct(self) -> bool:
        """``amqp://`` with no host: this node."""
        return not self.host

    def heartbeat(self) -> int:
        return _int(self.query.get("heartbeat"), 60)

    def timeout(self) -> float:
        return _int(self.query.get("connection_timeout"), 30000) / 1000

    def ssl_context(self) -> ssl.SSLContext | None:
        if self.scheme != "amqps":
            return None
        context = ssl.create_default_context(cafile=self.query.get("cacertfile") or None)
        if self.query.get("verify") == "verify_none":
            context.check_hostname = False
            context.verify_mode = ssl.CERT_NONE
        if self.query.get("certfile"):
            context.load_cert_chain(self.query["certfile"], self.query.get("keyfile") or None,
                                    self.query.get("password", ""))
        return context

    def server_hostname(self) -> str | None:
        if self.scheme != "amqps":
            return None
        return self.query.get("server_name_indication") or self.host


def _int(value: str | None, default: int) -> int:
    try:
        return int(value) if value is not None else default
    except ValueError:
        return default


def parse(text: str) -> AMQPURI:
    parts = urllib.parse.urlsplit(text)
    scheme = parts.scheme.lower()
    if scheme not in DEFAULT_PORTS:
        raise URIError(f"{{unexpected_uri_scheme,\"{parts.scheme}\"}}" if parts.scheme else "no_scheme")
    try:
        port = parts.port
    except ValueError:
        raise URIError("port_invalid") from None
    host = parts.hostname or ""
    if not host and scheme == "amqps":
        raise URIError("{unexpected_uri_scheme,\"amqps\"}")  # a direct connection has no TLS
    path = parts.path[1:] if parts.path.startswith("/") else parts.path
    if "/" in path:
        raise URIError(f"{{invalid_vhost,\"{path}\"}}")
    vhost = urllib.parse.unquote(path) if parts.path else "/"
    query: dict[str, str] = {}
    for key, value in urllib.parse.parse_qsl(parts.query, keep_blank_values=True):
        if key not in QUERY_KEYS:
            raise URIError(f"{{unknown_query_parameter,\"{key}\"}}")
        query[key] = value
    user = urllib.parse.unquote(parts.username) if parts.username is not None else None
    password = urllib.parse.unquote(parts.password) if parts.password is not None else None
    return AMQPURI(scheme, host, port or DEFAULT_PORTS[scheme], vhost, user, password, query)


def redacted(text: str) -> str:
    """The URI without credentials or query, as RabbitMQ shows it (``amqp_uri:remove_credentials``)."""
    parts = urllib.parse.urlsplit(text)
    try:
        port = f":{parts.port}" if parts.port is not None else ""
    except ValueError:
        port = ""
    host = parts.hostname or ""
    return f"{parts.scheme}://{host}{port}{parts.path}"
