"""A shovel's definition and URIs, in-process: RabbitMQ's defaults, where messages go, what the API shows."""
from __future__ import annotations

import pytest

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
