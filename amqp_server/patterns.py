r"""Regular expressions someone writes (permissions, topic permissions, policies, the HTTP API's name filters)
matched against names someone else chooses: with the ``regex`` module and a time limit per search, as
RabbitMQ's PCRE runs with a match limit, so that no pattern can hold the event loop (``^(a|a)*$`` against 255
chosen bytes would backtrack for minutes).

RabbitMQ 3.10 runs re:run on the name's binary with the pattern's binary and without the ``unicode`` option
(rabbit_policy:matches/2, rabbit_auth_backend_internal's resource and topic checks, the federation's upstream
pattern, the HTTP API's name filter): PCRE then reads both as bytes, each one Latin-1 character, with Latin-1
character tables.  So does this module: pattern and name are their UTF-8 bytes read as Latin-1, so that ``.`` is one
byte, ``é`` in a pattern the two bytes of é, and ``\w``, ``[[:alpha:]]`` and a caseless match are Latin-1's (checked
byte for byte against Erlang's re).  ``\s`` alone differs: Python's also takes the bytes 0x85 and 0xA0."""
from __future__ import annotations

import logging
from functools import lru_cache

import regex

from .logs import untrusted

log = logging.getLogger("warren.patterns")

SEARCH_TIMEOUT = 0.01  # seconds per search: names are at most 255 bytes, a sane pattern takes microseconds
Error = regex.error
Pattern = regex.Pattern


@lru_cache(maxsize=1024)
def compile(pattern: str, ignore_case: bool = False) -> Pattern:
    """The compiled pattern, over its bytes as Erlang's re compiles a binary; ``Error`` if it is not a valid one."""
    return regex.compile(_as_bytes(pattern), regex.IGNORECASE if ignore_case else 0)


def search(pattern: Pattern, text: str) -> bool:
    """Whether ``pattern`` is found anywhere in ``text``'s bytes (as ``re:run``); a search that runs out of time
    found nothing, as one past PCRE's match limit."""
    try:
        return pattern.search(_as_bytes(text), timeout=SEARCH_TIMEOUT) is not None
    except TimeoutError:
        log.warning("pattern %s gave up on %s after %.0f ms: no match", untrusted(_as_text(pattern.pattern)),
                    untrusted(text), SEARCH_TIMEOUT * 1000)
        return False


def _as_bytes(text: str) -> str:
    """``text``'s UTF-8 bytes, one Latin-1 character each (bytes a name decoded with surrogateescape kept are
    its own again)."""
    return text.encode("utf-8", "surrogateescape").decode("latin-1")


def _as_text(latin1: str) -> str:
    return latin1.encode("latin-1").decode("utf-8", "replace")
