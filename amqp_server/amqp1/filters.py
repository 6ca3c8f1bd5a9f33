"""A stream consumer's filters, read from its source's filter-set as RabbitMQ 4.2 reads them
(rabbit_amqp_session:parse_filters, rabbit_amqp_filter_prop, rabbit_amqp_filter_sql):

- ``rabbitmq:stream-offset-spec``: where it starts (``x-stream-offset``: first, last, next, an interval, a
  non-negative offset, a timestamp);
- ``rabbitmq:stream-filter`` (a string or a list of them) with ``rabbitmq:stream-match-unfiltered``: a message
  whose ``x-stream-filter-value`` annotation is one of the values, or (match-unfiltered) that has none;
- ``amqp:properties-filter`` and ``amqp:application-properties-filter`` (AMQP Filter Expressions, property
  filter expressions): every field named has the value given, a string value ``&p:x`` any string starting with
  ``x``, ``&s:x`` any ending with it, ``&&x`` the string ``&x``;
- the ``sql-filter`` entry, a SQL filter expression (``sql_filter``), exclusive of property filters.

"The sending endpoint sets the filter actually in place": the filters applied are echoed in the attach's source,
and a filter that is not one (a bad value, an unknown descriptor, an invalid expression, a second one of the same
section, a property filter beside a SQL one) is left out of it and not applied, the link attaching all the same.
As RabbitMQ's ``lists:foldr`` does, the later of two exclusive filters wins.

RabbitMQ reads stream-filter values through a chunk's Bloom filter and may deliver a message whose value is not
asked for; Warren reads each message's value, so delivers exactly those.  A properties filter reads the properties
section an AMQP 1.0 publish had (``amqp10.kept_properties_of``), else those an AMQP 0-9-1 message has
(message-id, user-id, reply-to, correlation-id, content-type, content-encoding); it may name any of the 13
fields.  An application-properties filter, like a SQL filter, reads the application properties an AMQP 1.0
reader gets (``sql_filter.view_of``): a 1.0 publish's whatever their names (``x-`` ones included, as
RabbitMQ 4.2's ``mc:routing_headers(Msg, [])``), a 0-9-1 message's headers but its ``x-`` ones.  Filters on a
queue other than a stream are echoed and not applied, as RabbitMQ 4.2 echoes them.
"""
from __future__ import annotations

import datetime
from typing import TYPE_CHECKING, Any, Callable, NamedTuple

from stream_log import amqp10
from stream_log.amqp10 import Value, kept_properties_of
from . import sql_filter

if TYPE_CHECKING:
    from ..message import Message

STREAM_OFFSET_SPEC = "rabbitmq:stream-offset-spec"
STREAM_FILTER = "rabbitmq:stream-filter"
MATCH_UNFILTERED = "rabbitmq:stream-match-unfiltered"
PROPERTIES_FILTER = ("amqp:properties-filter", 0x173)
APPLICATION_PROPERTIES_FILTER = ("amqp:application-properties-filter", 0x174)
FILTER_VALUE = "x-stream-filter-value"  # the message annotation (a 0-9-1 message's header) stream filters read
MAX_FIELDS = 16  # fields one property filter may name (RabbitMQ's MAX_FILTER_FIELDS)
PROPERTY_FIELDS = ("message-id", "user-id", "to", "subject", "reply-to", "correlation-id", "content-type",
                   "content-encoding", "absolute-expiry-time", "creation-time", "group-id", "group-sequence",
                   "reply-to-group-id")
# the properties an AMQP 0-9-1 message has, and how a properties filter reads each
_091_PROPERTIES: dict[str, Callable[[Any], Any]] = {
    "message-id": lambda props: props.message_id,
    "user-id": lambda props: props.user_id.encode() if props.user_id is not None else None,
    "reply-to": lambda props: props.reply_to,
    "correlation-id": lambda props: props.correlation_id,
    "content-type": lambda props: props.content_type,
    "content-encoding": lambda props: props.content_encoding,
}
_INTEGERS = ("ubyte", "byte", "ushort", "short", "uint", "int", "ulong", "long")

Accepts = Callable[["Message"], bool]


class Filters(NamedTuple):
    arguments: dict[str, Any]  # the consumer's arguments (x-stream-offset)
    accepts: Accepts | None  # the messages it takes; None: all
    applied: list[tuple[Value, Value]] | None  # the filter-set entries in place (echoed); None: the source had none


def read(source: list[Value] | None) -> Filters:
    """The filters of a source (its eighth field, a map of filter names to described values)."""
    return read_set(source[7] if source is not None and len(source) > 7 else None)


def decode(filter_set: bytes) -> Accepts | None:
    """What an encoded filter-set accepts (``Consumer.filter_set``: the filters a consumer's node tells a stream's
    owner, which applies them); None if it is not a filter-set, or one that filters nothing."""
    try:
        value, end = amqp10.value_at(filter_set)
    except (amqp10.Invalid, amqp10.TooLarge):
        return None
    return read_set(value).accepts if end == len(filter_set) else None


def read_set(filter_set: Value | None) -> Filters:
    if filter_set is None or filter_set.kind != "map":
        return Filters({}, None, None)
    arguments: dict[str, Any] = {}
    applied: list[tuple[Value, Value]] = []
    sections: dict[str, Accepts] = {}  # property filters by the section they read
    sql: Accepts | None = None
    values: list[str] | None = None
    match_unfiltered = False
    for key, entry in reversed(filter_set.value):  # (RabbitMQ folds from the right)
        if key.kind != "symbol":
            continue
        if entry.kind != "described" and key.value.startswith("rabbitmq:stream-"):
            entry = Value("described", (key.value, entry))  # (RabbitMQ's amqp_filter_set_bug, permitted)
        descriptor, value = entry.value if entry.kind == "described" else (None, entry)
        if descriptor == STREAM_OFFSET_SPEC:
            offset = _offset(value)
            if offset is None:
                continue
            arguments["x-stream-offset"] = offset
        elif descriptor == STREAM_FILTER:
            found = _filter_values(value)
            if found is None:
                continue
            values = found
        elif descriptor == MATCH_UNFILTERED:
            if value.kind != "bool":
                continue
            match_unfiltered = value.value
        elif key.value == sql_filter.FILTER_NAME:
            expression = sql_filter.read(entry) if sql is None and not sections else None
            if expression is None:
                continue
            sql = expression.accepts
        else:
            parsed = _property_filter(descriptor, value) if sql is None else None
            if parsed is None or parsed[0] in sections:
                continue
            sections[parsed[0]] = parsed[1]
        applied.append((key, entry))
    applied.reverse()
    tests = list(sections.values()) + ([sql] if sql is not None else [])
    if values is not None:
        tests.append(_stream_filter(values, match_unfiltered))
    if not tests:
        return Filters(arguments, None, applied)
    if len(tests) == 1:
        return Filters(arguments, tests[0], applied)
    return Filters(arguments, lambda message: all(test(message) for test in tests), applied)


def _offset(spec: Value) -> Any:
    if spec.kind in ("string", "symbol"):
        return spec.value
    if spec.kind == "timestamp":
        return datetime.datetime.fromtimestamp(spec.value / 1000, datetime.timezone.utc)
    if spec.kind in _INTEGERS and spec.value >= 0:
        return spec.value
    return None  # not an offset RabbitMQ takes: the filter is left out


def _filter_values(value: Value) -> list[str] | None:
    if value.kind == "string":
        return [value.value]
    if value.kind == "list":  # (its strings; RabbitMQ drops the rest)
        return [item.value for item in value.value if item.kind == "string"]
    return None


def _stream_filter(values: list[str], match_unfiltered: bool) -> Accepts:
    wanted = frozenset(values)

    def accepts(message: Message) -> bool:
        kept = message.amqp10
        if kept is None:
            value = message.header_value(FILTER_VALUE)
        else:  # (its annotation only, not an application property of that name: mc_amqp:x_header)
            found = amqp10.kept_annotations(kept).get(FILTER_VALUE)
            value = found.value if found is not None else None
        return match_unfiltered if value is None else value in wanted
    return accepts


def _property_filter(descriptor: Any, value: Value) -> tuple[str, Accepts] | None:
    """(the section it reads, its test) of a property filter; None if it is not one."""
    if value.kind != "map" or not 0 < len(value.value) <= MAX_FIELDS:
        return None
    try:
        if descriptor in PROPERTIES_FILTER:
            return "properties", _properties(value.value)
        if descriptor in APPLICATION_PROPERTIES_FILTER:
            return "application-properties", _application_properties(value.value)
    except ValueError:
        return None
    return None


def _properties(fields: list[tuple[Value, Value]]) -> Accepts:
    checks: list[tuple[int, Callable[[Any], Any] | None, Callable[[Any], bool]]] = []
    for key, expected in fields:
        field = key.value if key.kind == "symbol" else None
        if field not in PROPERTY_FIELDS:
            raise ValueError(f"{field!r} is not a field of properties")
        checks.append((PROPERTY_FIELDS.index(field), _091_PROPERTIES.get(field), _matcher(expected)))

    def accepts(message: Message) -> bool:
        fields = kept_properties_of(message)
        if fields is not None:
            return all(matches(fields[i].value if i < len(fields) else None) for i, _, matches in checks)
        props = message.properties
        return all(read is not None and matches(read(props)) for _, read, matches in checks)
    return accepts


def _application_properties(fields: list[tuple[Value, Value]]) -> Accepts:
    checks: list[tuple[str, Callable[[Any], bool]]] = []
    for key, expected in fields:
        if key.kind != "string":
            raise ValueError("application-properties filter keys must be strings")
        checks.append((key.value, _matcher(expected, null=True)))

    def accepts(message: Message) -> bool:
        view = sql_filter.view_of(message)
        return view is not None and all(key in view.application and matches(view.application[key])
                                        for key, matches in checks)
    return accepts


def _matcher(expected: Value, null: bool = False) -> Callable[[Any], bool]:
    """How a field's value is tested: a string by its ``&p:``/``&s:``/``&&`` form (a binary value by its bytes:
    Erlang's strings and binaries are one type), another value by equality (numbers across their types, a
    boolean only with a boolean, as Erlang's ``==``); ``null`` (where it is one) matches any value present, as
    rabbit_amqp_filter_prop's ``match_simple_type(null, _)``.  A string starting with another ``&`` form, or a
    null where none is taken, is not a value (ValueError)."""
    if expected.kind in ("string", "symbol"):
        text: str = expected.value
        if text.startswith("&") and not text.startswith(("&p:", "&s:", "&&")):
            raise ValueError(f"{text!r} is not a value")
        if text.startswith("&&"):
            text = text[1:]
        affix = text[3:].encode() if text.startswith(("&p:", "&s:")) else None
        if affix is not None:
            test = bytes.startswith if text.startswith("&p:") else bytes.endswith
            return lambda actual: isinstance(actual, (str, bytes)) and test(_bytes(actual), affix)
        wanted_text = text.encode()
        return lambda actual: isinstance(actual, (str, bytes)) and _bytes(actual) == wanted_text
    if expected.kind == "null":
        if not null:
            raise ValueError("null is not a value of properties")
        return lambda actual: True
    wanted = expected.value
    if expected.kind == "binary":
        return lambda actual: isinstance(actual, (str, bytes)) and _bytes(actual) == wanted
    if isinstance(wanted, bool):
        return lambda actual: actual is wanted
    return lambda actual: actual is not None and not isinstance(actual, bool) and actual == wanted


def _bytes(value: str | bytes) -> bytes:
    return value.encode() if isinstance(value, str) else value
