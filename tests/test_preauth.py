"""Before login a peer gets almost nothing, and what it says reaches the log quoted and cut.

In-process: the log handler against hostile text, and a hypothesis fuzzer of the cluster link's handshake on
both ends.  Live: a node attacked on its AMQP, HTTP and cluster ports by peers that never log in, which must
keep answering HTTP within a second, grow by less than 32 MiB, and write a line (no traceback) per refusal.
"""
from __future__ import annotations

import io
import logging
import time
from typing import Iterator

import pytest

from amqp_server import logs

pytestmark = pytest.mark.timeout(120)


# -- the log ------------------------------------------------------------------------------------------------


@pytest.fixture
def node_log() -> Iterator[io.StringIO]:
    """The node's logging set up as ``warren-server`` does, its console writing into a buffer."""
    root = logging.getLogger()
    saved = root.handlers[:], root.level
    logs.setup("INFO")
    out = io.StringIO()
    handler = root.handlers[0]
    handler.console.file = out  # type: ignore[attr-defined]
    yield out
    root.handlers[:], root.level = saved


def test_a_hostile_mebibyte_is_logged_in_milliseconds_quoted_and_cut(node_log):
    hostile = "ab12cd34" * 131072 + "\n[12:00:00] INFO forged line"
    log = logging.getLogger("warren.test")
    try:  # rich's first rendering of a line and a traceback (source files read, lexers built): out of the timing
        raise KeyError("warm-up")
    except KeyError:
        log.exception("login refused for %s", logs.untrusted(hostile))
    started = time.perf_counter()
    log.warning("link from %s refused: wrong cluster secret", logs.untrusted(hostile))
    log.warning("bytes: %s", logs.untrusted(hostile.encode()))
    try:
        raise KeyError(hostile)
    except KeyError:
        log.exception("internal error")
    elapsed = time.perf_counter() - started
    text = node_log.getvalue()
    assert elapsed < 0.1, elapsed
    assert "forged line" not in text
    assert "(1048604 characters)" in text and "(1048604 bytes)" in text
    assert len(text) < 20_000


def test_untrusted_quotes_as_repr_and_says_how_long_it_was():
    assert logs.untrusted("a\nb") == "'a\\nb'"
    assert logs.untrusted(b"\x00ab") == "b'\\x00ab'"
    cut = logs.untrusted("é" * 1000)
    assert cut.startswith("'éé") and cut.endswith("… (1000 characters)") and len(cut) < 230
    assert len(logs.untrusted("\x00" * 1000)) < 230  # a repr four times as long as its text is cut too
    assert logs.untrusted(ValueError("x" * 500)).endswith("… (500 characters)")


def test_a_record_with_untrusted_text_is_not_highlighted(node_log):
    handler = logging.getLogger().handlers[0]
    seen = []
    real = handler.highlighter  # type: ignore[attr-defined]
    handler.highlighter = lambda text: seen.append(text.plain) or real(text)  # type: ignore[attr-defined]
    log = logging.getLogger("warren.test")
    log.warning("queue %s declared", logs.untrusted("0x1234"))
    log.warning("node %s up", "warren@host")
    assert seen == ["node warren@host up"]


def test_throttle_logs_a_burst_then_counts_what_it_left_out(node_log):
    throttle = logs.Throttle(logging.getLogger("warren.test"), burst=3, interval=0.2)
    for n in range(10):
        throttle.warning("refused %d", n)
    time.sleep(0.25)
    throttle.warning("refused %d", 10)
    text = node_log.getvalue()
    assert [n for n in range(11) if f"refused {n}" in text] == [0, 1, 2, 10]
    assert "and 7 more like it not logged" in text
