"""TLS: AMQPS beside plain AMQP, client-certificate verification, the EXTERNAL mechanism, HTTPS management API.

Every test makes its own PKI with ``cryptography`` (a CA, a server certificate for localhost/127.0.0.1, client
certificates named by their CN) in a temporary directory, and drives nodes through pika, aio-pika, raw TLS
sockets and urllib, as users do.
"""
from __future__ import annotations

import base64
import datetime
import json
import re
import socket
import ssl
import subprocess
import sys
import urllib.error
import urllib.request
from dataclasses import dataclass
from ipaddress import IPv4Address
from pathlib import Path
from typing import Any, Iterator

import aio_pika
import pika
import pika.exceptions
import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID
from pamqp import commands, frame as pframe

from amqp_server import tls
from conftest import INTEGRATION, ROOT, BrokerProcess, free_port, starts

pytestmark = pytest.mark.timeout(90)

ORG = "Warren Test"
LOGIN_REFUSED = ("ACCESS_REFUSED - Login was refused using authentication mechanism EXTERNAL. "
                 "For details see the broker logfile.")


def _name(cn: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.ORGANIZATION_NAME, ORG), x509.NameAttribute(NameOID.COMMON_NAME, cn)])


def _write_key(key: ec.EllipticCurvePrivateKey, path: Path) -> str:
    path.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                       serialization.NoEncryption()))
    return str(path)


@dataclass
class PKI:
    """A throwaway CA and certificates it signed, as PEM files."""

    directory: Path
    ca_key: ec.EllipticCurvePrivateKey
    ca_cert: x509.Certificate
    cafile: str = ""
    server_cert: str = ""
    server_key: str = ""

    @classmethod
    def create(cls, directory: Path) -> "PKI":
        key = ec.generate_private_key(ec.SECP256R1())
        now = datetime.datetime.now(datetime.timezone.utc)
        cert = (x509.CertificateBuilder().subject_name(_name(f"{ORG} CA")).issuer_name(_name(f"{ORG} CA"))
                .public_key(key.public_key()).serial_number(x509.random_serial_number())
                .not_valid_before(now - datetime.timedelta(hours=1)).not_valid_after(now + datetime.timedelta(days=2))
                .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
                .add_extension(x509.KeyUsage(digital_signature=True, key_cert_sign=True, crl_sign=True,
                                             content_commitment=False, key_encipherment=False,
                                             data_encipherment=False, key_agreement=False, encipher_only=False,
                                             decipher_only=False), critical=True)
                .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
                .sign(key, hashes.SHA256()))
        pki = cls(directory, key, cert)
        pki.cafile = str(directory / "ca.pem")
        Path(pki.cafile).write_bytes(cert.public_bytes(serialization.Encoding.PEM))
        pki.server_cert, pki.server_key = pki.issue("localhost", server=True)
        return pki

    def issue(self, cn: str, server: bool = False, *more: x509.NameAttribute) -> tuple[str, str]:
        """(certfile, keyfile) for ``cn`` (and ``more`` subject attributes, before O and CN): a server certificate
        for localhost/127.0.0.1, or a client one."""
        key = ec.generate_private_key(ec.SECP256R1())
        now = datetime.datetime.now(datetime.timezone.utc)
        usage = x509.oid.ExtendedKeyUsageOID.SERVER_AUTH if server else x509.oid.ExtendedKeyUsageOID.CLIENT_AUTH
        builder = (x509.CertificateBuilder().subject_name(x509.Name([*more, *_name(cn)]))
                   .issuer_name(self.ca_cert.subject)
                   .public_key(key.public_key()).serial_number(x509.random_serial_number())
                   .not_valid_before(now - datetime.timedelta(hours=1))
                   .not_valid_after(now + datetime.timedelta(days=1))
                   .add_extension(x509.ExtendedKeyUsage([usage]), critical=False)
                   .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(self.ca_key.public_key()),
                                  critical=False))
        if server:
            builder = builder.add_extension(x509.SubjectAlternativeName(
                [x509.DNSName("localhost"), x509.IPAddress(IPv4Address("127.0.0.1"))]), critical=False)
        cert = builder.sign(self.ca_key, hashes.SHA256())
        stem = re.sub(r"\W", "_", cn)
        certfile = self.directory / f"{stem}.pem"
        certfile.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
        return str(certfile), _write_key(key, self.directory / f"{stem}.key")

    def client_context(self, cn: str | None = None, *more: x509.NameAttribute) -> ssl.SSLContext:
        """Trusts the CA; presents a certificate for ``cn`` (:meth:`issue`) when given."""
        context = ssl.create_default_context(cafile=self.cafile)
        if cn is not None:
            context.load_cert_chain(*self.issue(cn, False, *more))
        return context


@dataclass
class TLSNode:
    broker: BrokerProcess
    tls_port: int
    mgmt_tls_port: int

    def api(self, path: str, pki: PKI) -> Any:
        basic = "Basic " + base64.b64encode(b"guest:guest").decode()
        request = urllib.request.Request(f"https://localhost:{self.mgmt_tls_port}{path}",
                                         headers={"Authorization": basic})
        with urllib.request.urlopen(request, context=pki.client_context(), timeout=10) as response:
            return json.load(response)

    def params(self, context: ssl.SSLContext, **kwargs) -> pika.ConnectionParameters:
        return pika.ConnectionParameters("localhost", self.tls_port, ssl_options=pika.SSLOptions(context, "localhost"),
                                         connection_attempts=1, **kwargs)


def start_tls_node(data_dir: Path, pki: PKI, *extra: str) -> TLSNode:
    tls_port, mgmt_tls_port = free_port(), free_port()
    broker = BrokerProcess(data_dir, extra=[
        "--tls-port", str(tls_port), "--tls-certfile", pki.server_cert, "--tls-keyfile", pki.server_key,
        "--tls-cacertfile", pki.cafile, "--mgmt-tls", "true", "--mgmt-tls-port", str(mgmt_tls_port), *extra]).start()
    return TLSNode(broker, tls_port, mgmt_tls_port)


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> PKI:
    return PKI.create(tmp_path_factory.mktemp("pki"))


@pytest.fixture(scope="module")
@starts(INTEGRATION)
def node(pki: PKI, tmp_path_factory: pytest.TempPathFactory) -> Iterator[TLSNode]:
    """Peer verification on but a client certificate optional; EXTERNAL names users by CN."""
    started = start_tls_node(tmp_path_factory.mktemp("tlsnode") / "data", pki, "--tls-verify", "verify_peer",
                             "--auth-mechanisms", "PLAIN AMQPLAIN EXTERNAL", "--tls-cert-login-from", "common_name")
    assert started.broker.admin("add-user", "tls-client", "unused-password").returncode == 0
    assert started.broker.admin("set-permissions", "/", "tls-client", ".*", ".*", ".*").returncode == 0
    yield started
    started.broker.stop()


def _read_method(sock: socket.socket, data: bytes = b"") -> tuple[object, bytes]:
    """The next frame off ``sock`` and the bytes after it."""
    while True:
        try:
            consumed, _, value = pframe.unmarshal(data)
            return value, data[consumed:]
        except Exception:  # partial frame
            chunk = sock.recv(65536)
            if not chunk:
                raise ConnectionError("closed by the broker") from None
            data += chunk


def _start_mechanisms(sock: socket.socket) -> list[str]:
    """Send the protocol header, read connection.start, return its mechanisms."""
    sock.sendall(b"AMQP\x00\x00\x09\x01")
    start, _ = _read_method(sock)
    assert isinstance(start, commands.Connection.Start)
    return start.mechanisms.split()


# -- AMQPS with the usual clients ---------------------------------------------------------------------------


def test_pika_publishes_and_consumes_over_tls(node: TLSNode, pki: PKI, uid: str) -> None:
    connection = pika.BlockingConnection(node.params(pki.client_context()))
    try:
        channel = connection.channel()
        channel.queue_declare(uid)
        channel.confirm_delivery()
        for i in range(200):
            channel.basic_publish("", uid, f"m{i}".encode() * 50)
        received: list[bytes] = []

        def on_message(ch, method, _properties, body: bytes) -> None:
            received.append(body)
            ch.basic_ack(method.delivery_tag)
            if len(received) == 200:
                ch.stop_consuming()

        channel.basic_consume(uid, on_message)
        connection.call_later(20, channel.stop_consuming)
        channel.start_consuming()
        assert received == [f"m{i}".encode() * 50 for i in range(200)]
    finally:
        connection.close()


async def test_aio_pika_amqps_url_with_ssl_context(node: TLSNode, pki: PKI, uid: str) -> None:
    connection = await aio_pika.connect(f"amqps://guest:guest@localhost:{node.tls_port}/",
                                        ssl_context=pki.client_context(), timeout=10)
    async with connection:
        channel = await connection.channel()
        queue = await channel.declare_queue(uid, auto_delete=True)
        for i in range(50):
            await channel.default_exchange.publish(aio_pika.Message(f"a{i}".encode()), routing_key=uid)
        bodies = []
        async with queue.iterator(timeout=10) as messages:
            async for message in messages:
                async with message.process():
                    bodies.append(message.body)
                if len(bodies) == 50:
                    break
        assert bodies == [f"a{i}".encode() for i in range(50)]


def test_plain_amqp_still_served_alongside_tls(node: TLSNode, pki: PKI, uid: str) -> None:
    plain = pika.BlockingConnection(pika.URLParameters(node.broker.url))
    secure = pika.BlockingConnection(node.params(pki.client_context()))
    try:
        plain.channel().queue_declare(uid)
        plain.channel().basic_publish("", uid, b"from plain")
        secure.channel().basic_publish("", uid, b"from tls")
        channel = secure.channel()
        got = [channel.basic_get(uid, auto_ack=True)[2] for _ in range(2)]
        assert got == [b"from plain", b"from tls"]
    finally:
        plain.close()
        secure.close()


def test_server_certificate_is_checked_by_clients(node: TLSNode) -> None:
    """A client that does not trust our CA fails the handshake: the listener really speaks TLS."""
    with pytest.raises(ssl.SSLCertVerificationError):
        pika.BlockingConnection(node.params(ssl.create_default_context()))


# -- EXTERNAL -----------------------------------------------------------------------------------------------


def test_external_offered_on_tls_only(node: TLSNode, pki: PKI) -> None:
    with socket.create_connection(("127.0.0.1", node.broker.port), timeout=5) as sock:
        assert _start_mechanisms(sock) == ["PLAIN", "AMQPLAIN"]
    context = pki.client_context()
    with context.wrap_socket(socket.create_connection(("127.0.0.1", node.tls_port), timeout=5),
                             server_hostname="localhost") as sock:
        assert _start_mechanisms(sock) == ["PLAIN", "AMQPLAIN", "EXTERNAL"]
    with pytest.raises(pika.exceptions.AMQPConnectionError):  # pika finds no EXTERNAL to choose on plain AMQP
        pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", node.broker.port, connection_attempts=1,
                                                          credentials=pika.credentials.ExternalCredentials()))


def test_external_login_takes_the_user_from_the_certificate_cn(node: TLSNode, pki: PKI, uid: str) -> None:
    connection = pika.BlockingConnection(node.params(pki.client_context("tls-client"),
                                                     credentials=pika.credentials.ExternalCredentials(),
                                                     client_properties={"connection_name": uid}))
    try:
        channel = connection.channel()
        channel.queue_declare(uid)
        channel.basic_publish("", uid, b"by certificate")
        assert channel.basic_get(uid, auto_ack=True)[2] == b"by certificate"
        [info] = [c for c in node.api("/api/connections", pki) if c.get("user_provided_name") == uid]
        assert (info["user"], info["auth_mechanism"]) == ("tls-client", "EXTERNAL")
        assert info["peer_cert_subject"] == f"CN=tls-client,O={ORG}"
    finally:
        connection.close()


def test_external_login_with_unknown_cn_is_refused(node: TLSNode, pki: PKI) -> None:
    with pytest.raises(pika.exceptions.ProbableAuthenticationError) as refused:
        pika.BlockingConnection(node.params(pki.client_context("nobody"),
                                            credentials=pika.credentials.ExternalCredentials()))
    assert f"(403) '{LOGIN_REFUSED}'" in str(refused.value)
    assert "login refused for user 'nobody'" in node.broker.said()


async def test_external_login_without_client_certificate_is_refused(node: TLSNode, pki: PKI) -> None:
    with pytest.raises(aio_pika.exceptions.ProbableAuthenticationError) as refused:
        await aio_pika.connect(f"amqps://localhost:{node.tls_port}/?auth=external",
                               ssl_context=pki.client_context(), timeout=10)
    assert LOGIN_REFUSED in str(refused.value)
    assert "EXTERNAL login refused: connection peer presented no TLS (x.509) certificate" in node.broker.said()


def test_password_logins_still_work_with_a_client_certificate(node: TLSNode, pki: PKI) -> None:
    """The certificate authenticates the channel; PLAIN still names the user."""
    connection = pika.BlockingConnection(node.params(pki.client_context("tls-client"),
                                                     credentials=pika.PlainCredentials("guest", "guest")))
    connection.close()


# -- the management API over HTTPS --------------------------------------------------------------------------


def test_https_management_api_shows_connections_tls_fields(node: TLSNode, pki: PKI, uid: str) -> None:
    assert node.api("/api/overview", pki)["node"]
    secure = pika.BlockingConnection(node.params(pki.client_context("tls-client"),
                                                 client_properties={"connection_name": f"{uid}-tls"}))
    plain = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", node.broker.port,
                                                              client_properties={"connection_name": f"{uid}-plain"}))
    try:
        by_name = {c.get("user_provided_name"): c for c in node.api("/api/connections", pki)}
        info = by_name[f"{uid}-tls"]
        assert info["ssl"] is True and info["auth_mechanism"] == "PLAIN"
        assert info["ssl_protocol"] in ("tlsv1.2", "tlsv1.3")
        assert info["ssl_cipher"] and info["ssl_hash"] and info["ssl_key_exchange"]
        assert info["peer_cert_subject"] == f"CN=tls-client,O={ORG}"
        assert info["peer_cert_issuer"] == f"CN={ORG} CA,O={ORG}"
        assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ - \d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ",
                            info["peer_cert_validity"])
        assert info["port"] == node.tls_port
        plain_info = by_name[f"{uid}-plain"]
        assert plain_info["ssl"] is False and plain_info["port"] == node.broker.port
        assert all(plain_info[key] is None for key in tls.SSL_FIELDS)
    finally:
        secure.close()
        plain.close()


def test_overview_lists_the_tls_listeners_and_the_https_context(node: TLSNode, pki: PKI) -> None:
    """As rabbit_mgmt_wm_overview lists rabbit_networking:active_listeners() and the web dispatch contexts."""
    overview = node.api("/api/overview", pki)
    listed = {(entry["protocol"], entry["port"]) for entry in overview["listeners"]}
    assert {("amqp", node.broker.port), ("amqp/ssl", node.tls_port), ("http", node.broker.mgmt_port),
            ("https", node.mgmt_tls_port)} <= listed
    assert [entry["protocol"] for entry in overview["listeners"]] == sorted(
        entry["protocol"] for entry in overview["listeners"])
    [amqps] = [entry for entry in overview["listeners"] if entry["protocol"] == "amqp/ssl"]
    files = {"cacertfile": pki.cafile, "certfile": pki.server_cert, "keyfile": pki.server_key}
    assert amqps["socket_opts"] == {"versions": ["tlsv1.3", "tlsv1.2"], **files, "verify": "verify_peer"}
    [https_listener] = [entry for entry in overview["listeners"] if entry["protocol"] == "https"]
    assert https_listener["socket_opts"] == {"cowboy_opts": {"sendfile": False}, "port": node.mgmt_tls_port,
                                             "ssl": True, "ssl_opts": {**files, "port": node.mgmt_tls_port}}
    [https] = [entry for entry in overview["contexts"] if entry["port"] == str(node.mgmt_tls_port)]
    assert (https["description"], https["path"], https["ssl"]) == ("RabbitMQ Management", "/", "true")
    assert https["ssl_opts"] == {"port": str(node.mgmt_tls_port), "cacertfile": pki.cafile,
                                 "certfile": pki.server_cert, "keyfile": pki.server_key}


def test_tls12_connection_fields_in_erlang_spelling(node: TLSNode, pki: PKI, uid: str) -> None:
    context = pki.client_context()
    context.maximum_version = ssl.TLSVersion.TLSv1_2
    context.set_ciphers("ECDHE-ECDSA-AES128-GCM-SHA256")
    connection = pika.BlockingConnection(node.params(context, client_properties={"connection_name": uid}))
    try:
        [info] = [c for c in node.api("/api/connections", pki) if c.get("user_provided_name") == uid]
        assert (info["ssl_protocol"], info["ssl_key_exchange"], info["ssl_cipher"], info["ssl_hash"]) == (
            "tlsv1.2", "ecdhe_ecdsa", "aes_128_gcm", "sha256")
        assert info["peer_cert_subject"] is None  # no client certificate presented
    finally:
        connection.close()


def test_https_management_api_needs_the_ca_and_plain_http_still_answers(node: TLSNode, pki: PKI) -> None:
    with pytest.raises(urllib.error.URLError) as failed:
        urllib.request.urlopen(f"https://localhost:{node.mgmt_tls_port}/api/overview",
                               context=ssl.create_default_context(), timeout=10)
    assert isinstance(failed.value.reason, ssl.SSLCertVerificationError)
    request = urllib.request.Request(f"http://127.0.0.1:{node.broker.mgmt_port}/api/whoami",
                                     headers={"Authorization": "Basic " + base64.b64encode(b"guest:guest").decode()})
    with urllib.request.urlopen(request, timeout=10) as response:
        assert json.load(response)["name"] == "guest"


# -- fail_if_no_peer_cert and the distinguished-name login -------------------------------------------------


@pytest.mark.integration
def test_fail_if_no_peer_cert_refuses_clients_without_certificate(pki: PKI, tmp_path: Path) -> None:
    strict = start_tls_node(tmp_path / "data", pki, "--tls-verify", "verify_peer", "--tls-fail-if-no-peer-cert",
                            "true", "--auth-mechanisms", "EXTERNAL", "--explain-handshake-errors", "true")
    try:
        # TLS 1.3 lets the client finish its side first; the refusal arrives as an alert before any AMQP byte
        with pytest.raises((ssl.SSLError, ConnectionError)):
            with pki.client_context().wrap_socket(socket.create_connection(("127.0.0.1", strict.tls_port), timeout=5),
                                                  server_hostname="localhost") as sock:
                _start_mechanisms(sock)
        with pytest.raises(pika.exceptions.AMQPConnectionError):
            pika.BlockingConnection(strict.params(pki.client_context()))
        # with a certificate the handshake passes; only EXTERNAL is offered
        with pki.client_context("someone").wrap_socket(
                socket.create_connection(("127.0.0.1", strict.tls_port), timeout=5),
                server_hostname="localhost") as sock:
            assert _start_mechanisms(sock) == ["EXTERNAL"]
        # plain AMQP offers nothing then; a known mechanism not offered is 503, as RabbitMQ's auth_mechanism_to_module
        # says (RabbitMQ then drops the socket; --explain-handshake-errors sends it as connection.close)
        with socket.create_connection(("127.0.0.1", strict.broker.port), timeout=5) as sock:
            assert _start_mechanisms(sock) == []
            sock.sendall(pframe.marshal(commands.Connection.StartOk(
                client_properties={"capabilities": {"authentication_failure_close": True}}, mechanism="PLAIN",
                response="\x00guest\x00guest", locale="en_US"), 0))
            close, _ = _read_method(sock)
            assert isinstance(close, commands.Connection.Close)
            assert (close.reply_code, close.reply_text) == (503, "COMMAND_INVALID - invalid authentication "
                                                                 "mechanism 'PLAIN'")
    finally:
        strict.broker.stop()


@pytest.mark.integration
def test_external_login_by_distinguished_name_by_default(pki: PKI, tmp_path: Path) -> None:
    dn_node = start_tls_node(tmp_path / "data", pki, "--tls-verify", "verify_peer",
                             "--auth-mechanisms", "EXTERNAL PLAIN")
    try:
        broker = dn_node.broker
        dn = f"CN=dn-client,O={ORG}"
        for user in (dn, "cn-only"):
            assert broker.admin("add-user", user, "unused").returncode == 0
            assert broker.admin("set-permissions", "/", user, ".*", ".*", ".*").returncode == 0
        external = pika.credentials.ExternalCredentials()
        connection = pika.BlockingConnection(dn_node.params(pki.client_context("dn-client"), credentials=external))
        try:
            assert connection.channel().queue_declare("", exclusive=True).method.queue
        finally:
            connection.close()
        with pytest.raises(pika.exceptions.ProbableAuthenticationError):  # the CN alone names no user here
            pika.BlockingConnection(dn_node.params(pki.client_context("cn-only"), credentials=external))
        # attributes outside rabbit_cert_info:format_rdn/1's table are named by their OID, STREET among them
        postal = f"CN=postal,O={ORG},2.5.4.17=10115,2.5.4.9=Main St 1,C=DE"
        assert broker.admin("add-user", postal, "unused").returncode == 0
        assert broker.admin("set-permissions", "/", postal, ".*", ".*", ".*").returncode == 0
        context = pki.client_context("postal", x509.NameAttribute(NameOID.COUNTRY_NAME, "DE"),
                                     x509.NameAttribute(NameOID.STREET_ADDRESS, "Main St 1"),
                                     x509.NameAttribute(NameOID.POSTAL_CODE, "10115"))
        connection = pika.BlockingConnection(dn_node.params(context, credentials=external))
        connection.close()
    finally:
        dn_node.broker.stop()


# -- configuration and formatting ---------------------------------------------------------------------------


@pytest.mark.integration
def test_an_encrypted_key_is_opened_with_its_password_and_never_asked_for(pki: PKI, tmp_path: Path) -> None:
    """ssl_options.password: AMQPS and HTTPS serve with a password-protected key; without the password the node
    stops at once with a reason, instead of OpenSSL asking a terminal for a pass phrase."""
    key = serialization.load_pem_private_key(Path(pki.server_key).read_bytes(), None)
    encrypted = tmp_path / "encrypted.key"
    encrypted.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                            serialization.BestAvailableEncryption(b"s3cret")))
    locked = start_tls_node(tmp_path / "data", pki, "--tls-keyfile", str(encrypted), "--tls-password", "s3cret")
    try:
        pika.BlockingConnection(locked.params(pki.client_context())).close()
        assert locked.api("/api/whoami", pki)["name"] == "guest"
    finally:
        locked.broker.stop()
    result = subprocess.run([sys.executable, "-m", "amqp_server", "--bind", "127.0.0.1", "--amqp-port",
                             str(free_port()), "--mgmt-enabled", "false", "--tls-port", str(free_port()),
                             "--tls-certfile", pki.server_cert, "--tls-keyfile", str(encrypted),
                             "--data-dir", str(tmp_path / "d")], cwd=ROOT, capture_output=True, text=True,
                            timeout=30, stdin=subprocess.DEVNULL)
    said = " ".join((result.stdout + result.stderr).split())  # (the log wraps long lines)
    assert result.returncode == 1 and "cannot start: cannot load the key" in said and "wrong password" in said
    assert "pass phrase" not in said


@pytest.mark.integration
@pytest.mark.parametrize("args, message", [
    (["--tls-verify", "verify_maybe"], "tls_verify must be one of verify_none, verify_peer"),
    (["--auth-mechanisms", "PLAIN CRAM-MD5"], "unknown auth_mechanisms: CRAM-MD5"),
    (["--mgmt-tls", "true"], "mgmt_tls needs mgmt_tls_certfile or tls_certfile"),
])
def test_bad_tls_configuration_is_refused_at_start(tmp_path: Path, args: list[str], message: str) -> None:
    result = subprocess.run([sys.executable, "-m", "amqp_server", "--data-dir", str(tmp_path / "d"), *args],
                            cwd=ROOT, capture_output=True, text=True, timeout=30)
    assert result.returncode == 2 and message in result.stderr


@pytest.mark.integration
@pytest.mark.parametrize("args, message", [
    (["--tls-fail-if-no-peer-cert", "true"], "tls_fail_if_no_peer_cert needs tls_verify verify_peer"),
    (["--tls-verify", "verify_peer"], "tls_verify verify_peer needs tls_cacertfile"),
])
def test_tls_options_that_rabbitmq_cannot_listen_with_stop_the_node(pki: PKI, tmp_path: Path, args: list[str],
                                                                     message: str) -> None:
    """ssl:listen/2 refuses {verify, verify_none} with {fail_if_no_peer_cert, true}, and verify_peer without a CA
    ({options, {cacertfile, []}}): RabbitMQ serves no TLS port then.  Listening anyway would let in clients the
    options were to keep out (without a certificate, or with one any public CA signed)."""
    result = subprocess.run([sys.executable, "-m", "amqp_server", "--bind", "127.0.0.1", "--amqp-port",
                             str(free_port()), "--mgmt-enabled", "false", "--tls-port", str(free_port()),
                             "--tls-certfile", pki.server_cert, "--tls-keyfile", pki.server_key, *args,
                             "--data-dir", str(tmp_path / "d")], cwd=ROOT, capture_output=True, text=True, timeout=30)
    assert result.returncode == 2 and message in result.stderr


def test_tls_options_from_toml_env_and_command_line(tmp_path: Path) -> None:
    from amqp_server import config

    toml = tmp_path / "warren.toml"
    toml.write_text('tls_certfile = "/etc/warren/server.pem"\ntls_verify = "verify_peer"\n'
                    'tls_cacertfile = "/etc/warren/ca.pem"\n'
                    'auth_mechanisms = ["PLAIN", "EXTERNAL"]\ntls_port = 5000\n')
    loaded = config.load(["--config", str(toml), "--tls-cert-login-from", "common_name"],
                         environ={"WARREN_TLS_PORT": "5001", "WARREN_TLS_FAIL_IF_NO_PEER_CERT": "true"})
    assert (loaded.tls_certfile, loaded.tls_verify, loaded.tls_port) == ("/etc/warren/server.pem", "verify_peer", 5001)
    assert loaded.mechanisms == ["PLAIN", "EXTERNAL"] and loaded.tls_fail_if_no_peer_cert
    assert loaded.tls_cert_login_from == "common_name"
    assert config.load([], environ={}).mechanisms == ["PLAIN", "AMQPLAIN"]


@pytest.mark.integration
def test_missing_certificate_file_stops_the_node(tmp_path: Path) -> None:
    result = subprocess.run([sys.executable, "-m", "amqp_server", "--bind", "127.0.0.1", "--amqp-port",
                             str(free_port()), "--mgmt-enabled", "false", "--tls-port", str(free_port()),
                             "--tls-certfile", str(tmp_path / "missing.pem"), "--data-dir", str(tmp_path / "d")],
                            cwd=ROOT, capture_output=True, text=True, timeout=30)
    assert result.returncode == 1 and "cannot start" in result.stdout + result.stderr


def test_subject_formatting_escapes_as_rabbitmq() -> None:
    subject = ((("countryName", "DE"),), (("organizationName", "A, B+C"),),
               (("commonName", " lead#"), ("userId", "x;y")), (("commonName", "é"),))
    assert tls.format_name(subject) == "CN=\\C3\\A9,CN=\\ lead#+UID=x\\;y,O=A\\, B\\+C,C=DE"
    unlisted = ((("streetAddress", "Main St"),), (("businessCategory", "Private"),), (("dnQualifier", "q"),),
                (("1.2.3.4", "odd"),), (("domainComponent", "dc"), ("emailAddress", "a@b.c")))
    assert tls.format_name(unlisted) == ("DC=dc+EMAILADDRESS=a@b.c,1.2.3.4=odd,2.5.4.46=q,2.5.4.15=Private,"
                                         "2.5.4.9=Main St")
    assert tls.login_name({"subject": subject}, "common_name") == " lead#,é"
