"""A fuzzer of the stream protocol's frames after login (hypothesis): whatever a logged-in client sends, each
connection gets its answers or a clean close (a close frame, then the socket), other clients are served within
0.5 s meanwhile, and the node stays up."""
# ruff: noqa: F811 (test functions take the fixture `node`, imported from test_stream_protocol)
from __future__ import annotations

import socket
import struct
import time
import uuid

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from test_stream_hostile import Watch
from test_stream_protocol import Raw, frame, node, string  # noqa: F401 (node: the fixture)

pytestmark = [pytest.mark.timeout(600), pytest.mark.warren_only("a fuzzer of Warren's node")]

STREAM = f"fuzz-{uuid.uuid4().hex[:6]}"
KEYS = list(range(0x01, 0x1A)) + [0x7F, 0x8001, 0x8016]


@pytest.fixture(scope="module")
def stream(node) -> str:
    raw = Raw(node)
    assert raw.login() == 1
    assert raw.request(0x0D, string(STREAM) + struct.pack(">i", 0)) == 1
    return STREAM


def i64s() -> st.SearchStrategy[int]:
    return st.sampled_from([0, 1, -1, 2**63 - 1, -2**63, 2**32, 10**15])


@st.composite
def fields(draw: st.DrawFn) -> bytes:
    """A command's body made of the protocol's field types, with lengths that may lie."""
    parts = [struct.pack(">I", draw(st.integers(0, 2**32 - 1)))]  # a correlation id, or whatever comes first
    for _ in range(draw(st.integers(0, 6))):
        kind = draw(st.integers(0, 6))
        if kind == 0:
            parts.append(string(draw(st.sampled_from([STREAM, "", "x" * 255, "x" * 256, "no-such"]))))
        elif kind == 1:
            parts.append(struct.pack(">h", draw(st.sampled_from([-1, 0, 5, 300, 32767]))))
        elif kind == 2:
            parts.append(struct.pack(">q", draw(i64s())))
        elif kind == 3:
            parts.append(struct.pack(">i", draw(st.sampled_from([-1, 0, 1, 3, 2**31 - 1]))))
        elif kind == 4:
            parts.append(bytes([draw(st.integers(0, 255))]))
        elif kind == 5:
            parts.append(struct.pack(">H", draw(st.integers(0, 6))))
        else:
            parts.append(draw(st.binary(max_size=64)))
    return b"".join(parts)


@st.composite
def frames(draw: st.DrawFn) -> bytes:
    key = draw(st.sampled_from(KEYS))
    version = draw(st.sampled_from([1, 1, 1, 2, 0, 9]))
    body = draw(st.one_of(fields(), st.binary(max_size=128)))
    return frame(key, body, version)


CLOSE_WITH_TRAILING_BYTES = frame(0x16, struct.pack(">IH", 1, 0) + string("") + b"\0" * 4)


def answered_or_closed_cleanly(raw: Raw, sent: list[bytes]) -> str:
    """"answered": the metadata request sent after the frames (in the same segment) got its response; "closed": a
    close frame came (then the socket closes, or it stays for the client's answer), never one of INTERNAL_ERROR,
    or the close response to a close request among the frames (then the socket closes)."""
    raw.send(b"".join(sent) + frame(0x0F, struct.pack(">I", 0xFFFFFFFF) + struct.pack(">i", 1) + string(STREAM)))
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        key, rest = raw.receive()
        if key == 0x800F and rest[:4] == b"\xff\xff\xff\xff":
            return "answered"
        if key == 0x16:
            code = struct.unpack_from(">IH", rest)[1]
            assert code != 0x0F, "closed with INTERNAL_ERROR: an error the node did not expect"
            return "closed"
        if key == 0x8016:
            assert any(struct.unpack_from(">H", sent_frame, 4)[0] == 0x16 for sent_frame in sent), \
                "a close response to no close request"
            return "closed"
        if key == -1:
            raise AssertionError("the socket closed without a close frame")
    raise AssertionError("no answer within 10 s")


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                   HealthCheck.function_scoped_fixture])
@given(sent=st.lists(frames(), min_size=1, max_size=8))
@example(sent=[CLOSE_WITH_TRAILING_BYTES])
def test_fuzz_frames_after_login_get_answers_or_a_clean_close(node, stream, sent):
    raw = Raw(node)
    raw.sock.settimeout(10)
    assert raw.login() == 1
    with Watch(node) as watch:
        try:
            outcome = answered_or_closed_cleanly(raw, sent)
        except (ConnectionResetError, BrokenPipeError):
            outcome = "reset"  # (we were still writing when a close frame came and the socket went)
        finally:
            raw.sock.close()
    assert outcome in ("answered", "closed", "reset")
    assert watch.longest < 0.5
    assert "internal error" not in node.log()
    assert node.running
    socket.create_connection(("127.0.0.1", node.stream_port), timeout=2).close()
