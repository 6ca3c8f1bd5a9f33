"""Headers exchange: routes on message headers against binding arguments (key ignored).

Semantics of rabbit_exchange_type_headers: `x-match` selects all (default), any,
all-with-x or any-with-x.  "x-match" itself never takes part in matching; other
"x-" arguments do only in the -with-x modes.  A void (None) argument value means
"header present, any value".  "all" with nothing to match matches every message,
"any" with nothing matches none.
"""

from __future__ import annotations

from decimal import Decimal
from typing import Any

from .base import Binding, Exchange

# x-match value -> (match all?, consider "x-" arguments?)
_MODES: dict[str, tuple[bool, bool]] = {
    "all": (True, False),
    "any": (False, False),
    "all-with-x": (True, True),
    "any-with-x": (False, True),
}
_AMQP_TYPE_NAMES: dict[type, str] = {
    bool: "bool", int: "long", float: "double", bytes: "binary",
    dict: "table", list: "array", type(None): "void",
}
_MISSING = object()

# (match all?, ((header name, expected value or None for presence), ...))
_Matcher = tuple[bool, tuple[tuple[str, Any], ...]]


def _parse_x_match(arguments: dict[str, Any]) -> tuple[bool, bool]:
    """Validate x-match like RabbitMQ's validate_binding; ValueError becomes a 406."""
    if "x-match" not in arguments:
        return _MODES["all"]
    value = arguments["x-match"]
    if not isinstance(value, str):
        type_name = _AMQP_TYPE_NAMES.get(type(value), type(value).__name__)
        raise ValueError(f"Invalid x-match field type {type_name} (value {value!r}); "
                         "expected longstr")
    try:
        return _MODES[value]
    except KeyError:
        raise ValueError(f'Invalid x-match field value <<"{value}">>; '
                         "expected all, any, all-with-x, or any-with-x") from None


def _compile(arguments: dict[str, Any]) -> _Matcher:
    match_all, with_x = _parse_x_match(arguments)
    items = tuple((k, v) for k, v in arguments.items()
                  if k != "x-match" and (with_x or not k.startswith("x-")))
    return match_all, items


def _equal(actual: Any, expected: Any) -> bool:
    """rabbit_exchange_type_headers compares the values as Erlang's ``==`` does: a string and a byte array of
    the same bytes are one binary, and 1 is 1.0; but true is not 1, nor a decimal a number (Python finds those
    equal)."""
    return _term(actual) == _term(expected)


def _term(value: Any) -> Any:
    if isinstance(value, str):
        return value.encode()
    if isinstance(value, bytearray):
        return bytes(value)
    if isinstance(value, (bool, Decimal)):
        return type(value), value
    return value


def _matches(match_all: bool, items: tuple[tuple[str, Any], ...],
             headers: dict[str, Any]) -> bool:
    if match_all:
        for key, expected in items:
            actual = headers.get(key, _MISSING)
            if actual is _MISSING or (expected is not None and not _equal(actual, expected)):
                return False
        return True
    for key, expected in items:
        actual = headers.get(key, _MISSING)
        if actual is not _MISSING and (expected is None or _equal(actual, expected)):
            return True
    return False


class HeadersExchange(Exchange):
    """Linear scan over precompiled bindings.  Headers are read at most once per
    message and only if some binding needs them, since decoding them may be lazy."""

    __slots__ = ("_matchers",)

    type_name = "headers"

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._matchers: dict[Binding, _Matcher] = {}

    def route(self, routing_key: str, message: Any) -> set[object]:
        result: set[object] = set()
        headers: dict[str, Any] | None = None
        for binding, (match_all, items) in self._matchers.items():
            destination = binding.destination
            if destination in result:
                continue
            if not items:
                if match_all:
                    result.add(destination)
                continue
            if headers is None:
                headers = message.headers or {}
            if _matches(match_all, items, headers):
                result.add(destination)
        return result

    def _add(self, binding: Binding) -> None:
        self._matchers[binding] = _compile(binding.args_dict())

    def _remove(self, binding: Binding) -> None:
        del self._matchers[binding]
