"""The ``/management`` node (RabbitMQ 4.x's rabbit_amqp_management): HTTP over AMQP 1.0, as RabbitMQ's AMQP 1.0
clients declare their topology.  A request is a message on the link pair's incoming link: ``to`` the path,
``subject`` the method, ``message-id``, an amqp-value body; the response goes on the paired outgoing link with
``subject`` the status code, ``correlation-id`` the request's message-id, and an amqp-value body.

Each request goes through the broker operations the AMQP 0-9-1 channel uses, with its permission checks, in
cluster mode as the channel does: a new queue or exchange is agreed on in the cluster before it is declared, a
queue unknown here is looked up, another node's queue is purged there, and a change is answered once the cluster
has it (``Broker.agreed``).  The status codes and texts are RabbitMQ's.
"""
from __future__ import annotations

import base64
import re
import struct
import zlib
from typing import TYPE_CHECKING, Any
from urllib.parse import parse_qs, quote, unquote

from exchanges import Exchange

from .. import errors
from ..errors import AMQPError
from . import frames
from .frames import SessionError
from stream_log import amqp10
from stream_log.amqp10 import NULL, Value, described, encode_list, encode_map, utf8

if TYPE_CHECKING:
    from ..queues.queue import AnyQueue
    from .host import SessionHost

ADDRESS = "/management"
MAX_VALUE_DEPTH = 16


class Refused(Exception):
    """An HTTP status and text, as rabbit_amqp_management throws them."""

    def __init__(self, status: str, text: str) -> None:
        super().__init__(text)
        self.status = status
        self.text = text


def _status_of(exc: AMQPError, method: str | None, path: str) -> str:
    """rabbit_amqp_management's status for a broker operation's error: a declaration's precondition-failed is 409
    (but 400 for a property its queue type refuses, returned rather than raised there), a queue unknown to GET
    404, the vhost's queue limit 403, any other error 400 (purge, delete and bindings catch every
    ``amqp_error``)."""
    if isinstance(exc, errors.QueueLimitReached):
        return "403"
    if method == "PUT" and exc.code == errors.PRECONDITION_FAILED and not isinstance(exc, errors.QueuePropertyRefused):
        return "409"
    if method == "GET" and exc.code == errors.NOT_FOUND and path.startswith("/queues/"):
        return "404"
    return "400"


async def handle(connection: SessionHost, record: bytes) -> bytes | SessionError:
    """The response to one request (a message's bytes), as a message's bytes; or the error its session ends with,
    as RabbitMQ's check_resource_access ends it for an authorization failure rather than answer 403."""
    message_id: Value | None = None
    try:
        found = amqp10.sections(record)
    except (amqp10.Invalid, amqp10.TooLarge) as exc:
        return _response(None, "400", utf8(f"cannot decode request: {exc}"))
    path = method = None
    body: Value = Value("null", None)
    for descriptor, content, _ in found:
        if descriptor == amqp10.PROPERTIES and content.kind == "list":
            fields = content.value + [Value("null", None)] * 5
            message_id = fields[0] if fields[0].kind != "null" else None
            path = fields[2].value if fields[2].kind == "string" else None
            method = fields[3].value if fields[3].kind == "string" else None
        elif descriptor == amqp10.AMQP_VALUE:
            body = content
    if path is None or method is None:
        return _response(message_id, "400", utf8("request without 'to' or 'subject'"))
    try:
        status, answer = await _request(connection, method, path, body)
    except Refused as exc:
        status, answer = exc.status, utf8(exc.text)
    except AMQPError as exc:
        if exc.code == errors.ACCESS_REFUSED:
            return SessionError(frames.UNAUTHORIZED_ACCESS, exc.detail)
        status, answer = _status_of(exc, method, path), utf8(exc.detail)
    return _response(message_id, status, answer)


def _response(message_id: Value | None, status: str, body: bytes) -> bytes:
    correlation = _encode(message_id) if message_id is not None else NULL
    properties = described(amqp10.PROPERTIES, encode_list([NULL, NULL, NULL, utf8(status), NULL, correlation]))
    application = described(amqp10.APPLICATION_PROPERTIES, encode_map([(utf8("http:response"), utf8("1.1"))]))
    return properties + application + described(amqp10.AMQP_VALUE, body)


def _encode(value: Value) -> bytes:
    """A message-id back as it came (string, binary, ulong or uuid)."""
    if value.kind == "string":
        return utf8(value.value)
    if value.kind == "binary":
        return amqp10.binary(value.value)
    if value.kind == "ulong":
        return amqp10.ulong(value.value)
    if value.kind == "uuid":
        return b"\x98" + value.value.bytes
    return NULL


def _segments(path: str) -> tuple[list[str], dict[str, str]]:
    route, _, query = path.partition("?")
    if not route.startswith("/"):
        raise Refused("400", f"failed to normalize URI '{path[:300]}'")
    return route.split("/")[1:], {key: values[0] for key, values in parse_qs(query).items()}


def _name(quoted: str) -> str:
    name = unquote(quoted)
    if "\n" in name or "\r" in name:
        raise Refused("400", f"Bad name '{name}': line feed and carriage return characters not allowed")
    return name


async def _request(connection: SessionHost, method: str, path: str, body: Value) -> tuple[str, bytes]:
    segments, query = _segments(path)
    vhost = connection.vhost
    assert vhost is not None
    broker = connection.broker
    who = connection.principal
    if segments[:1] == ["queues"] and len(segments) == 2:
        name = _name(segments[1])
        if method == "GET":
            await broker.find_queue(vhost, name)
            queue = vhost.queues.get(name)
            if queue is None:
                raise Refused("404", f"queue '{name}' in vhost '{vhost.name}' not found")
            return "200", await _queue_info(connection, queue)
        if method == "PUT":
            return await _declare_queue(connection, name, body)
        if method == "DELETE":
            count = await broker.delete_anywhere(vhost, name, owner=connection, who=who)
            await broker.agreed()
            return "200", encode_map([(utf8("message_count"), amqp10.ulong(count))])
    if segments[:1] == ["queues"] and len(segments) == 3 and segments[2] == "messages" and method == "DELETE":
        name = _name(segments[1])
        try:
            count = await broker.purge_anywhere(vhost, name, connection, who)
        except AMQPError as exc:  # a stream: RabbitMQ's rabbit_queue_type:purge answers {error, not_supported}
            if exc.code != errors.NOT_IMPLEMENTED:
                raise
            raise Refused("400", f"purge not supported by {errors.resource_name('queue', name, vhost.name)}") \
                from None
        return "200", encode_map([(utf8("message_count"), amqp10.ulong(count))])
    if segments[:1] == ["exchanges"] and len(segments) == 2:
        name = _name(segments[1])
        if name == "":
            raise Refused("403", "operation not permitted on the default exchange")
        if method == "PUT":
            return await _declare_exchange(connection, name, body)
        if method == "DELETE":
            if name.startswith("amq."):
                raise Refused("403", f"exchange '{name}' in vhost '{vhost.name}' starts with reserved prefix 'amq.'")
            broker.delete_exchange(vhost, name, False, who)
            await broker.agreed()
            return "204", NULL
    if segments == ["bindings"] and method == "POST":
        _bind(connection, body)
        await broker.agreed()
        return "204", NULL
    if segments[:1] == ["bindings"] and len(segments) == 2 and method == "DELETE":
        _unbind(connection, segments[1])
        await broker.agreed()
        return "204", NULL
    if segments == ["bindings"] and method == "GET":
        return _bindings(connection, query)
    raise Refused("400", f"unsupported request {method} {path[:300]}")


def plain(value: Value, depth: int = 0) -> Any:
    """An AMQP 1.0 value as the Python value the broker's operations take (an AMQP 0-9-1 field's)."""
    if depth > MAX_VALUE_DEPTH:
        raise Refused("400", "arguments nested too deep")
    if value.kind == "map":
        return {str(key.value): plain(item, depth + 1) for key, item in value.value}
    if value.kind in ("list", "array"):
        return [plain(item, depth + 1) for item in value.value]
    if value.kind in ("described", "decimal", "uuid", "char"):
        raise Refused("400", f"unsupported argument of type {value.kind}")
    return value.value


_QUEUE_FIELDS = {"durable": "bool", "exclusive": "bool", "auto_delete": "bool", "arguments": None}
_EXCHANGE_FIELDS = {"durable": "bool", "auto_delete": "bool", "type": "string", "internal": "bool", "arguments": None}
_BINDING_FIELDS = {"source": "string", "destination_queue": "string", "destination_exchange": "string",
                   "binding_key": "string", "arguments": None}


def _fields(value: Value, known: dict[str, str | None], refusal: str) -> dict[str, Value]:
    """A request body's map, each key a string ``known`` names with a value of the kind it says (``None``: any),
    else 400 with the entry as RabbitMQ's decode_queue / decode_exchange / decode_binding refuse it."""
    if value.kind == "null":
        return {}
    if value.kind != "map":
        raise Refused("400", f"{refusal} {term(value)}")
    fields = {}
    for key, item in value.value:
        if key.kind != "string" or key.value not in known or known[key.value] not in (None, item.kind):
            raise Refused("400", f"{refusal} {{{term(key)},{term(item)}}}")
        fields[key.value] = item
    return fields


def _flag(fields: dict[str, Value], name: str, default: bool) -> bool:
    value = fields.get(name)
    return default if value is None else bool(value.value)


def _arguments(fields: dict[str, Value]) -> dict[str, Any]:
    """The ``arguments`` map, each key a string or symbol (else RabbitMQ's args_amqp_to_amqpl refuses it)."""
    value = fields.get("arguments")
    if value is None or value.kind == "null":
        return {}
    if value.kind != "map":
        raise Refused("400", "arguments is not a map")
    for key, item in value.value:
        if key.kind not in ("string", "symbol"):
            raise Refused("400", f"unsupported argument {{{term(key)},{term(item)}}}")
    arguments = plain(value)
    assert isinstance(arguments, dict)
    return arguments


_TAGS = {"string": "utf8"}


def term(value: Value) -> str:
    """A value as Erlang's ``~tp`` shows what amqp10_binary_parser decodes it to, which RabbitMQ's refusals quote
    (on one line: ``~tp`` would wrap a term past 80 columns)."""
    kind, item = value.kind, value.value
    if kind in ("null", "bool"):
        return "null" if item is None else str(bool(item)).lower()
    if kind in ("string", "symbol", "binary", "uuid", "decimal"):
        data = item.encode() if isinstance(item, str) else item.bytes if kind == "uuid" else bytes(item)
        return f"{{{_TAGS.get(kind, kind)},{_binary(data)}}}"
    if kind == "map":
        return "{map,[" + ",".join(f"{{{term(k)},{term(v)}}}" for k, v in item) + "]}"
    if kind == "list":
        return "{list,[" + ",".join(term(v) for v in item) + "]}"
    if kind == "array":
        element = _TAGS.get(item[0].kind, item[0].kind) if item else "null"
        return f"{{array,{element},[" + ",".join(term(v) for v in item) + "]}"
    if kind == "described":
        descriptor, content = item
        tag = f"{{ulong,{descriptor}}}" if isinstance(descriptor, int) else f"{{symbol,{_binary(descriptor.encode())}}}"
        return f"{{described,{tag},{term(content)}}}"
    if kind in ("float", "double"):
        mantissa, _, exponent = repr(float(item)).partition("e")
        mantissa = mantissa if "." in mantissa or not mantissa[-1].isdigit() else mantissa + ".0"
        return f"{{{kind},{mantissa}{'e' + str(int(exponent)) if exponent else ''}}}"
    return f"{{{kind},{ord(item) if isinstance(item, str) else item}}}"


_ESCAPES = {0x22: '\\"', 0x5C: "\\\\", 0x0A: "\\n", 0x0D: "\\r", 0x09: "\\t", 0x0B: "\\v", 0x08: "\\b",
            0x0C: "\\f", 0x1B: "\\e"}


def _binary(data: bytes) -> str:
    """An Erlang binary as ``~tp`` prints it: text when it is printable UTF-8, else its bytes."""
    try:
        text = data.decode()
    except UnicodeDecodeError:
        text = None
    if text is None or not all(ch.isprintable() or ord(ch) in _ESCAPES for ch in text):
        return "<<" + ",".join(str(byte) for byte in data) + ">>"
    quoted = "".join(_ESCAPES.get(ord(ch), ch) for ch in text)
    return f'<<"{quoted}"' + ("/utf8>>" if not text.isascii() else ">>")


async def _declare_queue(connection: SessionHost, name: str, body: Value) -> tuple[str, bytes]:
    fields = _fields(body, _QUEUE_FIELDS, "bad queue property")
    if name == "":
        raise Refused("400", "declare queue with empty name not allowed")
    vhost = connection.vhost
    assert vhost is not None
    if name.startswith("amq."):
        raise Refused("403", f"queue '{name}' in vhost '{vhost.name}' starts with reserved prefix 'amq.'")
    durable = _flag(fields, "durable", True)
    exclusive = _flag(fields, "exclusive", False)
    auto_delete = _flag(fields, "auto_delete", False)
    arguments = _arguments(fields)
    async with connection.broker.declaring(vhost, name, durable, exclusive, auto_delete, arguments,
                                           connection.principal):
        existed = name in vhost.queues
        queue = connection.broker.declare_queue(vhost, name, False, durable, exclusive, auto_delete, arguments,
                                                connection, who=connection.principal)
    return ("200" if existed else "201"), await _queue_info(connection, queue)


async def _declare_exchange(connection: SessionHost, name: str, body: Value) -> tuple[str, bytes]:
    fields = _fields(body, _EXCHANGE_FIELDS, "bad exchange property")
    vhost = connection.vhost
    assert vhost is not None
    kind = fields.get("type")
    type_name = str(kind.value) if kind is not None else "direct"
    if name not in vhost.exchanges and name.startswith("amq."):
        raise Refused("403", f"exchange '{name}' in vhost '{vhost.name}' starts with reserved prefix 'amq.'")
    durable, auto_delete = _flag(fields, "durable", True), _flag(fields, "auto_delete", False)
    internal, arguments = _flag(fields, "internal", False), _arguments(fields)
    await connection.broker.declare_exchange_agreed(vhost, name, type_name, durable, auto_delete, internal, arguments,
                                                    connection.principal)
    return "204", NULL


def _bind(connection: SessionHost, body: Value) -> None:
    fields = _fields(body, _BINDING_FIELDS, "bad binding field")
    source = fields.get("source")
    key = fields.get("binding_key")
    queue, exchange = fields.get("destination_queue"), fields.get("destination_exchange")
    destination = queue if queue is not None else exchange
    if source is None or key is None or destination is None:
        raise Refused("400", "binding needs source, destination_queue or destination_exchange, and binding_key")
    kind = "queue" if queue is not None else "exchange"
    names = str(source.value), str(destination.value)
    if "" in names:
        raise Refused("403", "operation not permitted on the default exchange")
    vhost = connection.vhost
    assert vhost is not None
    connection.broker.bind(vhost, names[0], kind, names[1], str(key.value), _arguments(fields), connection,
                           connection.principal)


_BINDING_SEGMENT = re.compile(r"^src=([0-9A-Za-z\-._~%]+);dst([eq])=([0-9A-Za-z\-._~%]+);"
                              r"key=([0-9A-Za-z\-._~%]*);args=([0-9A-Za-z\-_]*)$")


def _unbind(connection: SessionHost, segment: str) -> None:
    match = _BINDING_SEGMENT.match(segment)
    if match is None:
        raise Refused("400", f"bad binding path segment '{segment[:300]}'")
    source, kind, destination, key, args_hash = match.groups()
    vhost = connection.vhost
    assert vhost is not None
    arguments = next((arguments for _, arguments in _matching(connection, unquote(source), kind, unquote(destination),
                                                              unquote(key)) if _args_hash(arguments) == args_hash),
                     None)
    if arguments is not None:
        connection.broker.unbind(vhost, unquote(source), "queue" if kind == "q" else "exchange", unquote(destination),
                                 unquote(key), arguments, connection, connection.principal)


def _matching(connection: SessionHost, source: str, kind: str, destination: str,
              key: str) -> list[tuple[str, dict[str, Any]]]:
    vhost = connection.vhost
    assert vhost is not None
    found = []
    for src, target, routing_key, arguments in connection.broker.all_bindings(vhost):
        target_kind = "e" if isinstance(target, Exchange) else "q"
        if src == source and target.name == destination and target_kind == kind and routing_key == key:
            found.append((routing_key, arguments or {}))
    return found


def _args_hash(arguments: dict[str, Any]) -> str:
    """Warren's own hash of a binding's arguments (RabbitMQ's is erlang:phash2): the client only echoes it."""
    if not arguments:
        return ""
    digest = zlib.crc32(repr(sorted(arguments.items())).encode()).to_bytes(4, "big")
    return base64.urlsafe_b64encode(digest).decode().rstrip("=")


def _bindings(connection: SessionHost, query: dict[str, str]) -> tuple[str, bytes]:
    source, key = query.get("src"), query.get("key")
    if "dste" in query:
        kind, destination = "e", query["dste"]
    elif "dstq" in query:
        kind, destination = "q", query["dstq"]
    else:
        raise Refused("400", f"missing 'dste' or 'dstq' in query: {query!r}"[:300])
    if source is None or key is None:
        raise Refused("400", "missing 'src' or 'key' in query")
    items = []
    for routing_key, arguments in _matching(connection, source, kind, destination, key):
        location = (f"/bindings/src={quote(source, safe='')};dst{kind}={quote(destination, safe='')};"
                    f"key={quote(routing_key, safe='')};args={_args_hash(arguments)}")
        items.append(encode_map([(utf8("source"), utf8(source)),
                                 (utf8("destination_queue" if kind == "q" else "destination_exchange"),
                                  utf8(destination)),
                                 (utf8("binding_key"), utf8(routing_key)),
                                 (utf8("arguments"), _value(arguments)), (utf8("location"), utf8(location))]))
    return "200", encode_list(items)


def _value(value: Any) -> bytes:
    """A Python value (an argument) in AMQP 1.0."""
    if value is None:
        return NULL
    if isinstance(value, bool):
        return amqp10.boolean(value)
    if isinstance(value, int):
        return b"\x81" + value.to_bytes(8, "big", signed=True) if -(1 << 63) <= value < (1 << 63) else NULL
    if isinstance(value, float):
        return b"\x82" + struct.pack(">d", value)
    if isinstance(value, bytes):
        return amqp10.binary(value)
    if isinstance(value, dict):
        return encode_map([(utf8(str(key)), _value(item)) for key, item in value.items()])
    if isinstance(value, (list, tuple)):
        return encode_list([_value(item) for item in value])
    return utf8(str(value))


async def _queue_info(connection: SessionHost, queue: AnyQueue) -> bytes:
    """RabbitMQ 4.x's answer about a queue: its node's figures (``counted``: a proxy asks that node)."""
    node = queue.node or connection.broker.node_name
    kind = queue.type.name
    count, consumers = await queue.counted()
    return encode_map([
        (utf8("leader"), utf8(node)),
        (utf8("replicas"), b"\xe0" + bytes((len(node.encode()) + 3, 1, 0xA1, len(node.encode()))) + node.encode()
         if len(node.encode()) < 250 else NULL),
        (utf8("message_count"), amqp10.ulong(count)),
        (utf8("consumer_count"), amqp10.uint(consumers)),
        (utf8("name"), utf8(queue.name)),
        (utf8("vhost"), utf8(queue.vhost)),
        (utf8("durable"), amqp10.boolean(queue.durable)),
        (utf8("auto_delete"), amqp10.boolean(queue.auto_delete)),
        (utf8("exclusive"), amqp10.boolean(queue.exclusive_owner is not None)),
        (utf8("type"), utf8(kind)),
        (utf8("arguments"), _value(dict(queue.arguments or {}))),
    ])

