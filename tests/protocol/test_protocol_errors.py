"""Raw-socket protocol errors: the broker must answer malformed input exactly as RabbitMQ 3.10 does.

Frames are built with ``pamqp.frame.marshal`` (or by hand with ``struct`` where they must be broken),
and every read is bounded by a socket timeout so a hung broker fails the test instead of hanging it.
"""
from __future__ import annotations

import socket
import struct
import time

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pamqp import commands, frame as pframe, header as pheader, body as pbody

from conftest import BrokerProcess
from support import FRAME_END, PROTOCOL_HEADER, Closed, Raw, method_payload, publish_frames, raw_frame

pytestmark = pytest.mark.timeout(60)

def assert_serves(broker) -> None:
    """A fresh connection still completes the handshake and a queue round trip."""
    client = Raw(broker)
    try:
        client.handshake()
        client.open_channel(1)
        client.send_method(1, commands.Queue.Declare(queue="", exclusive=True, auto_delete=True))
        ok = client.expect(commands.Queue.DeclareOk)
        client.send(publish_frames(1, "", ok.queue, b"ping"))
        client.send_method(1, commands.Basic.Get(queue=ok.queue, no_ack=True))
        client.expect(commands.Basic.GetOk)
        client.expect(pheader.ContentHeader)
        assert client.expect(pbody.ContentBody).value == b"ping"
        client.send_method(0, commands.Connection.Close(reply_code=200, reply_text="bye", class_id=0, method_id=0))
        client.expect(commands.Connection.CloseOk)
    finally:
        client.close()
    assert broker.running


def connection_error(broker, payload: bytes, open_channel: bool = True, **handshake) -> commands.Connection.Close:
    client = Raw(broker)
    try:
        client.handshake(**handshake)
        if open_channel:
            client.open_channel(1)
        client.send(payload)
        close = client.expect_connection_close()
        client.assert_eof()
        return close
    finally:
        client.close()


def test_connection_start_server_properties_as_rabbitmq(broker):
    client = Raw(broker)
    try:
        client.send(PROTOCOL_HEADER)
        start = client.expect(commands.Connection.Start)
    finally:
        client.close()
    assert (start.version_major, start.version_minor, start.locales) == (0, 9, "en_US")
    props = start.server_properties
    assert set(props) == {"capabilities", "cluster_name", "copyright", "information", "platform", "product", "version"}
    assert props["capabilities"] == {  # RabbitMQ 3.10's set
        "publisher_confirms": True, "exchange_exchange_bindings": True, "basic.nack": True,
        "consumer_cancel_notify": True, "connection.blocked": True, "consumer_priorities": True,
        "authentication_failure_close": True, "per_consumer_qos": True, "direct_reply_to": True}


# -- protocol header ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("header", [b"AMQP\x00\x00\x08\x00", b"HTTP/1.1", b"AMQP\x01\x01\x00\x0a",
                                    b"GET / HTTP/1.1\r\n\r\n"])
def test_bad_protocol_header_gets_supported_header_and_close(broker, header):
    client = Raw(broker)
    try:
        client.send(header)
        data = b""
        while True:
            chunk = client.recv(64)
            if not chunk:
                break
            data += chunk
        assert data == PROTOCOL_HEADER
    finally:
        client.close()
    assert_serves(broker)


# -- framing ------------------------------------------------------------------------------------------------


def test_frame_without_end_octet_is_frame_error(broker):
    """rabbit_reader:handle_input: fatal_frame_error({invalid_frame_end_marker, EndMarker}, ...), whose text is
    frame_error's "type ~p, ~s octets = ~p: ~p" (on one line while it fits in 80 columns)."""
    bad = raw_frame(1, 1, method_payload(50, 10, b"\x00\x00"), end=b"A")
    close = connection_error(broker, bad)
    assert (close.reply_code, close.reply_text, close.class_id, close.method_id) == (
        501, "FRAME_ERROR - type 1, all octets = <<0,50,0,10,0,0>>: {invalid_frame_end_marker,65}", 0, 0)
    assert_serves(broker)


def test_frame_larger_than_frame_max_is_frame_error(broker):
    # a payload exactly frame_max long is tolerated (RabbitMQ's FRAME_SIZE_FUDGE); one octet more is not
    body = b"x" * 5000
    client = Raw(broker)
    try:
        client.handshake(frame_max=4096)
        client.open_channel(1)
        client.send_method(1, commands.Queue.Declare(queue="", exclusive=True))
        queue = client.expect(commands.Queue.DeclareOk).queue
        client.send(pframe.marshal(commands.Basic.Publish(exchange="", routing_key=queue), 1)
                    + pframe.marshal(pheader.ContentHeader(0, len(body), commands.Basic.Properties()), 1)
                    + raw_frame(3, 1, body[:4096]) + raw_frame(3, 1, body[4096:]))
        client.send_method(1, commands.Basic.Get(queue=queue, no_ack=True))
        client.expect(commands.Basic.GetOk)
        client.expect(pheader.ContentHeader)
        got = b""
        while len(got) < len(body):
            chunk = client.expect(pbody.ContentBody).value
            assert len(chunk) <= 4096 - 8  # the server keeps to frame_max itself
            got += chunk
        assert got == body
        client.send(raw_frame(3, 1, b"y" * 4097))
        close = client.expect_connection_close()
        assert (close.reply_code, close.reply_text) == (
            501, "FRAME_ERROR - type 3, all octets = <<>>: {frame_too_large,4097,4088}")
        client.assert_eof()
    finally:
        client.close()
    assert_serves(broker)


@pytest.mark.parametrize("ftype", [0, 4, 5, 7, 9, 200])
def test_unknown_frame_type_is_frame_error(broker, ftype):
    close = connection_error(broker, raw_frame(ftype, 1, b"abc"))
    assert close.reply_code == 501
    assert close.reply_text == f'FRAME_ERROR - type {ftype}, all octets = <<"abc">>: unknown_frame'


@pytest.mark.parametrize("frame, text", [
    (raw_frame(8, 0, b"xy"), 'type 8, all octets = <<"xy">>'),
    (raw_frame(8, 1, b"xy"), 'type 8, all octets = <<"xy">>'),
    (raw_frame(1, 1, b"\x00\x32"), "type 1, all octets = <<0,50>>"),
    (raw_frame(1, 0, b"\x00\x0a\x00"), "type 1, all octets = <<0,10,0>>"),
    (raw_frame(2, 1, b"\x00\x3c\x00\x00"), "type 2, all octets = <<0,60,0,0>>"),
    (raw_frame(2, 2, bytes(11)), "type 2, all octets = <<0,0,0,0,0,0,0,0,0,0,0>>"),
], ids=["heartbeat with a payload, channel 0", "heartbeat with a payload, channel 1", "method without its ids",
        "method without its ids, channel 0", "content header without its body size",
        "content header without its body size, channel not open"])
def test_a_frame_analyze_frame_cannot_read_is_unknown_frame(broker, frame, text):
    """rabbit_command_assembler:analyze_frame reads an empty heartbeat, a method of at least its class and method ids,
    a content header of at least its class, weight and body size (12 octets); any other is ``error``, which
    handle_frame answers with frame_error(unknown_frame, ...) (501) on any channel, before the channel (open or not)
    sees it."""
    close = connection_error(broker, frame)
    assert (close.reply_code, close.reply_text) == (501, f"FRAME_ERROR - {text}: unknown_frame")


STALE_CLOSE = pframe.marshal(commands.Channel.Close(reply_code=200, reply_text="Goodbye", class_id=0, method_id=0), 1)


@pytest.mark.parametrize("frame,text", [
    (STALE_CLOSE, "type 1, first 16 octets = <<0,20,0,40,0,200,7,71,111,111,100,98,121,101,0,0>>"),
    (raw_frame(3, 1, b"stray"), 'type 3, all octets = <<"stray">>'),
    (raw_frame(9, 2, b"x" * 20), 'type 9, first 16 octets = <<"xxxxxxxxxxxxxxxx">>'),
    (raw_frame(3, 0, b'a\n"\\'), 'type 3, all octets = <<"a\\n\\"\\\\">>'),
    (raw_frame(2, 0, b"\x00\x3c" + bytes(12)), "type 2, all octets = <<0,60,0,0,0,0,0,0,0,0,0,0,0,0>>"),
], ids=["stale channel.close", "body on channel 1", "unknown type on channel 2", "body on channel 0",
        "header on channel 0"])
def test_channel_frame_before_connection_open_is_unexpected_frame(broker, frame, text):
    """A client recovering its connection (Bunny 2.19) may send a stale channel.close on channel 1 after tune-ok,
    before connection.open.  rabbit_reader takes no channel's frame (nor content on channel 0) before the
    connection is open: 505 at once, quoting the first 16 octets as Erlang prints them, and the
    connection.open that follows is ignored."""
    client = Raw(broker)
    try:
        client.handshake(open_vhost=False)
        client.send(frame)
        client.send_method(0, commands.Connection.Open(virtual_host="/"))
        close = client.expect_connection_close()
        client.assert_eof()
    finally:
        client.close()
    assert (close.reply_code, close.reply_text) == (505, f"UNEXPECTED_FRAME - {text}")
    assert (close.class_id, close.method_id) == (0, 0)
    assert_serves(broker)


def test_channel_frame_before_tune_ok_drops_the_socket_after_a_delay(broker):
    """Earlier in the handshake RabbitMQ answers nothing and drops the socket after 3 s (as for any handshake error)."""
    client = Raw(broker, timeout=10)
    try:
        client.send(PROTOCOL_HEADER)
        client.expect(commands.Connection.Start)
        client.send(STALE_CLOSE)
        started = time.monotonic()
        with pytest.raises(Closed):
            client.read_frame()
        assert 2.5 < time.monotonic() - started < 6
    finally:
        client.close()
    assert_serves(broker)


def test_heartbeat_on_nonzero_channel_is_unexpected_frame(broker):
    close = connection_error(broker, raw_frame(8, 1, b""))
    assert close.reply_code == 505
    assert close.reply_text.startswith("UNEXPECTED_FRAME - type 8,")


def test_the_answers_to_the_frames_before_a_connection_error_go_out_before_its_close(broker):
    """The frames read with the one that fails the connection were handled: their answers are sent, in order,
    before connection.close (as RabbitMQ's channels answer before its reader closes)."""
    client = Raw(broker)
    try:
        client.handshake()
        client.open_channel(1)
        qos = pframe.marshal(commands.Basic.Qos(prefetch_count=5), 1)
        client.send(qos + qos + raw_frame(8, 1, b""))  # (one segment: read at once)
        answers = [client.read_frame()]
        while not isinstance(answers[-1][1], commands.Connection.Close):
            answers.append(client.read_frame())
        assert [(channel, type(frame)) for channel, frame in answers] == [
            (1, commands.Basic.QosOk), (1, commands.Basic.QosOk), (0, commands.Connection.Close)]
        assert answers[-1][1].reply_code == 505
    finally:
        client.close()


def test_heartbeat_frames_on_channel_zero_are_accepted(broker):
    client = Raw(broker)
    try:
        client.handshake()
        client.send(raw_frame(8, 0, b"") * 3)
        client.open_channel(1)
    finally:
        client.close()


# -- channels -----------------------------------------------------------------------------------------------


def test_method_on_unopened_channel_is_channel_error(broker):
    close = connection_error(broker, pframe.marshal(commands.Queue.Declare(queue="x", passive=True), 7))
    assert close.reply_code == 504
    assert close.reply_text == "CHANNEL_ERROR - expected 'channel.open'"
    assert_serves(broker)


def test_second_channel_open_is_channel_error(broker):
    close = connection_error(broker, pframe.marshal(commands.Channel.Open(), 1))
    assert close.reply_code == 504
    assert close.reply_text == "CHANNEL_ERROR - second 'channel.open' seen"
    assert (close.class_id, close.method_id) == (20, 10)
    assert_serves(broker)


@pytest.mark.parametrize("frame", [pframe.marshal(commands.Queue.Declare(queue="x", passive=True), 2),
                                   raw_frame(3, 2, b"stray")], ids=["method", "body"])
@pytest.mark.parametrize("awaiting_close_ok", [False, True], ids=["channel open", "channel awaiting close-ok"])
def test_the_first_frame_on_a_channel_past_channel_max_is_not_allowed(broker, uid, frame, awaiting_close_ok):
    """rabbit_reader:process_frame calls create_channel for the first frame on any channel number that has no
    channel, whatever the frame: at the negotiated channel_max, which counts a channel awaiting the close-ok of the
    node's channel.close, that frame is 530, before the channel could say "expected 'channel.open'" (504) or
    "expected method frame" (505)."""
    client = Raw(broker)
    try:
        client.handshake(channel_max=1)
        client.open_channel(1)
        if awaiting_close_ok:
            client.send_method(1, commands.Queue.Declare(queue=f"missing-{uid}", passive=True))
            client.expect(commands.Channel.Close)
        client.send(frame)
        close = client.expect_connection_close()
    finally:
        client.close()
    assert (close.reply_code, close.reply_text, close.class_id, close.method_id) == (
        530, "NOT_ALLOWED - number of channels opened (1) has reached the negotiated channel_max (1)", 0, 0)


def test_channel_error_leaves_connection_and_other_channels_usable(broker, uid):
    client = Raw(broker)
    try:
        client.handshake()
        client.open_channel(1)
        client.open_channel(2)
        client.send_method(1, commands.Queue.Declare(queue=f"missing-{uid}", passive=True))
        channel, close = client.read_frame()
        assert channel == 1 and isinstance(close, commands.Channel.Close)
        assert close.reply_code == 404
        assert close.reply_text == f"NOT_FOUND - no queue 'missing-{uid}' in vhost '/'"
        assert (close.class_id, close.method_id) == (50, 10)
        # frames on the closing channel are ignored until close-ok
        client.send_method(1, commands.Queue.Declare(queue=uid))
        client.send_method(1, commands.Channel.CloseOk())
        # channel 2 still works
        client.send_method(2, commands.Queue.Declare(queue=uid, auto_delete=True))
        channel, ok = client.read_frame()
        assert channel == 2 and isinstance(ok, commands.Queue.DeclareOk)
        # and channel 1 can be opened again
        client.open_channel(1)
        client.send_method(1, commands.Queue.Delete(queue=uid))
        client.expect(commands.Queue.DeleteOk)
        client.send_method(0, commands.Connection.Close(reply_code=200, reply_text="bye", class_id=0, method_id=0))
        client.expect(commands.Connection.CloseOk)
    finally:
        client.close()


def _raw_publish(channel: int, exchange: bytes, routing_key: bytes, body: bytes) -> bytes:
    args = struct.pack(">HB", 0, len(exchange)) + exchange + struct.pack(">B", len(routing_key)) + routing_key + b"\x00"
    return (raw_frame(1, channel, method_payload(60, 40, args))
            + pframe.marshal(pheader.ContentHeader(0, len(body), commands.Basic.Properties()), channel)
            + pframe.marshal(pbody.ContentBody(body), channel))


@pytest.mark.warren_only("RabbitMQ echoes the invalid bytes into its reply text, which pamqp cannot decode")
def test_publish_with_names_that_are_not_utf8(broker):
    """Names are bytes on the wire: invalid UTF-8 finds no exchange (404) and never breaks the connection."""
    client = Raw(broker)
    try:
        client.handshake()
        client.open_channel(1)
        client.send(_raw_publish(1, b"", b"no-such-\xff-queue", b"x"))  # unroutable, dropped quietly
        client.send(_raw_publish(1, b"amq\xfftopic", b"k", b"x"))
        channel, close = client.read_frame()
        assert channel == 1 and isinstance(close, commands.Channel.Close)
        assert close.reply_code == 404 and close.reply_text.startswith("NOT_FOUND - no exchange 'amq")
        assert (close.class_id, close.method_id) == (60, 40)
        client.send_method(1, commands.Channel.CloseOk())
    finally:
        client.close()
    assert_serves(broker)


# -- content ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("channel, method, code, text", [
    (1, commands.Connection.Open(virtual_host="/"), 503, "COMMAND_INVALID - unimplemented method"),
    (1, commands.Exchange.DeclareOk(), 503, "COMMAND_INVALID - unimplemented method"),
    (1, commands.Channel.CloseOk(), 503, "COMMAND_INVALID - unimplemented method"),
    (1, commands.Channel.FlowOk(active=True), 503, "COMMAND_INVALID - unimplemented method"),
    (0, commands.Queue.Declare(queue="x"), 504, "CHANNEL_ERROR - unexpected method in connection state running"),
    (0, commands.Connection.Open(virtual_host="/"), 504,
     "CHANNEL_ERROR - unexpected method in connection state running"),
    (0, commands.Connection.CloseOk(), 504, "CHANNEL_ERROR - unexpected method in connection state running"),
], ids=lambda value: value.name if hasattr(value, "name") else None)
def test_method_where_it_does_not_belong(broker, channel, method, code, text):
    close = connection_error(broker, pframe.marshal(method, channel))
    assert (close.reply_code, close.reply_text) == (code, text)
    assert (close.class_id, close.method_id) == divmod(method.index, 0x10000)
    assert_serves(broker)


def test_content_header_of_another_class_is_unexpected_frame(broker):
    header = raw_frame(2, 1, struct.pack(">HHQH", 50, 0, 1, 0))
    close = connection_error(broker, pframe.marshal(commands.Basic.Publish(routing_key="q"), 1) + header)
    assert close.reply_code == 505
    assert close.reply_text == "UNEXPECTED_FRAME - expected content header for class 60, got one for class 50 instead"
    assert (close.class_id, close.method_id) == (60, 40)
    assert_serves(broker)


@pytest.mark.parametrize("class_id", [60, 50])
def test_content_header_of_a_weight_other_than_0_is_unexpected_frame(broker, class_id):
    """rabbit_command_assembler:process takes a content header of weight 0 alone (of another class it is "got one for
    class"): any other weight, of any class, is "got non content header frame instead", naming basic.publish."""
    header = struct.pack(">HHQH", class_id, 1, 1, 0)  # weight 1, body size 1, no properties
    close = connection_error(broker, pframe.marshal(commands.Basic.Publish(exchange="", routing_key="nowhere"), 1)
                             + raw_frame(2, 1, header) + raw_frame(3, 1, b"x"))
    assert (close.reply_code, close.reply_text, close.class_id, close.method_id) == (
        505, "UNEXPECTED_FRAME - expected content header for class 60, got non content header frame instead", 60, 40)


def test_body_without_publish_is_unexpected_frame(broker):
    close = connection_error(broker, pframe.marshal(pbody.ContentBody(b"stray"), 1))
    assert close.reply_code == 505
    assert close.reply_text == "UNEXPECTED_FRAME - expected method frame, got non method frame instead"
    assert_serves(broker)


def test_header_without_publish_is_unexpected_frame(broker):
    close = connection_error(broker, pframe.marshal(pheader.ContentHeader(0, 3, commands.Basic.Properties()), 1))
    assert close.reply_code == 505
    assert close.reply_text == "UNEXPECTED_FRAME - expected method frame, got non method frame instead"


def test_body_on_unopened_channel_is_unexpected_frame(broker):
    close = connection_error(broker, pframe.marshal(pbody.ContentBody(b"stray"), 9))
    assert close.reply_code == 505


def test_method_between_publish_and_header_is_unexpected_frame(broker):
    payload = (pframe.marshal(commands.Basic.Publish(exchange="", routing_key="nowhere"), 1)
               + pframe.marshal(commands.Basic.Qos(prefetch_count=1), 1))
    close = connection_error(broker, payload)
    assert close.reply_code == 505
    assert close.reply_text == ("UNEXPECTED_FRAME - expected content header for class 60, "
                                "got non content header frame instead")
    assert (close.class_id, close.method_id) == (60, 40)
    assert_serves(broker)


def test_method_between_header_and_body_is_unexpected_frame(broker):
    payload = (pframe.marshal(commands.Basic.Publish(exchange="", routing_key="nowhere"), 1)
               + pframe.marshal(pheader.ContentHeader(0, 10, commands.Basic.Properties()), 1)
               + pframe.marshal(pbody.ContentBody(b"12345"), 1)
               + pframe.marshal(commands.Basic.Qos(prefetch_count=1), 1))
    close = connection_error(broker, payload)
    assert close.reply_code == 505
    assert close.reply_text == "UNEXPECTED_FRAME - expected content body, got non content body frame instead"
    assert (close.class_id, close.method_id) == (60, 40)


def test_body_longer_than_declared_is_swallowed_until_the_next_method(broker):
    """rabbit_command_assembler never completes such a message: more body frames are taken silently (and,
    here, dropped), the channel answers nothing, and the next method on it is a 505."""
    client = Raw(broker)
    try:
        client.handshake()
        client.open_channel(1)
        client.open_channel(2)
        client.send(publish_frames(1, "", "nowhere", b"0123456789", declared=4)
                    + raw_frame(3, 1, b"more body") * 3)
        client.send_method(2, commands.Basic.Qos(prefetch_count=5))  # the connection still serves
        client.expect(commands.Basic.QosOk)
        client.send_method(1, commands.Basic.Qos(prefetch_count=1))
        close = client.expect_connection_close()
        client.assert_eof()
    finally:
        client.close()
    assert close.reply_code == 505
    assert close.reply_text == "UNEXPECTED_FRAME - expected content body, got non content body frame instead"
    assert_serves(broker)


# -- method arguments ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("class_id, method_id, fields", [
    (50, 10, b"\x00"),                                            # queue.declare cut inside reserved-1
    (50, 10, b"\x00\x00\x20abc"),                                 # shortstr longer than the frame
    (60, 40, b"\x00\x00\x05ab"),                                  # basic.publish, exchange name truncated
    (60, 40, b"\x00\x00"),                                        # basic.publish without its names
    (40, 10, b"\x00\x00\x01x\x01d\x00\x00\x00\x00\xff\xff\xff\xff"),  # exchange.declare, table too long
    (60, 10, b"\x00\x00\x00"),                                    # basic.qos cut inside prefetch-size
    (60, 10, commands.Basic.Qos(prefetch_count=5).marshal() + b"\x00"),  # basic.qos and an octet after it
    (60, 40, commands.Basic.Publish(exchange="", routing_key="q").marshal() + b"\x00\x00"),  # publish, after it
    (60, 80, commands.Basic.Ack(delivery_tag=1).marshal() + b"\x00"),  # basic.ack, an octet after its bits
])
def test_method_fields_that_do_not_fill_their_frame_exactly_are_frame_error(broker, class_id, method_id, fields):
    """The generated rabbit_framing_amqp_0_9_1:decode_method_fields matches each method's fields exactly: fields cut
    short or followed by more octets fall to rabbit_misc:frame_error/2, 501 "cannot decode ~w" (every octet a
    number) naming the method."""
    close = connection_error(broker, raw_frame(1, 1, method_payload(class_id, method_id, fields)))
    assert (close.reply_code, close.reply_text, close.class_id, close.method_id) == (
        501, f"FRAME_ERROR - cannot decode <<{','.join(map(str, fields))}>>", class_id, method_id)
    assert_serves(broker)


def test_method_fields_on_channel_0_that_do_not_fill_their_frame_are_a_bare_internal_error(broker):
    """On channel 0 the same frame_error crashes rabbit_reader's handle_method0, which catches an amqp_error naming no
    method alone (frame_error names its method): respond_and_close answers the crash with a bare 541."""
    fields = commands.Connection.Close(reply_code=200, reply_text="", class_id=0, method_id=0).marshal() + b"\x00"
    close = connection_error(broker, raw_frame(1, 0, method_payload(10, 50, fields)))
    assert (close.reply_code, close.reply_text, close.class_id, close.method_id) == (541, "INTERNAL_ERROR", 0, 0)
    assert_serves(broker)


@pytest.mark.parametrize("class_id,method_id", [(50, 99), (99, 10), (60, 0xFFFF)])
def test_unknown_class_or_method(broker, class_id, method_id):
    client = Raw(broker)
    try:
        client.handshake()
        client.open_channel(1)
        client.send(raw_frame(1, 1, method_payload(class_id, method_id, b"\x00\x00")))
        try:
            close = client.expect_connection_close()
        except Closed:  # RabbitMQ's reader exits on an unknown method id: dropping the socket is acceptable
            close = None
        if close is not None:
            assert close.reply_code in (503, 540)
    finally:
        client.close()
    assert_serves(broker)


def test_client_only_method_on_channel_is_command_invalid(broker):
    close = connection_error(broker, pframe.marshal(commands.Channel.OpenOk(), 1))
    assert close.reply_code in (503, 504, 540)


# -- handshake ----------------------------------------------------------------------------------------------


def test_bad_credentials_are_access_refused(broker):
    client = Raw(broker)
    try:
        client.send(PROTOCOL_HEADER)
        client.expect(commands.Connection.Start)
        client.send_method(0, commands.Connection.StartOk(
            client_properties={"capabilities": {"authentication_failure_close": True}},
            mechanism="PLAIN", response="\x00guest\x00wrong", locale="en_US"))
        close = client.expect_connection_close()
        assert close.reply_code == 403
        assert close.reply_text == ("ACCESS_REFUSED - Login was refused using authentication mechanism PLAIN. "
                                    "For details see the broker logfile.")
        assert (close.class_id, close.method_id) == (0, 0)
        client.assert_eof()
    finally:
        client.close()
    assert_serves(broker)


def test_capabilities_that_are_not_a_table_count_as_none(broker, uid):
    """A client's ``capabilities`` property of another type is no table (RabbitMQ's reader takes it as none): its
    consumer of a queue deleted is not told with basic.cancel (no ``consumer_cancel_notify``), the rest goes on."""
    client = Raw(broker)
    try:
        client.handshake(capabilities="consumer_cancel_notify")
        client.open_channel()
        client.send_method(1, commands.Queue.Declare(queue=uid))
        client.expect(commands.Queue.DeclareOk)
        client.send_method(1, commands.Basic.Consume(queue=uid, consumer_tag="c"))
        client.expect(commands.Basic.ConsumeOk)
        client.send_method(1, commands.Queue.Delete(queue=uid))
        client.expect(commands.Queue.DeleteOk)
        client.send_method(1, commands.Channel.Close(reply_code=200, reply_text="", class_id=0, method_id=0))
        client.expect(commands.Channel.CloseOk)
    finally:
        client.close()
    assert_serves(broker)


@pytest.mark.parametrize("frame_max, channel_max, detail", [
    (1024, None, "frame_max = 1024 is lower than the minimum allowed value (4096)"),
    (0, None, "frame_max = 0 is higher than the maximum allowed value ({frame_max})"),  # 0 = "no limit"
    (None, 0, "channel_max = 0 is higher than the maximum allowed value ({channel_max})"),
])
@pytest.mark.warren_only("Warren's --explain-handshake-errors; by default the socket is dropped, as RabbitMQ does")
def test_tune_ok_outside_the_servers_limits_is_not_allowed(start_broker, frame_max, channel_max, detail):
    broker = start_broker("--explain-handshake-errors", "true")
    client = Raw(broker)
    try:
        client.send(PROTOCOL_HEADER)
        client.expect(commands.Connection.Start)
        client.send_method(0, commands.Connection.StartOk(
            client_properties={"capabilities": {}}, mechanism="PLAIN", response="\x00guest\x00guest",
            locale="en_US"))
        tune = client.expect(commands.Connection.Tune)
        client.send_method(0, commands.Connection.TuneOk(
            channel_max=tune.channel_max if channel_max is None else channel_max,
            frame_max=tune.frame_max if frame_max is None else frame_max, heartbeat=0))
        close = client.expect_connection_close()
        assert close.reply_code == 530
        assert close.reply_text == "NOT_ALLOWED - negotiated " + detail.format(frame_max=tune.frame_max,
                                                                               channel_max=tune.channel_max)
        client.assert_eof()
    finally:
        client.close()
    assert_serves(broker)


@pytest.mark.parametrize("method", [
    commands.Connection.Close(reply_code=200, reply_text="bye", class_id=0, method_id=0),
    commands.Connection.CloseOk(),
    commands.Connection.TuneOk(channel_max=2047, frame_max=131072, heartbeat=0),
    commands.Connection.StartOk(client_properties={}, mechanism="PLAIN", response="\x00guest\x00guest",
                                locale="en_US"),
], ids=["close", "close-ok", "tune-ok", "start-ok"])
def test_a_connection_method_other_than_open_after_tune_ok_is_channel_error(broker, method):
    """After tune-ok rabbit_reader is in state ``opening``, where handle_method0 takes connection.open alone (close
    only once running): any other method is channel_error "unexpected method in connection state opening", and
    handle_exception(opening, ...) answers it with connection.close naming the method (respond_and_close)."""
    client = Raw(broker)
    try:
        client.handshake(open_vhost=False)
        client.send_method(0, method)
        close = client.expect_connection_close()
        client.assert_eof()
    finally:
        client.close()
    assert (close.reply_code, close.reply_text, close.class_id, close.method_id) == (
        504, "CHANNEL_ERROR - unexpected method in connection state opening", *divmod(method.index, 0x10000))


TOLD = {"authentication_failure_close": True}


HANDSHAKE_ERRORS = [  # (mechanism, response, capabilities, case)
    ("FOO", b"\x00guest\x00guest", {}, "unknown mechanism"),
    ("PLAIN", b"\x00guest\x00guest", {}, "frame_max too low"),
    ("PLAIN", b"guest\x00guest\x00guest", TOLD, "PLAIN with an authorisation identity"),
    ("PLAIN", b"\x00guest", TOLD, "PLAIN without a password"),
    ("AMQPLAIN", b"\x05LOGINS\x00\x00\x00\x05guest", TOLD, "AMQPLAIN without a password"),
    ("PLAIN", b"\x00guest\x00wrong", {}, "login refused, the client not asking to be told"),
]


@pytest.mark.parametrize("mechanism, response, capabilities, case", HANDSHAKE_ERRORS,
                         ids=[error[-1] for error in HANDSHAKE_ERRORS])
def test_handshake_errors_drop_the_socket_after_a_delay(broker, mechanism, response, capabilities, case):
    """Before connection.open RabbitMQ trusts no client: no connection.close, the socket goes after 3 s
    (handle_exception's last clause).  A response the mechanism cannot read (rabbit_auth_mechanism_plain's
    extract_elem takes NUL user NUL password alone) is a protocol_error, which it tells no client; a refused login
    only a client with the authentication_failure_close capability (rabbit_reader:auth_fail)."""
    client = Raw(broker, timeout=10)
    try:
        client.send(PROTOCOL_HEADER)
        client.expect(commands.Connection.Start)
        client.send_method(0, commands.Connection.StartOk(
            client_properties={"capabilities": capabilities}, mechanism=mechanism, response=response.decode(),
            locale="en_US"))
        if case == "frame_max too low":
            tune = client.expect(commands.Connection.Tune)
            client.send_method(0, commands.Connection.TuneOk(channel_max=tune.channel_max, frame_max=100,
                                                            heartbeat=0))
        started = time.monotonic()
        with pytest.raises(Closed):
            client.read_frame()
        assert 2.5 < time.monotonic() - started < 6
    finally:
        client.close()
    assert_serves(broker)


def test_client_close_gets_close_ok(broker):
    client = Raw(broker)
    try:
        client.handshake()
        client.send_method(0, commands.Connection.Close(reply_code=200, reply_text="bye", class_id=0, method_id=0))
        client.expect(commands.Connection.CloseOk)  # then the client closes the socket (RabbitMQ waits for it)
    finally:
        client.close()


# -- fuzzing ------------------------------------------------------------------------------------------------


def _valid_sequence() -> bytes:
    return (pframe.marshal(commands.Channel.Open(), 1)
            + pframe.marshal(commands.Queue.Declare(queue="", exclusive=True, auto_delete=True), 1)
            + pframe.marshal(commands.Exchange.Declare(exchange="fuzz-x", exchange_type="topic",
                                                       auto_delete=True), 1)
            + publish_frames(1, "amq.topic", "a.b", b"hello fuzz")
            + pframe.marshal(commands.Basic.Qos(prefetch_count=3), 1)
            + pframe.marshal(commands.Basic.Get(queue="", no_ack=True), 1)
            + raw_frame(8, 0, b"")
            + pframe.marshal(commands.Channel.Close(reply_code=200, reply_text="ok", class_id=0, method_id=0), 1))


VALID = _valid_sequence()


@st.composite
def mutated(draw) -> bytes:
    data = bytearray(VALID)
    for _ in range(draw(st.integers(1, 6))):
        op = draw(st.sampled_from(["flip", "insert", "delete", "truncate", "dup"]))
        if not data:
            break
        at = draw(st.integers(0, len(data) - 1))
        if op == "flip":
            data[at] = draw(st.integers(0, 255))
        elif op == "insert":
            data[at:at] = draw(st.binary(min_size=1, max_size=8))
        elif op == "delete":
            del data[at:at + draw(st.integers(1, 8))]
        elif op == "truncate":
            del data[at:]
        else:
            data[at:at] = data[at:at + draw(st.integers(1, 32))]
    return bytes(data)


def _frames(draw_bytes: bytes) -> bytes:
    return draw_bytes


@st.composite
def random_frames(draw) -> bytes:
    out = b""
    for _ in range(draw(st.integers(1, 4))):
        ftype = draw(st.sampled_from([1, 2, 3, 8, draw(st.integers(0, 255))]))
        channel = draw(st.sampled_from([0, 1, 2, draw(st.integers(0, 65535))]))
        if ftype == 1 and draw(st.booleans()):
            payload = struct.pack(">HH", draw(st.sampled_from([10, 20, 40, 50, 60, 85, 90])),
                                  draw(st.sampled_from([10, 11, 20, 30, 40, 50, 70, 80, 90]))) + draw(
                st.binary(max_size=40))
        else:
            payload = draw(st.binary(max_size=40))
        out += raw_frame(ftype, channel, payload, end=draw(st.sampled_from([FRAME_END, FRAME_END, b"\x00"])))
    return out


FUZZ_TIMEOUT = 2.0


def _fuzz_once(broker, data: bytes) -> None:
    client = Raw(broker, timeout=FUZZ_TIMEOUT)
    try:
        client.handshake()
        try:
            client.send(data)
        except OSError:
            return
        deadline = time.monotonic() + FUZZ_TIMEOUT
        client.sock.settimeout(0.15)
        while time.monotonic() < deadline:
            try:
                channel, value = client.read_frame()
            except (socket.timeout, TimeoutError):
                return  # nothing (more) to say: fine
            except (Closed, ConnectionResetError, BrokenPipeError):
                return
            name = type(value).__name__
            if isinstance(value, commands.Connection.Close):
                if value.reply_code == 541:  # only RabbitMQ's own answer to an undecodable content header
                    assert value.reply_text == "INTERNAL_ERROR" and not value.class_id, value
                    return
                assert value.reply_code in (320, 402, 403, 404, 405, 406, 501, 502, 503, 504, 505, 506, 530, 540), \
                    value
                return
            if isinstance(value, commands.Channel.Close):
                assert value.reply_code != 541, value
                continue
            assert name, value
    finally:
        client.close()


@settings(max_examples=200, deadline=None, suppress_health_check=list(HealthCheck), database=None)
@given(st.one_of(mutated(), random_frames(), st.binary(min_size=1, max_size=200)))
def test_fuzz_after_handshake(broker, data):
    _fuzz_once(broker, data)


@pytest.mark.warren_only("reads the node's log")
def test_broker_alive_after_fuzz(broker):
    assert_serves(broker)
    assert broker.running
    assert "internal error" not in broker.log() and "Traceback" not in broker.log(), broker.log()[-3000:]


def test_a_client_that_drops_its_socket_is_logged_as_rabbitmq_logs_it(broker):
    """rabbit_reader logs "client unexpectedly closed TCP connection" for a connection whose client went without
    closing it, and nothing of the kind for one closed as the protocol says: a consumer's lost connection is then
    told apart from one the node closed (a node that closes one says why)."""
    if not isinstance(broker, BrokerProcess):
        pytest.skip("reads the node's log")
    time.sleep(1.1)  # the node logs at most 20 such lines a second (``logs.Throttle``): the tests before this one's
    # refused connections may have used up the second's, and this one's line would be left out (counted)
    before = len(broker.said())  # an earlier connection may have had the same port: only what follows counts
    lines = []
    for close_first in (True, False):
        client = Raw(broker)
        client.handshake()
        name = "{}:{} -> {}:{}".format(*client.sock.getsockname()[:2], *client.sock.getpeername()[:2])
        lines.append(f"closing connection {name}: client unexpectedly closed TCP connection")
        if close_first:
            client.send_method(0, commands.Connection.Close(reply_code=200, reply_text="bye", class_id=0,
                                                            method_id=0))
            client.expect(commands.Connection.CloseOk)
        client.close()
    closed, dropped = lines
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and dropped not in broker.said()[before:]:
        time.sleep(0.05)
    said = broker.said()[before:]
    assert dropped in said, said[-2000:]
    assert closed not in said
