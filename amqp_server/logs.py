"""The node's log: rich on the console, with text from outside quoted and cut before it gets there.

Anything a client, a peer node or an HTTP request supplies (names, paths, reasons) is logged through
:func:`untrusted`: ``%r`` of at most ``MAX_UNTRUSTED`` characters, so a log line can neither be forged with
newlines nor made long.  Rich's highlighter runs regular expressions that are quadratic on a long word (a
64 KiB hex-like node name held the event loop 25-30 s), so :class:`Handler` renders a record carrying
untrusted text, or long text of any kind, without it, and cuts the exception text its tracebacks highlight.
:class:`Throttle` bounds the lines one kind of event (a refused peer) may write per second.
"""
from __future__ import annotations

import logging
import sys
import time
from typing import Any

from rich.console import ConsoleRenderable
from rich.logging import RichHandler

MAX_UNTRUSTED = 200  # characters of untrusted text a log line quotes
MAX_HIGHLIGHTED = 1000  # a longer message is rendered without the highlighter, whatever it holds
MAX_EXCEPTION_TEXT = 500  # characters of an exception's text a traceback shows


class Untrusted(str):
    """Text from outside, quoted and cut by :func:`untrusted`: a record carrying one is not highlighted."""

    __slots__ = ()


def untrusted(value: Any) -> Untrusted:
    """``value`` (text, bytes or anything else, as its ``str``) quoted as ``%r`` would, at most
    ``MAX_UNTRUSTED`` characters of it, saying how long it was when cut."""
    if not isinstance(value, (str, bytes, bytearray, memoryview)):
        value = str(value)
    head = value[:MAX_UNTRUSTED]
    if isinstance(head, (bytearray, memoryview)):
        head = bytes(head)
    quoted = repr(head)
    size = len(value)
    if size > MAX_UNTRUSTED or len(quoted) > MAX_UNTRUSTED + 3:
        unit = "characters" if isinstance(value, str) else "bytes"
        quoted = f"{quoted[:MAX_UNTRUSTED]}… ({size} {unit})"
    return Untrusted(quoted)


def _carries_untrusted(record: logging.LogRecord) -> bool:
    args = record.args
    if isinstance(args, dict):
        args = tuple(args.values())
    return isinstance(record.msg, Untrusted) or any(isinstance(arg, Untrusted) for arg in args or ())


def _cut(exc: BaseException, seen: set[int] | None = None) -> BaseException:
    """``exc``, or a stand-in of the same name whose text (and its causes') is cut to ``MAX_EXCEPTION_TEXT``."""
    seen = seen if seen is not None else set()
    seen.add(id(exc))
    cause, context = exc.__cause__, exc.__context__
    new_cause = _cut(cause, seen) if cause is not None and id(cause) not in seen else cause
    new_context = _cut(context, seen) if context is not None and id(context) not in seen else context
    try:
        text = str(exc)
    except Exception:  # noqa: BLE001 - a broken __str__ must not lose the record
        text = f"<{type(exc).__name__}: unprintable>"
    if len(text) <= MAX_EXCEPTION_TEXT and new_cause is cause and new_context is context:
        return exc
    stand_in = type(type(exc).__name__, (Exception,), {"__module__": type(exc).__module__})(
        text if len(text) <= MAX_EXCEPTION_TEXT else f"{text[:MAX_EXCEPTION_TEXT]}… ({len(text)} characters)")
    stand_in.__cause__, stand_in.__context__ = new_cause, new_context
    stand_in.__suppress_context__ = exc.__suppress_context__
    return stand_in.with_traceback(exc.__traceback__)


class Handler(RichHandler):
    """Rich's console handler, highlighting only short messages of the node's own text."""

    def emit(self, record: logging.LogRecord) -> None:
        if record.exc_info and record.exc_info[1] is not None:
            exc = record.exc_info[1]
            record.exc_info = (type(exc), _cut(exc), exc.__traceback__)
        try:
            super().emit(record)
        except Exception:  # noqa: BLE001 - rendering failed (out of descriptors: a traceback opens sources)
            _plain(record)

    def render_message(self, record: logging.LogRecord, message: str) -> ConsoleRenderable:
        if len(message) > MAX_HIGHLIGHTED or _carries_untrusted(record):
            record.highlighter = None
        return super().render_message(record, message)


def _plain(record: logging.LogRecord) -> None:
    """A record as one plain line, its exception as its type and text: what logging falls back to, which may
    not raise (a log call must never take the node down)."""
    try:
        line = f"{record.levelname} {record.name}: {record.getMessage()}"
        if record.exc_info and record.exc_info[1] is not None:
            line += f" ({type(record.exc_info[1]).__name__}: {record.exc_info[1]})"
        sys.stderr.write(line[:MAX_EXCEPTION_TEXT] + "\n")
    except Exception:  # noqa: BLE001, S110 - nowhere left to say it
        pass


def setup(level: str) -> None:
    """The node's logging: every record through :class:`Handler` on stderr."""
    logging.basicConfig(level=level.upper(), format="%(message)s", datefmt="[%X]",
                        handlers=[Handler(rich_tracebacks=True, show_path=False)], force=True)


class Throttle:
    """At most ``burst`` lines a ``interval`` for one kind of event; those left out are counted, and the
    count is logged with the next line let through."""

    def __init__(self, logger: logging.Logger, burst: int = 20, interval: float = 1.0) -> None:
        self.logger = logger
        self.burst = burst
        self.interval = interval
        self._window = 0.0
        self._lines = 0
        self._dropped = 0

    def warning(self, msg: str, *args: Any) -> None:
        now = time.monotonic()
        if now - self._window >= self.interval:
            self._window, self._lines = now, 0
        if self._lines >= self.burst:
            self._dropped += 1
            return
        self._lines += 1
        if self._dropped:
            msg = f"{msg} (and {self._dropped} more like it not logged)"
            self._dropped = 0
        self.logger.warning(msg, *args)
