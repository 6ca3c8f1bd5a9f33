"""A shovel's definition and URIs, in-process: RabbitMQ's defaults, where messages go, what the API shows."""
from __future__ import annotations

import datetime
import ssl

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from amqp_server.shovel.definition import Definition, validate
from amqp_server.links.uri import URIError, parse, redacted


def test_uris_as_amqp_uri_reads_them():
    assert parse("amqp://").direct and parse("amqp://").vhost == "/"
    direct = parse("amqp://app@/shop")
    assert direct.direct and direct.user == "app" and direct.vhost == "shop"
    remote = parse("amqps://u:p%40ss@rabbit.example:5999/%2F?heartbeat=10&verify=verify_none")
    assert (remote.host, remote.port, remote.vhost, remote.user, remote.password) == ("rabbit.example", 5999, "/",
                                                                                    "u", "p@ss")
    assert remote.heartbeat() == 10 and remote.ssl_context() is not None
    assert parse("amqp://host/").vhost == ""  # the AMQP URI spec: an empty path segment is the vhost ""
    assert parse("amqp://host").port == 5672 and parse("amqps://host").port == 5671
    for bad in ("http://host", "amqp://host:99999", "amqp://host/a/b", "amqp://host?nosuch=1", "amqps://"):
        with pytest.raises(URIError):
            parse(bad)


def test_an_encrypted_client_key_takes_the_uris_password(tmp_path):
    """amqp_uri's ``password`` query parameter opens the keyfile; without it the URI's TLS context fails at once
    (OpenSSL would otherwise ask the node's terminal, holding its event loop)."""
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "shovel")])
    now = datetime.datetime.now(datetime.timezone.utc)
    cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
            .serial_number(1).not_valid_before(now).not_valid_after(now + datetime.timedelta(days=1))
            .sign(key, hashes.SHA256()))
    certfile, keyfile = tmp_path / "client.pem", tmp_path / "client.key"
    certfile.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    keyfile.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                          serialization.BestAvailableEncryption(b"pw")))
    uri = f"amqps://remote.example?certfile={certfile}&keyfile={keyfile}"
    assert parse(f"{uri}&password=pw").ssl_context() is not None
    with pytest.raises(ssl.SSLError):
        parse(uri).ssl_context()


def test_redacted_as_remove_credentials():
    assert redacted("amqp://user:secret@host:5673/vh?heartbeat=5") == "amqp://host:5673/vh"
    assert redacted("amqps://user:secret@host/%2F") == "amqps://host/%2F"
    assert redacted("amqp://") == "amqp://"


def test_defaults_and_destinations_as_rabbitmqs_parse():
    value = {"src-uri": "amqp://", "src-queue": "a", "dest-uri": ["amqp://", "amqp://b"]}
    assert validate("s", value) == []
    definition = Definition.parse(value)
    assert (definition.prefetch, definition.ack_mode, definition.delete_after, definition.reconnect_delay) == (
        1000, "on-confirm", "never", 5)
    assert definition.destination("x", "k") == ("x", "k")  # neither dest-queue nor dest-exchange: as published
    assert Definition.parse({**value, "dest-queue": "q"}).destination("x", "k") == ("", "q")
    assert Definition.parse({**value, "dest-exchange": "d"}).destination("x", "k") == ("d", "k")
    assert Definition.parse({**value, "dest-exchange": "d", "dest-exchange-key": "r"}).destination("x", "k") == (
        "d", "r")
    legacy = Definition.parse({**value, "prefetch-count": 5, "delete-after": 3, "add-forward-headers": True})
    assert (legacy.prefetch, legacy.delete_after, legacy.add_forward_headers) == (5, 3, True)


def test_validation_texts():
    assert validate("n", []) == ["n not a list []"]
    assert validate("n", {"src-uri": "amqp://", "dest-uri": "amqp://"}) == [
        "Must specify 'src-exchange' or 'src-queue'"]
    errors = validate("n", {"src-uri": 1, "src-queue": "a", "dest-uri": "amqp://", "reconnect-delay": "x",
                            "src-delete-after": "sometime", "add-forward-headers": "yes"})
    assert "src-uri should be binary, actually was 1" in errors
    assert 'reconnect-delay should be a number, actually was <<"x">>' in errors
    assert 'src-delete-after should be number, "never" or "queue-length", actually was <<"sometime">>' in errors
    assert 'add-forward-headers should be boolean, actually was <<"yes">>' in errors
    assert validate("n", {"src-uri": "amqp://", "src-queue": "a", "dest-uri": "amqp://",
                          "dest-publish-properties": {"colour": "red"}}) == [
        'Unrecognised terms [{<<"colour">>,<<"red">>}] in dest-publish-properties']


def test_a_dest_queue_longer_than_255_bytes_is_refused():
    """rabbit_parameter_validation:amqp091_queue_name, as rabbit_shovel_parameters checks dest-queue."""
    value = {"src-uri": "amqp://", "src-queue": "a", "dest-uri": "amqp://"}
    assert validate("n", {**value, "dest-queue": "q" * 255}) == []
    assert validate("n", {**value, "dest-queue": "é" * 128}) == [
        "dest-queue should be less than 255 bytes, actually was 256"]
    assert validate("n", {**value, "dest-queue": 1}) == ["dest-queue should be binary, actually was 1"]
