"""The AMQP 1.0 codec of stream records (``stream.amqp10``) under hostile input: every input decodes or is
refused, in time and memory linear in its bytes; counts read from the input are checked before any loop.

Times are this thread's CPU time: the decoder's work, not the pauses a loaded machine adds to it."""
from __future__ import annotations

import gc
import struct
import time
import tracemalloc

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pamqp import commands

from amqp_server.message import Message, make_message
from stream_log import amqp10


def app_properties(value: bytes) -> bytes:
    """An application-properties section {"k": value}, then a data section."""
    pair = b"\xa1\x01k" + value
    return b"\x00\x53\x74\xc1" + bytes([len(pair) + 1, 2]) + pair + b"\x00\x53\x75\xa0\x01x"


def null_array(count: int) -> bytes:
    """array32 of ``count`` elements whose constructor, null, has no data: five bytes say it all."""
    return b"\xf0" + struct.pack(">II", 5, count) + b"\x40"


@pytest.mark.parametrize("count", [20_000_000, 2**32 - 1])
def test_an_array_of_millions_of_nulls_in_a_few_bytes_is_refused_at_once(count):
    record = app_properties(null_array(count))
    started = time.thread_time()
    with pytest.raises(amqp10.TooLarge):
        amqp10.Decoder("s").message(record)
    assert time.thread_time() - started < 0.05


def test_a_count_above_the_bytes_left_is_refused_before_any_loop():
    items = b"\xa1\x01k\x43"
    lying = b"\xd1" + struct.pack(">II", len(items) + 4, 2**32 - 1) + items  # a map32 "of 4 billion" items
    with pytest.raises(amqp10.Invalid):
        amqp10.sections(b"\x00\x53\x74" + lying)
    started = time.thread_time()
    message = amqp10.Decoder("s").message(b"\x00\x53\x74" + lying + b"\x00\x53\x75\xa0\x01x")
    assert time.thread_time() - started < 0.05
    assert message.properties.headers is None  # not AMQP 1.0: delivered as its bytes, as before


def test_values_per_record_are_capped():
    pairs = amqp10.MAX_ITEMS // 2 + 1
    items = b"\xa1\x01k\x43" * pairs
    record = b"\x00\x53\x74\xd1" + struct.pack(">II", len(items) + 4, 2 * pairs) + items + b"\x00\x53\x75\xa0\x01x"
    with pytest.raises(amqp10.TooLarge):
        amqp10.Decoder("s").message(record)


def test_small_arrays_of_nulls_and_an_ordinary_record_still_decode():
    [(_, value, _)] = amqp10.sections(app_properties(null_array(3)))[:1]
    assert [item.kind for item in value.value[0][1].value] == ["null"] * 3
    record = amqp10.from_amqp091(make_message("", "s", commands.Basic.Properties(
        headers={"a": 1, "b": "x"}, message_id="m"), b"body"))
    message = amqp10.Decoder("s").message(record)
    assert message.body == b"body" and message.properties.headers == {"a": 1, "b": "x"}


CODES = sorted({0x00, 0x40, 0x41, 0x42, 0x43, 0x44, 0x45, 0x50, 0x51, 0x52, 0x53, 0x54, 0x55, 0x56, 0x60, 0x61,
                0x70, 0x71, 0x72, 0x73, 0x74, 0x80, 0x81, 0x82, 0x83, 0x84, 0x94, 0x98, 0xA0, 0xA1, 0xA3, 0xB0,
                0xB1, 0xB3, 0xC0, 0xC1, 0xD0, 0xD1, 0xE0, 0xF0})


@st.composite
def hostile_records(draw: st.DrawFn) -> bytes:
    """Sections built of constructors the codec knows, with sizes and counts that may lie (large ones often)."""
    parts = []
    for _ in range(draw(st.integers(1, 12))):
        kind = draw(st.integers(0, 4))
        if kind == 0:
            parts.append(b"\x00\x53" + bytes([draw(st.integers(0x70, 0x78))]))
        elif kind == 1:
            parts.append(bytes([draw(st.sampled_from(CODES))]))
        elif kind == 2:
            parts.append(bytes([draw(st.sampled_from([0xC0, 0xC1, 0xE0]))])
                         + bytes([draw(st.integers(0, 255)), draw(st.integers(0, 255))]))
        elif kind == 3:
            parts.append(bytes([draw(st.sampled_from([0xD0, 0xD1, 0xF0, 0xB0, 0xB1]))]) + struct.pack(
                ">II", draw(st.sampled_from([0, 1, 5, 9, 2**31, 2**32 - 1])),
                draw(st.sampled_from([0, 1, 2, 1000, 2**24, 2**32 - 1]))))
        else:
            parts.append(draw(st.binary(max_size=16)))
    return b"".join(parts)


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.one_of(hostile_records(), st.binary(max_size=200)))
def test_fuzz_every_input_decodes_or_is_refused_in_time_and_memory_linear_in_its_bytes(record):
    gc.disable()  # a collection of the whole process's heap is no cost of this input's
    tracemalloc.start()
    started = time.thread_time()
    try:
        for decode in (amqp10.sections, amqp10.Decoder("s").message, amqp10.Decoder("", native=True).message):
            try:
                decoded = decode(record)
            except (amqp10.Invalid, amqp10.TooLarge):
                continue
            if isinstance(decoded, Message):  # its 0-9-1 header well-formed, its 1.0 views written
                decoded.properties, amqp10.record_parts(decoded, True), amqp10.entry(decoded)
        elapsed = time.thread_time() - started
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
        gc.enable()
    assert elapsed < 0.05 + 20e-6 * len(record)
    assert peak < 200_000 + 400 * len(record)


_V = amqp10.Value
_SCALARS = st.one_of(
    st.just(_V("null", None)), st.booleans().map(lambda b: _V("bool", b)),
    st.integers(0, 255).map(lambda n: _V("ubyte", n)), st.integers(-128, 127).map(lambda n: _V("byte", n)),
    st.integers(0, 2**32 - 1).map(lambda n: _V("uint", n)), st.integers(-2**31, 2**31 - 1).map(lambda n: _V("int", n)),
    st.integers(0, 2**64 - 1).map(lambda n: _V("ulong", n)),
    st.integers(-2**63, 2**63 - 1).map(lambda n: _V("long", n)),
    st.integers(-2**63, 2**63 - 1).map(lambda n: _V("timestamp", n)),
    st.floats(allow_nan=False).map(lambda f: _V("double", f)), st.binary(max_size=300).map(lambda b: _V("binary", b)),
    st.text(max_size=300).map(lambda t: _V("string", t)), st.text(max_size=20).map(lambda t: _V("symbol", t)))
_VALUES = st.recursive(_SCALARS, lambda inner: st.one_of(
    st.lists(inner, max_size=5).map(lambda items: _V("list", items)),
    st.lists(st.tuples(inner, inner), max_size=4).map(lambda pairs: _V("map", pairs)),
    st.lists(st.integers(-2**31, 2**31 - 1), max_size=5).map(lambda ns: _V("array", [_V("int", n) for n in ns])),
    st.tuples(st.one_of(st.text(max_size=10), st.integers(0, 2**64 - 1)), inner).map(
        lambda pair: _V("described", pair))), max_leaves=20)


@settings(max_examples=300, deadline=None)
@given(_VALUES)
def test_any_decoded_value_encodes_back_to_itself(value):
    encoded = amqp10.encode(value)
    assert amqp10.value_at(encoded) == (value, len(encoded))


_KEYS = st.text(min_size=1, max_size=300)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(_KEYS, _VALUES), max_size=6), st.lists(st.tuples(_KEYS, _VALUES), max_size=6))
def test_an_amqp10_publish_of_any_annotations_and_properties_is_kept_and_converted(annotations, application):
    """Whatever a 1.0 publish's message annotations and application properties hold: a well-formed 0-9-1 header
    with its headers sorted, the application properties back byte for byte, from the publish and from a stream."""
    section = (amqp10.described(amqp10.MESSAGE_ANNOTATIONS, amqp10.encode_map([
        (amqp10.symbol(key), amqp10.encode(value)) for key, value in annotations]))
        + amqp10.described(amqp10.APPLICATION_PROPERTIES, amqp10.encode_map([
            (amqp10.utf8(key), amqp10.encode(value)) for key, value in application])))
    bare = section[section.index(b"\x00\x53\x74"):]
    message = amqp10.Decoder("", native=True).message(section + b"\x00\x53\x75\xa0\x01x")
    headers = list((message.properties.headers or {}).keys())
    assert headers == sorted(headers, key=str.encode)
    assert amqp10.record_parts(message, True)[0].endswith(bare)
    read = amqp10.Decoder("s").message(amqp10.entry(message)[4:])
    assert read.header == message.header and amqp10.record_parts(read, True)[0].endswith(bare)


def test_records_of_one_size_with_other_sections_are_each_read_as_themselves():
    """The decoder keeps its last record's bytes before the body: a record of that size whose sections differ
    (another message-id of the same length), or the same one where it lies in a larger buffer, reads as what it
    is."""
    from stream_log.amqp10 import PROPERTIES, described, encode_list, utf8

    def record(message_id: str, body: bytes) -> bytes:
        return (described(PROPERTIES, encode_list([utf8(message_id)]))
                + b"\x00\x53\x75\xa0" + bytes((len(body),)) + body)

    decoder = amqp10.Decoder("s", native=True)
    seen = [decoder.message(record(message_id, body)) for message_id, body in [("a", b"xy"), ("a", b"zw"),
                                                                                ("b", b"zw"), ("b", b"z")]]
    assert [(message.properties.message_id, message.body) for message in seen] == [
        ("a", b"xy"), ("a", b"zw"), ("b", b"zw"), ("b", b"z")]
    buf = bytearray(b"\x40" + record("b", b"uv") + b"\x40")
    message = decoder.message(buf, 1, len(buf) - 1)
    assert (message.properties.message_id, message.body) == ("b", b"uv")
