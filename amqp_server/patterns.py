"""Regular expressions someone writes (permissions, topic permissions, policies, the HTTP API's name filters)
matched against names someone else chooses: with the ``regex`` module and a time limit per search, as
RabbitMQ's PCRE runs with a match limit, so that no pattern can hold the event loop (``^(a|a)*$`` against 255
chosen bytes would backtrack for minutes)."""
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
    """The compiled pattern; ``Error`` if it is not a valid one."""
    return regex.compile(pattern, regex.IGNORECASE if ignore_case else 0)


def search(pattern: Pattern, text: str) -> bool:
    """Whether ``pattern`` is found anywhere in ``text`` (as ``re:run``); a search that runs out of time found
    nothing, as one past PCRE's match limit."""
    try:
        return pattern.search(text, timeout=SEARCH_TIMEOUT) is not None
    except TimeoutError:
        log.warning("pattern %s gave up on %s after %.0f ms: no match", untrusted(pattern.pattern), untrusted(text),
                    SEARCH_TIMEOUT * 1000)
        return False
