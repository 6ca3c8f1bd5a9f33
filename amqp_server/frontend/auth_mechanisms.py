"""SASL mechanisms of connection.start / start-ok (RabbitMQ's rabbit_auth_mechanism_plain, _amqplain and _ssl).

PLAIN and AMQPLAIN carry a username and password.  ANONYMOUS (not offered unless configured, as in RabbitMQ)
logs in as ``anonymous_login_user``.  EXTERNAL carries nothing:
the TLS layer authenticated the client, its verified certificate names the
user (``tls_cert_login_from``), and that user only has to exist.
"""
from __future__ import annotations

import logging
import ssl
import struct
from typing import TYPE_CHECKING

from pamqp import decode

from ..framing import codec
from .. import errors, tls
from ..config import MECHANISMS
from ..errors import ConnectionError

if TYPE_CHECKING:
    from ..access_control import AccessControl, User
    from ..config import Config

log = logging.getLogger("warren.connection")


def offered(config: "Config", ssl_object: ssl.SSLObject | None) -> list[str]:
    """The configured mechanisms; EXTERNAL only on TLS connections (rabbit_auth_mechanism_ssl:should_offer/1)."""
    return [name for name in config.mechanisms if name != "EXTERNAL" or ssl_object is not None]


def authenticate(access: "AccessControl", config: "Config", ssl_object: ssl.SSLObject | None, mechanism: str,
                 response: str | bytes, peer_host: str | None = None) -> tuple[str, "User | None"]:
    """(username, user or None if refused); a mechanism not offered is 503 COMMAND_INVALID, as in RabbitMQ.
    ``peer_host``: the client's address on an AMQP 0-9-1 connection, where this node's own links log in (from
    loopback, without TLS); None on others (AMQP 1.0), which never take the node's direct secret."""
    if mechanism not in MECHANISMS:
        raise ConnectionError(errors.COMMAND_INVALID, f"unknown authentication mechanism '{mechanism}'")
    if mechanism not in offered(config, ssl_object):
        raise ConnectionError(errors.COMMAND_INVALID, f"invalid authentication mechanism '{mechanism}'")
    if mechanism == "EXTERNAL":
        return _external(access, config, ssl_object)
    if mechanism == "ANONYMOUS":  # rabbit_auth_mechanism_anonymous: a configured user, off unless offered
        return config.anonymous_login_user, access.authenticate(config.anonymous_login_user,
                                                                config.anonymous_login_pass)
    username, password = _credentials(mechanism, response)
    return username, access.authenticate(username, password, peer_host if ssl_object is None else None)


def _external(access: "AccessControl", config: "Config", ssl_object: ssl.SSLObject | None) -> tuple[str, "User | None"]:
    """The user named by the verified client certificate; the refusal reasons are rabbit_auth_mechanism_ssl's."""
    cert = tls.peer_certificate(ssl_object)
    username = tls.login_name(cert, config.tls_cert_login_from) if cert else None
    if config.tls_verify != "verify_peer":
        reason = "TLS configuration is unsafe"  # an unverified certificate must not name a user
    elif not cert:
        reason = "connection peer presented no TLS (x.509) certificate"
    elif username is None:
        reason = "no name found"
    else:
        return username, access.user(username)
    log.warning("EXTERNAL login refused: %s", reason)
    return "", None


def _credentials(mechanism: str, response: str | bytes) -> tuple[str, str]:
    """(username, password) as UTF-8, as RabbitMQ reads them; never quoted in a reply or a log line.  A response the
    mechanism cannot read is a syntax error (502), not a refused login (rabbit_auth_mechanism_plain and _amqplain
    answer it with protocol_error): RabbitMQ tells no client of it, even one that asks to be told of a refusal."""
    raw = response.encode("utf-8", "surrogateescape") if isinstance(response, str) else bytes(response)
    if mechanism == "PLAIN":
        parts = raw.split(b"\x00")
        if len(parts) != 3 or parts[0]:  # NUL user NUL password alone: no authorisation identity (extract_elem)
            raise ConnectionError(errors.SYNTAX_ERROR, "authentication failed: malformed PLAIN response")
        return parts[1].decode(errors="replace"), parts[2].decode(errors="replace")
    try:
        _, table = decode.field_table(struct.pack(">I", len(raw)) + raw)
    except Exception:
        raise ConnectionError(errors.SYNTAX_ERROR, "authentication failed: malformed AMQPLAIN response") from None
    if "LOGIN" not in table or "PASSWORD" not in table:
        raise ConnectionError(errors.SYNTAX_ERROR, "authentication failed: AMQPLAIN response without LOGIN or "
                              "PASSWORD")
    return codec.text(table["LOGIN"]), codec.text(table["PASSWORD"])
