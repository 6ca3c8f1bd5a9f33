"""Policies and operator policies (RabbitMQ's rabbit_policy / rabbit_policies).

A policy sets optional arguments on every queue or exchange whose name its
pattern matches, without redeclaring anything.  Per object only one user
policy and one operator policy apply: the matching one with the highest
priority (RabbitMQ leaves ties to its table order, which looks arbitrary; here
the name that sorts first wins).  The two are merged into the effective
definition; where both set a numeric limit the lower value wins.
That definition then meets the object's own x-arguments as RabbitMQ's classic
queue resolves them: expires, message-ttl, max-length, max-length-bytes and consumer-timeout take
the lower of argument and policy; dead-letter-exchange, dead-letter-routing-key,
overflow and alternate-exchange take the argument when it is set.

Policies are durable (one definition-store record each) and are applied again
to the vhost's queues and exchanges whenever one is set or cleared.  In cluster
mode a listener makes every change the cluster's, as for users and vhosts.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Iterable, Mapping, Protocol

from ..framing import field_types
from .. import patterns
from . import queue_args
from ..access_control import DefinitionListener, vhost_key
from ..definition_store import DefinitionStore
from .queue_args import DEAD_LETTER_STRATEGIES, OVERFLOW_MODES, QueueArgs
from .queue_type import QueueType

if TYPE_CHECKING:
    from exchanges import Exchange

POLICY = "policy"
OPERATOR_POLICY = "operator_policy"
APPLY_TO = ("all", "queues", "exchanges", "classic_queues", "quorum_queues", "streams")
# Which keys apply to a queue, and how they meet its own arguments, its type says (QueueType.policy_lower_wins,
# policy_argument_wins): a key a type does not list it refuses as an argument and ignores here.  A policy with a key
# of the type's unsupported_policies does not apply to its queues at all (rabbit_policy:is_applicable/2).
OPERATOR_KEYS = frozenset({"expires", "message-ttl", "max-length", "max-length-bytes", "max-in-memory-length",
                           "max-in-memory-bytes", "delivery-limit"})
# Keys RabbitMQ 3.10 accepts that change nothing in Warren (mirroring, classic queue placement, quorum settings):
# accepted, and their values checked as RabbitMQ checks them, so that definitions exported from RabbitMQ import
# unchanged.  A plugin's keys that Warren does not serve are refused, as RabbitMQ refuses them without the plugin.
MIRRORING_KEYS = ("ha-mode", "ha-params", "ha-sync-mode", "ha-sync-batch-size", "ha-promote-on-shutdown",
                  "ha-promote-on-failure")  # rabbit_mirror_queue_misc's, checked together (_mirroring)
WITHOUT_EFFECT = frozenset({"queue-mode", "queue-version", "initial-cluster-size", "max-in-memory-length",
                            "max-in-memory-bytes", "queue-master-locator", *MIRRORING_KEYS})
LEADER_LOCATORS = ("client-local", "random", "least-leaders", "balanced")
MASTER_LOCATORS = ("min-masters", "client-local", "random")  # rabbit_queue_location_validator's
HA_MODES = ("all", "exactly", "nodes")
HA_SYNC_MODES = ("manual", "automatic")
HA_PROMOTE = ("always", "when-synced")


class Governed(Protocol):
    """A queue as policies see it: its declared arguments, the policies applied, and its effective arguments."""

    type: QueueType
    name: str
    vhost: str
    arguments: dict[str, Any]
    args: QueueArgs
    policy: Policy | None
    operator_policy: Policy | None

    def set_args(self, args: QueueArgs) -> None: ...


class Resources(Protocol):
    """A vhost as policies see it: the queues and exchanges they apply to."""

    name: str
    exchanges: dict[str, Exchange]

    @property
    def queues(self) -> Mapping[str, Governed]: ...


class PolicyError(ValueError):
    """A policy RabbitMQ would refuse; the text is its validation message."""


def _erl(value: Any) -> str:
    """A JSON value as Erlang's ~p prints the decoded term (RabbitMQ's validation messages quote it so)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return '<<"' + value.replace('"', '\\"') + '">>'
    if isinstance(value, list):
        return "[" + ",".join(_erl(v) for v in value) + "]"
    if isinstance(value, dict):
        return "#{" + ",".join(f"{_erl(k)} => {_erl(v)}" for k, v in value.items()) + "}"
    if value is None:
        return "null"
    return str(value)


erlang_term = _erl  # (the shovel's validation prints values so too)


def _integer(minimum: int, what: str, maximum: int = field_types.LONG_MAX):
    def check(value: Any) -> str | None:
        ok = isinstance(value, int) and not isinstance(value, bool) and minimum <= value <= maximum
        return None if ok else f"{_erl(value)} is not a valid {what}"
    return check


def _string(what: str):
    """A name or routing key: a string that fits an AMQP short string."""
    def check(value: Any) -> str | None:
        ok = isinstance(value, str) and len(value.encode()) <= 255
        return None if ok else f"{_erl(value)} is not a valid {what}"
    return check


def _pattern(value: Any) -> str | None:
    if not isinstance(value, str):
        return f"{_erl(value)} is not a valid federation upstream pattern name"
    try:
        patterns.compile(value)
    except patterns.Error as exc:
        return f"could not compile pattern {value} to a regular expression. Error: {exc}"
    return None


def _one_of(choices: Iterable[Any], what: str):
    """One of ``choices``, of their type (Erlang's true is not 1)."""
    choices = tuple(choices)
    return lambda value: None if any(type(value) is type(choice) and value == choice for choice in choices) \
        else f"{_erl(value)} is not a valid {what}"


def _master_locator(value: Any) -> str | None:
    """rabbit_queue_location_validator:validate_strategy/1."""
    return None if isinstance(value, str) and value in MASTER_LOCATORS \
        else f"{_erl(value)} invalid queue-master-locator value"


def _mirroring(definition: dict[str, Any]) -> str | None:
    """The ha-* keys, together as rabbit_mirror_queue_misc:validate_policy/1 checks them: ha-mode first (none of
    the others without it), then ha-params as the mode's module takes them (rabbit_mirror_queue_mode_all, _exactly,
    _nodes), ha-sync-mode, ha-sync-batch-size, ha-promote-on-shutdown, ha-promote-on-failure.  A key that is not
    there prints as Erlang's ``none``.  (A mode that is no string RabbitMQ crashes on, 500: here it is invalid.)"""
    if not any(key in definition for key in MIRRORING_KEYS):
        return None
    if "ha-mode" not in definition:
        return "ha-mode must be specified to specify ha-params, ha-sync-mode or ha-promote-on-shutdown"
    mode = definition["ha-mode"]
    if not (isinstance(mode, str) and mode in HA_MODES):
        return f"{_erl(mode)} is not a valid ha-mode value"
    given = {key: _erl(definition[key]) if key in definition else "none" for key in MIRRORING_KEYS}
    params = definition.get("ha-params")
    if mode == "all" and "ha-params" in definition:
        return 'ha-mode="all" does not take parameters'
    if mode == "exactly" and not (isinstance(params, int) and not isinstance(params, bool) and params > 0):
        return f'ha-mode="exactly" takes an integer, {given["ha-params"]} given'
    if mode == "nodes":
        if not isinstance(params, list):
            return f'ha-mode="nodes" takes a list, {given["ha-params"]} given'
        if not params:
            return 'ha-mode="nodes" list must be non-empty'
        invalid = [node for node in params if not isinstance(node, str)]
        if invalid:
            return f'ha-mode="nodes" takes a list of strings, {_erl(invalid)} was not a string'
    if definition.get("ha-sync-mode", "manual") not in HA_SYNC_MODES:
        return f'ha-sync-mode must be "manual" or "automatic", got {given["ha-sync-mode"]}'
    size = definition.get("ha-sync-batch-size", 1)
    if not (isinstance(size, int) and not isinstance(size, bool) and size > 0):
        return f'ha-sync-batch-size takes an integer greater than 0, {given["ha-sync-batch-size"]} given'
    for key in ("ha-promote-on-shutdown", "ha-promote-on-failure"):
        if definition.get(key, "always") not in HA_PROMOTE:
            return f'{key} must be "always" or "when-synced", got {given[key]}'
    return None


VALIDATORS = {
    "alternate-exchange": _string("alternate exchange name"),
    "dead-letter-exchange": _string("dead letter exchange name"),
    "dead-letter-routing-key": _string("dead letter routing key"),
    "message-ttl": _integer(0, "message TTL"),
    "expires": _integer(1, "queue expiry"),
    "max-length": _integer(0, "maximum length"),
    "max-length-bytes": _integer(0, "maximum length in bytes"),
    "overflow": _one_of(OVERFLOW_MODES, "overflow value"),
    "queue-leader-locator": _one_of(LEADER_LOCATORS, "queue leader locator value"),
    "queue-master-locator": _master_locator,
    "queue-mode": _one_of(("default", "lazy"), "queue-mode value"),
    "queue-version": _one_of((1, 2), "queue-version value"),
    "initial-cluster-size": _integer(0, "cluster size"),
    "delivery-limit": _integer(0, "delivery limit"),
    "dead-letter-strategy": _one_of(DEAD_LETTER_STRATEGIES, "dead letter strategy"),
    "max-in-memory-length": _integer(0, "maximum memory in bytes"),
    "max-in-memory-bytes": _integer(0, "maximum memory in bytes"),
    "consumer-timeout": _integer(0, "consumer timeout"),
    "max-age": lambda value: None if isinstance(value, str) and queue_args.interval_ms(value)
    else f"{_erl(value)} is not a valid max age",
    "stream-max-segment-size-bytes": _integer(0, "segment size",
                                              queue_args.MAX_SEGMENT_BYTES),
    # exchange and queue federation (rabbit_federation_parameters:validate_policy); one of them at most
    "federation-upstream": _string("federation upstream name"),
    "federation-upstream-set": _string("federation upstream set name"),
    "federation-upstream-pattern": _pattern,
}
FEDERATION_KEYS = ("federation-upstream", "federation-upstream-set", "federation-upstream-pattern")


@dataclass(frozen=True)
class Policy:
    vhost: str
    name: str
    pattern: str
    definition: dict[str, Any]
    priority: int = 0
    apply_to: str = "all"
    _regex: patterns.Pattern = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "_regex", patterns.compile(self.pattern))

    def matches(self, kind: str, name: str, queue_type: QueueType | None = None) -> bool:
        """``kind`` is queue (of ``queue_type``) or exchange, as rabbit_policy:matches/2: its apply-to, then for a
        queue whether its type supports every key (``QueueType.is_policy_applicable``), then the pattern, searched
        anywhere in the name as re:run does."""
        if kind == "queue":
            applies = self.apply_to in ("all", "queues", queue_type.apply_to if queue_type is not None else None) \
                and (queue_type is None or queue_type.is_policy_applicable(self.definition))
        else:
            applies = self.apply_to in ("all", "exchanges")
        return applies and patterns.search(self._regex, name)

    def to_json(self) -> dict[str, Any]:
        return {"vhost": self.vhost, "name": self.name, "pattern": self.pattern, "apply-to": self.apply_to,
                "definition": dict(self.definition), "priority": self.priority}

    @classmethod
    def from_json(cls, record: dict[str, Any]) -> "Policy":
        """A policy as :meth:`to_json` stored it (already validated)."""
        return cls(record["vhost"], record["name"], record["pattern"], record["definition"], record["priority"],
                   record["apply-to"])


def parse(vhost: str, name: str, body: dict[str, Any], operator: bool = False) -> Policy:
    """A policy from its JSON (``pattern``, ``definition``, ``priority``, ``apply-to``), validated as RabbitMQ does."""
    for key in ("pattern", "definition"):
        if key not in body:
            raise PolicyError(f"[{{key_missing,{key}}}]")
    pattern, definition = body["pattern"], body["definition"]
    priority, apply_to = body.get("priority", 0), body.get("apply-to", "all")
    if isinstance(priority, str):
        try:
            priority = int(priority)
        except ValueError:
            pass
    if isinstance(priority, bool) or not isinstance(priority, (int, float)):
        raise _failed(f"priority should be a number, actually was {_erl(priority)}")
    if not isinstance(pattern, str):
        raise _failed(f"pattern should be a string, actually was {_erl(pattern)}")
    try:
        patterns.compile(pattern)
    except patterns.Error as exc:
        raise _failed(f"pattern should be regular expression but is invalid: {exc}") from None
    if apply_to not in APPLY_TO:
        raise _failed(f"apply-to '{apply_to}' unrecognised; should be one of: 'queues', 'classic_queues', "
                      " 'quorum_queues', 'streams', 'exchanges', or 'all'")
    if not isinstance(definition, dict):
        raise _failed(f"definition must be a dictionary: {_erl(definition)}")
    if not definition:
        raise _failed("no policy provided")
    allowed = OPERATOR_KEYS if operator else VALIDATORS.keys() | WITHOUT_EFFECT
    unknown = [(key, value) for key, value in definition.items() if key not in allowed]
    if unknown:
        terms = ",".join(f"{{{_erl(key)},{_erl(value)}}}" for key, value in unknown)
        raise _failed(f"[{terms}] are not recognised policy settings")
    for key, value in definition.items():
        check = VALIDATORS.get(key)
        problem = check(value) if check is not None else None
        if problem:
            raise _failed(problem)
    problem = _mirroring(definition)
    if problem:
        raise _failed(problem)
    if sum(key in definition for key in FEDERATION_KEYS) > 1:
        raise _failed("cannot specify federation-upstream, federation-upstream-set or federation-upstream-pattern "
                      "together")
    return Policy(vhost, name, pattern, dict(definition), int(priority), apply_to)


def unserved_keys(definition: Any, operator: bool = False) -> list[str]:
    """The keys of a policy's definition that Warren refuses (a definitions import drops them, and says so)."""
    allowed = OPERATOR_KEYS if operator else VALIDATORS.keys() | WITHOUT_EFFECT
    return [key for key in definition if key not in allowed] if isinstance(definition, dict) else []


def _failed(reason: str) -> PolicyError:
    return PolicyError(f"Validation failed\n\n{reason}\n")


def effective_definition(policy: Policy | None, operator: Policy | None) -> dict[str, Any]:
    """The user policy's definition merged with the operator policy's: the lower value of a limit both set."""
    merged = dict(policy.definition) if policy is not None else {}
    if operator is not None:
        for key, value in operator.definition.items():
            merged[key] = min(merged[key], value) if key in merged and key in OPERATOR_KEYS else value
    return merged


def effective_queue_args(queue: Governed, definition: dict[str, Any]) -> QueueArgs:
    """The queue's x-arguments resolved against an effective policy definition, key by key as RabbitMQ does."""
    merged = dict(queue.arguments)  # every argument, so what policies cannot set parses as declared
    kind = queue.type
    for key in kind.policy_lower_wins:
        value = definition.get(key)
        if value is not None:
            name = f"x-{key}"
            merged[name] = min(merged[name], value) if isinstance(merged.get(name), int) else value
    for key in kind.policy_argument_wins:
        if key in definition:
            merged.setdefault(f"x-{key}", definition[key])
    if "x-dead-letter-exchange" not in merged:
        merged.pop("x-dead-letter-routing-key", None)  # a routing key alone has no effect
    return kind.parse(merged, queue.name, queue.vhost)


def alternate_exchange(exchange: "Exchange", definition: dict[str, Any]) -> str | None:
    """The exchange's alternate-exchange argument, else its policy's (rabbit_policy:get_arg)."""
    value = exchange.arguments.get("alternate-exchange")
    return value if value is not None else definition.get("alternate-exchange")


class Policies:
    """Every vhost's user and operator policies: kept in the definition store, matched in memory."""

    def __init__(self, store: DefinitionStore) -> None:
        self.store = store
        self.listener: DefinitionListener | None = None
        self._policies: dict[tuple[str, str], dict[str, Policy]] = {}  # (kind, vhost) -> name -> policy
        for kind in (POLICY, OPERATOR_POLICY):
            for _, record in store.items(kind):
                policy = Policy.from_json(record)
                self._policies.setdefault((kind, policy.vhost), {})[policy.name] = policy

    def list(self, kind: str, vhost: str | None = None) -> list[Policy]:
        """Sorted by vhost and name."""
        found = [p for (k, v), named in self._policies.items() if k == kind and vhost in (None, v)
                 for p in named.values()]
        return sorted(found, key=lambda p: (p.vhost, p.name))

    def get(self, kind: str, vhost: str, name: str) -> Policy | None:
        return self._policies.get((kind, vhost), {}).get(name)

    def put(self, kind: str, policy: Policy, vhost: "Resources") -> None:
        """Set (create or replace) a policy of ``vhost``; it applies to its queues and exchanges at once."""
        key, record = _record_key(policy.vhost, policy.name), policy.to_json()
        self.store.put(kind, key, record)  # first: a write that fails leaves nothing behind
        self._policies.setdefault((kind, policy.vhost), {})[policy.name] = policy
        if self.listener is not None:
            self.listener.defined(kind, key, record)
        self.apply_to_vhost(vhost)

    def delete(self, kind: str, vhost: "Resources", name: str) -> bool:
        """Clear a policy; what it set falls back to the next matching policy or the arguments."""
        named = self._policies.get((kind, vhost.name), {})
        if named.pop(name, None) is None:
            return False
        self._forget(kind, vhost.name, name)
        self.apply_to_vhost(vhost)
        return True

    def drop_vhost(self, vhost: str) -> None:
        """The vhost is deleted: its policies go with it."""
        for kind in (POLICY, OPERATOR_POLICY):
            for name in list(self._policies.pop((kind, vhost), {})):
                self._forget(kind, vhost, name)

    def _forget(self, kind: str, vhost: str, name: str) -> None:
        key = _record_key(vhost, name)
        self.store.delete(kind, key)
        if self.listener is not None:
            self.listener.undefined(kind, key)

    def match(self, kind: str, vhost: str, resource: str, name: str,
              queue_type: QueueType | None = None) -> Policy | None:
        """The one policy of ``kind`` that applies to a queue (of ``queue_type``) or an exchange: highest
        priority, then first name."""
        named = self._policies.get((kind, vhost))
        if not named:
            return None
        best: Policy | None = None
        for policy in named.values():
            if policy.matches(resource, name, queue_type) and (
                    best is None or (-policy.priority, policy.name) < (-best.priority, best.name)):
                best = policy
        return best

    # -- applying ------------------------------------------------------------------------------

    def apply_to_queue(self, queue: Governed) -> None:
        """Resolve the queue's effective arguments if the policies that match it changed."""
        kind = queue.type
        policy = self.match(POLICY, queue.vhost, "queue", queue.name, kind)
        operator = self.match(OPERATOR_POLICY, queue.vhost, "queue", queue.name, kind)
        if policy == queue.policy and operator == queue.operator_policy:
            return
        queue.policy, queue.operator_policy = policy, operator
        queue.set_args(effective_queue_args(queue, effective_definition(policy, operator)))

    def apply_to_exchange(self, vhost: str, exchange: "Exchange") -> None:
        policy = self.match(POLICY, vhost, "exchange", exchange.name)
        operator = self.match(OPERATOR_POLICY, vhost, "exchange", exchange.name)
        if policy == exchange.policy and operator == exchange.operator_policy:
            return
        exchange.policy, exchange.operator_policy = policy, operator
        exchange.alternate = alternate_exchange(exchange, effective_definition(policy, operator))

    def apply_to_vhost(self, vhost: "Resources") -> None:
        """A policy was set or cleared (or the vhost recovered): every queue and exchange is matched again."""
        for queue in list(vhost.queues.values()):
            self.apply_to_queue(queue)
        for exchange in list(vhost.exchanges.values()):
            self.apply_to_exchange(vhost.name, exchange)


def _record_key(vhost: str, name: str) -> str:
    return f"{vhost_key(vhost)}/{name}"
