"""Checks of runtime parameter values as RabbitMQ's ``rabbit_parameter_validation`` makes them, with its texts:
each check takes a key and its value and says what is wrong (None: nothing); :func:`proplist` checks an object's
keys against a list of them.  Shovels and federation upstreams use them."""
from __future__ import annotations

from typing import Any, Callable

from ..queues.policy import erlang_term
from . import uri as uri_module

Check = Callable[[str, Any], "str | None"]


def binary(key: str, value: Any) -> str | None:
    return None if isinstance(value, str) else f"{key} should be binary, actually was {erlang_term(value)}"


def number(key: str, value: Any) -> str | None:
    ok = isinstance(value, (int, float)) and not isinstance(value, bool)
    return None if ok else f"{key} should be a number, actually was {erlang_term(value)}"


def boolean(key: str, value: Any) -> str | None:
    return None if isinstance(value, bool) else f"{key} should be boolean, actually was {erlang_term(value)}"


def enum(options: tuple[str, ...]) -> Check:
    def check(key: str, value: Any) -> str | None:
        if not isinstance(value, str):
            return binary(key, value)
        if value in options:
            return None
        return f"{key} should be one of [{','.join(options)}], actually was {erlang_term(value)}"
    return check


def prefetch_count(key: str, value: Any) -> str | None:
    """A number (RabbitMQ's check), and one basic.qos can carry."""
    problem = number(key, value)
    if problem is None and not 0 <= value <= 65535:
        return f"{key} should be from 0 to 65535, actually was {erlang_term(value)}"
    return problem


def uri(key: str, value: Any) -> str | None:
    """One AMQP URI or a list of them."""
    values = value if isinstance(value, list) else [value]
    if isinstance(value, list) and not value:
        return f"{key} should be list, actually was []"  # (amqp_uri needs one at least)
    for item in values:
        if not isinstance(item, str):
            return binary(key, item)
        try:
            uri_module.parse(item)
        except uri_module.URIError as exc:
            return f"\"{item}\" not a valid URI: {exc}"
    return None


def terms(items: list[tuple[str, Any]]) -> str:
    return "[" + ",".join(f"{{{erlang_term(k)},{erlang_term(v)}}}" for k, v in items) + "]"


def proplist(name: str, constraints: tuple[tuple[str, Check, bool], ...], value: Any) -> list[str]:
    """``value`` an object whose keys are those of ``constraints`` (key, check, mandatory), each valid."""
    if not isinstance(value, dict):
        return [f"{name} not a list {erlang_term(value)}"]
    known = {key for key, _, _ in constraints}
    unknown = [(k, v) for k, v in value.items() if k not in known]
    errors = [f"Unrecognised terms {terms(unknown)} in {name}"] if unknown else []
    for key, check, mandatory in constraints:
        if key in value:
            problem = check(key, value[key])
            if problem:
                errors.append(problem)
        elif mandatory:
            errors.append(f"Key \"{key}\" not found in {name}")
    return errors
