"""Federation upstreams: the ``federation-upstream`` and ``federation-upstream-set`` runtime parameters, validated
as RabbitMQ's rabbit_federation_parameters validates them, and the upstreams a policy names for an exchange or
a queue (rabbit_federation_upstream:for/1): one upstream (``federation-upstream``), a set
(``federation-upstream-set``; ``all`` is every upstream of the vhost) or the upstreams whose name matches a
pattern (``federation-upstream-pattern``).  A set's element may override the upstream's keys but its URI.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterable

from .. import patterns
from ..links.validation import Check, binary, boolean, enum, number, prefetch_count, proplist, uri
from ..queues.policy import FEDERATION_KEYS, erlang_term

UPSTREAM = "federation-upstream"
UPSTREAM_SET = "federation-upstream-set"
COMPONENTS = (UPSTREAM, UPSTREAM_SET)
DEFAULT_PREFETCH = 1000
DEFAULT_RECONNECT_DELAY = 5


def _whole(low: int, high: int) -> Check:
    """A number (RabbitMQ's check) that is sent as an AMQP integer: a whole one in range."""
    def check(key: str, value: Any) -> str | None:
        problem = number(key, value)
        if problem is None and not (value == int(value) and low <= value <= high):
            return f"{key} should be a whole number from {low} to {high}, actually was {erlang_term(value)}"
        return problem
    return check


SHARED: tuple[tuple[str, Check, bool], ...] = (
    ("exchange", binary, False),
    ("queue", binary, False),
    ("consumer-tag", binary, False),
    ("prefetch-count", prefetch_count, False),
    ("reconnect-delay", number, False),
    ("max-hops", _whole(1, 255), False),
    ("expires", _whole(1, 2**32 - 1), False),
    ("message-ttl", _whole(0, 2**32 - 1), False),
    ("trust-user-id", boolean, False),
    ("ack-mode", enum(("no-ack", "on-publish", "on-confirm")), False),
    ("resource-cleanup-mode", enum(("default", "never")), False),
    ("ha-policy", binary, False),
    ("bind-nowait", boolean, False),
    ("channel-use-mode", enum(("multiple", "single")), False),
)
MAX_SET = 1024  # upstreams in a set (bounded work per reconciliation)


def validate(component: str, name: str, value: Any) -> list[str]:
    """RabbitMQ's validation errors for a ``federation-upstream`` or ``-set`` named ``name`` (none: valid)."""
    if component == UPSTREAM:
        return proplist(name, (("uri", uri, True), *SHARED), value)
    if not isinstance(value, list):
        return [f"{name} not a list {erlang_term(value)}"]
    if len(value) > MAX_SET:
        return [f"{name} should have at most {MAX_SET} upstreams"]
    constraints = (("upstream", binary, True), *SHARED)
    return [error for element in value for error in proplist(name, constraints, element)]


@dataclass(frozen=True)
class Upstream:
    """One upstream as a link uses it (rabbit_federation_upstream's #upstream{}); defaults as RabbitMQ's."""

    name: str
    uris: tuple[str, ...]
    exchange: str | None  # None: the federated exchange's own name
    queue: str | None  # None: the federated queue's own name
    consumer_tag: str
    prefetch: int
    reconnect_delay: float
    max_hops: int
    expires: int | None
    message_ttl: int | None
    trust_user_id: bool
    ack_mode: str
    cleanup: bool  # resource-cleanup-mode: default (delete what the link made when it goes for good) or never
    setter: str  # who set the upstream: the links act on this node as that user

    @classmethod
    def of(cls, name: str, element: dict[str, Any], value: dict[str, Any], setter: str) -> "Upstream":
        def get(key: str, default: Any = None) -> Any:
            return element[key] if key in element else value.get(key, default)

        uris = get("uri")
        expires, ttl = get("expires"), get("message-ttl")
        return cls(name=name, uris=tuple(uris if isinstance(uris, list) else [uris]), exchange=get("exchange"),
                   queue=get("queue"), consumer_tag=get("consumer-tag", f"federation-link-{name}"),
                   prefetch=int(get("prefetch-count", DEFAULT_PREFETCH)),
                   reconnect_delay=get("reconnect-delay", DEFAULT_RECONNECT_DELAY),
                   max_hops=int(get("max-hops", 1)), expires=None if expires is None else int(expires),
                   message_ttl=None if ttl is None else int(ttl), trust_user_id=get("trust-user-id", False),
                   ack_mode=get("ack-mode", "on-confirm"), cleanup=get("resource-cleanup-mode") != "never",
                   setter=setter)


def upstreams(definition: dict[str, Any], records: Iterable[dict[str, Any]]) -> list[Upstream]:
    """The upstreams a policy's ``definition`` names, from the vhost's federation parameter ``records``
    (rabbit_federation_upstream:upstreams/1, from_set_contents/2): an element naming no upstream is left out."""
    found = {(r["component"], r["name"]): r for r in records}
    one, named_set, pattern = (definition.get(key) for key in FEDERATION_KEYS)
    if one is not None:
        elements: list[Any] = [{"upstream": one}]
    elif named_set == "all":
        elements = [{"upstream": name} for component, name in sorted(found) if component == UPSTREAM]
    elif named_set is not None:
        record = found.get((UPSTREAM_SET, named_set))
        elements = record["value"] if record is not None and isinstance(record["value"], list) else []
    elif isinstance(pattern, str):
        regex = patterns.compile(pattern)
        elements = [{"upstream": name} for component, name in sorted(found)
                    if component == UPSTREAM and patterns.search(regex, name)]
    else:
        return []
    result = []
    for element in elements:
        name = element.get("upstream") if isinstance(element, dict) else None
        record = found.get((UPSTREAM, name)) if isinstance(name, str) else None
        if isinstance(name, str) and record is not None and isinstance(record["value"], dict):
            result.append(Upstream.of(name, element, record["value"], record.get("user") or ""))
    return result
