"""TLS for listeners (RabbitMQ's ``ssl_options``, ``rabbit_ssl`` and ``rabbit_cert_info``).

Server contexts are built from the node's configuration; a connection's
``ssl.SSLObject`` is described the way RabbitMQ's management API shows it, and
its peer certificate yields the EXTERNAL login name.  Certificate fields come
from ``SSLObject.getpeercert()`` (only populated for verified certificates), so
no X.509 parser is needed at run time.
"""
from __future__ import annotations

import re
import ssl
import time
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .config import Config

HANDSHAKE_TIMEOUT = 5.0  # seconds, RabbitMQ's ssl_handshake_timeout
VERSIONS = ["tlsv1.3", "tlsv1.2"]  # what server_context accepts, in Erlang's spelling

# OpenSSL's long attribute names -> the RFC 4514 keys RabbitMQ prints (rabbit_cert_info:format_rdn/1); its STREET
# entry is keyed on 17, not on streetAddress's OID, so a street prints as 2.5.4.9 like every attribute not listed
_RDN_KEYS = {
    "surname": "SN", "givenName": "GIVENNAME", "initials": "INITIALS", "generationQualifier": "GENERATIONQUALIFIER",
    "commonName": "CN", "localityName": "L", "stateOrProvinceName": "ST", "organizationName": "O",
    "organizationalUnitName": "OU", "title": "TITLE", "countryName": "C", "serialNumber": "SERIALNUMBER",
    "pseudonym": "PSEUDONYM", "domainComponent": "DC", "emailAddress": "EMAILADDRESS", "userId": "UID",
}
_DOTTED_OID = re.compile(r"\d+(\.\d+)+")
_KEY_EXCHANGES = {"ECDHE", "DHE", "ECDH", "DH", "RSA", "ECDSA", "DSS", "PSK", "SRP"}
_SIZED_CIPHER = re.compile(r"(AES|CAMELLIA|ARIA)(\d+)")
SSL_FIELDS = ("ssl_protocol", "ssl_key_exchange", "ssl_cipher", "ssl_hash",
              "peer_cert_subject", "peer_cert_issuer", "peer_cert_validity")


def server_context(certfile: str, keyfile: str = "", password: str = "", cacertfile: str = "",
                   verify: str = "verify_none", fail_if_no_peer_cert: bool = False) -> ssl.SSLContext:
    """TLS 1.2+ server context; ``verify_peer`` asks clients for a certificate and checks it against the CA.  The
    key's password is always given (empty when none is configured), so that OpenSSL never asks a terminal for it."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    try:
        context.load_cert_chain(certfile, keyfile or None, password)
    except ssl.SSLError as exc:
        raise ssl.SSLError(exc.errno, f"cannot load the key of {certfile} (wrong password, or not its key?): "
                                      f"{exc.strerror}") from None
    if cacertfile:
        context.load_verify_locations(cacertfile)
    if verify == "verify_peer":
        context.verify_mode = ssl.CERT_REQUIRED if fail_if_no_peer_cert else ssl.CERT_OPTIONAL
    return context


def amqp_context(config: "Config") -> ssl.SSLContext | None:
    """The AMQPS listener's context, or None when no certificate is configured (no AMQPS listener)."""
    if not config.tls_certfile or not config.tls_port:
        return None
    return server_context(config.tls_certfile, config.tls_keyfile, config.tls_password, config.tls_cacertfile,
                          config.tls_verify, config.tls_fail_if_no_peer_cert)


def mgmt_context(config: "Config") -> ssl.SSLContext | None:
    """The management HTTPS listener's context: its own certificate, or the AMQPS one."""
    if not config.mgmt_tls:
        return None
    if config.mgmt_tls_certfile:
        return server_context(config.mgmt_tls_certfile, config.mgmt_tls_keyfile, config.mgmt_tls_password,
                              config.tls_cacertfile)
    return server_context(config.tls_certfile, config.tls_keyfile, config.tls_password, config.tls_cacertfile)


def _files(certfile: str, keyfile: str, cacertfile: str) -> dict[str, str]:
    return {key: path for key, path in (("cacertfile", cacertfile), ("certfile", certfile), ("keyfile", keyfile))
            if path}


def amqp_options(config: "Config") -> dict[str, Any]:
    """The AMQPS listener's ``ssl_options`` as the HTTP API lists them (rabbit_mgmt_format:format_socket_opts/1):
    the versions served, the files, and verify and fail_if_no_peer_cert when set."""
    return {"versions": VERSIONS, **_files(config.tls_certfile, config.tls_keyfile, config.tls_cacertfile),
            **({"verify": "verify_peer"} if config.tls_verify == "verify_peer" else {}),
            **({"fail_if_no_peer_cert": True} if config.tls_fail_if_no_peer_cert else {})}


def mgmt_options(config: "Config") -> dict[str, str]:
    """The HTTPS listener's ``management.ssl`` files, those :func:`mgmt_context` loads."""
    if config.mgmt_tls_certfile:
        return _files(config.mgmt_tls_certfile, config.mgmt_tls_keyfile, config.tls_cacertfile)
    return _files(config.tls_certfile, config.tls_keyfile, config.tls_cacertfile)


def _escape(value: str) -> str:
    """RFC 4514 escaping as rabbit_cert_info:escape_rdn_value/1 does it (non-printable bytes as \\XX)."""
    out = []
    raw = value.encode()
    for i, byte in enumerate(raw):
        char = chr(byte)
        if (i == 0 and char in " #") or (i == len(raw) - 1 and char == " ") or char in '"+,;<>\\':
            out.append("\\" + char)
        elif byte < 32 or byte >= 126:
            out.append(f"\\{byte:02X}")
        else:
            out.append(char)
    return "".join(out)


def _rdn_key(name: str) -> str:
    """RabbitMQ's key for an attribute ``getpeercert()`` names: its short name if listed, else its dotted OID
    (OpenSSL gives the long name of the attributes it knows, the OID of others)."""
    if name in _RDN_KEYS:
        return _RDN_KEYS[name]
    return name if _DOTTED_OID.fullmatch(name) else ssl._ASN1Object.fromname(name).oid


def format_name(rdns: tuple) -> str:
    """An RDN sequence from ``getpeercert()`` as RabbitMQ's RFC 4514 string: last RDN first, ``+`` within one."""
    return ",".join("+".join(f"{_rdn_key(key)}={_escape(value)}" for key, value in rdn) for rdn in reversed(rdns))


def _iso(timestamp: str) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(ssl.cert_time_to_seconds(timestamp)))


def peer_certificate(ssl_object: ssl.SSLObject | None) -> dict[str, Any]:
    """The verified client certificate's fields, or {} (no TLS, no certificate, or not verified)."""
    return (ssl_object.getpeercert() or {}) if ssl_object is not None else {}


def login_name(cert: dict[str, Any], login_from: str) -> str | None:
    """ssl_cert_login_from: the whole subject (distinguished_name) or its CN values joined by ','."""
    subject = cert.get("subject", ())
    if login_from == "common_name":
        names = [value for rdn in subject for key, value in rdn if key == "commonName"]
        return ",".join(names) or None
    return format_name(subject) or None


def _cipher_suite(name: str) -> tuple[str, str, str]:
    """(key exchange, cipher, hash) in Erlang's spelling: TLS_AES_256_GCM_SHA384 -> any, aes_256_gcm, sha384."""
    if name.startswith("TLS_"):  # TLS 1.3 suites leave the key exchange to the handshake
        cipher, _, mac = name[4:].rpartition("_")
        return "any", cipher.lower(), mac.lower()
    parts = name.split("-")
    mac = parts.pop().lower() if parts[-1].startswith("SHA") else "aead"
    exchange = []
    while len(parts) > 1 and parts[0] in _KEY_EXCHANGES:
        exchange.append(parts.pop(0))
    return ("_".join(exchange) or "rsa").lower(), _SIZED_CIPHER.sub(r"\1_\2", "_".join(parts)).lower(), mac


def connection_info(ssl_object: ssl.SSLObject | None) -> dict[str, Any]:
    """The TLS fields of a connection in the HTTP API: null on plain TCP, as RabbitMQ shows them."""
    if ssl_object is None:
        return {"ssl": False, **dict.fromkeys(SSL_FIELDS)}
    negotiated = ssl_object.cipher()
    assert negotiated is not None  # a connection's: its handshake is done
    suite, protocol, _bits = negotiated
    exchange, cipher, mac = _cipher_suite(suite)
    cert = peer_certificate(ssl_object)
    return {
        "ssl": True, "ssl_protocol": (protocol or ssl_object.version() or "").lower(), "ssl_key_exchange": exchange,
        "ssl_cipher": cipher, "ssl_hash": mac,
        "peer_cert_subject": format_name(cert["subject"]) if cert else None,
        "peer_cert_issuer": format_name(cert["issuer"]) if cert else None,
        "peer_cert_validity": f"{_iso(cert['notBefore'])} - {_iso(cert['notAfter'])}" if cert else None,
    }
